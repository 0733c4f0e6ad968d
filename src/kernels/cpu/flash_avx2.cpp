// The flash forward and decode kernels compiled for avx2 (flags in CMakeLists.txt).
#include "kernels/cpu/simd_avx2.hpp"  // first, as in every ISA unit (simd_avx512.hpp)
#include "kernels/cpu/decode_i8.hpp"
#include "kernels/cpu/flash_decode_impl.hpp"
#include "kernels/cpu/flash_forward_impl.hpp"

namespace qkv::kernels::cpu {

void flash_forward_avx2(const FlashArgs* list, std::int64_t n) { forward<SimdAvx2, OperandsF32<SimdAvx2>>(list, n); }
void flash_decode_avx2(const FlashArgs& a) {
  if (a.kv_i8) decode<SimdAvx2, DecodeOpsI8Ref>(a);
  else decode<SimdAvx2>(a);
}

}  // namespace qkv::kernels::cpu
