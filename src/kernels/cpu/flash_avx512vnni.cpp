// The decode from an int8 KV cache on CPUs with AVX512-VNNI: decode_i8_avx512.hpp's VNNI policy
// (scores by vpdpbusd, P·V by vpdpwssd). The only kernel of the avx512_vnni level, and the one the
// avx512_bf16 level runs on an int8 cache too; every other call there runs flash_avx512.cpp (or
// flash_avx512bf16.cpp). Compiled with -mavx512vnni on top of the AVX-512 flags but without
// -mavx512bf16 (CMakeLists.txt), so that it runs on Cascade Lake and Ice Lake.
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/decode_i8_avx512.hpp"
#include "kernels/cpu/flash_decode_impl.hpp"

namespace qkv::kernels::cpu {

void flash_decode_avx512_vnni(const FlashArgs& a) { decode_i8<SimdAvx512, true>(a); }

}  // namespace qkv::kernels::cpu
