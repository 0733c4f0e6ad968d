// The fast forward kernel's body (flash_tile.hpp has the pieces and the dimension legend); each ISA
// translation unit instantiates forward<S, Operands>.
//
// flash_forward — one work item per (b, h, query block of kMb rows), handed out dynamically:
//   load the block's queries (scaled) into Qs; for every K/V tile of kNt keys the block may
//   attend: transpose K into Kt, then
//     for every 6-row strip that may attend the tile:
//       Q·Kᵀ micro-kernel (6 × NQ·L register block) → the strip's scores in Ps
//       mask (only on tiles the causal/window/padding rule cuts, or with a dense mask)
//       online softmax: running max m (raised lazily), running sum l, accumulators rescaled
//     then for every such strip: P·V micro-kernel (6 × 4L register blocks on AVX-512, 6 × 2L
//     elsewhere) into the accumulators Os
//   then out = Os / l, lse = ln 2 · (m + log2 l). Tiles and strips the rule removes entirely
//   are never computed, so causal costs about half.
// Deterministic: a row's result depends only on the shape, never on the thread count.
#pragma once

#include "kernels/cpu/flash_tile.hpp"

namespace qkv::kernels::cpu {
namespace {

// Register blocking per ISA: NQ vectors of keys in Q·Kᵀ (NQ·L divides kNt), NV vectors of
// value columns in P·V (the unit Dv is padded to), NVw vectors in P·V where Dvp has room.
// AVX-512: Q·Kᵀ 6×4 + 4 = 28 zmm, P·V 6×4 + 4 = 28 zmm (NVw) or 6×2 + 2; AVX2 (16 ymm): 6×2 + 2.
// Why P·V takes 4 vectors where it can: each key costs NV loads of V, 6 broadcasts of P and a
// loop step (4 uops) for 6·NV FMAs. On a CPU with two 512-bit FMA ports and a 4-wide front end
// (Intel Xeon), NV = 2 is 24 uops per 6 cycles of FMAs, the front end's whole width; NV = 4 is
// 38 uops per 12 cycles, and loads each P broadcast and each accumulator once per 64 columns.
template <class S>
struct Blocking {
  static constexpr int NQ = S::L >= 16 ? 4 : 2;
  static constexpr int NV = 2;
  static constexpr int NVw = S::L >= 16 ? 4 : 2;
};

// The operands of forward() in f32 (any input dtype, converted once per block / tile):
//   Qs [kMb][D]    the block's queries × scale · log2 e
//   Kt [D][kNt]    the K tile, transposed (keys contiguous)
//   Vs [kNt][Dvp]  the V tile as f32, unless V is read in place (f32, unit stride, Dv % kVc = 0)
// Another operand policy (flash_avx512bf16.cpp) keeps bf16 pairs for the dot-product instructions;
// forward() only sees load_q / load_kv / qk / pv.
template <class S>
struct OperandsF32 {
  static constexpr int kQc = Blocking<S>::NQ * S::L;  // key columns per Q·Kᵀ call
  static constexpr int kVc = Blocking<S>::NV * S::L;  // value columns per P·V call
  static i64 scratch_floats(const FlashArgs& a) {
    const i64 Dvp = round_up(a.Dv, kVc);
    return round_up(kMb * a.D, 16) + round_up(a.D * kNt, 16) + (in_place(a) ? 0 : kNt * Dvp);
  }
  static bool in_place(const FlashArgs& a) { return !a.bf16 && a.sv[3] == 1 && a.Dv % kVc == 0; }

  const FlashArgs& a;
  i64 D, Dvp;
  float *Qs, *Kt, *Vs;
  const float* vt = nullptr;  // the V tile used by pv(): in place or Vs
  i64 ldv = 0;

