// Decode from an int8 KV cache on AVX-512: decode_i8.hpp's contract (the same integers, exact in
// int32) computed by vectors on the int8 rows as they lie in the cache. Included by flash_avx512.cpp
// (kVnni false) and flash_avx512vnni.cpp (kVnni true: the avx512_vnni and avx512_bf16 levels, see
// runtime.cpp) after simd_avx512.hpp; DecodeOpsI8Ref is its oracle and the path of the other ISAs.
//
//   scores  VNNI: vpdpbusd, unsigned × signed bytes, 4 products per int32 lane: the key bytes are
//           offset by +128 (k8 ^ 0x80) and each row's 128 · Σ q8 taken off the sum afterwards.
//           Without VNNI: q8 and k8 widened to int16 and summed by vpmaddwd. R rows × 16/R keys
//           at a time, reduced by reduce16_epi32.
//   P·V     keys in pairs (j, j + 1): the two int8 V rows interleaved byte by byte (vpunpck[lh]bw)
//           and widened to int16 pairs, so vpdpwssd (or vpmaddwd + vpaddd) adds w16_j v_j +
//           w16_j+1 v_j+1 into each column's int32 lane. The interleave leaves the columns of a
//           64-column block in the order of pair_columns; the tile's sums are put back in order
//           (4 lane shuffles) when they join the f32 accumulators.
// GQA 4, D = 128, one thread, Skv = 16384 (bench_kvcache): 1.18 ms against 2.13 for the bf16 cache
// (2.06 before, with q widened to int16, V to f32 and P·V by FMA: compute-bound on the conversions).
// Most of the rest was scalar set-up per key: the row pointers and scales of a tile are found once
// by runs (tile_kv), which took it from 1.58 to 1.39 ms.
#pragma once

#include <cstring>
#include <utility>

#include "kernels/cpu/decode_i8.hpp"
#include "kernels/cpu/flash_decode_impl.hpp"

namespace qkv::kernels::cpu {
namespace {

// Scratch (as floats): Qt [Dp64] one query row in f32; Q [kDecRows][Dp64] the int8 rows (VNNI) or
// int16 rows (without), zero past D (Dp64 = D rounded up to 64); qf [kDecRows] score factors;
// qc [kDecRows] int32 128 · Σ q8 (VNNI); W16 [kDecRows][kNt] int16 weights, 0 outside the tile's
// keys; then two sets of a tile's rows, this tile's and the next one's (tile_kv), each
//   vs [kNt] v_scale, vp and kt [kNt] pointers to the V and K rows (8 bytes each), kst [kNt + 16]
//   k_scale (0 outside the tile's keys; 16 past the end: read by vectors).
// Ends an accumulator's live range in a vector register at this point of each loop iteration.
// Without it GCC keeps the 16 accumulators of scores_block and pv_block in zmm16–31 across the
// loop and copies each to a zmm0–15 and back around its one VNNI update (30–40 moves and 2–3
// stack stores per iteration); with it each stays in one register. The same instructions
// otherwise: the same bits. int8 decode, GQA 4, D = 128, one thread, Skv 16384–32768: 10–16 %
// faster contiguous, 8–14 % paged (bench/results/kvcache_i8_2026-11-28.md).
inline void pin_reg(__m512i& x) { asm("" : "+v"(x)); }

template <bool kVnni>
struct DecodeOpsI8 {
  static constexpr bool kEnabled = true;
  static constexpr i64 kQBytes = kVnni ? 1 : 2;  // bytes per element of Q
  static constexpr i64 kSetFloats = kNt + 4 * kNt + kNt + 16;  // one set: vs, vp, kt, kst
  static i64 Dp64(const FlashArgs& a) { return round_up(a.D, 64); }
  static i64 scratch_floats(const FlashArgs& a) {
    return Dp64(a) + kDecRows * Dp64(a) * kQBytes / 4 + 2 * kDecRows + kDecRows * kNt / 2 + 2 * kSetFloats;
  }
  // The caller (decode_i8) takes this policy for K and V rows of unit element stride only.
  static bool takes_k(const FlashArgs& a) { return a.kv_i8; }
  static bool takes_v(const FlashArgs& a) { return a.kv_i8; }

