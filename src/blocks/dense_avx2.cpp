// The dense kernels of dense.hpp on AVX2 + FMA; compiled with those flags
// (src/blocks/CMakeLists.txt), entered only after dense.cpp checks active_isa().
#include "kernels/cpu/simd_avx2.hpp"
#include "blocks/dense_impl.hpp"

namespace qkv::blocks::detail {
namespace {

struct S : kernels::cpu::SimdAvx2 {
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  // Lane j of the result = the sum of the 8 lanes of x[j] (attend_one's scores, 8 keys at a time):
  // three rounds, each adding the two halves of every input's lanes and packing two inputs' halves
  // into one vector (8 → 4 → 2 → 1 lanes an input; 7 adds, 14 shuffles). The rounds leave the sum
  // of their i-th input in lane 4(i mod 2) + i / 2: x[4(i mod 2) + i / 2] is that input.
  static V hsum_lanes(const V (&x)[8]) {
    auto in = [&](int i) { return x[4 * (i % 2) + i / 2]; };
    V a[4], b[2];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)  // 128-bit halves of in(2i) and in(2i+1) added
      a[i] = _mm256_add_ps(_mm256_permute2f128_ps(in(2 * i), in(2 * i + 1), 0x20),
                           _mm256_permute2f128_ps(in(2 * i), in(2 * i + 1), 0x31));
    #pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)  // two lanes an input, within each 128-bit half
      b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm256_shuffle_ps(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
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
