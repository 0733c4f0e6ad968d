// The flash forward and decode kernels compiled for scalar (flags in CMakeLists.txt).
#include "kernels/cpu/simd_scalar.hpp"  // first, as in every ISA unit (simd_avx512.hpp)
#include "kernels/cpu/decode_i8.hpp"
#include "kernels/cpu/flash_decode_impl.hpp"
#include "kernels/cpu/flash_forward_impl.hpp"

namespace qkv::kernels::cpu {

void flash_forward_scalar(const FlashArgs* list, std::int64_t n) { forward<SimdScalar, OperandsF32<SimdScalar>>(list, n); }
void flash_decode_scalar(const FlashArgs& a) {
  if (a.kv_i8) decode<SimdScalar, DecodeOpsI8Ref>(a);
  else decode<SimdScalar>(a);
}

}  // namespace qkv::kernels::cpu
