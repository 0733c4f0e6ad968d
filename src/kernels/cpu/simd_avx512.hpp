// AVX-512 (F, BW, VL, DQ) vector helpers for the CPU attention kernels.
//
// Include only from translation units compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// (see src/kernels/cpu/CMakeLists.txt); the code behind them runs only after the run-time ISA
// check in src/attention/dispatch.cpp. Every ISA header (simd_avx2.hpp, simd_scalar.hpp)
// offers the same static interface, so a kernel is written once as a template over it:
//
//   L                       lanes (floats per vector)
//   zero, set1, loadu, storeu, load_n / store_n (first n < L lanes, the rest untouched / zero)
//   fmadd(a, b, c) = a·b + c, mul, add, sub, max, hmax, hsum
//   min(a, b)               (min and max return b when either lane is NaN, as the instructions do)
//   rcp(x)                  1/x for normal x > 0: the approximate reciprocal and one Newton step
//                           (≈ 1 ulp; the tanh of score_mod.hpp divides by it)
//   where_neg_inf(x, y)     x on the lanes where x = −∞, y elsewhere (score variants: masked stays masked)
//   any_gt(x, t)            whether some lane of x is > t (ordered: NaN lanes are not)
//   exp2(x)                 2^x, relative error ≤ 2.4e-7 (measured in tests/kernels), 0 for x < −126,
//                           NaN for NaN and +∞
//   load_bf16 / store_bf16  L bf16 values ↔ f32 (round to nearest even, NaN kept NaN)
#pragma once

// GCC 12 warns "__Y may be used uninitialized" inside its own avx512fintrin.h (GCC bug 105593:
// _mm512_undefined_ps). Include this header before anything that includes <immintrin.h>.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/simd_common.hpp"

namespace qkv::kernels::cpu {

struct SimdAvx512 {
  static constexpr int L = 16;
  using V = __m512;

  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void storeu(float* p, V x) { _mm512_storeu_ps(p, x); }
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(first(n), p); }
  static void store_n(float* p, V x, int n) { _mm512_mask_storeu_ps(p, first(n), x); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V max(V a, V b) { return _mm512_max_ps(a, b); }
  static V min(V a, V b) { return _mm512_min_ps(a, b); }
  static V rcp(V x) {
    const V r = _mm512_rcp14_ps(x);  // relative error ≤ 2^-14; r (2 − x r) squares it
    return _mm512_mul_ps(r, _mm512_fnmadd_ps(x, r, set1(2.0f)));
  }
  // One vfixupimmps instead of a compare and a blend: the table's 4-bit response for x's class
  // "−∞" (token 4) is 4, "−∞"; every other class (token 0–3, 5–7) answers 0, "keep y".
  static V where_neg_inf(V x, V y) { return _mm512_fixupimm_ps(y, x, _mm512_set1_epi32(0x4 << 16), 0); }
  static float hmax(V x) { return _mm512_reduce_max_ps(x); }
  static float hsum(V x) { return _mm512_reduce_add_ps(x); }
  static bool any_gt(V x, float t) { return _mm512_cmp_ps_mask(x, set1(t), _CMP_GT_OQ) != 0; }

  // 2^x = 2^n · 2^f with n = round(x), f ∈ [−½, ½]; 2^f by the degree-5 polynomial of
  // simd_common.hpp, 2^n by scalef. Inputs below −126 (−∞ included) give exactly 0: the zeroing
  // mask of scalef drops their lanes, whatever n and f were (−∞ makes f NaN), so no clamp of x is
  // needed. NaN stays NaN (the mask is "not less than", true for unordered lanes; then f and p
  // are NaN), and so does +∞ (f = ∞ − ∞): the kernels' non-finite policy (qkv/attention.hpp)
  // rides on it at no cost. 9 instructions instead of 11 (a clamp, and a mask move after scalef)
  // for the same bits; the flash forward runs exp2 on 24 vectors per 3072 FMAs of a strip and
  // tile at D = 64, so the two instructions are worth ≈ 1 %.
  static V exp2(V x) {
    const V n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm512_sub_ps(x, n);
    V p = set1(kExp2Poly[5]);
    p = fmadd(p, f, set1(kExp2Poly[4]));
    p = fmadd(p, f, set1(kExp2Poly[3]));
    p = fmadd(p, f, set1(kExp2Poly[2]));
    p = fmadd(p, f, set1(kExp2Poly[1]));
    p = fmadd(p, f, set1(kExp2Poly[0]));
    const __mmask16 keep = _mm512_cmp_ps_mask(x, set1(-126.0f), _CMP_NLT_UQ);
    return _mm512_maskz_scalef_ps(keep, p, n);
  }

  // dst[c·ldd + r] = src[r·lds + c] for a 16 × 16 block, in registers: unpack pairs of rows
  // (ps, then pd), which leaves 4 × 4 transposed blocks in the 128-bit lanes, then gather the
  // lanes with two rounds of shuffle_f32x4. 64 shuffles instead of 256 scalar moves.
  static constexpr bool kHasTranspose16 = true;
  static void transpose16(const float* src, std::int64_t lds, float* dst, std::int64_t ldd) {
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
      const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
      r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));      // lane k: column 4k,     rows 4i..4i+3
      r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));  //         column 4k + 1
      r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));  //         column 4k + 2
      r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));  //         column 4k + 3
    }
    for (int m = 0; m < 4; ++m) {
      t[m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
      t[4 + m] = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xdd);
      t[8 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
      t[12 + m] = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xdd);
    }
    for (int m = 0; m < 4; ++m) {
      _mm512_storeu_ps(dst + m * ldd, _mm512_shuffle_f32x4(t[m], t[8 + m], 0x88));
      _mm512_storeu_ps(dst + (8 + m) * ldd, _mm512_shuffle_f32x4(t[m], t[8 + m], 0xdd));
      _mm512_storeu_ps(dst + (4 + m) * ldd, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0x88));
      _mm512_storeu_ps(dst + (12 + m) * ldd, _mm512_shuffle_f32x4(t[4 + m], t[12 + m], 0xdd));
    }
  }

  // L binary16 → f32, exact (vcvtph2ps, AVX-512F): f16 KV caches. kHasF16: the other ISAs widen
  // element by element (F16C is not part of their run-time check).
  static constexpr bool kHasF16 = true;
  static V load_f16(const std::uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static V load_bf16(const std::uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V load_bf16_n(const std::uint16_t* p, int n) {
    const __m256i h = _mm256_maskz_loadu_epi16(first(n), p);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m256i to_bf16(V x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
  }
  static void store_bf16(std::uint16_t* p, V x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x));
  }
  static void store_bf16_n(std::uint16_t* p, V x, int n) { _mm256_mask_storeu_epi16(p, first(n), to_bf16(x)); }
};