  const FlashArgs& a;
  i64 dp64;
  i64 j_end_ = 0;  // of the tile scores() saw last: pv() prefetches the K rows up to it
  float *Qt, *qf;
  void* Q;
  std::int32_t* qc;
  std::int16_t* W16;
  // This tile's set (scores() and pv() read it) and the next tile's (pv() fills it and
  // prefetches its K rows; scores() takes it when the next tile is the one filled: (b, hk) and
  // keys [t0, j_hi) as recorded in nb_ …, nb_ = −1 when none is).
  float *vs, *vs2, *kst, *kst2;
  const std::int8_t **vp, **vp2, **kt, **kt2;
  i64 nb_ = -1, nhk_ = 0, nt0_ = 0, nhi_ = 0;
  bool v_ahead_ = false;  // pv() prefetched all of the next tile's V rows (pv_rows)
  DecodeOpsI8(const FlashArgs& args, float* mem) : a(args), dp64(Dp64(args)) {
    Qt = mem;
    Q = Qt + dp64;
    qf = Qt + dp64 + kDecRows * dp64 * kQBytes / 4;
    qc = reinterpret_cast<std::int32_t*>(qf + kDecRows);
    W16 = reinterpret_cast<std::int16_t*>(qf + 2 * kDecRows);
    vs = qf + 2 * kDecRows + kDecRows * kNt / 2;
    vp = reinterpret_cast<const std::int8_t**>(vs + kNt);
    kt = vp + kNt;
    kst = reinterpret_cast<float*>(kt + kNt);
    vs2 = vs + kSetFloats;
    vp2 = reinterpret_cast<const std::int8_t**>(vs2 + kNt);
    kt2 = vp2 + kNt;
    kst2 = reinterpret_cast<float*>(kt2 + kNt);
  }

  void load_q(int r, i64 off) {
    load_row(a, a.q, off, a.sq[3], a.D, 1.0f, Qt);
    alignas(64) std::int8_t q8[512];  // D ≤ 512 (flash_supports)
    qf[r] = quantise_q8(Qt, a.D, a.scale_log2, q8);
    std::int32_t sum = 0;
    for (i64 d = 0; d < a.D; ++d) sum += q8[d];
    qc[r] = 128 * sum;
    if constexpr (kVnni) {
      auto* row = static_cast<std::int8_t*>(Q) + r * dp64;
      std::memcpy(row, q8, static_cast<std::size_t>(a.D));
      std::memset(row + a.D, 0, static_cast<std::size_t>(dp64 - a.D));
    } else {
      auto* row = static_cast<std::int16_t*>(Q) + r * dp64;
      for (i64 d = 0; d < dp64; ++d) row[d] = d < a.D ? q8[d] : std::int16_t{0};
    }
  }

