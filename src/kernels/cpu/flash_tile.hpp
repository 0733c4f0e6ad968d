// The pieces the fast forward and decode kernels share, written once over a SIMD interface S
// (simd_*.hpp) and compiled by each ISA translation unit with its own flags: tile sizes, scratch,
// prefetch, the allowed-key rule, loading and storing rows, masks and score variants on a tile row,
// the online softmax, dropout, and the Q·Kᵀ / P·V micro-kernels. flash_forward_impl.hpp and
// flash_decode_impl.hpp build the two kernels from them. Everything here has internal linkage
// (anonymous namespace, no std:: templates): see simd_common.hpp for why.
//
// Dimension legend: B batch, H query heads, Hkv kv heads, G = H / Hkv, Sq / Skv positions,
// D query/key head dim, Dv value head dim. Scores live in log2 units: s = q·k · scale · log2(e),
// so softmax uses exp2 and lse = ln 2 · (m + log2 l).
//
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/parallel.hpp"
#include "core/scratch.hpp"
#include "kernels/cpu/flash.hpp"
#include "kernels/cpu/score_mod.hpp"
#include "kernels/cpu/simd_common.hpp"
#include "kernels/dropout.hpp"

namespace qkv::kernels::cpu {
namespace {

using i64 = std::int64_t;

constexpr int kRows = 6;      // rows of a strip: 6 × 4 accumulators + 4 K vectors fill 30 of 32 zmm
constexpr int kNt = 64;       // keys per tile: Kt [D ≤ 128][64] f32 = 32 KiB stays in L1
constexpr int kMb = 192;      // query rows per block (32 strips): K/V tiles are reused 192 times
constexpr int kDecRows = 8;   // query rows per decode item and kv head (heads of one GQA group × Sq)
constexpr int kDecHeads = 8;  // kv heads per decode item at most (flash_decode_impl.hpp)
constexpr i64 kSplit = 512;   // keys per decode chunk (before the partial-memory cap below)
constexpr float kNegInf = -__builtin_inff();

inline i64 imin(i64 a, i64 b) { return a < b ? a : b; }
inline i64 imax(i64 a, i64 b) { return a > b ? a : b; }
inline i64 round_up(i64 x, i64 m) { return (x + m - 1) / m * m; }

// 64-byte aligned scratch leased from the pool (core/scratch.hpp) and given back on scope exit
// (no std::vector: see the note at the top). Lease it on the calling thread, outside parallel
// regions: the lease may throw std::bad_alloc.
// size is set by the lease in the constructor's body: a default member initializer would run
// after p's (members are initialised in declaration order) and reset it to 0, and a block given
// back with size 0 never fits a lease again, so every call would allocate and fault in fresh
// scratch (Test Flash.ScratchReusedAcrossCalls).
struct Scratch {
  void* p;
  std::size_t size;
  explicit Scratch(i64 bytes) : size(0) { p = scratch_lease(static_cast<std::size_t>(imax(bytes, 64)), &size); }
  ~Scratch() { scratch_return(p, size); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* f() const { return static_cast<float*>(p); }
};

// Floats of per-thread scratch rounded up to whole 4 KiB pages, so that threads never share a
// cache line or a page of the block they lease together.
inline i64 per_thread_floats(i64 floats) { return round_up(floats, 1024); }

// pf_row fetches one row of `bytes` into L2 (prefetcht1). The hardware prefetchers stop at every
// 4 KiB page (8 f32 rows of 128), so the kernels fetch the K and V rows they read next in
// software. Decode reads K and V from memory once, a tile's 64 rows being 32 KiB of each: each
// stream is fetched one phase ahead (while a tile's keys are scored, their V rows; while its P·V
// runs, the next tile's K rows). The forward fetches the next tile while it computes this one.
inline void pf_row(const void* p, i64 bytes) {
  for (i64 x = 0; x < bytes; x += 64) __builtin_prefetch(static_cast<const char*>(p) + x, 0, 2);
}
// The same for a row about to be written (prefetchw: the line arrives ready to be modified).
inline void pf_row_w(void* p, i64 bytes) {
  for (i64 x = 0; x < bytes; x += 64) __builtin_prefetch(static_cast<char*>(p) + x, 1, 2);
}

// The diagonal of query row i in a batch row with key_len valid keys (KeyRange::diag).
inline i64 row_diag(const FlashArgs& a, i64 i, i64 key_len) {
  return rule_diag(i, a.diag_offset, a.diag_from_key_len, key_len);
}

// Allowed keys of query row i (KeyRange::range): [0, kend) ∪ [lo, hi) with kend = 0 or
// 0 < kend < lo (keep_first's keys apart from the window; when the two touch or the window is
// empty they are one range [lo, hi) and kend = 0); nothing allowed → kend = lo = hi = 0.
inline void key_range(const FlashArgs& a, i64 i, i64 key_len, i64* kend, i64* lo, i64* hi) {
  rule_range(row_diag(a, i, key_len), a.causal, a.window_left, a.window_right, key_len, lo, hi);
  i64 k = imax(imin(a.keep_first, *hi), 0);  // keys [0, k) kept
  if (*hi <= *lo) *lo = 0, *hi = k, k = 0;   // only the kept keys
  else if (k >= *lo) *lo = 0, k = 0;         // the kept keys join the window
  if (*hi <= *lo) *lo = *hi = 0;
  *kend = k;
}

// The keys some row of a group attends, inside a window of keys [k0, k1) (decode's chunk; the
// forward's is [0, Skv)): the rows' key_range unions [0, ke_r) ∪ [lo_r, hi_r), clipped, kept as
// the hull [lo, hi) and the gap [ke, wlo) inside it that no row attends (between keep_first's
// keys and every row's window). One loop walks its tiles for the forward and decode:
//   for (i64 t0 = span.first_tile(); t0 < span.hi; t0 += kNt)
//     if (!span.skips(t0)) … keys [span.tile_lo(t0), span.tile_hi(t0)) …
struct KeySpan {
  i64 k0, k1;
  i64 lo, hi;   // hull; empty when hi ≤ lo
  i64 ke, wlo;  // gap [ke, wlo): no key of any row (ke = k0 or less: no kept keys)
  explicit KeySpan(i64 first = 0, i64 end = 0) : k0(first), k1(end), lo(end), hi(first), ke(first), wlo(end) {}
  // Row keys [0, rke) ∪ [rlo, rhi) (key_range's form).
  void add(i64 rke, i64 rlo, i64 rhi) {
    if (rke > k0) lo = k0, ke = imax(ke, imin(rke, k1)), hi = imax(hi, ke);
    if (rhi > rlo && rlo < k1 && rhi > k0) {
      lo = imin(lo, imax(rlo, k0)), hi = imax(hi, imin(rhi, k1));
      wlo = imin(wlo, imax(rlo, k0));
    }
  }
  void add(const KeySpan& o) { lo = imin(lo, o.lo), hi = imax(hi, o.hi), ke = imax(ke, o.ke), wlo = imin(wlo, o.wlo); }
  i64 first_tile() const { return lo / kNt * kNt; }
  // Tile [t0, t0 + kNt) lies wholly in the gap.
  bool skips(i64 t0) const { return t0 >= ke && t0 + kNt <= wlo; }
  // The tile's keys that some row may attend: from the hull's start (a tile with kept keys) or
  // the windows' start, to the hull's end.
  i64 tile_lo(i64 t0) const { return imax(t0 < ke ? lo : wlo, t0); }
  i64 tile_hi(i64 t0) const { return imin(t0 + kNt, hi); }
};

// n elements of row `src` (element stride `stride`, f32 or bf16) → dst as f32 · mul.
inline void load_row(const FlashArgs& a, const void* base, i64 off, i64 stride, i64 n, float mul, float* dst) {
  if (a.bf16) {
    const auto* s = static_cast<const std::uint16_t*>(base) + off;
    for (i64 x = 0; x < n; ++x) dst[x] = bf16_bits_to_f32(s[x * stride]) * mul;
  } else {
    const auto* s = static_cast<const float*>(base) + off;
    for (i64 x = 0; x < n; ++x) dst[x] = s[x * stride] * mul;
  }
}

// n elements of a unit-stride f32 row → dst · mul (the same products as load_row, by vectors).
template <class S>
inline void scale_row(const float* src, i64 n, float mul, float* dst) {
  const auto vm = S::set1(mul);
  i64 x = 0;
  for (; x + S::L <= n; x += S::L) S::storeu(dst + x, S::mul(S::loadu(src + x), vm));
  if (x < n) S::store_n(dst + x, S::mul(S::load_n(src + x, static_cast<int>(n - x)), vm), static_cast<int>(n - x));
}

// n elements of a unit-stride bf16 row → dst[0, round_up(n, L)) as f32, zeros past n.
template <class S>
inline void widen_row(const std::uint16_t* src, i64 n, float* dst) {
  i64 x = 0;
  for (; x + S::L <= n; x += S::L) S::storeu(dst + x, S::load_bf16(src + x));
  if (x < n) S::storeu(dst + x, S::load_bf16_n(src + x, static_cast<int>(n - x)));
}

// n elements of a binary16 row (element stride `stride`) → dst[0, n) as f32 (f16 KV caches):
// by vectors where S converts them (S::kHasF16, unit stride), the rest element by element; both exact.
template <class S>
inline void widen_f16_row(const std::uint16_t* src, i64 stride, i64 n, float* dst) {
  i64 x = 0;
  if constexpr (S::kHasF16)
    if (stride == 1)
      for (; x + S::L <= n; x += S::L) S::storeu(dst + x, S::load_f16(src + x));
  for (; x < n; ++x) dst[x] = f16_bits_to_f32(src[x * stride]);
}

// Where key row j of batch row b lies in the cache's tensors: row *r of block *blk (when paged,
// through the block table, flash.hpp), else row j of batch row b; (b, kv head hk)'s row is then at
// element offset blk · s[0] + hk · s[1] + r · s[2] of any of them (strides s).
inline void kv_pos(const FlashArgs& a, i64 b, i64 j, i64* blk, i64* r) {
  if (!a.block_table) {
    *blk = b, *r = j;
    return;
  }
  *blk = a.block_table[b * a.ldt + (j >> a.page_shift)];
  *r = j & ((i64{1} << a.page_shift) - 1);
}

// Element offset of key/value row j of (b, kv head hk) in a tensor with strides s (a.sk, a.sv,
// or a scale's a.sks, a.svs): kv_pos's row.
inline i64 kv_row(const FlashArgs& a, const i64* s, i64 b, i64 hk, i64 j) {
  i64 blk, r;
  kv_pos(a, b, j, &blk, &r);
  return blk * s[0] + hk * s[1] + r * s[2];
}

// The end of the run of rows from j on that are evenly strided in memory: j's block's end when
// paged, otherwise none (every row of a sequence).
inline i64 kv_run_end(const FlashArgs& a, i64 j) {
  return a.block_table ? ((j >> a.page_shift) + 1) << a.page_shift : INT64_MAX;
}

// A sink logit s2 (log2 units, finite) joins a row's softmax sum l, kept relative to the running
// max m (acc likewise): with M = max(m, s2), l ← l · 2^(m − M) + 2^(s2 − M) and m ← M, *w the
// factor 2^(m − M) the accumulators take. A row that saw no key (m = −∞, l = 0, acc = 0) gets
// l = 1 and m = s2: out 0, lse the sink. NaN rows (l = NaN) stay NaN.
inline void add_sink(float s2, float* m, float* l, float* w) {
  if (*l != *l) return;
  const float M = *m > s2 ? *m : s2;
  *w = __builtin_exp2f(*m - M);
  *l = *l * *w + __builtin_exp2f(s2 - M);
  *m = M;
}

// out row i of head h ← acc / l (0 when l = 0: the row saw no key); lse ← ln 2 (m + log2 l).
// A NaN row (a NaN or +∞ score, see softmax_row) has l = NaN: out and lse come out NaN.
// With sinks, the head's sink joins the sum first (add_sink).
template <class S>
void store_row(const FlashArgs& a, i64 b, i64 h, i64 i, const float* acc, float m, float l) {
  float w = 1.0f;  // acc's factor when the sink raises the max
  if (a.sinks) add_sink(static_cast<float>(a.sinks[h] * kLog2e), &m, &l, &w);
  const float inv = l == 0.0f ? 0.0f : w / l;
  const i64 off = b * a.so[0] + h * a.so[1] + i * a.so[2];
  const i64 st = a.so[3];
  const int L = S::L;
  if (st == 1) {
    const auto vinv = S::set1(inv);
    i64 e = 0;
    if (a.bf16) {
      auto* o = static_cast<std::uint16_t*>(a.out) + off;
      for (; e + L <= a.Dv; e += L) S::store_bf16(o + e, S::mul(S::loadu(acc + e), vinv));
      if (e < a.Dv) S::store_bf16_n(o + e, S::mul(S::loadu(acc + e), vinv), static_cast<int>(a.Dv - e));
    } else {
      float* o = static_cast<float*>(a.out) + off;
      for (; e + L <= a.Dv; e += L) S::storeu(o + e, S::mul(S::loadu(acc + e), vinv));
      if (e < a.Dv) S::store_n(o + e, S::mul(S::loadu(acc + e), vinv), static_cast<int>(a.Dv - e));
    }
  } else if (a.bf16) {
    auto* o = static_cast<std::uint16_t*>(a.out) + off;
    for (i64 e = 0; e < a.Dv; ++e) o[e * st] = f32_to_bf16_bits(acc[e] * inv);
  } else {
    float* o = static_cast<float*>(a.out) + off;
    for (i64 e = 0; e < a.Dv; ++e) o[e * st] = acc[e] * inv;
  }
  const float lse = l == 0.0f ? kNegInf : (m + __builtin_log2f(l)) * kLn2;
  const i64 lo = b * a.slse[0] + h * a.slse[1] + i * a.slse[2];
  if (a.lse_f32) a.lse_f32[lo] = lse;
  if (a.lse_f64) a.lse_f64[lo] = static_cast<double>(lse);
}

// The dense mask on columns [c_lo, c_hi) of one row of tile scores s (keys t0 + c), all allowed
// by the rule: bool deny → −∞; additive −∞ → −∞, else + mask · log2 e. moff: offset of the mask
// element (b, h, i, 0).
inline void dense_mask_cols(const FlashArgs& a, float* s, i64 t0, i64 moff, i64 c_lo, i64 c_hi) {
  const i64 sj = a.smask[3];
  const i64 base = moff + t0 * sj;
  switch (a.mask_kind) {
    case MaskKind::u8: {
      const auto* m = static_cast<const std::uint8_t*>(a.mask) + base;
      for (i64 c = c_lo; c < c_hi; ++c)
        if (m[c * sj] == 0) s[c] = kNegInf;
      break;
    }
    case MaskKind::f32: {
      const auto* m = static_cast<const float*>(a.mask) + base;
      for (i64 c = c_lo; c < c_hi; ++c) s[c] = m[c * sj] == kNegInf ? kNegInf : s[c] + m[c * sj] * kLog2e;
      break;
    }
    case MaskKind::bf16: {
      const auto* m = static_cast<const std::uint16_t*>(a.mask) + base;
      for (i64 c = c_lo; c < c_hi; ++c) {
        const float x = bf16_bits_to_f32(m[c * sj]);
        s[c] = x == kNegInf ? kNegInf : s[c] + x * kLog2e;
      }
      break;
    }
    case MaskKind::f64: {
      const auto* m = static_cast<const double*>(a.mask) + base;
      for (i64 c = c_lo; c < c_hi; ++c) {
        const float x = static_cast<float>(m[c * sj]);
        s[c] = x == kNegInf ? kNegInf : s[c] + x * kLog2e;
      }
      break;
    }
    case MaskKind::none: break;
  }
}

// Masks one row of tile scores s[cb, ce) for keys t0 + c: −∞ outside [0, kend) ∪ [lo, hi)
// (key_range's form; kend = 0: [lo, hi) alone), and the dense mask applied inside. Masked keys
// are overwritten, never added to: a NaN in a masked key's K does not reach the row. moff: offset of the mask
// element (b, h, i, 0). [cb, ce): the columns the strip computed (the caller reads no others).
inline void mask_row(const FlashArgs& a, float* s, i64 t0, i64 kend, i64 lo, i64 hi, i64 moff, i64 cb, i64 ce) {
  const i64 c_lo = imin(imax(lo - t0, cb), ce), c_hi = imax(imin(hi - t0, ce), c_lo);
  const i64 c_k = imin(imax(kend - t0, cb), c_lo);  // [cb, c_k): kept keys below the window
  for (i64 c = c_k; c < c_lo; ++c) s[c] = kNegInf;
  for (i64 c = c_hi; c < ce; ++c) s[c] = kNegInf;
  if (a.mask_kind == MaskKind::none) return;
  if (c_k > cb) dense_mask_cols(a, s, t0, moff, cb, c_k);
  dense_mask_cols(a, s, t0, moff, c_lo, c_hi);
}

// One row's scores s[cb, ce) in qkv/attention.hpp's order: softcap (score_mod.hpp), mask_row
// (the rule's ranges [0, kend) ∪ [lo, hi) and the dense mask: masked keys become −∞ after the cap, so they stay
// masked), then ALiBi. slope2: the head's slope · log2 e (ignored without ALiBi); moff as mask_row.
// capped: the scores come capped already (the forward caps them in Q·Kᵀ, qk_block).
template <class S>
inline void mask_mod_row(const FlashArgs& a, float* s, i64 t0, i64 kend, i64 lo, i64 hi, i64 moff, i64 diag,
                         float slope2, int cb, int ce, bool capped = false) {
  if (a.softcap_log2 > 0.0f && !capped) softcap_row<S>(s, cb, ce, a.softcap_log2);
  mask_row(a, s, t0, kend, lo, hi, moff, cb, ce);
  if (a.alibi) alibi_row<S>(s, cb, ce, slope2, t0, diag);
}

// Whether some s[c], c ∈ [cb, ce), is NaN. Out of line and cold: it runs only on tiles masked
// off for a row, and inlined into softmax_row's callers it grew forward() by 1.7 KB and slowed
// its hot loops by ≈ 13 %; out of line the NaN policy costs nothing measurable.
__attribute__((noinline, cold)) bool any_nan(const float* s, int cb, int ce) {
  bool r = false;
  for (int c = cb; c < ce; ++c) r = r || s[c] != s[c];
  return r;
}

// Online softmax of one row's tile scores s[cb, ce) (−∞ where masked; cb, ce multiples of L):
// raises the running max m when a score exceeds it by more than kLazyRescale (rescaling the sum
// and the accumulators o[0, Dvp)), then overwrites s with p = 2^(s − m) and adds them to the sum,
// kept lane-wise in l[0, L) (no horizontal add per row and tile; the row's sum is Σ l at the end).
// The columns outside [cb, ce) would be −∞, i.e. p = +0, which changes neither the max nor the
// sum: leaving them out gives the same bits.
template <class S>
inline void softmax_row(float* s, float* m, float* l, float* o, i64 Dvp, int cb = 0, int ce = kNt) {
  constexpr int L = S::L;
  auto mx = S::loadu(s + cb);
  for (int c = cb + L; c < ce; c += L) mx = S::max(mx, S::loadu(s + c));
  // The tests on the lanes of mx decide as the tile's max would (some lane > t ⟺ max > t); the
  // horizontal max is taken only when m is raised, which after a row's first tile is rare:
  // a compare instead of an 8-instruction reduction per row and tile (≈ 1 %; same bits).
  // Non-finite scores (the policy of qkv/attention.hpp) cost nothing on the common path: a NaN
  // score gives p = 2^(NaN − m) = NaN (exp2 keeps NaN), and a +∞ one raises m to +∞ (any_gt
  // below), so that its p = 2^(∞ − ∞) = NaN; either way the sum l turns NaN and store_row writes
  // a NaN row. (mx may have lost a NaN: a vector max returns its second operand when either is
  // NaN. That is why the rule is carried by exp2, not by the max.) The one test that must look
  // at NaN is this one: a tile whose mx is −∞ everywhere is skipped only if no score is NaN,
  // checked element by element, but only on such tiles (masked off for this row: rare).
  if (!S::any_gt(mx, kNegInf) && !any_nan(s, cb, ce)) {  // nothing allowed in this tile for this row
    std::memset(s + cb, 0, sizeof(float) * static_cast<std::size_t>(ce - cb));
    return;
  }
  if (S::any_gt(mx, *m + kLazyRescale)) {
    const float mt = S::hmax(mx);
    if (*m != kNegInf) {
      const float alpha = __builtin_exp2f(*m - mt);
      const auto va = S::set1(alpha);
      S::storeu(l, S::mul(S::loadu(l), va));
      for (i64 e = 0; e < Dvp; e += L) S::storeu(o + e, S::mul(S::loadu(o + e), va));
    }
    *m = mt;
  }
  const auto vm = S::set1(*m);
  auto sum = S::zero();
  for (int c = cb; c < ce; c += L) {
    const auto p = S::exp2(S::sub(S::loadu(s + c), vm));
    S::storeu(s + c, p);
    sum = S::add(sum, p);
  }
  S::storeu(l, S::add(S::loadu(l), sum));
}

// Dropout of one row's tile probabilities p[c], c ∈ [c_lo, c_hi) (keys t0 + c), after the softmax
// summed them (l and lse stay the softmax's): p[c] ·= keep / (1 − p). key: the row's
// dropout_row_key. Multiplying, not selecting, keeps a NaN row's probabilities NaN.
inline void dropout_tile_row(const FlashArgs& a, std::uint64_t key, float* p, i64 t0, i64 c_lo, i64 c_hi) {
  float w[kNt];
  dropout_row(key, t0 + c_lo, c_hi - c_lo, a.dropout_t, a.dropout_rs, w);
  for (i64 c = c_lo; c < c_hi; ++c) p[c] *= w[c - c_lo];
}

// Q·Kᵀ micro-kernel: scores of kRows queries against NQ·L keys starting at column c0.
//   q  [kRows][ldq]  (scaled queries)      kt [D][kNt] (transposed K tile)
//   s  [kRows][kNt]  written at columns [c0, c0 + NQ·L)
// The kRows × NQ accumulators stay in registers for the whole D loop. Out of line (as pv_block):
// with 28 of the 32 zmm live, inlined into forward()'s body the register allocator spilled
// accumulators of one micro-kernel or the other to the stack, a load and a store per FMA.
// With cap (softcap), the scores are stored capped (score_mod.hpp; cap->kz = softcap_kz(c2)): the cap
// runs on the accumulators in registers, once per score, before anything else touches them.
template <class S, int NQ>
__attribute__((noinline)) void qk_block(const float* q, i64 ldq, const float* kt, i64 D, float* s, int c0, const SoftcapK<S>* cap) {
  constexpr int L = S::L;
  typename S::V acc[kRows][NQ];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NQ; ++c) acc[r][c] = S::zero();
  for (i64 d = 0; d < D; ++d) {
    typename S::V kv[NQ];
#pragma GCC unroll 8
    for (int c = 0; c < NQ; ++c) kv[c] = S::loadu(kt + d * kNt + c0 + c * L);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const auto qb = S::set1(q[r * ldq + d]);
#pragma GCC unroll 8
      for (int c = 0; c < NQ; ++c) acc[r][c] = S::fmadd(qb, kv[c], acc[r][c]);
    }
  }
  if (cap) {
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < NQ; ++c) acc[r][c] = softcap_v<S>(acc[r][c], *cap);
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NQ; ++c) S::storeu(s + r * kNt + c0 + c * L, acc[r][c]);
}

