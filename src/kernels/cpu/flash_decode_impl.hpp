// The fast decode kernel's body (flash_tile.hpp has the pieces and the dimension legend); each ISA
// translation unit instantiates decode<S, Ops>.
//
// flash_decode — keys cut into fixed chunks of kSplit; one work item per (b, chunk, group of
//   ≤ kDecRows query rows of each kv head, run of ≤ kDecHeads kv heads), computing partial
//   (O, m, l) of every (kv head, row); a second pass merges the chunks of each row by logsumexp.
//   For few queries this keeps every core busy and reads each key once for all the query heads
//   that share it (GQA). An item walks its chunk tile by tile and, within a tile, kv head by kv
//   head: a cache row [.., Skv, Hkv, D] (a paged block [Sc, Hkv, D]) holds every head's key j
//   side by side, so the tile's rows of all heads are read together, one pass over memory,
//   rather than one strided pass per head, each fetching the other heads' bytes alongside and
//   losing them before their item comes (see pf_all below). f16 caches, and int8 ones unless
//   paged, keep runs of one head (see NH). Each (kv head, row)'s arithmetic is the same whatever
//   the run of heads: the run only orders the work.
// Deterministic: a row's result depends only on the shape, never on the thread count.
#pragma once

#include <optional>

#include "kernels/cpu/flash_tile.hpp"

namespace qkv::kernels::cpu {
namespace {

// Scores of query rows q[r] (padded to Dp, zeros beyond D) against one key row k[0, Dp).
template <class S>
inline float dot(const float* q, const float* k, i64 Dp) {
  constexpr int L = S::L;
  auto acc = S::zero();
  for (i64 d = 0; d < Dp; d += L) acc = S::fmadd(S::loadu(q + d), S::loadu(k + d), acc);
  return S::hsum(acc);
}

// The same for two query rows against one key row: the key is loaded once for both.
template <class S>
inline void dot2(const float* q0, const float* q1, const float* k, i64 Dp, float* s0, float* s1) {
  constexpr int L = S::L;
  auto a0 = S::zero(), a1 = S::zero();
  for (i64 d = 0; d < Dp; d += L) {
    const auto kv = S::loadu(k + d);
    a0 = S::fmadd(S::loadu(q0 + d), kv, a0);
    a1 = S::fmadd(S::loadu(q1 + d), kv, a1);
  }
  *s0 = S::hsum(a0);
  *s1 = S::hsum(a1);
}

// Decode P·V of R query rows: o[r][e0, e0 + NV·L) += Σ_{c ∈ [c_lo, c_hi)} p[r][c] · v[c][…], the
// R × NV accumulators in registers across the tile's keys (each V vector loaded once for R rows).
//   p [R][kNt]    v rows c at v + c·ldv    o [R][Dvp]
// With pf: for each key c with c − c_lo < pf_n, the row of pf_bytes at pf + (c − c_lo)·pf_ld is
// prefetched (pf_row).
template <class S, int R, int NV>
inline void dec_pv_block(const float* p, const float* v, i64 ldv, i64 c_lo, i64 c_hi, float* o, i64 Dvp, i64 e0,
                         const char* pf = nullptr, i64 pf_ld = 0, i64 pf_n = 0, i64 pf_bytes = 0) {
  constexpr int L = S::L;
  typename S::V acc[R][NV];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int x = 0; x < NV; ++x) acc[r][x] = S::loadu(o + r * Dvp + e0 + x * L);
  for (i64 c = c_lo; c < c_hi; ++c) {
    if (pf && c - c_lo < pf_n) pf_row(pf + (c - c_lo) * pf_ld, pf_bytes);
    typename S::V vv[NV];
#pragma GCC unroll 8
    for (int x = 0; x < NV; ++x) vv[x] = S::loadu(v + c * ldv + e0 + x * L);
#pragma GCC unroll 2
    for (int r = 0; r < R; ++r) {
      const auto pb = S::set1(p[r * kNt + c]);
#pragma GCC unroll 8
      for (int x = 0; x < NV; ++x) acc[r][x] = S::fmadd(pb, vv[x], acc[r][x]);
    }
  }
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int x = 0; x < NV; ++x) S::storeu(o + r * Dvp + e0 + x * L, acc[r][x]);
}