  // Ps[r0 + r][c0 + c] for R rows × C = 16/R keys c0 + c of the tile (kp: their rows), lane
  // l = r · C + c of the sums; qfl, qcl: each lane's row factor and correction, ksl its key scale.
  template <int R>
  void scores_block(int r0, int nr, const std::int8_t* const* kp, __m512 qfl, __m512i qcl, __m512 ksl, float* Ps,
                    i64 c0) const {
    constexpr int C = 16 / R;
    __m512i acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_si512();
    for (i64 d = 0; d < dp64; d += 64) {
      const i64 left = a.D - d;
      const __mmask64 dm = left >= 64 ? ~__mmask64{0} : (__mmask64{1} << left) - 1u;
      if constexpr (kVnni) {
        const __m512i off = _mm512_set1_epi8(static_cast<char>(0x80));
        __m512i ku[C];  // k8 + 128 as unsigned bytes (bytes past D: 128, against q8 = 0)
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) ku[c] = _mm512_xor_si512(_mm512_maskz_loadu_epi8(dm, kp[c] + d), off);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512i qv = _mm512_loadu_si512(static_cast<const std::int8_t*>(Q) + (r0 + r) * dp64 + d);
#pragma GCC unroll 16
          for (int c = 0; c < C; ++c) acc[r * C + c] = _mm512_dpbusd_epi32(acc[r * C + c], ku[c], qv);
        }
      } else {
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __mmask32 hm = static_cast<__mmask32>(dm >> (32 * h));
          __m512i kw[C];
#pragma GCC unroll 16
          for (int c = 0; c < C; ++c) kw[c] = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(hm, kp[c] + d + 32 * h));
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const __m512i qv = _mm512_loadu_si512(static_cast<const std::int16_t*>(Q) + (r0 + r) * dp64 + d + 32 * h);
#pragma GCC unroll 16
            for (int c = 0; c < C; ++c) acc[r * C + c] = _mm512_add_epi32(acc[r * C + c], _mm512_madd_epi16(qv, kw[c]));
          }
        }
      }
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) pin_reg(acc[i]);
    }
    const __m512i sum = _mm512_sub_epi32(reduce16_epi32(acc), qcl);
    alignas(64) float s[16];
    _mm512_store_ps(s, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(qfl, ksl)));
    for (int r = 0; r < R && r0 + r < nr; ++r) std::memcpy(Ps + (r0 + r) * kNt + c0, s + r * C, sizeof(float) * C);
  }
  // Rows [r0, r0 + R) against the tile's keys (kt, kst: their rows and scales by column).
  template <int R>
  void scores_rows(int r0, int nr, i64 c_lo, i64 c_hi, float* Ps) const {
    constexpr int C = 16 / R;
    alignas(64) float qf16[16];
    alignas(64) std::int32_t qc16[16], kidx[16];
    for (int l = 0; l < 16; ++l) {  // rows past nr (padding of the last group): Q zero, not stored
      const int r = r0 + l / C;
      qf16[l] = r < nr ? qf[r] : 0.0f, qc16[l] = r < nr && kVnni ? qc[r] : 0, kidx[l] = l % C;
    }
    for (int r = nr; r < r0 + R; ++r)
      std::memset(static_cast<char*>(Q) + r * dp64 * kQBytes, 0, static_cast<std::size_t>(dp64 * kQBytes));
    const __m512 qfl = _mm512_load_ps(qf16);
    const __m512i qcl = _mm512_load_si512(qc16), ki = _mm512_load_si512(kidx);
    for (i64 c0 = c_lo / C * C; c0 < c_hi; c0 += C)
      scores_block<R>(r0, nr, kt + c0, qfl, qcl, _mm512_permutexvar_ps(ki, _mm512_loadu_ps(kst + c0)), Ps, c0);
  }
  // out[x] ← p + x · step for x ∈ [0, n): eight pointers per store. GCC's own vectorisation of
  // this loop built its first vector lane by lane (≈ 20 instructions and an overlap test per
  // run) and paged by 16 rows pays that 4 times per tile where contiguous pays it once.
  static void row_ptrs(const std::int8_t** out, const std::int8_t* p, i64 step, i64 n) {
    const __m512i step8 = _mm512_set1_epi64(8 * step);
    __m512i v = _mm512_add_epi64(_mm512_set1_epi64(reinterpret_cast<long long>(p)),
                                 _mm512_mullo_epi64(_mm512_set1_epi64(step), _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)));
    i64 x = 0;
    for (; x + 8 <= n; x += 8, v = _mm512_add_epi64(v, step8)) _mm512_storeu_si512(out + x, v);
    if (x < n) _mm512_mask_storeu_epi64(out + x, static_cast<__mmask8>((1u << (n - x)) - 1u), v);
  }
  // Columns [c0, c1) of a tile at t0 into one set (ko, vo, kso, vso): ko[c], vo[c] the K and V rows
  // of key j = t0 + c, kso[c], vso[c] their scales; a key outside [j_lo, j_hi) gets j_lo's rows
  // and scales 0. By runs of evenly strided rows (kv_run_end: one block when paged), the block
  // table read once per run for the four tensors; the row pointers by row_ptrs, the scales by
  // scalar loads (a gather per 16 keys was no faster: kvcache_pg16_2026-11-28.md). int8 decode
  // paged by 16 rows, Skv 16384–32768: 0.95–0.98× the time, contiguous unchanged
  // (bench/results/kvcache_pg16b_2026-11-28.md).
  void tile_kv(i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, i64 c0, i64 c1, const std::int8_t** ko,
               const std::int8_t** vo, float* kso, float* vso) const {
    const auto* k = static_cast<const std::int8_t*>(a.k);
    const auto* v = static_cast<const std::int8_t*>(a.v);
    const std::int8_t *k_lo = k + kv_row(a, a.sk, b, hk, j_lo), *v_lo = v + kv_row(a, a.sv, b, hk, j_lo);
    for (i64 c = c0; c < c1;) {
      const i64 j = t0 + c;
      if (j < j_lo || j >= j_hi) {
        ko[c] = k_lo, vo[c] = v_lo, kso[c] = 0.0f, vso[c] = 0.0f;
        ++c;
        continue;
      }
      const i64 end = imin(imin(j_hi, kv_run_end(a, j)) - t0, c1);
      i64 blk, r;
      kv_pos(a, b, j, &blk, &r);
      const std::int8_t* kr = k + blk * a.sk[0] + hk * a.sk[1] + r * a.sk[2];
      const std::int8_t* vr = v + blk * a.sv[0] + hk * a.sv[1] + r * a.sv[2];
      const float* ks = a.k_scale + blk * a.sks[0] + hk * a.sks[1] + r * a.sks[2];
      const float* vsc = a.v_scale + blk * a.svs[0] + hk * a.svs[1] + r * a.svs[2];
      const i64 n = end - c, sks = a.sks[2], svs = a.svs[2];
      row_ptrs(ko + c, kr, a.sk[2], n), row_ptrs(vo + c, vr, a.sv[2], n);
      float* __restrict kd = kso + c;  // scratch: no overlap with the cache's scales
      float* __restrict vd = vso + c;
      for (i64 x = 0; x < n; ++x) kd[x] = ks[x * sks], vd[x] = vsc[x * svs];
      c = end;
    }
  }
  // Fetches the k_scale and v_scale entries of keys [j_lo, j_hi) (of the next tile: a tile ahead
  // of the scalar loads in tile_kv, with no stream for the hardware prefetcher to follow across
  // scattered blocks), by runs as tile_kv.
  void pf_scales(i64 b, i64 hk, i64 j_lo, i64 j_hi) const {
    for (i64 j = j_lo; j < j_hi;) {
      const i64 end = imin(j_hi, kv_run_end(a, j));
      i64 blk, r;
      kv_pos(a, b, j, &blk, &r);
      const float* ks = a.k_scale + blk * a.sks[0] + hk * a.sks[1] + r * a.sks[2];
      const float* vsc = a.v_scale + blk * a.svs[0] + hk * a.svs[1] + r * a.svs[2];
      const i64 n = end - j;
      for (i64 x = 0; x < n * a.sks[2]; x += 16) __builtin_prefetch(ks + x, 0, 2);
      __builtin_prefetch(ks + (n - 1) * a.sks[2], 0, 2);
      for (i64 x = 0; x < n * a.svs[2]; x += 16) __builtin_prefetch(vsc + x, 0, 2);
      __builtin_prefetch(vsc + (n - 1) * a.svs[2], 0, 2);
      j = end;
    }
  }
  void scores(int nr, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, i64 j_end, float* Ps) {
    j_end_ = j_end;
    // The tile's K and V rows and scales by column c = j − t0 (pv() takes the V ones), over the
    // 16-column blocks the scores and the key pairs of P·V touch: the set the previous tile's
    // pv() filled when this is the tile it filled (the same rows and scales: the same bits),
    // else gathered here.
    const i64 c_lo = j_lo - t0, c_hi = j_hi - t0, c0 = c_lo / 16 * 16, c1 = round_up(c_hi, 16);
    const bool filled = b == nb_ && hk == nhk_ && t0 == nt0_ && j_lo == t0 && j_hi == nhi_;
    if (filled)
      std::swap(vs, vs2), std::swap(vp, vp2), std::swap(kt, kt2), std::swap(kst, kst2);
    else
      tile_kv(b, hk, t0, j_lo, j_hi, c0, c1, kt, vp, kst, vs);
    nb_ = -1;
    if (t0 + kNt < j_end) pf_scales(b, hk, t0 + kNt, imin(t0 + 2 * kNt, j_end));
    // V rows, read next by pv(), unless the previous tile's pv() fetched them already.
    if (!(filled && v_ahead_))
      for (i64 c = c_lo; c < c_hi; ++c) pf_row(vp[c], a.Dv);
    for (int r0 = 0; r0 < nr; r0 += 4) {
      const int left = nr - r0;
      if (left >= 3) scores_rows<4>(r0, nr, c_lo, c_hi, Ps);
      else if (left == 2) scores_rows<2>(r0, nr, c_lo, c_hi, Ps);
      else scores_rows<1>(r0, nr, c_lo, c_hi, Ps);
    }
  }

  // W16 row r, columns [0, kNt) ← decode_i8.hpp's round_weights of Ps row r times vs over the
  // tile's keys [c_lo, c_hi), 0 elsewhere; returns the step. The same products, maximum and
  // roundings (vcvtps2dq rounds to nearest even, as nearbyint) by vectors.
  float round_row(const float* p, i64 c_lo, i64 c_hi, std::int16_t* w16) const {
    __m512 w[kNt / 16];
    __m512 mx = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int x = 0; x < kNt / 16; ++x) {
      const i64 lo = c_lo - 16 * x, hi = c_hi - 16 * x;
      const std::uint32_t m_hi = hi >= 16 ? 0xffffu : hi <= 0 ? 0u : (1u << hi) - 1u;
      const std::uint32_t m_lo = lo <= 0 ? 0xffffu : lo >= 16 ? 0u : 0xffffu & ~((1u << lo) - 1u);
      const __mmask16 m = static_cast<__mmask16>(m_hi & m_lo);
      w[x] = _mm512_maskz_mul_ps(m, _mm512_loadu_ps(p + 16 * x), _mm512_loadu_ps(vs + 16 * x));
      mx = _mm512_max_ps(mx, w[x]);
    }
    const float wmax = _mm512_reduce_max_ps(mx);
    const __m512 inv = _mm512_set1_ps(wmax > 0.0f ? kW16Max / wmax : 0.0f);
