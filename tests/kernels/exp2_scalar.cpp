// The scalar exp2's error (exp2_error.hpp), compiled with the scalar flags (tests/CMakeLists.txt).
#include "kernels/cpu/simd_scalar.hpp"
#include "kernels/exp2_error.hpp"

namespace qkv_test {

double exp2_max_rel_error_scalar(bool* zeros_ok) {
  return exp2_max_rel_error<qkv::kernels::cpu::SimdScalar>(zeros_ok);
}

}  // namespace qkv_test
