// The body of the fast forward kernels, written once over a SIMD interface S (simd_*.hpp) and
// compiled by each ISA translation unit with its own flags. Everything here has internal
// linkage (anonymous namespace, no std:: templates): see simd_common.hpp for why.
//
// Dimension legend: B batch, H query heads, Hkv kv heads, G = H / Hkv, Sq / Skv positions,
// D query/key head dim, Dv value head dim. Scores live in log2 units: s = q·k · scale · log2(e),
// so softmax uses exp2 and lse = ln 2 · (m + log2 l).
//
// flash_forward — one work item per (b, h, query block of kMb rows), handed out dynamically:
//   load the block's queries (scaled) into Qs; for every K/V tile of kNt keys the block may
//   attend: transpose K into Kt, then for every 6-row strip that may attend the tile:
//     Q·Kᵀ micro-kernel (6 × NQ·L register block) → scores Ps
//     mask (only on tiles the causal/window/padding rule cuts, or with a dense mask)
//     online softmax: running max m (raised lazily), running sum l, accumulators rescaled
//     P·V micro-kernel (6 × 2L register block) into the accumulators Os
//   then out = Os / l, lse = ln 2 · (m + log2 l). Tiles and strips the rule removes entirely
//   are never computed, so causal costs about half.
// flash_decode — keys cut into fixed chunks of kSplit; one work item per (b, kv head, group of
//   ≤ kDecRows query rows of that kv head, chunk), computing partial (O, m, l); a second pass
//   merges the chunks of each row by logsumexp. For few queries this keeps every core busy and
//   reads each key once for all the query heads that share it (GQA).
// Both are deterministic: a row's result depends only on the shape, never on the thread count.
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
constexpr int kDecRows = 8;   // query rows per decode item (heads of one GQA group × Sq)
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
// back with size 0 never fits a lease again, so every call allocated and faulted in fresh
// scratch. Fixed, at B = 1, H = 16, S = 512, D = 64: forward entry to the end of its leases
// 29–40 µs → under 1 µs (one thread), page faults per call 16.4 → 0 (two threads, perf stat
// over 100 calls). Test Flash.ScratchReusedAcrossCalls.
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
inline i64 row_diag(const FlashArgs& a, i64 i, i64 key_len) { return i + a.diag_offset + (a.diag_from_key_len ? key_len : 0); }

// Allowed keys [lo, hi) of query row i (see KeyRange in params.hpp); empty → lo = hi = 0.
inline void key_range(const FlashArgs& a, i64 i, i64 key_len, i64* lo, i64* hi) {
  const i64 diag = row_diag(a, i, key_len);
  i64 l = 0, h = key_len;
  if (a.window_left >= 0) l = imax(l, diag - a.window_left);
  if (a.causal) h = imin(h, diag + 1);
  if (a.window_right >= 0) h = imin(h, diag + a.window_right + 1);
  if (h <= l) l = h = 0;
  *lo = l;
  *hi = h;
}

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