// P·V micro-kernel: o[r][e0, e0 + NV·L) += Σ_{j ∈ [j0, j1)} p[r][j] · v[j][e0, e0 + NV·L), the sum
// in increasing j from +0, added to o after the loop. o is read after the loop rather than before
// it: the loop's first multiply-adds do not wait for o (the forward's accumulators, 48–96 KiB a
// block, live in L2), and its loads issue while the loop still runs.
//   p [kRows][kNt]    v rows j at v + j·ldv    o [kRows][ldo]
template <class S, int NV>
__attribute__((noinline)) void pv_block(const float* p, const float* v, i64 ldv, i64 j0, i64 j1, float* o, i64 ldo, i64 e0) {
  constexpr int L = S::L;
  typename S::V acc[kRows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) acc[r][c] = S::zero();
  for (i64 j = j0; j < j1; ++j) {
    typename S::V vv[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) vv[c] = S::loadu(v + j * ldv + e0 + c * L);
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r) {
      const auto pb = S::set1(p[r * kNt + j]);
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) acc[r][c] = S::fmadd(pb, vv[c], acc[r][c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) S::storeu(o + r * ldo + e0 + c * L, S::add(S::loadu(o + r * ldo + e0 + c * L), acc[r][c]));
}

// qk_block over nv ≤ N vectors of keys: the widest instantiation that is not wider than needed.
template <class S, int N>
inline void qk_narrow(int nv, const float* q, i64 ldq, const float* kt, i64 D, float* s, int c0, const SoftcapK<S>* cap) {
  if constexpr (N > 1) {
    if (nv < N) {
      qk_narrow<S, N - 1>(nv, q, ldq, kt, D, s, c0, cap);
      return;
    }
  }
  qk_block<S, N>(q, ldq, kt, D, s, c0, cap);
}

}  // namespace
}  // namespace qkv::kernels::cpu
