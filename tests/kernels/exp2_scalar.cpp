// The scalar exp2's error (exp2_error.hpp) and softcap's (softcap_error.hpp), compiled with the scalar
// flags (tests/CMakeLists.txt).
#include "kernels/cpu/simd_scalar.hpp"
#include "kernels/exp2_error.hpp"
#include "kernels/softcap_error.hpp"

namespace qkv_test {

double exp2_max_rel_error_scalar(bool* zeros_ok) {
  return exp2_max_rel_error<qkv::kernels::cpu::SimdScalar>(zeros_ok);
}
double softcap_max_abs_error_scalar(bool* special_ok) {
  return softcap_max_abs_error<qkv::kernels::cpu::SimdScalar>(special_ok);
}

}  // namespace qkv_test