// Masks one row of tile scores s[cb, ce) for keys t0 + c: −∞ outside [lo, hi), and the dense
// mask applied inside (bool: deny → −∞; additive: −∞ → −∞, else + mask · log2 e). Masked keys
// are overwritten, never added to: a NaN in a masked key's K does not reach the row. moff: offset of the mask
// element (b, h, i, 0). [cb, ce): the columns the strip computed (the caller reads no others).
inline void mask_row(const FlashArgs& a, float* s, i64 t0, i64 lo, i64 hi, i64 moff, i64 cb, i64 ce) {
  const i64 c_lo = imin(imax(lo - t0, cb), ce), c_hi = imax(imin(hi - t0, ce), c_lo);
  for (i64 c = cb; c < c_lo; ++c) s[c] = kNegInf;
  for (i64 c = c_hi; c < ce; ++c) s[c] = kNegInf;
  if (a.mask_kind == MaskKind::none) return;
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

// One row's scores s[cb, ce) in qkv/attention.hpp's order: softcap (score_mod.hpp), mask_row
// (the rule's range [lo, hi) and the dense mask: masked keys become −∞ after the cap, so they stay
// masked), then ALiBi. slope2: the head's slope · log2 e (ignored without ALiBi); moff as mask_row.
template <class S>
inline void mask_mod_row(const FlashArgs& a, float* s, i64 t0, i64 lo, i64 hi, i64 moff, i64 diag, float slope2,
                         int cb, int ce) {
  if (a.softcap_log2 > 0.0f) softcap_row<S>(s, cb, ce, a.softcap_log2);
  mask_row(a, s, t0, lo, hi, moff, cb, ce);
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
// The kRows × NQ accumulators stay in registers for the whole D loop.
template <class S, int NQ>
inline void qk_block(const float* q, i64 ldq, const float* kt, i64 D, float* s, int c0) {
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
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NQ; ++c) S::storeu(s + r * kNt + c0 + c * L, acc[r][c]);
}

// P·V micro-kernel: o[r][e0, e0 + NV·L) += Σ_{j ∈ [j0, j1)} p[r][j] · v[j][e0, e0 + NV·L).
//   p [kRows][kNt]    v rows j at v + j·ldv    o [kRows][ldo]
template <class S, int NV>
inline void pv_block(const float* p, const float* v, i64 ldv, i64 j0, i64 j1, float* o, i64 ldo, i64 e0) {
  constexpr int L = S::L;
  typename S::V acc[kRows][NV];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) acc[r][c] = S::loadu(o + r * ldo + e0 + c * L);
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
    for (int c = 0; c < NV; ++c) S::storeu(o + r * ldo + e0 + c * L, acc[r][c]);
}

// qk_block over nv ≤ N vectors of keys: the widest instantiation that is not wider than needed.
template <class S, int N>
inline void qk_narrow(int nv, const float* q, i64 ldq, const float* kt, i64 D, float* s, int c0) {
  if constexpr (N > 1) {
    if (nv < N) {
      qk_narrow<S, N - 1>(nv, q, ldq, kt, D, s, c0);
      return;
    }
  }
  qk_block<S, N>(q, ldq, kt, D, s, c0);
}

