// AVX2 + FMA vector helpers: the interface of simd_avx512.hpp with 8 lanes.
// Include only from translation units compiled with -mavx2 -mfma.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/simd_common.hpp"

namespace qkv::kernels::cpu {

struct SimdAvx2 {
  static constexpr int L = 8;
  using V = __m256;

  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void storeu(float* p, V x) { _mm256_storeu_ps(p, x); }
  // Lane i is on when i < n.
  static __m256i first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V load_n(const float* p, int n) { return _mm256_maskload_ps(p, first(n)); }
  static void store_n(float* p, V x, int n) { _mm256_maskstore_ps(p, first(n), x); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V max(V a, V b) { return _mm256_max_ps(a, b); }
  static V min(V a, V b) { return _mm256_min_ps(a, b); }
  static V rcp(V x) {  // as SimdAvx512::rcp; rcp_ps has relative error ≤ 1.5 · 2^-12
    const V r = _mm256_rcp_ps(x);
    return _mm256_mul_ps(r, _mm256_fnmadd_ps(x, r, set1(2.0f)));
  }
  static V where_neg_inf(V x, V y) {
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, set1(-__builtin_inff()), _CMP_EQ_OQ));
  }
  static float hmax(V x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static float hsum(V x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static bool any_gt(V x, float t) { return _mm256_movemask_ps(_mm256_cmp_ps(x, set1(t), _CMP_GT_OQ)) != 0; }

  // As SimdAvx512::exp2; 2^n is built in the exponent field (n ∈ [−126, 127] after clamping).
  // The clamp puts x second: max/min return their second operand when either is NaN, so NaN
  // passes through (and the final mask, "not less than", keeps unordered lanes): NaN in, NaN out.
  // +∞ is clamped to 127 (finite); the kernels never pass it (their running max is +∞ first).
  static V exp2(V x) {
    const V xc = _mm256_min_ps(set1(127.0f), _mm256_max_ps(set1(-126.0f), x));
    const V n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const V f = _mm256_sub_ps(xc, n);
    V p = set1(kExp2Poly[5]);
    p = fmadd(p, f, set1(kExp2Poly[4]));
    p = fmadd(p, f, set1(kExp2Poly[3]));
    p = fmadd(p, f, set1(kExp2Poly[2]));
    p = fmadd(p, f, set1(kExp2Poly[1]));
    p = fmadd(p, f, set1(kExp2Poly[0]));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const V r = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_and_ps(r, _mm256_cmp_ps(x, set1(-126.0f), _CMP_NLT_UQ));
  }

  static V widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static constexpr bool kHasTranspose16 = false;
  static constexpr bool kHasF16 = false;  // no load_f16: see SimdAvx512
  static void transpose16(const float*, std::int64_t, float*, std::int64_t) {}
  static V load_bf16(const std::uint16_t* p) { return widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static V load_bf16_n(const std::uint16_t* p, int n) {
    alignas(16) std::uint16_t t[8] = {};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  }
  static void store_bf16_n(std::uint16_t* p, V x, int n) {
    alignas(32) float t[8];
    _mm256_store_ps(t, x);
    for (int i = 0; i < n; ++i) p[i] = f32_to_bf16_bits(t[i]);
  }
  static void store_bf16(std::uint16_t* p, V x) { store_bf16_n(p, x, L); }
};

}  // namespace qkv::kernels::cpu
