// Decode from an int8 KV cache on AVX-512 (F, BW): the decode policy (flash_decode_impl.hpp) that
// reads the int8 K and V rows in place instead of widening each row to f32 first. Included by
// flash_avx512.cpp and flash_avx512bf16.cpp after simd_avx512.hpp; the generic rows of decode
// (every other ISA, QKV_ISA=avx2 or scalar) stay the oracle: the f32 kernel on the dequantised cache.
//
//   scores  the query row is quantised to int16 once per item: q16 = round(q · 32767 / max|q|)
//           (relative step 2^-15 of the row's largest element, far below K's int8 step), and
//           q16 · k8 summed exactly in int32 by vpmaddwd (pairs of int16 products) over
//           R rows × 16/R keys at a time, reduced by reduce16_epi32; the score is
//           float(Σ) · (max|q| / 32767 · scale · log2 e) · k_scale_j.
//   P·V     v_scale_j is folded into the probability (w = p · v_scale_j), the int8 V row widened
//           in registers (vpmovsxbd + vcvtdq2ps) and accumulated by FMA into R ≤ 4 rows at once.
// The generic rows widen each K and V row to f32 in scratch, reread it, and sum each score
// horizontally: at GQA 4, D = 128, one thread, Skv = 16384 they took 4.5 ms where this takes
// 2.1–2.3 (bench_kvcache). It stays compute-bound (the K and V conversions and the f32 FMAs of
// P·V), not memory-bound: vpdpwssd (AVX512-VNNI) in place of vpmaddwd + vpaddd gained 1 %,
// f32 scores (q not quantised) cost 20 %.
//
// The sums differ from the oracle's only by q's quantisation and f32 rounding: tests compare
// this policy with the f64 reference on the same quantised q (test_kvcache.cpp).
#pragma once

#include <cmath>
#include <cstring>

#include "kernels/cpu/flash_decode_impl.hpp"

namespace qkv::kernels::cpu {
namespace {

// Scratch (as floats): Qw [kDecRows][Dp32] int16 query rows, zero past D (Dp32 = D rounded up
// to 32); Qt [Dp32] one query row in f32 while it is quantised; qs [kDecRows] each row's factor
// max|q| / 32767 · scale · log2 e; Pw [kDecRows][kNt] the probabilities times v_scale.
struct DecodeOpsI8 {
  static constexpr bool kEnabled = true;
  static constexpr float kQmax = 32767.0f;
  static i64 Dp32(const FlashArgs& a) { return round_up(a.D, 32); }
  static i64 scratch_floats(const FlashArgs& a) { return kDecRows * Dp32(a) / 2 + Dp32(a) + kDecRows + kDecRows * kNt; }
  // int8 rows of unit element stride. K: D ≤ 256 keeps the int32 sums exact (|Σ| ≤ D · 32767 · 128 < 2^31).
  static bool takes_k(const FlashArgs& a) { return a.kv_i8 && a.sk[3] == 1 && a.D <= 256; }
  static bool takes_v(const FlashArgs& a) { return a.kv_i8 && a.sv[3] == 1; }

  const FlashArgs& a;
  i64 dp32;
  i64 j_end_ = 0;  // of the tile scores() saw last: pv() prefetches the K rows up to it
  std::int16_t* Qw;
  float *Qt, *qs, *Pw;
  DecodeOpsI8(const FlashArgs& args, float* mem) : a(args), dp32(Dp32(args)) {
    Qw = reinterpret_cast<std::int16_t*>(mem);
    Qt = mem + kDecRows * dp32 / 2;
    qs = Qt + dp32;
    Pw = qs + kDecRows;
  }
  const std::int8_t* krow(i64 b, i64 hk, i64 j) const { return static_cast<const std::int8_t*>(a.k) + kv_row(a, a.sk, b, hk, j); }
  const std::int8_t* vrow(i64 b, i64 hk, i64 j) const { return static_cast<const std::int8_t*>(a.v) + kv_row(a, a.sv, b, hk, j); }

  // A row with a NaN or ±∞ gets the factor NaN: its scores are NaN on every key, as q · k would be
  // (qkv/attention.hpp's non-finite policy); an all-zero row scores 0.
  void load_q(int r, i64 off) {
    load_row(a, a.q, off, a.sq[3], a.D, 1.0f, Qt);
    float amax = 0.0f;
    bool finite = true;
    for (i64 d = 0; d < a.D; ++d) {
      const float x = std::fabs(Qt[d]);
      finite = finite && x <= __builtin_huge_valf();
      amax = x > amax ? x : amax;
    }
    finite = finite && amax < __builtin_huge_valf();
    std::int16_t* row = Qw + r * dp32;
    const float inv = finite && amax > 0.0f ? kQmax / amax : 0.0f;
    for (i64 d = 0; d < a.D; ++d) row[d] = inv > 0.0f ? static_cast<std::int16_t>(std::nearbyint(Qt[d] * inv)) : 0;
    for (i64 d = a.D; d < dp32; ++d) row[d] = 0;
    qs[r] = finite ? amax / kQmax * a.scale_log2 : __builtin_nanf("");
  }