// All Dvp columns, prefetching (pf, see dec_pv_block) in the first pass only. AVX-512 takes 8
// vectors (128 columns: a whole V row for Dv = 128) per pass, so the V tile is read once front to
// back as one stream instead of twice by halves (with 2 rows: 16 + 8 of the 32 zmm); AVX2 (16 ymm)
// takes 4. Either way each column's sum runs over the keys in the same order: the same bits.
// The prefetch lifts long-context decode from ≈ 67 % to ≈ 84 % of the read bandwidth.
template <class S, int R>
inline void dec_pv(const float* p, const float* v, i64 ldv, i64 c_lo, i64 c_hi, float* o, i64 Dvp,
                   const char* pf = nullptr, i64 pf_ld = 0, i64 pf_n = 0, i64 pf_bytes = 0) {
  constexpr int L = S::L;
  i64 e0 = 0;
  if constexpr (S::L >= 16) {
    for (; e0 + 8 * L <= Dvp; e0 += 8 * L) {
      dec_pv_block<S, R, 8>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_n, pf_bytes);
      pf = nullptr;
    }
  }
  for (; e0 + 4 * L <= Dvp; e0 += 4 * L) {
    dec_pv_block<S, R, 4>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_n, pf_bytes);
    pf = nullptr;
  }
  for (; e0 < Dvp; e0 += L) {
    dec_pv_block<S, R, 1>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_n, pf_bytes);
    pf = nullptr;
  }
}

// The tile operations of decode for f32: none, decode() computes scores and P·V itself
// (flash_avx512bf16.cpp supplies a policy for bf16 K and V read in place). A policy offers:
//   scratch_floats(a)   its per-thread scratch; takes_k(a) / takes_v(a): whether it computes the
//                       scores (from K) / the P·V (from V) of this call
//   load_q(r, off)      query row r of the item from q + off
//   scores(nr, b, hk, t0, j_lo, j_hi, j_end, Ps)  Ps[r][j − t0] ← q_r·k_j · scale · log2 e
//                       for keys j ∈ [j_lo, j_hi) of the tile at t0 of batch row b, kv head hk,
//                       rows [0, nr); the other columns finite. Keys [j_hi, j_end) come next in
//                       this item (prefetching). Rows are found by kv_row (paged or not).
//   pv(nr, Ps, b, hk, t0, j_lo, j_hi, Od, Dvp)  Od[r][0, Dvp) += Σ_{j ∈ [j_lo, j_hi)} Ps[r][j − t0] v_j
struct DecodeOpsF32 {
  static constexpr bool kEnabled = false;
  static i64 scratch_floats(const FlashArgs&) { return 0; }
  static bool takes_k(const FlashArgs&) { return false; }
  static bool takes_v(const FlashArgs&) { return false; }
  DecodeOpsF32(const FlashArgs&, float*) {}
  void load_q(int, i64) {}
  void scores(int, i64, i64, i64, i64, i64, i64, float*) const {}
  void pv(int, const float*, i64, i64, i64, i64, i64, float*, i64) {}
};