#pragma GCC unroll 4
    for (int x = 0; x < kNt / 16; ++x) {
      const __m512 v = _mm512_mul_ps(w[x], inv);
      const __mmask16 ok = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_GE_OQ);  // NaN → 0
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(w16 + 16 * x), _mm512_cvtepi32_epi16(_mm512_maskz_cvtps_epi32(ok, v)));
    }
    return wmax / kW16Max;
  }

  // acc += pairs · w (16 int32 lanes of two int16 products each).
  static __m512i dp16(__m512i acc, __m512i pairs, __m512i w) {
    if constexpr (kVnni) return _mm512_dpwssd_epi32(acc, pairs, w);
    else return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, w));
  }

  // Od rows [r0, r0 + R), columns [e0, e0 + 64·NB) ∩ [0, Dvp) += step_r · Σ_j W16[r][j] v_j over the
  // key pairs [c_lo, c_hi) (even c_lo; vp[c] the V rows, W16 0 for keys outside the tile's range).
  // Block x of 64 columns: for a pair, lo = the bytes of its two rows interleaved from columns
  // 16L + [0, 8) of each 128-bit lane L, hi from 16L + [8, 16); their four int16-pair halves
  // X0 = lo[0, 32), X1 = lo[32, 64), X2 = hi[0, 32), X3 = hi[32, 64) hold columns
  // {0–7, 16–23}, {32–39, 48–55}, {8–15, 24–31}, {40–47, 56–63} of the block.
  // With pf: each pair also prefetches the K rows of keys kNt further on (kt2), below pf_end; with
  // pf_v, their V rows (vp2).
  template <int R, int NB>
  void pv_block(int r0, i64 t0, i64 c_lo, i64 c_hi, const float* step, float* Od, i64 Dvp, i64 e0,
                bool pf, bool pf_v, i64 pf_end) const {
    __m512i acc[R][NB][4];
    __mmask64 cm[NB];
#pragma GCC unroll 2
    for (int x = 0; x < NB; ++x) {
      const i64 left = a.Dv - e0 - 64 * x;
      cm[x] = left >= 64 ? ~__mmask64{0} : left <= 0 ? 0 : (__mmask64{1} << left) - 1u;
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int y = 0; y < 4; ++y) acc[r][x][y] = _mm512_setzero_si512();
    }
    for (i64 c = c_lo; c < c_hi; c += 2) {
      if (pf)
        for (i64 n = c; n < imin(c + 2, pf_end - t0 - kNt); ++n) pf_row(kt2[n], a.D);
      if (pf_v)
        for (i64 n = c; n < imin(c + 2, pf_end - t0 - kNt); ++n) pf_row(vp2[n], a.Dv);
      __m512i xs[NB][4];
#pragma GCC unroll 2
      for (int x = 0; x < NB; ++x) {
        const __m512i v0 = _mm512_maskz_loadu_epi8(cm[x], vp[c] + e0 + 64 * x);
        const __m512i v1 = _mm512_maskz_loadu_epi8(cm[x], vp[c + 1] + e0 + 64 * x);
        const __m512i lo = _mm512_unpacklo_epi8(v0, v1), hi = _mm512_unpackhi_epi8(v0, v1);
        xs[x][0] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(lo));
        xs[x][1] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(lo, 1));
        xs[x][2] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(hi));
        xs[x][3] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(hi, 1));
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        std::int32_t pair;
        std::memcpy(&pair, W16 + (r0 + r) * kNt + c, sizeof pair);
        const __m512i w = _mm512_set1_epi32(pair);