// Register blocking per ISA: NQ vectors of keys in Q·Kᵀ (NQ·L divides kNt), NV vectors of
// value columns in P·V. AVX-512: 6×4 + 4 = 28 zmm and 6×2 + 2 = 14 zmm; AVX2 (16 ymm): 6×2 + 2.
template <class S>
struct Blocking {
  static constexpr int NQ = S::L >= 16 ? 4 : 2;
  static constexpr int NV = 2;
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
  void qk(int r0, float* Ps, i64 c_lo, i64 c_hi) const {
    constexpr int L = S::L;
    for (int c0 = 0; c0 < kNt; c0 += kQc) {
      if (c0 >= c_hi || c0 + kQc <= c_lo) continue;
      const int v0 = static_cast<int>(imax(c_lo - c0, 0)) / L;
      const int v1 = static_cast<int>((imin(c_hi - c0, kQc) + L - 1) / L);
      qk_narrow<S, Blocking<S>::NQ>(v1 - v0, Qs + r0 * D, D, Kt, D, Ps, c0 + v0 * L);
    }
  }
  // o[kRows][Dvp] += P[:, c_lo:c_hi] · V[c_lo:c_hi, :]
  void pv(const float* Ps, i64 c_lo, i64 c_hi, float* o) const {
    for (i64 e0 = 0; e0 < Dvp; e0 += kVc) pv_block<S, Blocking<S>::NV>(Ps, vt, ldv, c_lo, c_hi, o, Dvp, e0);
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
  //   Ps [kRows][kNt] one strip's scores, then probabilities
  //   then the operands' own scratch (Ops::scratch_floats: queries, K and V tiles)
  const i64 n_os = round_up(kMb * Dvp, 16);
  const i64 arena = per_thread_floats(n_os + kMb + kMb * S::L + kRows * kNt + ops_floats);
  Scratch mem(threads * arena * static_cast<i64>(sizeof(float)));

  // One item needs no team (waking another thread costs microseconds). The items are handed out
  // one at a time from next_item (a dynamic schedule); thread t works in arena t.
  std::atomic<i64> next_item{0};
  run_shared(items > 1 ? threads : 1, [&](int t) {
    float* Os = mem.f() + t * arena;
    float* Ms = Os + n_os;
    float* Ls = Ms + kMb;
    float* Ps = Ls + kMb * S::L;
    i64 lo[kMb], hi[kMb];                    // allowed keys of each row ([0, 0) for rows past Sq)
    i64 slo[kMb / kRows], shi[kMb / kRows];  // union of the ranges of each strip
    std::uint64_t dkey[kMb];                 // dropout_row_key of each row, when a.dropout

    for (i64 item; (item = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      i64 c0 = 0, c1 = n;  // the call owning this item: plan[c0].first ≤ item < plan[c0 + 1].first
      while (c1 - c0 > 1) {
        const i64 mid = (c0 + c1) / 2;
        (plan[mid].first <= item ? c0 : c1) = mid;
      }
      const FlashArgs& a = list[c0];
      Ops ops(a, Ps + kRows * kNt);
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
      const bool mods = a.softcap_log2 > 0.0f || a.alibi;
      const float slope2 = a.alibi ? static_cast<float>(a.alibi[h] * kLog2e) : 0.0f;

      i64 blo = a.Skv, bhi = 0;  // union over the block
      for (int s = 0; s < nstrips; ++s) {
        slo[s] = a.Skv, shi[s] = 0;
        for (int r = s * kRows; r < (s + 1) * kRows; ++r) {
          if (r < nrows) key_range(a, i0 + r, klen, &lo[r], &hi[r]);
          else lo[r] = hi[r] = 0;
          if (hi[r] > lo[r]) slo[s] = imin(slo[s], lo[r]), shi[s] = imax(shi[s], hi[r]);
        }
        blo = imin(blo, slo[s]), bhi = imax(bhi, shi[s]);
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
      const i64 t_first = blo / kNt * kNt;
      const bool out_rows = a.so[3] == 1;                   // output rows contiguous (pf_row_w)
      for (i64 t0 = t_first; t0 < bhi; t0 += kNt) {
        // Keys of this tile that some row of the block may attend: only those are read.
        ops.load_kv(kbase, vbase, t0, imax(t0, blo), imin(t0 + kNt, bhi));
        // The next tile's K and V rows [n0, n1) are prefetched into L2 (pf_row) while this tile
        // is computed, `per` keys before each strip: at S ≥ 8192 a head's K and V (4–8 MB) come
        // from beyond L2, and load_kv would otherwise wait on each line of the tile in turn.
        const i64 n0 = t0 + kNt, n1 = imin(n0 + kNt, bhi);
        const i64 per = (kNt + nstrips - 1) / nstrips;
        for (int s = 0; s < nstrips; ++s) {
          if (prefetch)
            for (i64 j = n0 + s * per; j < imin(n0 + (s + 1) * per, n1); ++j) {
              pf_row(static_cast<const char*>(a.k) + esz * (kbase + j * a.sk[2]), esz * a.D);
              pf_row(static_cast<const char*>(a.v) + esz * (vbase + j * a.sv[2]), esz * a.Dv);
            }
          // In the last tile: the strip's output rows, written by store_row once the tile is done.
          if (out_rows && n0 >= bhi)
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
          if (slo[s] >= t0 + kNt || shi[s] <= t0) continue;  // the rule removes the whole strip
          const i64 c_lo = imax(slo[s], t0) - t0, c_hi = imin(shi[s], t0 + kNt) - t0;
          ops.qk(r0, Ps, c_lo, c_hi);
          // Score variants go through the masked path: one pass per row over the computed columns.
          bool cut = a.mask_kind != MaskKind::none || mods;
          for (int r = r0; r < r0 + kRows; ++r) cut = cut || lo[r] > t0 || hi[r] < t0 + kNt;
          if (!cut) {
            for (int r = 0; r < kRows; ++r)
              softmax_row<S>(Ps + r * kNt, &Ms[r0 + r], Ls + (r0 + r) * S::L, Os + (r0 + r) * Dvp, Dvp);
          } else {
            // Masked and normalised over the vectors Q·Kᵀ computed, [cb, ce) ⊇ [c_lo, c_hi), not
            // the whole tile: on the causal diagonal a strip sees on average half of it (same
            // bits; ≈ 5 % on short causal rows).
            const int cb = static_cast<int>(c_lo / S::L * S::L), ce = static_cast<int>(round_up(c_hi, S::L));
            for (int r = 0; r < kRows; ++r) {
              const i64 row = r0 + r;
              const i64 moff = b * a.smask[0] + h * a.smask[1] + (i0 + row) * a.smask[2];
              if (mods) mask_mod_row<S>(a, Ps + r * kNt, t0, lo[row], hi[row], moff, row_diag(a, i0 + row, klen), slope2, cb, ce);
              else mask_row(a, Ps + r * kNt, t0, lo[row], hi[row], moff, cb, ce);
              softmax_row<S>(Ps + r * kNt, &Ms[row], Ls + row * S::L, Os + row * Dvp, Dvp, cb, ce);
            }
          }
          if (a.dropout)
            for (int r = r0; r < imin(r0 + kRows, nrows); ++r) dropout_tile_row(a, dkey[r], Ps + (r - r0) * kNt, t0, c_lo, c_hi);
          ops.pv(Ps, c_lo, c_hi, Os + r0 * Dvp);
        }
      }
      for (int r = 0; r < nrows; ++r)
        store_row<S>(a, b, h, i0 + r, Os + r * Dvp, Ms[r], S::hsum(S::loadu(Ls + r * S::L)));
    }
  });
}

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
// With pf: for each key c < pf_end, the row of pf_bytes at pf + c·pf_ld is prefetched (pf_row).
template <class S, int R, int NV>
inline void dec_pv_block(const float* p, const float* v, i64 ldv, i64 c_lo, i64 c_hi, float* o, i64 Dvp, i64 e0,
                         const char* pf = nullptr, i64 pf_ld = 0, i64 pf_end = 0, i64 pf_bytes = 0) {
  constexpr int L = S::L;
  typename S::V acc[R][NV];
#pragma GCC unroll 2
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int x = 0; x < NV; ++x) acc[r][x] = S::loadu(o + r * Dvp + e0 + x * L);
  for (i64 c = c_lo; c < c_hi; ++c) {
    if (pf && c < pf_end) pf_row(pf + c * pf_ld, pf_bytes);
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
                   const char* pf = nullptr, i64 pf_ld = 0, i64 pf_end = 0, i64 pf_bytes = 0) {
  constexpr int L = S::L;
  i64 e0 = 0;
  if constexpr (S::L >= 16) {
    for (; e0 + 8 * L <= Dvp; e0 += 8 * L) {
      dec_pv_block<S, R, 8>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_end, pf_bytes);
      pf = nullptr;
    }
  }
  for (; e0 + 4 * L <= Dvp; e0 += 4 * L) {
    dec_pv_block<S, R, 4>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_end, pf_bytes);
    pf = nullptr;
  }
  for (; e0 < Dvp; e0 += L) {
    dec_pv_block<S, R, 1>(p, v, ldv, c_lo, c_hi, o, Dvp, e0, pf, pf_ld, pf_end, pf_bytes);
    pf = nullptr;
  }
}

// The tile operations of decode for f32: none, decode() computes scores and P·V itself
// (flash_avx512bf16.cpp supplies a policy for bf16 K and V read in place). A policy offers:
//   scratch_floats(a)   its per-thread scratch; takes_k(a) / takes_v(a): whether it computes the
//                       scores (from K) / the P·V (from V) of this call
//   load_q(r, off)      query row r of the item from q + off
//   scores(nr, kbase, vbase, t0, j_lo, j_hi, j_end, Ps)  Ps[r][j − t0] ← q_r·k_j · scale · log2 e
//                       for keys j ∈ [j_lo, j_hi) of the tile at t0, rows [0, nr); the other
//                       columns finite. Keys [j_hi, j_end) come next in this item (prefetching).
//   pv(nr, Ps, vbase, t0, j_lo, j_hi, Od, Dvp)  Od[r][0, Dvp) += Σ_{j ∈ [j_lo, j_hi)} Ps[r][j − t0] v_j
struct DecodeOpsF32 {
  static constexpr bool kEnabled = false;
  static i64 scratch_floats(const FlashArgs&) { return 0; }
  static bool takes_k(const FlashArgs&) { return false; }
  static bool takes_v(const FlashArgs&) { return false; }
  DecodeOpsF32(const FlashArgs&, float*) {}
  void load_q(int, i64) {}
  void scores(int, i64, i64, i64, i64, i64, i64, float*) const {}
  void pv(int, const float*, i64, i64, i64, i64, float*, i64) {}
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
  const i64 items = a.B * a.Hkv * ngroups * nsplit;
  const bool k_in_place = !a.bf16 && a.sk[3] == 1 && D % L == 0;
  const bool ops_k = Ops::kEnabled && Ops::takes_k(a);  // scores by the policy
  const bool ops_v = Ops::kEnabled && Ops::takes_v(a);  // P·V by the policy
  const bool v_in_place = !a.bf16 && a.sv[3] == 1 && Dv % L == 0;
  // Software prefetch of the K and V streams (pf_row) where rows are contiguous and this code
  // reads both: it lifts long-context decode from ≈ 70 % to 85–100 % of the read bandwidth.
  const bool prefetch = !ops_k && !ops_v && a.sk[3] == 1 && a.sv[3] == 1;
  const i64 esz = a.bf16 ? 2 : 4;  // bytes per K/V element