  OperandsF32(const FlashArgs& args, float* mem) : a(args), D(args.D), Dvp(round_up(args.Dv, kVc)) {
    Qs = mem;
    Kt = Qs + round_up(kMb * D, 16);
    Vs = Kt + round_up(D * kNt, 16);
  }
  // Rows r ∈ [r0, r1) of Qs: q[b, h, i0 + r, :] for r < nrows, zero past it.
  void load_q(i64 b, i64 h, i64 i0, int r0, int r1, int nrows) {
    for (int r = r0; r < r1; ++r) {
      const i64 off = b * a.sq[0] + h * a.sq[1] + (i0 + r) * a.sq[2];
      if (r >= nrows) std::memset(Qs + r * D, 0, sizeof(float) * static_cast<std::size_t>(D));
      else if (!a.bf16 && a.sq[3] == 1) scale_row<S>(static_cast<const float*>(a.q) + off, D, a.scale_log2, Qs + r * D);
      else load_row(a, a.q, off, a.sq[3], D, a.scale_log2, Qs + r * D);
    }
  }
  // Keys [j_lo, j_hi) of the tile starting at t0 (only those are read; other columns are masked).
  void load_kv(i64 kbase, i64 vbase, i64 t0, i64 j_lo, i64 j_hi) {
    i64 j_done = j_lo;
    if (S::kHasTranspose16 && !a.bf16 && a.sk[3] == 1 && D >= 16) {
      // Whole 16 × 16 blocks in registers; the last D % 16 dims of those keys below.
      const auto* k = static_cast<const float*>(a.k) + kbase;
      for (; j_done + 16 <= j_hi; j_done += 16) {
        const i64 c = j_done - t0;
        i64 d0 = 0;
        for (; d0 + 16 <= D; d0 += 16) S::transpose16(k + j_done * a.sk[2] + d0, a.sk[2], Kt + d0 * kNt + c, kNt);
        for (i64 j = j_done; j < j_done + 16; ++j)
          for (i64 d = d0; d < D; ++d) Kt[d * kNt + (j - t0)] = k[j * a.sk[2] + d];
      }
    }
    for (i64 j = j_done; j < j_hi; ++j) {
      const i64 off = kbase + j * a.sk[2], c = j - t0;
      if (a.bf16) {
        const auto* kp = static_cast<const std::uint16_t*>(a.k) + off;
        for (i64 d = 0; d < D; ++d) Kt[d * kNt + c] = bf16_bits_to_f32(kp[d * a.sk[3]]);
      } else {
        const auto* kp = static_cast<const float*>(a.k) + off;
        for (i64 d = 0; d < D; ++d) Kt[d * kNt + c] = kp[d * a.sk[3]];
      }
    }
    if (in_place(a)) {
      vt = static_cast<const float*>(a.v) + vbase + t0 * a.sv[2];
      ldv = a.sv[2];
      return;
    }
    for (i64 j = j_lo; j < j_hi; ++j) {
      float* row = Vs + (j - t0) * Dvp;
      load_row(a, a.v, vbase + j * a.sv[2], a.sv[3], a.Dv, 1.0f, row);
      for (i64 e = a.Dv; e < Dvp; ++e) row[e] = 0.0f;
    }
    vt = Vs;
    ldv = Dvp;
  }
  // Scores (log2 units) of strip rows [r0, r0 + kRows) for the column vectors meeting [c_lo, c_hi);
  // the columns left out are masked by the caller. On the causal diagonal a strip needs only the
  // first keys of its tile: a narrower register block skips the rest (each column's sum is the
  // same whatever the block width, so the scores do not change).
  // With softcap the scores come out capped (qk_block).
  void qk(int r0, float* Ps, i64 c_lo, i64 c_hi) const {
    constexpr int L = S::L;
    const bool capped = a.softcap_log2 > 0.0f;
    const SoftcapK<S> cap(capped ? a.softcap_log2 : 1.0f, capped ? softcap_kz(a.softcap_log2) : 0.0f);
    for (int c0 = 0; c0 < kNt; c0 += kQc) {
      if (c0 >= c_hi || c0 + kQc <= c_lo) continue;
      const int v0 = static_cast<int>(imax(c_lo - c0, 0)) / L;
      const int v1 = static_cast<int>((imin(c_hi - c0, kQc) + L - 1) / L);
      qk_narrow<S, Blocking<S>::NQ>(v1 - v0, Qs + r0 * D, D, Kt, D, Ps, c0 + v0 * L, capped ? &cap : nullptr);
    }
  }
  // Columns of the accumulators a P·V pass covers (forward() runs every strip's P·V on one pass of
  // columns before the next, so that the part of V they read, 64 keys × 64 columns, stays in L1).
  i64 pv_pass_cols() const { return Blocking<S>::NVw * S::L; }
  // o[kRows][e0, e1) += P[:, c_lo:c_hi] · V[c_lo:c_hi, e0:e1) for a pass [e0, e1) of columns, by
  // blocks of NVw vectors of columns, the rest by NV. Each column's sum runs over the keys in the
  // same order whatever its block or pass.
  void pv(const float* Ps, i64 c_lo, i64 c_hi, float* o, i64 e0, i64 e1) const {
    constexpr int kVw = Blocking<S>::NVw * S::L;
    e1 = imin(e1, Dvp);
    if constexpr (kVw > kVc)
      for (; e0 + kVw <= e1; e0 += kVw) pv_block<S, Blocking<S>::NVw>(Ps, vt, ldv, c_lo, c_hi, o, Dvp, e0);
    for (; e0 < e1; e0 += kVc) pv_block<S, Blocking<S>::NV>(Ps, vt, ldv, c_lo, c_hi, o, Dvp, e0);
  }
};

// How forward() cuts a call's query rows into blocks: nqb blocks of mb rows (the last may be
// shorter); mb is a multiple of kRows, at most kMb.
struct Blocks {
  i64 first;  // index of the call's first work item (b, h, block)
  i64 nqb, mb;
};

// Work items per thread below which forward() cuts smaller blocks: with dynamic scheduling the
// threads finish at most one item apart, so 8 items each bound the idle tail to about 1/16.
constexpr i64 kItemsPerThread = 8;
// The smallest block it cuts (8 strips): below that, converting each K/V tile once per block
// starts to cost more than the tail it saves.
constexpr i64 kMinMb = 48;

// Blocks of equal size (to a strip) for Sq rows in about Sq / target rows each (none for Sq = 0).
inline Blocks even_blocks(i64 Sq, i64 target) {
  if (Sq <= 0) return {0, 0, kRows};
  const i64 nqb = (Sq + target - 1) / target;
  const i64 mb = round_up((Sq + nqb - 1) / nqb, kRows);
  return {0, (Sq + mb - 1) / mb, mb};
}

// list[0, n): independent calls sharing D, Dv, dtypes and threads (one per sequence of a
// varlen batch, or just one); their work items go through a single parallel loop.
template <class S, class Ops>
void forward(const FlashArgs* list, i64 n) {
  const int threads = list[0].threads;
  const i64 Dvp = round_up(list[0].Dv, Ops::kVc);
  // Block size: kMb rows (each K/V tile converted once serves 192 rows), cut evenly so that a
  // short last block does not leave a thread idle at the end (S = 256: 132 + 124, not
  // 192 + 64), and halved while there are fewer than kItemsPerThread items per thread.
  // A row's result does not depend on the blocks (each row's online softmax sees the same tiles
  // in the same order), so this choice, which depends on the thread count, keeps the results
  // bit-identical for every thread count.
  i64 target = kMb, items_at_kmb = 0;
  for (i64 c = 0; c < n; ++c) items_at_kmb += list[c].B * list[c].H * even_blocks(list[c].Sq, kMb).nqb;
  for (i64 items = items_at_kmb; target / 2 >= kMinMb && items < kItemsPerThread * threads; items *= 2) target /= 2;
  Scratch plan_mem((n + 1) * static_cast<i64>(sizeof(Blocks)));
  auto* plan = static_cast<Blocks*>(plan_mem.p);  // plan[c] for call c; plan[n].first: the total
  i64 ops_floats = 0;
  plan[0].first = 0;
  for (i64 c = 0; c < n; ++c) {
    const Blocks bl = even_blocks(list[c].Sq, target);
    plan[c].nqb = bl.nqb, plan[c].mb = bl.mb;
    plan[c + 1].first = plan[c].first + list[c].B * list[c].H * bl.nqb;
    ops_floats = imax(ops_floats, Ops::scratch_floats(list[c]));
  }
  const i64 items = plan[n].first;

  // Per-thread scratch (floats), laid out once per call, one block of the pool for all threads
  // (thread t at t · arena):
  //   Os [kMb][Dvp]  unnormalised output accumulators (Dvp = Dv rounded up to the P·V block)
  //   Ms [kMb]       running max (log2 units)
  //   Ls [kMb][L]    running sum, lane-wise (see softmax_row)
  //   Ps [kMb][kNt]  the block's scores of one tile, then probabilities (strip s at rows 6s…)
  //   then the operands' own scratch (Ops::scratch_floats: queries, K and V tiles)
  const i64 n_os = round_up(kMb * Dvp, 16);
  const i64 arena = per_thread_floats(n_os + kMb + kMb * S::L + kMb * kNt + ops_floats);
  Scratch mem(threads * arena * static_cast<i64>(sizeof(float)));

  // One item needs no team (waking another thread costs microseconds). The items are handed out
  // one at a time from next_item (a dynamic schedule); thread t works in arena t.
  std::atomic<i64> next_item{0};
  run_shared(items > 1 ? threads : 1, [&](int t) {
    float* Os = mem.f() + t * arena;
    float* Ms = Os + n_os;
    float* Ls = Ms + kMb;
    float* Ps = Ls + kMb * S::L;
    i64 ke[kMb], lo[kMb], hi[kMb];           // allowed keys [0, ke) ∪ [lo, hi) of each row (key_range; none past Sq)
    KeySpan strip[kMb / kRows];              // the keys of each strip's rows (set per item)
    i64 strip_lo[kMb / kRows], strip_hi[kMb / kRows];  // the tile's columns each strip computed (empty: none)
    std::uint64_t dkey[kMb];                 // dropout_row_key of each row, when a.dropout

    for (i64 item; (item = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      i64 c0 = 0, c1 = n;  // the call owning this item: plan[c0].first ≤ item < plan[c0 + 1].first
      while (c1 - c0 > 1) {
        const i64 mid = (c0 + c1) / 2;
        (plan[mid].first <= item ? c0 : c1) = mid;
      }
      const FlashArgs& a = list[c0];
      Ops ops(a, Ps + kMb * kNt);
      const i64 G = a.H / a.Hkv;
      const i64 nqb = plan[c0].nqb, mb = plan[c0].mb;
      const i64 local = item - plan[c0].first;
      const i64 h = (local / nqb) % a.H, b = local / (nqb * a.H);
      // Causal: a head's blocks from the last (most keys) to the first, so that the items
      // handed out last are the cheapest and the threads finish together.
      const i64 qb = a.causal ? nqb - 1 - local % nqb : local % nqb;
      const i64 hk = h / G;
      const i64 i0 = qb * mb;
      const int nrows = static_cast<int>(imin(mb, a.Sq - i0));
      const int nstrips = (nrows + kRows - 1) / kRows;
      const i64 klen = a.key_len[b];
      const bool mods = a.alibi != nullptr;  // softcap is applied by ops.qk (the scores come capped)
      const float slope2 = a.alibi ? static_cast<float>(a.alibi[b * a.alibi_sb + h] * kLog2e) : 0.0f;

      KeySpan block(0, a.Skv);  // the keys of the whole block's rows
      for (int s = 0; s < nstrips; ++s) {
        strip[s] = KeySpan(0, a.Skv);
        for (int r = s * kRows; r < (s + 1) * kRows; ++r) {
          if (r < nrows) key_range(a, i0 + r, klen, &ke[r], &lo[r], &hi[r]);
          else ke[r] = lo[r] = hi[r] = 0;
          strip[s].add(ke[r], lo[r], hi[r]);
        }
        block.add(strip[s]);
      }
      for (int r = 0; r < nstrips * kRows; ++r) {
        std::memset(Os + r * Dvp, 0, sizeof(float) * static_cast<std::size_t>(Dvp));
        Ms[r] = kNegInf;
        S::storeu(Ls + r * S::L, S::zero());
      }
      if (a.dropout)
        for (int r = 0; r < nrows; ++r) dkey[r] = dropout_row_key(a.dropout_seed, a.dropout_offset, a.dropout_b0 + b, h, i0 + r);

      const i64 kbase = b * a.sk[0] + hk * a.sk[1];
      const i64 vbase = b * a.sv[0] + hk * a.sv[1];
      // Software prefetch of K and V rows (pf_row) where rows are contiguous: 3–8 % at S ≥ 2048.
      const bool prefetch = a.sk[3] == 1 && a.sv[3] == 1;  // rows contiguous: pf_row covers them
      const i64 esz = a.bf16 ? 2 : 4;                       // bytes per K/V element
      const bool q_rows = a.sq[3] == 1;                     // query rows contiguous (pf_row)
      const i64 t_first = block.first_tile();
      const bool out_rows = a.so[3] == 1;                   // output rows contiguous (pf_row_w)
      for (i64 t0 = t_first; t0 < block.hi; t0 += kNt) {
        if (block.skips(t0)) continue;  // between kept keys and every row's window
        // Keys of this tile in the block's hull: only those are read.
        ops.load_kv(kbase, vbase, t0, imax(t0, block.lo), block.tile_hi(t0));
        // The next tile's K and V rows [n0, n1) are prefetched into L2 (pf_row) while this tile
        // is computed, `per` keys before each strip: at S ≥ 8192 a head's K and V (4–8 MB) come
        // from beyond L2, and load_kv would otherwise wait on each line of the tile in turn.
        const i64 n0 = t0 + kNt, n1 = imin(n0 + kNt, block.hi);
        const i64 per = (kNt + nstrips - 1) / nstrips;
        for (int s = 0; s < nstrips; ++s) {
          if (prefetch)
            for (i64 j = n0 + s * per; j < imin(n0 + (s + 1) * per, n1); ++j) {
              pf_row(static_cast<const char*>(a.k) + esz * (kbase + j * a.sk[2]), esz * a.D);
              pf_row(static_cast<const char*>(a.v) + esz * (vbase + j * a.sv[2]), esz * a.Dv);
            }
          // In the last tile: the strip's output rows, written by store_row once the tile is done.
          if (out_rows && n0 >= block.hi)
            for (i64 r = s * kRows; r < imin((s + 1) * kRows, nrows); ++r)
              pf_row_w(static_cast<char*>(a.out) + esz * (b * a.so[0] + h * a.so[1] + (i0 + r) * a.so[2]), esz * a.Dv);
          const int r0 = s * kRows;
          // In the first tile: the strip's queries, loaded just before its first Q·Kᵀ, and the
          // next strip's rows prefetched, so that the block's Q rows (from L3 or memory) stream
          // in while it computes; in the last tile (above) the output rows are fetched likewise,
          // before store_row writes them: up to 3 % at S ≤ 512, where these rows miss the cache.
          if (t0 == t_first) {
            ops.load_q(b, h, i0, r0, r0 + kRows, nrows);
            if (q_rows)
              for (i64 r = r0 + kRows; r < imin(r0 + 2 * kRows, nrows); ++r)
                pf_row(static_cast<const char*>(a.q) + esz * (b * a.sq[0] + h * a.sq[1] + (i0 + r) * a.sq[2]), esz * a.D);
          }
          strip_lo[s] = strip_hi[s] = 0;
          if (strip[s].lo >= t0 + kNt || strip[s].hi <= t0) continue;  // the rule removes the whole strip
          if (strip[s].skips(t0)) continue;                             // in the strip's keep_first gap
          const i64 c_lo = strip[s].tile_lo(t0) - t0, c_hi = strip[s].tile_hi(t0) - t0;
          strip_lo[s] = c_lo, strip_hi[s] = c_hi;
          float* Pst = Ps + r0 * kNt;
          ops.qk(r0, Pst, c_lo, c_hi);
          // A tile no rule or mask cuts for any row of the strip takes the whole tile at once;
          // with ALiBi its bias is added there without the masked path (softcap needs neither:
          // ops.qk capped the scores). mask_mod_row would do the same: its mask_row changes
          // nothing on such a tile, and the columns [cb, ce) are the whole tile.
          bool cut = a.mask_kind != MaskKind::none;
          for (int r = r0; r < r0 + kRows; ++r) cut = cut || lo[r] > t0 || hi[r] < t0 + kNt;
          if (!cut) {
            if (mods)
              for (int r = 0; r < kRows; ++r) alibi_row<S>(Pst + r * kNt, 0, kNt, slope2, t0, row_diag(a, i0 + r0 + r, klen));
            for (int r = 0; r < kRows; ++r)
              softmax_row<S>(Pst + r * kNt, &Ms[r0 + r], Ls + (r0 + r) * S::L, Os + (r0 + r) * Dvp, Dvp);
          } else {
            // Masked and normalised over the vectors Q·Kᵀ computed, [cb, ce) ⊇ [c_lo, c_hi), not
            // the whole tile: on the causal diagonal a strip sees on average half of it (same
            // bits; ≈ 5 % on short causal rows).
            const int cb = static_cast<int>(c_lo / S::L * S::L), ce = static_cast<int>(round_up(c_hi, S::L));
            for (int r = 0; r < kRows; ++r) {
              const i64 row = r0 + r;
              const i64 moff = b * a.smask[0] + h * a.smask[1] + (i0 + row) * a.smask[2];
              if (mods) mask_mod_row<S>(a, Pst + r * kNt, t0, ke[row], lo[row], hi[row], moff, row_diag(a, i0 + row, klen), slope2, cb, ce, true);
              else mask_row(a, Pst + r * kNt, t0, ke[row], lo[row], hi[row], moff, cb, ce);
              softmax_row<S>(Pst + r * kNt, &Ms[row], Ls + row * S::L, Os + row * Dvp, Dvp, cb, ce);
            }
          }
          if (a.dropout)
            for (int r = r0; r < imin(r0 + kRows, nrows); ++r) dropout_tile_row(a, dkey[r], Pst + (r - r0) * kNt, t0, c_lo, c_hi);
        }
        // P·V of every strip after all the scores, by passes of columns: while the strips' Q·Kᵀ
        // run, only Kt is read again and again, and while their P·V run, only one pass's part of
        // V, so the tile operand the micro-kernels re-read stays in L1 (Kt and V of a tile
        // together, 32 KiB at D = 64, do not fit beside the rows streaming through). Each row still
        // takes its softmax's rescale before its P·V, and each column's sum runs over the same
        // keys in the same order: this order gives the same bits as P·V right after each strip's
        // softmax.
        const i64 pass = ops.pv_pass_cols();
        for (i64 e0 = 0; e0 < Dvp; e0 += pass)
          for (int s = 0; s < nstrips; ++s)
            if (strip_hi[s] > strip_lo[s])
              ops.pv(Ps + s * kRows * kNt, strip_lo[s], strip_hi[s], Os + s * kRows * Dvp, e0, e0 + pass);
      }
      for (int r = 0; r < nrows; ++r)
        store_row<S>(a, b, h, i0 + r, Os + r * Dvp, Ms[r], S::hsum(S::loadu(Ls + r * S::L)));
    }
  });
}

}  // namespace
}  // namespace qkv::kernels::cpu
