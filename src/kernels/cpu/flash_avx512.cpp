// The flash forward and decode kernels compiled for avx512 (flags in CMakeLists.txt).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/decode_i8_avx512.hpp"
#include "kernels/cpu/flash_decode_impl.hpp"
#include "kernels/cpu/flash_forward_impl.hpp"

namespace qkv::kernels::cpu {

void flash_forward_avx512(const FlashArgs* list, std::int64_t n) { forward<SimdAvx512, OperandsF32<SimdAvx512>>(list, n); }
void flash_decode_avx512(const FlashArgs& a) {
  if (a.kv_i8) decode_i8<SimdAvx512, false>(a);
  else decode<SimdAvx512>(a);
}

}  // namespace qkv::kernels::cpu