  // Partial results, indexed by (row = (b·Hkv + hk)·GS + r, chunk):
  //   Op [rows][nsplit][Dvp] unnormalised accumulators, Mp / Lp [rows][nsplit] max and sum.
  Scratch part_o(rows_total * nsplit * Dvp * 4), part_m(rows_total * nsplit * 4), part_l(rows_total * nsplit * 4);
  float* Op = part_o.f();
  float* Mp = part_m.f();
  float* Lp = part_l.f();

  // Per-thread scratch: Qd [kDecRows][Dp] scaled queries, Od [kDecRows][Dvp] accumulators,
  // Kr [Dp] one key row as f32 when not read in place, Vs [kNt][Dvp] the V tile as f32 when not
  // read in place, Ps [kDecRows][kNt].
  // Then the policy's own scratch (Ops::scratch_floats).
  // One block of the pool for all threads, thread t at t · arena.
  const i64 arena = per_thread_floats(kDecRows * Dp + kDecRows * Dvp + Dp + kNt * Dvp + kDecRows * kNt + Ops::scratch_floats(a));
  Scratch mem(a.threads * arena * 4);
  // Items one at a time from next_item (a dynamic schedule); thread t works in arena t.
  std::atomic<i64> next_item{0};
  run_shared(items > 1 ? a.threads : 1, [&](int t) {
    float* Qd = mem.f() + t * arena;
    float* Od = Qd + kDecRows * Dp;
    float* Kr = Od + kDecRows * Dvp;
    float* Vs = Kr + Dp;
    float* Ps = Vs + kNt * Dvp;
    Ops ops(a, Ps + kDecRows * kNt);
    for (i64 d = D; d < Dp; ++d) Kr[d] = 0.0f;
    i64 lo[kDecRows], hi[kDecRows], hs[kDecRows], is[kDecRows];
    std::uint64_t dkey[kDecRows];  // dropout_row_key of each row, when a.dropout
    float Md[kDecRows], Ld[kDecRows * L];  // Ld: lane-wise running sums (softmax_row)

    for (i64 item; (item = next_item.fetch_add(1, std::memory_order_relaxed)) < items;) {
      const i64 sp = item % nsplit, g = (item / nsplit) % ngroups, hk = (item / (nsplit * ngroups)) % a.Hkv;
      const i64 b = item / (nsplit * ngroups * a.Hkv);
      const i64 k0 = sp * split, k1 = imin(a.Skv, k0 + split);
      const int nr = static_cast<int>(imin(kDecRows, GS - g * kDecRows));
      const i64 klen = a.key_len[b];
      i64 ulo = k1, uhi = k0;
      for (int r = 0; r < nr; ++r) {
        const i64 gr = g * kDecRows + r;
        hs[r] = hk * G + gr / a.Sq, is[r] = gr % a.Sq;
        if (a.dropout) dkey[r] = dropout_row_key(a.dropout_seed, a.dropout_offset, a.dropout_b0 + b, hs[r], is[r]);
        key_range(a, is[r], klen, &lo[r], &hi[r]);
        if (hi[r] > lo[r] && lo[r] < k1 && hi[r] > k0) ulo = imin(ulo, imax(lo[r], k0)), uhi = imax(uhi, imin(hi[r], k1));
        const i64 qoff = b * a.sq[0] + hs[r] * a.sq[1] + is[r] * a.sq[2];
        if (ops_k) ops.load_q(r, qoff);
        else load_row(a, a.q, qoff, a.sq[3], D, a.scale_log2, Qd + r * Dp);
        for (i64 d = D; d < Dp; ++d) Qd[r * Dp + d] = 0.0f;
        std::memset(Od + r * Dvp, 0, sizeof(float) * static_cast<std::size_t>(Dvp));
        Md[r] = kNegInf;
        S::storeu(Ld + r * L, S::zero());
      }
      const i64 kbase = b * a.sk[0] + hk * a.sk[1];
      const i64 vbase = b * a.sv[0] + hk * a.sv[1];
      for (i64 t0 = ulo / kNt * kNt; t0 < uhi; t0 += kNt) {
        const i64 j_lo = imax(t0, ulo), j_hi = imin(t0 + kNt, uhi);
        if (ops_k) ops.scores(nr, kbase, vbase, t0, j_lo, j_hi, uhi, Ps);
        for (i64 j = ops_k ? j_hi : j_lo; j < j_hi; ++j) {
          if (prefetch) pf_row(static_cast<const char*>(a.v) + esz * (vbase + j * a.sv[2]), esz * Dv);
          const float* kp;
          if (k_in_place) {
            kp = static_cast<const float*>(a.k) + kbase + j * a.sk[2];
          } else {
            if (a.bf16 && a.sk[3] == 1) widen_row<S>(static_cast<const std::uint16_t*>(a.k) + kbase + j * a.sk[2], D, Kr);
            else load_row(a, a.k, kbase + j * a.sk[2], a.sk[3], D, 1.0f, Kr);
            kp = Kr;
          }
          int r = 0;
          for (; r + 2 <= nr; r += 2)
            dot2<S>(Qd + r * Dp, Qd + (r + 1) * Dp, kp, Dp, &Ps[r * kNt + (j - t0)], &Ps[(r + 1) * kNt + (j - t0)]);
          if (r < nr) Ps[r * kNt + (j - t0)] = dot<S>(Qd + r * Dp, kp, Dp);
        }
        for (int r = 0; r < nr; ++r) {
          // The chunk bounds cut like the rule does: keys outside [k0, k1) are not this item's.
          const i64 rlo = imax(lo[r], imax(k0, j_lo)), rhi = imin(hi[r], imin(k1, j_hi));
          const i64 moff = b * a.smask[0] + hs[r] * a.smask[1] + is[r] * a.smask[2];
          if (a.softcap_log2 > 0.0f || a.alibi)
            mask_mod_row<S>(a, Ps + r * kNt, t0, rlo, imax(rhi, rlo), moff, row_diag(a, is[r], klen),
                            a.alibi ? static_cast<float>(a.alibi[hs[r]] * kLog2e) : 0.0f, 0, kNt);
          else
            mask_row(a, Ps + r * kNt, t0, rlo, imax(rhi, rlo), moff, 0, kNt);
          softmax_row<S>(Ps + r * kNt, &Md[r], Ld + r * L, Od + r * Dvp, Dvp);
          if (a.dropout) dropout_tile_row(a, dkey[r], Ps + r * kNt, t0, j_lo - t0, j_hi - t0);
        }
        if (ops_v) {
          ops.pv(nr, Ps, vbase, t0, j_lo, j_hi, Od, Dvp);
          continue;
        }
        // The tile's V rows [j_lo, j_hi) as f32 rows c = j − t0 of vt (in place, or converted into Vs).
        const float* vt = Vs;
        i64 ldv = Dvp;
        if (v_in_place) {
          vt = static_cast<const float*>(a.v) + vbase + t0 * a.sv[2];
          ldv = a.sv[2];
        } else {
          for (i64 j = j_lo; j < j_hi; ++j) {
            float* row = Vs + (j - t0) * Dvp;
            if (a.bf16 && a.sv[3] == 1) {
              widen_row<S>(static_cast<const std::uint16_t*>(a.v) + vbase + j * a.sv[2], Dv, row);
            } else {
              load_row(a, a.v, vbase + j * a.sv[2], a.sv[3], Dv, 1.0f, row);
              for (i64 e = Dv; e < Dvp; ++e) row[e] = 0.0f;
            }
          }
        }
        // While P·V reads this tile's V rows: the next tile's K rows, those this item scores.
        const char* pf = prefetch ? static_cast<const char*>(a.k) + esz * (kbase + (t0 + kNt) * a.sk[2]) : nullptr;
        const i64 pf_ld = esz * a.sk[2], pf_end = uhi - t0 - kNt, pf_bytes = esz * D;
        int r = 0;
        for (; r + 2 <= nr; r += 2) {
          dec_pv<S, 2>(Ps + r * kNt, vt, ldv, j_lo - t0, j_hi - t0, Od + r * Dvp, Dvp, pf, pf_ld, pf_end, pf_bytes);
          pf = nullptr;
        }
        if (r < nr) dec_pv<S, 1>(Ps + r * kNt, vt, ldv, j_lo - t0, j_hi - t0, Od + r * Dvp, Dvp, pf, pf_ld, pf_end, pf_bytes);
      }
      for (int r = 0; r < nr; ++r) {
        const i64 row = (b * a.Hkv + hk) * GS + g * kDecRows + r;
        std::memcpy(Op + (row * nsplit + sp) * Dvp, Od + r * Dvp, sizeof(float) * static_cast<std::size_t>(Dvp));
        Mp[row * nsplit + sp] = Md[r];
        Lp[row * nsplit + sp] = S::hsum(S::loadu(Ld + r * L));
      }
    }
  });

  // Merge the chunks of each row: M = max m_s, l = Σ l_s 2^(m_s − M), O = Σ O_s 2^(m_s − M),
  // over the chunks that saw a key (l_s ≠ 0), once every chunk is done (the end of the run_shared
  // above). A NaN chunk (l_s = NaN, see softmax_row) makes l NaN, and with it the row.
  std::atomic<i64> next_row{0};
  run_shared(rows_total > 1 ? a.threads : 1, [&](int t) {
    float* acc = mem.f() + t * arena + kDecRows * Dp;  // thread t's Od, reused: [Dvp]
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
