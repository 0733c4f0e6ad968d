// The avx2 exp2's error (exp2_error.hpp) and softcap's (softcap_error.hpp), compiled with the avx2
// flags (tests/CMakeLists.txt).
#include "kernels/cpu/simd_avx2.hpp"
#include "kernels/exp2_error.hpp"
#include "kernels/softcap_error.hpp"

namespace qkv_test {

double exp2_max_rel_error_avx2(bool* zeros_ok) {
  return exp2_max_rel_error<qkv::kernels::cpu::SimdAvx2>(zeros_ok);
}
double softcap_max_abs_error_avx2(bool* special_ok) {
  return softcap_max_abs_error<qkv::kernels::cpu::SimdAvx2>(special_ok);
}

}  // namespace qkv_test