// Sum of each of 16 vectors: lane c of the result = Σ lanes of acc[c]. Four rounds of
// shuffle + add halve the partial sums per key (16 → 8 → 4 → 2 → 1 lanes) while packing two
// keys' partials into the room freed (add: the lanes' addition, f32 or int32 on the same
// bits); 45 instructions for 16 keys instead of a horizontal sum (≈ 8 dependent instructions
// and a scalar store) per key. The rounds leave key
// kSlot[p] in lane p, so acc[kSlot[s]] is fed as the s-th input and the lanes come out in order.
template <class Add>
inline __m512 reduce16(const __m512* acc, Add add) {
  // Lane 4L + m of the last round holds input L + {0, 8, 4, 12}[m]: input s feeds lane kSlot[s].
  constexpr int kSlot[16] = {0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15};
  __m512 x[8], y[4], z[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // x[i]: 8 partials of input 2i, then of 2i + 1 (256-bit halves)
    const __m512 a = acc[kSlot[2 * i]], b = acc[kSlot[2 * i + 1]];
    x[i] = add(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // y[i]: 128-bit lane L holds 4 partials of input 4i + L
    y[i] = add(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88), _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xdd));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // z[i], lane L: 2 partials of inputs 8i + L and 8i + 4 + L, interleaved
    z[i] = add(_mm512_unpacklo_ps(y[2 * i], y[2 * i + 1]), _mm512_unpackhi_ps(y[2 * i], y[2 * i + 1]));
  return add(_mm512_unpacklo_ps(z[0], z[1]), _mm512_unpackhi_ps(z[0], z[1]));
}

inline __m512 reduce16(const __m512* acc) { return reduce16(acc, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); }); }
// The same for 16 vectors of int32 (exact: integer sums).
inline __m512i reduce16_epi32(const __m512i* acc) {
  const __m512 r = reduce16(reinterpret_cast<const __m512*>(acc), [](__m512 x, __m512 y) {
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(x), _mm512_castps_si512(y)));
  });
  return _mm512_castps_si512(r);
}

}  // namespace qkv::kernels::cpu