template <class S, class Ops = DecodeOpsF32>
void decode(const FlashArgs& a) {
  constexpr int L = S::L;
  const i64 G = a.H / a.Hkv;
  const i64 D = a.D, Dv = a.Dv;
  const i64 Dp = round_up(D, L), Dvp = round_up(Dv, L);
  const i64 GS = G * a.Sq;                            // query rows per (b, kv head): (h in group, i)
  const i64 ngroups = (GS + kDecRows - 1) / kDecRows;
  // Chunk length: kSplit keys, lengthened if the partial results would pass 256 MiB.
  const i64 rows_total = a.B * a.Hkv * GS;
  i64 split = kSplit;
  // The bf16 policy reads chunks of up to 4 · kSplit keys while the call keeps ≥ 32 items: fewer
  // item starts (query loads, a cold first tile, partial results). A constant, not the thread
  // count, so the results stay the same bits on any number of threads (15–25 % on bf16 GQA
  // decode; f32 slowed by 3–5 %, so its chunks stay kSplit).
  if (Ops::kEnabled && Ops::takes_k(a))
    while (split < 4 * kSplit && a.B * a.Hkv * ngroups * ((a.Skv + 2 * split - 1) / (2 * split)) >= 32) split *= 2;
  while (rows_total * ((a.Skv + split - 1) / split) * (Dvp + 2) * 4 > (i64{256} << 20)) split *= 2;
  const i64 nsplit = a.Skv > 0 ? (a.Skv + split - 1) / split : 1;
  const i64 esz = a.kv_i8 ? 1 : a.bf16 || a.kv_f16 ? 2 : 4;  // bytes per K/V element
  // kv heads per item: up to kDecHeads, halved while there would be fewer than 4 items per thread
  // (no result depends on it). Heads together pay when K and V come from memory: a cache of less
  // than kDecStreamBytes (half a 32 MiB L3) keeps one head per item (at Skv 2048, 4 MiB of bf16,
  // the heads together were 9–17 % slower: prefetches of rows already in cache). f16 caches keep
  // one head per item: their kernel converts every row and ran 11–20 % slower with the heads of a
  // tile together on Zen 4 (bench/results/kvcache_paged_2026-11-28.md). int8 caches take runs of
  // heads only when paged and of ≥ 2 · kDecStreamBytes (the whole L3): one head's 128-byte rows of
  // scattered blocks wait on memory where the heads' whole rows, one run per block, do not (paged
  // by 16 rows, Skv 32768, 32 MiB: 0.86× the time), while contiguous int8 at Skv 32768 ran 6–22 %
  // slower with the heads together and paged at 16 MiB 4–10 % (bench/results/kvcache_pi8_2026-11-28.md).
  constexpr i64 kDecStreamBytes = i64{16} << 20;
  const i64 kv_bytes = a.B * a.Skv * a.Hkv * (D + Dv) * esz;
  const bool heads = a.kv_i8 ? a.block_table && kv_bytes >= 2 * kDecStreamBytes : !a.kv_f16 && kv_bytes >= kDecStreamBytes;
  i64 NH = heads ? imin(a.Hkv, kDecHeads) : 1;
  while (NH > 1 && a.B * ((a.Hkv + NH - 1) / NH) * ngroups * nsplit < 4 * a.threads) NH = (NH + 1) / 2;
  const i64 nhr = (a.Hkv + NH - 1) / NH;  // runs of kv heads
  const i64 items = a.B * nhr * ngroups * nsplit;
  const bool k_in_place = !a.bf16 && !a.kv_i8 && !a.kv_f16 && a.sk[3] == 1 && D % L == 0;
  const bool ops_k = Ops::kEnabled && Ops::takes_k(a);  // scores by the policy
  const bool ops_v = Ops::kEnabled && Ops::takes_v(a);  // P·V by the policy
  const bool v_in_place = !a.bf16 && !a.kv_i8 && !a.kv_f16 && a.sv[3] == 1 && Dv % L == 0;
  // Software prefetch of the K and V streams (pf_row) where rows are contiguous and this code
  // reads both: it lifts long-context decode from ≈ 70 % to 85–100 % of the read bandwidth.
  const bool prefetch = !ops_k && !ops_v && a.sk[3] == 1 && a.sv[3] == 1;

  // Partial results, indexed by (row = (b·Hkv + hk)·GS + r, chunk):
  //   Op [rows][nsplit][Dvp] unnormalised accumulators, Mp / Lp [rows][nsplit] max and sum.
  Scratch part_o(rows_total * nsplit * Dvp * 4), part_m(rows_total * nsplit * 4), part_l(rows_total * nsplit * 4);
  float* Op = part_o.f();
  float* Mp = part_m.f();
  float* Lp = part_l.f();

  // Per-thread scratch, row x = h · kDecRows + r for row r of the item's kv head h ∈ [0, NH):
  // Qd [NH · kDecRows][Dp] scaled queries, Od [NH · kDecRows][Dvp] accumulators, Kr [Dp] one key
  // row as f32 when not read in place, Vs [kNt][Dvp] the V tile as f32 when not read in place,
  // Ps [kDecRows][kNt] (one head's tile at a time). Then NH policies' own scratch
  // (Ops::scratch_floats, each rounded to 64 bytes), one policy per kv head of the item.
  // One block of the pool for all threads, thread t at t · arena.
  const i64 ops_floats = round_up(Ops::scratch_floats(a), 16);
  const i64 arena =
      per_thread_floats(NH * kDecRows * (Dp + Dvp) + Dp + kNt * Dvp + kDecRows * kNt + NH * ops_floats);
  Scratch mem(a.threads * arena * 4);
  // Items one at a time from next_item (a dynamic schedule); thread t works in arena t.
  std::atomic<i64> next_item{0};
  run_shared(items > 1 ? a.threads : 1, [&](int t) {
    float* Qd_all = mem.f() + t * arena;
    float* Od_all = Qd_all + NH * kDecRows * Dp;
    float* Kr = Od_all + NH * kDecRows * Dvp;
    float* Vs = Kr + Dp;
    float* Ps = Vs + kNt * Dvp;
    std::optional<Ops> ops_all[kDecHeads];
    for (i64 h = 0; h < NH; ++h) ops_all[h].emplace(a, Ps + kDecRows * kNt + h * ops_floats);
    for (i64 d = D; d < Dp; ++d) Kr[d] = 0.0f;
    // By row x = h · kDecRows + r: keys [0, ke) ∪ [lo, hi) (key_range), query head and index.
    i64 ke_all[kDecHeads * kDecRows], lo_all[kDecHeads * kDecRows], hi_all[kDecHeads * kDecRows];
    i64 hs_all[kDecHeads * kDecRows], is_all[kDecHeads * kDecRows];
    std::uint64_t dkey_all[kDecHeads * kDecRows];  // dropout_row_key of each row, when a.dropout
    float Md_all[kDecHeads * kDecRows], Ld_all[kDecHeads * kDecRows * L];  // Ld: lane-wise running sums (softmax_row)

    for (i64 item; (item = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const i64 hr = item % nhr, g = (item / nhr) % ngroups, sp = (item / (nhr * ngroups)) % nsplit;
      const i64 b = item / (nhr * ngroups * nsplit);
      const i64 hk0 = hr * NH, nh = imin(NH, a.Hkv - hk0);  // kv heads [hk0, hk0 + nh)
      const i64 k0 = sp * split, k1 = imin(a.Skv, k0 + split);
      const int nr = static_cast<int>(imin(kDecRows, GS - g * kDecRows));
      const i64 klen = a.key_len[b];
      KeySpan span(k0, k1);  // the rows' keys in this chunk
      for (i64 h = 0; h < nh; ++h)
        for (int r = 0; r < nr; ++r) {
          const i64 gr = g * kDecRows + r, x = h * kDecRows + r;
          hs_all[x] = (hk0 + h) * G + gr / a.Sq, is_all[x] = gr % a.Sq;
          if (a.dropout)
            dkey_all[x] = dropout_row_key(a.dropout_seed, a.dropout_offset, a.dropout_b0 + b, hs_all[x], is_all[x]);
          key_range(a, is_all[x], klen, &ke_all[x], &lo_all[x], &hi_all[x]);
          span.add(ke_all[x], lo_all[x], hi_all[x]);
          const i64 qoff = b * a.sq[0] + hs_all[x] * a.sq[1] + is_all[x] * a.sq[2];
          if (ops_k) ops_all[h]->load_q(r, qoff);
          else load_row(a, a.q, qoff, a.sq[3], D, a.scale_log2, Qd_all + x * Dp);
          for (i64 d = D; d < Dp; ++d) Qd_all[x * Dp + d] = 0.0f;
          std::memset(Od_all + x * Dvp, 0, sizeof(float) * static_cast<std::size_t>(Dvp));
          Md_all[x] = kNegInf;
          S::storeu(Ld_all + x * L, S::zero());
        }
      // One tile of kv head hk0 + h: the keys [j_lo, j_hi) of the tile at t0 for its rows.
      auto tile = [&](i64 h, i64 t0, i64 j_lo, i64 j_hi) {
        const i64 hk = hk0 + h, x0 = h * kDecRows;
        Ops& ops = *ops_all[h];
        float *Qd = Qd_all + x0 * Dp, *Od = Od_all + x0 * Dvp, *Md = Md_all + x0, *Ld = Ld_all + x0 * L;
        const i64 *ke = ke_all + x0, *lo = lo_all + x0, *hi = hi_all + x0, *hs = hs_all + x0, *is = is_all + x0;
        const std::uint64_t* dkey = dkey_all + x0;
        if (ops_k) ops.scores(nr, b, hk, t0, j_lo, j_hi, span.hi, Ps);
        // Keys by runs of evenly strided rows (one block when paged): the table read once per run.
        for (i64 j = ops_k ? j_hi : j_lo, run = j, koff = 0, voff = 0; j < j_hi; ++j, koff += a.sk[2], voff += a.sv[2]) {
          if (j == run) koff = kv_row(a, a.sk, b, hk, j), voff = kv_row(a, a.sv, b, hk, j), run = kv_run_end(a, j);
          if (prefetch) pf_row(static_cast<const char*>(a.v) + esz * voff, esz * Dv);
          const float* kp;
          if (k_in_place) {
            kp = static_cast<const float*>(a.k) + koff;
          } else {
            if (a.kv_f16) widen_f16_row<S>(static_cast<const std::uint16_t*>(a.k) + koff, a.sk[3], D, Kr);
            else if (a.bf16 && a.sk[3] == 1) widen_row<S>(static_cast<const std::uint16_t*>(a.k) + koff, D, Kr);
            else load_row(a, a.k, koff, a.sk[3], D, 1.0f, Kr);
            kp = Kr;
          }
          int r = 0;
          for (; r + 2 <= nr; r += 2)
            dot2<S>(Qd + r * Dp, Qd + (r + 1) * Dp, kp, Dp, &Ps[r * kNt + (j - t0)], &Ps[(r + 1) * kNt + (j - t0)]);
          if (r < nr) Ps[r * kNt + (j - t0)] = dot<S>(Qd + r * Dp, kp, Dp);
        }
        for (int r = 0; r < nr; ++r) {
          // The chunk bounds cut like the rule does: keys outside [k0, k1) are not this item's.
          // Kept keys [0, rke) in mask_row's form: a tile with kept keys starts at j_lo = t0 ≥ k0
          // (t0 < span.ke above; chunks start at multiples of kNt), so every kept column was computed.
          const i64 rlo = imax(lo[r], imax(k0, j_lo)), rhi = imin(hi[r], imin(k1, j_hi));
          const i64 rke = imin(ke[r], imin(k1, j_hi));
          const i64 moff = b * a.smask[0] + hs[r] * a.smask[1] + is[r] * a.smask[2];
          if (a.softcap_log2 > 0.0f || a.alibi)
            mask_mod_row<S>(a, Ps + r * kNt, t0, rke, rlo, imax(rhi, rlo), moff, row_diag(a, is[r], klen),
                            a.alibi ? static_cast<float>(a.alibi[b * a.alibi_sb + hs[r]] * kLog2e) : 0.0f, 0, kNt);
          else
            mask_row(a, Ps + r * kNt, t0, rke, rlo, imax(rhi, rlo), moff, 0, kNt);
          softmax_row<S>(Ps + r * kNt, &Md[r], Ld + r * L, Od + r * Dvp, Dvp);
          if (a.dropout) dropout_tile_row(a, dkey[r], Ps + r * kNt, t0, j_lo - t0, j_hi - t0);
        }
        if (ops_v) {
          ops.pv(nr, Ps, b, hk, t0, j_lo, j_hi, Od, Dvp);
          return;
        }
        // While P·V reads this tile's V rows: the next tile's K rows, those this item scores. Paged,
        // P·V runs block by block (below) and each run [s_lo, s_hi) fetches the next tile's keys
        // [s_lo, s_hi) + kNt, which lie in one block too (block sizes are powers of two, kNt is
        // 64): fetching only the rows evenly strided from the next tile's first left 16-row blocks
        // 29 % slower than contiguous.
        const i64 pf_ld = esz * a.sk[2], pf_bytes = esz * D;
        // P·V over keys [c_lo, c_hi) of probabilities P (rows r at P + r·kNt) whose V rows are f32
        // rows c of vt, column c_lo being key j_first; the first pass prefetches the K rows of the
        // keys kNt further on (evenly strided: one block when paged), those below span.hi.
        auto pv = [&](const float* P, const float* vt, i64 ldv, i64 c_lo, i64 c_hi, i64 j_first) {
          const i64 n_lo = j_first + kNt, n_hi = prefetch ? imin(n_lo + c_hi - c_lo, span.hi) : n_lo;
          const char* pf = n_hi > n_lo ? static_cast<const char*>(a.k) + esz * kv_row(a, a.sk, b, hk, n_lo) : nullptr;
          const i64 pf_n = n_hi - n_lo;
          int r = 0;
          for (; r + 2 <= nr; r += 2) {
            dec_pv<S, 2>(P + r * kNt, vt, ldv, c_lo, c_hi, Od + r * Dvp, Dvp, pf, pf_ld, pf_n, pf_bytes);
            pf = nullptr;
          }
          if (r < nr) dec_pv<S, 1>(P + r * kNt, vt, ldv, c_lo, c_hi, Od + r * Dvp, Dvp, pf, pf_ld, pf_n, pf_bytes);
        };
        if (v_in_place && !a.block_table) {
          pv(Ps, static_cast<const float*>(a.v) + kv_row(a, a.sv, b, hk, t0), a.sv[2], j_lo - t0, j_hi - t0, j_lo);
          return;
        }
        if (v_in_place) {
          // Paged, in place: one block's run of keys [s_lo, s_hi) at a time, P and V both taken
          // from the run's first key.
          for (i64 s_lo = j_lo; s_lo < j_hi;) {
            const i64 s_hi = imin(j_hi, kv_run_end(a, s_lo));
            pv(Ps + (s_lo - t0), static_cast<const float*>(a.v) + kv_row(a, a.sv, b, hk, s_lo), a.sv[2], 0, s_hi - s_lo, s_lo);
            s_lo = s_hi;
          }
          return;
        }
        // Otherwise the tile's V rows [j_lo, j_hi) converted into rows c = j − t0 of Vs (by runs, as the keys).
        for (i64 j = j_lo, run = j, voff = 0; j < j_hi; ++j, voff += a.sv[2]) {
          float* row = Vs + (j - t0) * Dvp;
          if (j == run) voff = kv_row(a, a.sv, b, hk, j), run = kv_run_end(a, j);
          if (a.kv_f16) {
            widen_f16_row<S>(static_cast<const std::uint16_t*>(a.v) + voff, a.sv[3], Dv, row);
            for (i64 e = Dv; e < Dvp; ++e) row[e] = 0.0f;
          } else if (a.bf16 && a.sv[3] == 1) {
            widen_row<S>(static_cast<const std::uint16_t*>(a.v) + voff, Dv, row);
          } else {
            load_row(a, a.v, voff, a.sv[3], Dv, 1.0f, row);
            for (i64 e = Dv; e < Dvp; ++e) row[e] = 0.0f;
          }
        }
        // By runs of one block when paged, each prefetching the matching keys of the next tile.
        for (i64 s_lo = j_lo; s_lo < j_hi;) {
          const i64 s_hi = a.block_table ? imin(j_hi, kv_run_end(a, s_lo)) : j_hi;
          pv(Ps, Vs, Dvp, s_lo - t0, s_hi - t0, s_lo);
          s_lo = s_hi;
        }
      };
      // With the item's heads side by side in each row (K [.., Hkv, D], V [.., Hkv, Dv]), the next
      // tile's rows of all of them, nh · D and nh · Dv elements from head hk0's, are prefetched
      // while this tile is computed, a share of the keys before each head's turn: one contiguous
      // run per row (with all Hkv heads, one run per paged block) rather than nh strided streams.
      // f32 and bf16 decode at Skv 16384–32768 (GQA 4, one thread): 15–21 % faster, contiguous
      // and paged; the heads together without this prefetch gained 0–13 %.
      const bool pf_all = nh > 1 && a.sk[3] == 1 && a.sv[3] == 1 && a.sk[1] == D && a.sv[1] == Dv;
      for (i64 t0 = span.first_tile(); t0 < span.hi; t0 += kNt) {
        if (span.skips(t0)) continue;  // between kept keys and every row's window
        const i64 n_lo = t0 + kNt, n_hi = imin(t0 + 2 * kNt, span.hi);  // the next tile's keys
        for (i64 h = 0; h < nh; ++h) {
          if (pf_all && n_lo < n_hi) {
            const i64 per = (n_hi - n_lo + nh - 1) / nh;
            for (i64 j = n_lo + h * per; j < imin(n_hi, n_lo + (h + 1) * per); ++j) {
              pf_row(static_cast<const char*>(a.k) + esz * kv_row(a, a.sk, b, hk0, j), esz * nh * D);
              pf_row(static_cast<const char*>(a.v) + esz * kv_row(a, a.sv, b, hk0, j), esz * nh * Dv);
            }
          }
          tile(h, t0, span.tile_lo(t0), span.tile_hi(t0));
        }
      }
      for (i64 h = 0; h < nh; ++h)
        for (int r = 0; r < nr; ++r) {
          const i64 row = (b * a.Hkv + hk0 + h) * GS + g * kDecRows + r, x = h * kDecRows + r;
          std::memcpy(Op + (row * nsplit + sp) * Dvp, Od_all + x * Dvp, sizeof(float) * static_cast<std::size_t>(Dvp));
          Mp[row * nsplit + sp] = Md_all[x];
          Lp[row * nsplit + sp] = S::hsum(S::loadu(Ld_all + x * L));
        }
    }
  });

  // Merge the chunks of each row: M = max m_s, l = Σ l_s 2^(m_s − M), O = Σ O_s 2^(m_s − M),
  // over the chunks that saw a key (l_s ≠ 0), once every chunk is done (the end of the run_shared
  // above). A NaN chunk (l_s = NaN, see softmax_row) makes l NaN, and with it the row.
  std::atomic<i64> next_row{0};
  run_shared(rows_total > 1 ? a.threads : 1, [&](int t) {
    float* acc = mem.f() + t * arena + NH * kDecRows * Dp;  // thread t's Od, reused: [Dvp]
    for (i64 row; (row = next_row.fetch_add(1, std::memory_order_relaxed)) < rows_total;) {
      float M = kNegInf, l = 0.0f;
      for (i64 s = 0; s < nsplit; ++s) {
        const float ls = Lp[row * nsplit + s];
        if (ls != ls) l = ls;  // a NaN chunk, possibly with m_s = −∞ (NaN scores only)
        else if (ls != 0.0f && Mp[row * nsplit + s] > M) M = Mp[row * nsplit + s];
      }
      std::memset(acc, 0, sizeof(float) * static_cast<std::size_t>(Dvp));
      if (M != kNegInf) {
        for (i64 s = 0; s < nsplit; ++s) {
          if (Lp[row * nsplit + s] == 0.0f) continue;
          const float w = __builtin_exp2f(Mp[row * nsplit + s] - M);
          l += Lp[row * nsplit + s] * w;
          const auto vw = S::set1(w);
          const float* o = Op + (row * nsplit + s) * Dvp;
          for (i64 e = 0; e < Dvp; e += L) S::storeu(acc + e, S::fmadd(vw, S::loadu(o + e), S::loadu(acc + e)));
        }
      }
      const i64 bhk = row / GS, r = row % GS;
      const i64 b = bhk / a.Hkv, hk = bhk % a.Hkv;
      store_row<S>(a, b, hk * G + r / a.Sq, r % a.Sq, acc, M, l);
    }
  });
}

}  // namespace
}  // namespace qkv::kernels::cpu
