// The dense kernels of dense.hpp on AVX-512 (F, BW, VL, DQ); compiled with those flags
// (src/blocks/CMakeLists.txt), entered only after dense.cpp checks active_isa().
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "blocks/dense_impl.hpp"

namespace qkv::blocks::detail {
namespace {

struct S : kernels::cpu::SimdAvx512 {
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
};

}  // namespace

void gemv_f32_avx512(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsF32<S>>(a, o0, o1); }
void gemv_bf16_avx512(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsBf16<S>>(a, o0, o1); }
void gemv_batch_f32_avx512(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsF32<S>, 4>(a, o0, o1); }
void gemv_batch_bf16_avx512(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsBf16<S>, 4>(a, o0, o1); }
void attend_one_avx512(const AttendArgs& a) { attend_one_impl<S>(a); }
void gelu_avx512(float* out, const float* x, i64 n) { gelu_impl<S>(out, x, n); }
void to_bf16_avx512(std::uint16_t* dst, const float* src, i64 n) {
  i64 i = 0;
  for (; i + S::L <= n; i += S::L) S::store_bf16(dst + i, S::loadu(src + i));
  if (i < n) S::store_bf16_n(dst + i, S::load_n(src + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

}  // namespace qkv::blocks::detail
