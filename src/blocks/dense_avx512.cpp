// The dense kernels of dense.hpp on AVX-512 (F, BW, VL, DQ); compiled with those flags
// (src/blocks/CMakeLists.txt), entered only after dense.cpp checks active_isa().
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "blocks/dense_impl.hpp"

namespace qkv::blocks::detail {
namespace {

struct S : kernels::cpu::SimdAvx512 {
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  // hsum(x_i) for 4 vectors, bit for bit (the batched GEMV's rows must equal its one-row calls):
  // hsum (_mm512_reduce_add_ps) adds lanes k + 8 → k, then j + 4 → j, then i + 2 → i, then 1 → 0;
  // the same pairs here, on 4 vectors at once (8 shuffles and 5 adds instead of 4 × 7 ops), leave
  // the sums in lanes 0, 4, 8, 12. hsum4 writes them to out[0..4) (through memory: gemv_batch_row
  // wants floats), hsum4x returns them as one 4-lane vector (gemv_batch_block's y update).
  static V hsum4_lanes(V a, V b, V c, V d) {
    const V ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));  // a8 | b8
    const V cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));  // c8 | d8
    V r = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));  // a4 b4 c4 d4
    r = _mm512_add_ps(r, _mm512_permute_ps(r, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm512_add_ps(r, _mm512_permute_ps(r, _MM_SHUFFLE(2, 3, 0, 1)));
  }
  static void hsum4(V a, V b, V c, V d, float* out) {
    alignas(64) float t[16];
    _mm512_store_ps(t, hsum4_lanes(a, b, c, d));
    out[0] = t[0], out[1] = t[4], out[2] = t[8], out[3] = t[12];
  }
  static __m128 hsum4x(V a, V b, V c, V d) {
    const __m512i lanes = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(lanes, hsum4_lanes(a, b, c, d)));
  }
  // Lane j of the result = the sum of the 16 lanes of x[j] (attend_one's scores, 16 keys at a
  // time): four rounds, each adding the two halves of every input's lanes left and packing two
  // inputs' halves into one vector (16 → 8 → 4 → 2 → 1 lanes an input; 15 adds, 30 shuffles).
  // The rounds leave the sum of their i-th input in lane 4(i mod 4) + i / 4: x[4(i mod 4) + i / 4] is that input.
  static V hsum_lanes(const V (&x)[16]) {
    auto in = [&](int i) { return x[4 * (i % 4) + i / 4]; };
    V a[8], b[4], c[2];
    #pragma GCC unroll 8
    for (int i = 0; i < 8; ++i)  // 128-bit blocks of in(2i) and in(2i+1): 0 + 2, 1 + 3
      a[i] = _mm512_add_ps(_mm512_shuffle_f32x4(in(2 * i), in(2 * i + 1), 0x44),
                           _mm512_shuffle_f32x4(in(2 * i), in(2 * i + 1), 0xEE));
    #pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)  // one 128-bit block an input
      b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xDD));
    #pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)  // two lanes an input, within each 128-bit block
      c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(c[0], c[1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
};

}  // namespace

void gemv_f32_avx512(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsF32<S>>(a, o0, o1); }
void gemv_bf16_avx512(const GemvArgs& a, i64 o0, i64 o1) { gemv_rows<S, RowsBf16<S>>(a, o0, o1); }
void gemv_batch_f32_avx512(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsF32<S>, 4, 4>(a, o0, o1); }
void gemv_batch_bf16_avx512(const BatchGemvArgs& a, i64 o0, i64 o1) { gemv_batch_rows<S, RowsBf16<S>, 4, 4>(a, o0, o1); }
void attend_one_avx512(const AttendArgs& a) { attend_one_impl<S, RowsF32<S>>(a); }
void attend_one_bf16_avx512(const AttendArgs& a) { attend_one_impl<S, RowsBf16<S>>(a); }
void gelu_avx512(float* out, const float* x, i64 n) { gelu_impl<S>(out, x, n); }
void to_bf16_avx512(std::uint16_t* dst, const float* src, i64 n) {
  i64 i = 0;
  for (; i + S::L <= n; i += S::L) S::store_bf16(dst + i, S::loadu(src + i));
  if (i < n) S::store_bf16_n(dst + i, S::load_n(src + i, static_cast<int>(n - i)), static_cast<int>(n - i));
}

}  // namespace qkv::blocks::detail
