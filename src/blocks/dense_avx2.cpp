// The dense kernels of dense.hpp on AVX2 + FMA; compiled with those flags
// (src/blocks/CMakeLists.txt), entered only after dense.cpp checks active_isa().
#include "kernels/cpu/simd_avx2.hpp"
#include "blocks/dense_impl.hpp"

namespace qkv::blocks::detail {
namespace {

struct S : kernels::cpu::SimdAvx2 {
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
};

}  // namespace

void gemv_f32_avx2(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsF32<S>>(a, o0, o1); }
void gemv_bf16_avx2(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsBf16<S>>(a, o0, o1); }
void gemv_batch_f32_avx2(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsF32<S>, 2, 2>(a, o0, o1); }
void gemv_batch_bf16_avx2(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsBf16<S>, 2, 2>(a, o0, o1); }
void attend_one_avx2(const AttendArgs& a) { attend_one_impl<S, RowsF32<S>>(a); }
void attend_one_bf16_avx2(const AttendArgs& a) { attend_one_impl<S, RowsBf16<S>>(a); }
void gelu_avx2(float* out, const float* x, i64 n) { gelu_impl<S>(out, x, n); }

}  // namespace qkv::blocks::detail
