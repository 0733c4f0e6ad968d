// Internal: 16-float vectors and a vectorised exp2 for the CPU attention kernels, one source
// for every instruction set.
//
// A kernel file that includes this header is compiled once per ISA with that ISA's flags
// (src/kernels/CMakeLists.txt) and is entered only after a run-time CPU check. The compiler
// flags choose the implementation:
//   __AVX512F__  V16 = one zmm register
//   __AVX2__     V16 = two ymm registers (needs FMA as well)
//   otherwise    V16 = 16 floats in plain loops (portable; the compiler may use SSE2)
//
// Everything here is inline and lives in namespace qkv::kernels::QKV_ISA_NS, which the including
// file defines (avx512, avx2 or scalar). Distinct namespaces keep the linker from merging an
// AVX-512 copy of a function into the portable build (one definition rule across flag sets).
// For the same reason ISA files avoid std:: templates on floats (std::min, std::fill, ...):
// those are shared across translation units and a copy compiled with -mavx512f could be picked.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#ifndef QKV_ISA_NS
#error "define QKV_ISA_NS (avx512, avx2 or scalar) before including kernels/cpu/simd.hpp"
#endif

namespace qkv::kernels::QKV_ISA_NS {

inline constexpr int kLanes = 16;  // floats per V16

#if defined(__AVX512F__)

struct V16 {
  __m512 r;
};
// GCC 12 reports the _mm512_undefined_*() inside some unmasked AVX-512 intrinsics as "may be used
// uninitialized"; their zero-masked forms with a full mask compile to the same instruction.
inline constexpr __mmask16 kAll = 0xffff;
inline V16 vzero() { return {_mm512_setzero_ps()}; }
inline V16 vset1(float x) { return {_mm512_set1_ps(x)}; }
inline V16 vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void vstore(float* p, V16 a) { _mm512_storeu_ps(p, a.r); }
inline V16 vadd(V16 a, V16 b) { return {_mm512_add_ps(a.r, b.r)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm512_sub_ps(a.r, b.r)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm512_mul_ps(a.r, b.r)}; }
inline V16 vfma(V16 a, V16 b, V16 c) { return {_mm512_fmadd_ps(a.r, b.r, c.r)}; }  // a·b + c
inline V16 vmax(V16 a, V16 b) { return {_mm512_maskz_max_ps(kAll, a.r, b.r)}; }
inline float vreduce_max(V16 a) { return _mm512_reduce_max_ps(a.r); }
inline float vreduce_add(V16 a) { return _mm512_reduce_add_ps(a.r); }

// 2^x for x ≤ 127; exactly 0 for x < −126 (so −∞ gives 0, never NaN).
inline V16 vexp2(V16 x) {
  const __m512 lo = _mm512_set1_ps(-126.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x.r, lo, _CMP_GE_OQ);
  const __m512 xc = _mm512_maskz_max_ps(kAll, x.r, lo);
  // Round to nearest by the 1.5·2^23 trick; the integer n is read off the mantissa bits.
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_add_ps(xc, magic);
  const __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_castps_si512(magic));
  const __m512 f = _mm512_sub_ps(xc, _mm512_sub_ps(t, magic));  // f ∈ [−0.5, 0.5]
  __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  const __m512i pow2n = _mm512_maskz_slli_epi32(kAll, _mm512_add_epi32(n, _mm512_set1_epi32(127)), 23);
  return {_mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(pow2n))};
}

#elif defined(__AVX2__)

struct V16 {
  __m256 lo, hi;
};
inline V16 vzero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline V16 vset1(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline V16 vload(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void vstore(float* p, V16 a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline V16 vadd(V16 a, V16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline V16 vsub(V16 a, V16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline V16 vmul(V16 a, V16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline V16 vfma(V16 a, V16 b, V16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline V16 vmax(V16 a, V16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline float hsum8(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax8(__m256 a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vreduce_max(V16 a) { return hmax8(_mm256_max_ps(a.lo, a.hi)); }
inline float vreduce_add(V16 a) { return hsum8(_mm256_add_ps(a.lo, a.hi)); }

inline __m256 exp2_8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-126.0f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  const __m256 xc = _mm256_max_ps(x, lo);
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_add_ps(xc, magic);
  const __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic));
  const __m256 f = _mm256_sub_ps(xc, _mm256_sub_ps(t, magic));
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i pow2n = _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(keep, _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n)));
}
// 2^x for x ≤ 127; exactly 0 for x < −126 (so −∞ gives 0, never NaN).
inline V16 vexp2(V16 x) { return {exp2_8(x.lo), exp2_8(x.hi)}; }

#else

struct V16 {
  float v[kLanes];
};
inline V16 vzero() {
  V16 a;
  for (int l = 0; l < kLanes; ++l) a.v[l] = 0.0f;
  return a;
}
inline V16 vset1(float x) {
  V16 a;
  for (int l = 0; l < kLanes; ++l) a.v[l] = x;
  return a;
}
inline V16 vload(const float* p) {
  V16 a;
  std::memcpy(a.v, p, sizeof a.v);
  return a;
}
inline void vstore(float* p, V16 a) { std::memcpy(p, a.v, sizeof a.v); }
#define QKV_SIMD_LANEWISE(name, expr)              \
  inline V16 name(V16 a, V16 b) {                  \
    V16 r;                                         \
    for (int l = 0; l < kLanes; ++l) r.v[l] = expr; \
    return r;                                      \
  }
QKV_SIMD_LANEWISE(vadd, a.v[l] + b.v[l])
QKV_SIMD_LANEWISE(vsub, a.v[l] - b.v[l])
QKV_SIMD_LANEWISE(vmul, a.v[l] * b.v[l])
QKV_SIMD_LANEWISE(vmax, a.v[l] > b.v[l] ? a.v[l] : b.v[l])
#undef QKV_SIMD_LANEWISE
inline V16 vfma(V16 a, V16 b, V16 c) {
  V16 r;
  for (int l = 0; l < kLanes; ++l) r.v[l] = a.v[l] * b.v[l] + c.v[l];
  return r;
}
inline float vreduce_max(V16 a) {
  float m = a.v[0];
  for (int l = 1; l < kLanes; ++l) m = a.v[l] > m ? a.v[l] : m;
  return m;
}
inline float vreduce_add(V16 a) {
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += a.v[l];
  return s;
}
// 2^x for x ≤ 127; exactly 0 for x < −126 (so −∞ gives 0, never NaN). Same algorithm and
// constants as the SIMD versions.
inline V16 vexp2(V16 x) {
  V16 r;
  for (int l = 0; l < kLanes; ++l) {
    const float xv = x.v[l];
    const float xc = xv < -126.0f ? -126.0f : xv;
    const float t = xc + 12582912.0f;
    std::int32_t ti, mi;
    const float magic = 12582912.0f;
    std::memcpy(&ti, &t, sizeof ti);
    std::memcpy(&mi, &magic, sizeof mi);
    const std::int32_t n = ti - mi;
    const float f = xc - (t - 12582912.0f);
    float p = 1.535336188319500e-4f;
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    const std::uint32_t bits = static_cast<std::uint32_t>(n + 127) << 23;
    float pow2n;
    std::memcpy(&pow2n, &bits, sizeof pow2n);
    r.v[l] = xv >= -126.0f ? p * pow2n : 0.0f;
  }
  return r;
}

#endif

}  // namespace qkv::kernels::QKV_ISA_NS