#pragma GCC unroll 2
        for (int x = 0; x < NB; ++x)
#pragma GCC unroll 4
          for (int y = 0; y < 4; ++y) acc[r][x][y] = dp16(acc[r][x][y], xs[x][y], w);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int x = 0; x < NB; ++x)
#pragma GCC unroll 4
          for (int y = 0; y < 4; ++y) pin_reg(acc[r][x][y]);
    }
    // Back in column order: block columns [0, 16) = X0[0, 8) X2[0, 8), [16, 32) = X0[8, 16) X2[8, 16),
    // [32, 48) = X1[0, 8) X3[0, 8), [48, 64) = X1[8, 16) X3[8, 16).
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 sv = _mm512_set1_ps(step[r]);
#pragma GCC unroll 2
      for (int x = 0; x < NB; ++x) {
        const __m512i* A = acc[r][x];
        const __m512i n[4] = {_mm512_shuffle_i32x4(A[0], A[2], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_i32x4(A[0], A[2], _MM_SHUFFLE(3, 2, 3, 2)),
                              _mm512_shuffle_i32x4(A[1], A[3], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_i32x4(A[1], A[3], _MM_SHUFFLE(3, 2, 3, 2))};
#pragma GCC unroll 4
        for (int y = 0; y < 4; ++y) {
          const i64 e = e0 + 64 * x + 16 * y;
          if (e >= Dvp) break;
          float* o = Od + (r0 + r) * Dvp + e;
          _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(n[y]), sv, _mm512_loadu_ps(o)));
        }
      }
    }
  }
  // All Dvp columns of rows [r0, r0 + R): 64-column blocks, 2 per pass for R ≤ 2 (16 accumulators).
  // With pf, the first pass prefetches the next tile's K rows and the second (when there is one:
  // R > 2 or Dv > 128) its V rows, a tile ahead of their use instead of just before it (scores()):
  // int8 decode at Skv 16384–32768 (GQA 4, D = 128, one thread): 0.92–0.98× the time, contiguous
  // and paged by 16 rows (bench/results/kvcache_pi8_2026-11-28.md). Returns whether the V rows
  // were fetched.
  template <int R>
  bool pv_rows(int r0, i64 t0, i64 c_lo, i64 c_hi, const float* step, float* Od, i64 Dvp, bool pf,
               i64 pf_end) const {
    constexpr int NB = R <= 2 ? 2 : 1;
    i64 e0 = 0;
    int pass = 0;
    for (; e0 + 64 * NB <= Dvp; e0 += 64 * NB, ++pass)
      pv_block<R, NB>(r0, t0, c_lo, c_hi, step, Od, Dvp, e0, pf && pass == 0, pf && pass == 1, pf_end);
    for (; e0 < Dvp; e0 += 64, ++pass)
      pv_block<R, 1>(r0, t0, c_lo, c_hi, step, Od, Dvp, e0, pf && pass == 0, pf && pass == 1, pf_end);
    return pf && pass > 1;
  }
  void pv(int nr, const float* Ps, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp) {
    // Key pairs [c_lo, c_hi) of the tile: a key outside [j_lo, j_hi) in a pair reads j_lo's row
    // with weight 0.
    // (vp, vs: set by scores() for this tile.)
    const i64 c_lo = (j_lo - t0) & ~i64{1}, c_hi = (j_hi - t0 + 1) & ~i64{1};
    // The next tile's set, keys [t0 + kNt, j_end_) as far as a tile goes, gathered before P·V
    // (whose pv_block prefetches its K rows from kt2): its scale loads, scattered when paged, wait
    // for memory while P·V computes rather than at the next tile's start. A next tile that starts
    // elsewhere (a gap of keep_first and a window) is gathered by scores() instead.
    if (const i64 nt0 = t0 + kNt; nt0 < j_end_) {
      nb_ = b, nhk_ = hk, nt0_ = nt0, nhi_ = imin(nt0 + kNt, j_end_);
      tile_kv(b, hk, nt0, nt0, nhi_, 0, round_up(nhi_ - nt0, 16), kt2, vp2, kst2, vs2);
    }
    float step[kDecRows];
    for (int r = 0; r < nr; ++r) step[r] = round_row(Ps + r * kNt, j_lo - t0, j_hi - t0, W16 + r * kNt);
    bool v_fetched = false;
    for (int r0 = 0; r0 < nr; r0 += 4) {
      const int left = nr - r0;
      const bool f = r0 == 0;
      bool v;
      if (left >= 4) v = pv_rows<4>(r0, t0, c_lo, c_hi, step + r0, Od, Dvp, f, j_end_);
      else if (left == 3) v = pv_rows<3>(r0, t0, c_lo, c_hi, step + r0, Od, Dvp, f, j_end_);
      else if (left == 2) v = pv_rows<2>(r0, t0, c_lo, c_hi, step + r0, Od, Dvp, f, j_end_);
      else v = pv_rows<1>(r0, t0, c_lo, c_hi, step + r0, Od, Dvp, f, j_end_);
      v_fetched = v_fetched || v;
    }
    // The prefetch covered the next tile's keys below pf_end paired with this tile's [c_lo, c_hi):
    // all of them when this tile's pairs span the whole next tile.
    v_ahead_ = nb_ >= 0 && v_fetched && c_lo == 0 && c_hi >= nhi_ - nt0_;
  }
};

// Decode on an int8 cache: this policy when K's and V's rows have unit element stride, else the
// oracle's (which reads any strides).
template <class S, bool kVnni>
void decode_i8(const FlashArgs& a) {
  if (a.sk[3] == 1 && a.sv[3] == 1) decode<S, DecodeOpsI8<kVnni>>(a);
  else decode<S, DecodeOpsI8Ref>(a);
}

}  // namespace
}  // namespace qkv::kernels::cpu