  // Ps[r0 + r][c0 + c] for R rows × C = 16/R keys: key c at kp[c] with scale ks[c] (0 for a key
  // outside the tile's range, which then scores 0; kp[c] points at a key inside it).
  template <int R>
  void scores_block(int r0, int nr, const std::int8_t* const* kp, const float* ks, float* Ps, i64 c0) const {
    constexpr int C = 16 / R;
    __m512i acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
    for (i64 d = 0; d < dp32; d += 32) {
      const __mmask32 dm = a.D - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (a.D - d)) - 1u);
      __m512i kw[C];
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) kw[c] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(dm, kp[c] + d));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512i qv = _mm512_loadu_si512(Qw + (r0 + r) * dp32 + d);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) acc[r * C + c] = _mm512_add_epi32(acc[r * C + c], _mm512_madd_epi16(qv, kw[c]));
      }
    }
    alignas(64) float f[16], s[16];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) f[r * C + c] = qs[r0 + r] * ks[c];
    _mm512_store_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(reduce16_epi32(acc)), _mm512_load_ps(f)));
    for (int r = 0; r < R && r0 + r < nr; ++r) std::memcpy(Ps + (r0 + r) * kNt + c0, s + r * C, sizeof(float) * C);
  }
  template <int R>
  void scores_rows(int r0, int nr, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Ps) const {
    constexpr int C = 16 / R;
    for (int r = nr; r < r0 + R; ++r) {  // padding rows of the last group: score 0, not stored
      std::memset(Qw + r * dp32, 0, sizeof(std::int16_t) * static_cast<std::size_t>(dp32));
      qs[r] = 0.0f;
    }
    for (i64 c0 = (j_lo - t0) / C * C; t0 + c0 < j_hi; c0 += C) {
      const std::int8_t* kp[C];
      float ks[C];
      for (int c = 0; c < C; ++c) {
        const i64 j = t0 + c0 + c;
        const bool in = j >= j_lo && j < j_hi;
        kp[c] = krow(b, hk, in ? j : j_lo);
        ks[c] = in ? a.k_scale[kv_row(a, a.sks, b, hk, j)] : 0.0f;
      }
      scores_block<R>(r0, nr, kp, ks, Ps, c0);
    }
  }
  void scores(int nr, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, i64 j_end, float* Ps) {
    j_end_ = j_end;
    for (i64 j = j_lo; j < j_hi; ++j) pf_row(vrow(b, hk, j), a.Dv);  // V rows, read next by pv()
    for (int r0 = 0; r0 < nr; r0 += 4) {
      const int left = nr - r0;
      if (left >= 3) scores_rows<4>(r0, nr, b, hk, t0, j_lo, j_hi, Ps);
      else if (left == 2) scores_rows<2>(r0, nr, b, hk, t0, j_lo, j_hi, Ps);
      else scores_rows<1>(r0, nr, b, hk, t0, j_lo, j_hi, Ps);
    }
  }

  // Od rows [r0, r0 + R) columns [e0, e0 + 16·NV) += Σ_j Pw[r][j − t0] · v_j (columns ≥ Dv read as 0).
  // With pf: key j's pass also prefetches the K row of key j + kNt, if below pf_end (the next
  // tile's keys that scores() will read: without it the K loads wait on memory).
  template <int R, int NV>
  void pv_block(int r0, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp, i64 e0, bool pf,
                i64 pf_end) const {
    __m512 acc[R][NV];
    __mmask16 cm[NV];
#pragma GCC unroll 8
    for (int x = 0; x < NV; ++x) {
      const i64 left = a.Dv - e0 - 16 * x;
      cm[x] = static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int x = 0; x < NV; ++x) acc[r][x] = _mm512_loadu_ps(Od + (r0 + r) * Dvp + e0 + 16 * x);
    for (i64 j = j_lo; j < j_hi; ++j) {
      if (pf && j + kNt < pf_end) pf_row(krow(b, hk, j + kNt), a.D);
      const std::int8_t* v = vrow(b, hk, j) + e0;
      __m512 vv[NV];
#pragma GCC unroll 8
      for (int x = 0; x < NV; ++x) vv[x] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(cm[x], v + 16 * x)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 w = _mm512_set1_ps(Pw[(r0 + r) * kNt + (j - t0)]);
#pragma GCC unroll 8
        for (int x = 0; x < NV; ++x) acc[r][x] = _mm512_fmadd_ps(w, vv[x], acc[r][x]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int x = 0; x < NV; ++x) _mm512_storeu_ps(Od + (r0 + r) * Dvp + e0 + 16 * x, acc[r][x]);
  }
  // All Dvp columns of rows [r0, r0 + R): 16 accumulators (R · NV) per pass over the keys.
  template <int R>
  void pv_rows(int r0, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp, bool pf, i64 pf_end) const {
    constexpr int NV = R <= 2 ? 8 : 4;
    i64 e0 = 0;
    for (; e0 + 16 * NV <= Dvp; e0 += 16 * NV, pf = false) pv_block<R, NV>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, e0, pf, pf_end);
    for (; e0 < Dvp; e0 += 16, pf = false) pv_block<R, 1>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, e0, pf, pf_end);
  }
  void pv(int nr, const float* Ps, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp) {
    for (i64 j = j_lo; j < j_hi; ++j) {
      const float vs = a.v_scale[kv_row(a, a.svs, b, hk, j)];
      for (int r = 0; r < nr; ++r) Pw[r * kNt + (j - t0)] = Ps[r * kNt + (j - t0)] * vs;
    }
    // The next tile's K rows, when scores() reads them (and set j_end_).
    const bool pf = takes_k(a);
    for (int r0 = 0; r0 < nr; r0 += 4) {
      const int left = nr - r0;
      if (left >= 4) pv_rows<4>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, pf && r0 == 0, j_end_);
      else if (left == 3) pv_rows<3>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, pf && r0 == 0, j_end_);
      else if (left == 2) pv_rows<2>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, pf && r0 == 0, j_end_);
      else pv_rows<1>(r0, b, hk, t0, j_lo, j_hi, Od, Dvp, pf && r0 == 0, j_end_);
    }
  }
};

}  // namespace
}  // namespace qkv::kernels::cpu
