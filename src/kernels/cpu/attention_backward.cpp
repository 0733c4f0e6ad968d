// The fast attention backward: the portable driver. It converts what the per-ISA tile loops need
// into f32 (prepass), runs one task per (b, hk, key chunk) on per-thread scratch, and sums the
// per-chunk dQ partials in a fixed order (reduce). See attention_backward.hpp for the algorithm.
#include "kernels/cpu/attention_backward.hpp"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "core/scratch.hpp"
#include "kernels/dropout.hpp"
#include "qkv/memory.hpp"

namespace qkv::kernels {
namespace bwd {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kInf = std::numeric_limits<float>::infinity();

// An uninitialised, 64-byte aligned float array leased from the scratch pool (core/scratch.hpp),
// so that the next call of a similar shape finds its work copies' pages mapped instead of
// faulting in fresh MiBs. Lease on the calling thread, outside parallel regions.
struct Floats {
  void* p = nullptr;
  std::size_t size = 0;
  explicit Floats(std::int64_t n) {
    p = scratch_lease(static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float), &size);
  }
  ~Floats() { scratch_return(p, size); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  float* get() const { return static_cast<float*>(p); }
};

// dst[e] = t[off + e·stride] for e < n, converted to f32.
void load_row(const View& t, std::int64_t off, std::int64_t stride, std::int64_t n, float* dst) {
  switch (t.dtype) {
    case DType::f32: {
      const float* s = t.ptr<float>() + off;
      if (stride == 1)
        std::memcpy(dst, s, static_cast<std::size_t>(n) * sizeof(float));
      else
        for (std::int64_t e = 0; e < n; ++e) dst[e] = s[e * stride];
      return;
    }
    case DType::bf16: {
      const std::uint16_t* s = t.ptr<std::uint16_t>() + off;
      for (std::int64_t e = 0; e < n; ++e) dst[e] = bf16_to_f32(s[e * stride]);
      return;
    }
    default:
      for (std::int64_t e = 0; e < n; ++e) dst[e] = static_cast<float>(t.load(off + e * stride));
  }
}

// t[off + e·stride] = src[e] for e < n, rounded to t's dtype.
void store_row(const View& t, std::int64_t off, std::int64_t stride, std::int64_t n, const float* src) {
  switch (t.dtype) {
    case DType::f32: {
      float* d = t.ptr<float>() + off;
      if (stride == 1)
        std::memcpy(d, src, static_cast<std::size_t>(n) * sizeof(float));
      else
        for (std::int64_t e = 0; e < n; ++e) d[e * stride] = src[e];
      return;
    }
    case DType::bf16: {
      std::uint16_t* d = t.ptr<std::uint16_t>() + off;
      for (std::int64_t e = 0; e < n; ++e) d[e * stride] = f32_to_bf16(src[e]);
      return;
    }
    default:
      for (std::int64_t e = 0; e < n; ++e) t.store(off + e * stride, src[e]);
  }
}

// A [B, H, Sq, n] tensor's rows usable in place: f32, unit inner stride, n a multiple of 16
// (so the padded row is the row itself).
bool usable_in_place(const View& t, std::int64_t n) {
  return t.dtype == DType::f32 && (t.stride(3) == 1 || n == 1) && n % 16 == 0;
}

// Tasks to aim for: several per thread on a 2-core machine, so that largest-first dynamic
// scheduling ends within a small task of balance, while the dQ partials stay few (each chunk
// beyond the first costs a dq-sized f32 buffer: fresh pages to fault in, and a reduction).
constexpr std::int64_t kTargetTasks = 16;
constexpr std::int64_t kMinTasks = 8;  // 4 per thread on 2 cores, where memory asks for fewer

// Query blocks of batch b whose allowed keys meet [k0, k0 + nk) (the tasks' skip test).
std::int64_t live_query_blocks(const AttnParams& p, std::int64_t b, std::int64_t k0, std::int64_t nk) {
  std::int64_t n = 0;
  for (std::int64_t i0 = 0; i0 < p.Sq; i0 += kBq) {
    const std::int64_t i1 = std::min(i0 + kBq, p.Sq) - 1;
    std::int64_t lo_first, hi_first, lo_last, hi_last;
    p.rule.range(i0, p.key_len[static_cast<std::size_t>(b)], &lo_first, &hi_first);
    p.rule.range(i1, p.key_len[static_cast<std::size_t>(b)], &lo_last, &hi_last);
    if (std::max(lo_first, k0) < std::min(hi_last, k0 + nk)) ++n;
  }
  return n;
}

}  // namespace

std::int64_t arena_size(std::int64_t D, std::int64_t Dv) {
  const std::int64_t Dp = pad16(D), Dvp = pad16(Dv);
  return kBk * Dp + kBk * Dvp + 3 * kBq * kBk + kBk + std::max(ops_f32_floats(D, Dv), ops_bf16_floats(D, Dv));
}

// x, or 0 for NaN and ±∞. Kr is the K operand of dQ += dS·K only: there a key with dS = 0 (masked
// for the row) must add 0 even if its K is not finite, not 0·NaN = NaN. Rows that do attend such
// a key are NaN rows (qkv/attention.hpp), whose dS is NaN already. (KT, for the scores, keeps K.)
inline float finite_or_zero(float x) { return x - x == 0.0f ? x : 0.0f; }
// The same on bf16 bits (exponent all ones: ±∞ or NaN).
inline std::uint16_t finite_or_zero_bf16(std::uint16_t x) { return (x & 0x7f80u) == 0x7f80u ? 0 : x; }

void pack_kv_block(const Context& cx, std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk, float* KT,
                   float* Kr, float* VT) {
  const View& k = cx.p->fwd.k;
  const View& v = cx.p->fwd.v;
  const std::int64_t D = cx.D, Dv = cx.Dv, Dp = cx.Dp;
  std::memset(KT, 0, static_cast<std::size_t>(D * kBk) * sizeof(float));
  std::memset(VT, 0, static_cast<std::size_t>(Dv * kBk) * sizeof(float));
  std::memset(Kr, 0, static_cast<std::size_t>(kBk * Dp) * sizeof(float));
  if (k.dtype == DType::f32 && v.dtype == DType::f32 && k.stride(3) == 1 && v.stride(3) == 1) {
    // The common case, read in place rather than through load_row: no memcpy call per row and
    // no row buffer (qkv train, D = 32: memcpy + packing 5.2% → 4.6% of the CPU time, perf).
    // K/V rows are strided (qkv train: q | k | v side by side, 1.5 KB apart) and a block is too
    // short for the hardware prefetcher to lock on, so rows kAhead keys ahead are prefetched (the
    // loads were the loop's time; 8 was tried and cut packing from ≈ 3% to ≈ 2.2%, not tuned further).
    constexpr std::int64_t kAhead = 8;
    for (std::int64_t j = 0; j < nk; ++j) {
      const float* ks = k.ptr<float>() + k.offset(b, hk, k0 + j, 0);
      const float* vs = v.ptr<float>() + v.offset(b, hk, k0 + j, 0);
      if (j + kAhead < nk)
        for (std::int64_t d = 0; d < D; d += 16) {
          __builtin_prefetch(ks + kAhead * k.stride(2) + d);
          __builtin_prefetch(vs + kAhead * v.stride(2) + d);
        }
      float* kr = Kr + j * Dp;
      for (std::int64_t d = 0; d < D; ++d) KT[d * kBk + j] = ks[d], kr[d] = finite_or_zero(ks[d]);
      for (std::int64_t e = 0; e < Dv; ++e) VT[e * kBk + j] = vs[e];
    }
    return;
  }
  float vrow[256];
  for (std::int64_t j = 0; j < nk; ++j) {
    float* kr = Kr + j * Dp;
    load_row(k, k.offset(b, hk, k0 + j, 0), k.stride(3), D, kr);
    for (std::int64_t d = 0; d < D; ++d) KT[d * kBk + j] = kr[d], kr[d] = finite_or_zero(kr[d]);
    load_row(v, v.offset(b, hk, k0 + j, 0), v.stride(3), Dv, vrow);
    for (std::int64_t e = 0; e < Dv; ++e) VT[e * kBk + j] = vrow[e];
  }
}

void load_mask_row(const Context& cx, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t k0,
                   std::int64_t nk, float* row) {
  const View& m = cx.p->fwd.mask;
  const std::int64_t off = m.offset(b, h, i, k0), st = m.stride(3);
  if (cx.p->fwd.mask_is_bool) {
    const std::uint8_t* s = m.ptr<std::uint8_t>() + off;
    for (std::int64_t j = 0; j < nk; ++j) row[j] = s[j * st] ? 0.0f : -kInf;
  } else {
    load_row(m, off, st, nk, row);
    for (std::int64_t j = 0; j < nk; ++j) row[j] *= kLog2e;
  }
  for (std::int64_t j = nk; j < pad16(nk); ++j) row[j] = -kInf;
}

void store_dkdv_block(const Context& cx, std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk,
                      const float* dK, const float* dV) {
  const View& dk = cx.p->dk;
  const View& dv = cx.p->dv;
  for (std::int64_t j = 0; j < nk; ++j) {
    store_row(dk, dk.offset(b, hk, k0 + j, 0), dk.stride(3), cx.D, dK + j * cx.Dp);
    store_row(dv, dv.offset(b, hk, k0 + j, 0), dv.stride(3), cx.Dv, dV + j * cx.Dvp);
  }
}

}  // namespace bwd

bool attention_backward_flash_supports(const AttnBwdParams& bp, const char** why) {
  const AttnParams& p = bp.fwd;
  if (p.q.dtype != DType::f32 && p.q.dtype != DType::bf16) {
    *why = "dtype must be f32 or bf16";
    return false;
  }
  if (p.D < 1 || p.D > 256 || p.Dv < 1 || p.Dv > 256) {
    *why = "head dims D and Dv must be in 1..256";
    return false;
  }
  return true;
}

void attention_backward_flash(const AttnBwdParams& bp, Isa isa) {
  using namespace bwd;
  const AttnParams& p = bp.fwd;
  Context cx;
  cx.p = &bp;
  cx.B = p.B, cx.H = p.H, cx.Hkv = p.Hkv, cx.Sq = p.Sq, cx.Skv = p.Skv, cx.D = p.D, cx.Dv = p.Dv;
  cx.G = p.Hkv > 0 ? p.group() : 1;
  cx.Dp = pad16(p.D), cx.Dvp = pad16(p.Dv);
  cx.scale = static_cast<float>(p.scale);
  cx.scale_log2e = static_cast<float>(p.scale * 1.4426950408889634);
  cx.rule = p.rule;
  cx.key_len = p.key_len.data();
  cx.has_mask = p.mask.data != nullptr;
  cx.dropout = p.dropout.on();
  cx.dropout_t = dropout_threshold(p.dropout.p);
  cx.dropout_rs = static_cast<float>(1.0 / (1.0 - p.dropout.p));
  cx.softcap_log2 = static_cast<float>(p.softcap * 1.4426950408889634);
  cx.alibi = p.alibi.empty() ? nullptr : p.alibi.data();
  cx.alibi_sb = p.alibi_sb;
  const std::int64_t rows = p.B * p.H * p.Sq;

  // A Q row that is not finite belongs to a NaN row or to a row with no allowed key (lse NaN or
  // −∞: any finite score needs a finite q). Those rows' P comes from L alone (NaN, or 0), so Q
  // is packed with its non-finite values set to 0 (finite_or_zero): as the B operand of
  // dK += dSᵀ·Q, a NaN in it would reach, by 0·NaN, the dk of keys that row masks. Only rows
  // whose lse is not finite are scanned; when none has a non-finite q, Q is read as usual.
  // With sinks a row without allowed keys has lse = its sink, finite: then every row is scanned.
  bool q_sanitize = false;
  for (std::int64_t r = 0; r < rows && !q_sanitize; ++r) {
    const std::int64_t b = r / (p.H * p.Sq), h = r / p.Sq % p.H, i = r % p.Sq;
    if (p.sinks.empty() && std::isfinite(p.lse.load(p.lse.offset(b, h, i)))) continue;
    for (std::int64_t d = 0; d < p.D; ++d) q_sanitize = q_sanitize || !std::isfinite(p.q.load(p.q.offset(b, h, i, d)));
  }

  // Prepass: Q and dO rows as f32 (in place when possible) or, for the bf16 tiles, as bf16 in
  // the two layouts of Context::qb…ob2; delta and L per query row.
  const bool bf16_tiles = isa == Isa::avx512_bf16;
  const bool q_direct = !bf16_tiles && usable_in_place(p.q, p.D) && !q_sanitize;
  const bool o_direct = !bf16_tiles && usable_in_place(bp.dout, p.Dv);
  const bool out_direct = p.out.dtype == DType::f32 && (p.out.stride(3) == 1 || p.Dv == 1);
  const std::int64_t Sq2 = (p.Sq + 1) / 2;
  // bf16 copies: rows of Dp (Dvp) and pair rows of 2·Dp (2·Dvp) bf16, in floats (halves).
  const std::int64_t qb_floats = bf16_tiles ? (rows + p.B * p.H * Sq2 * 2) * cx.Dp / 2 : 0;
  const std::int64_t ob_floats = bf16_tiles ? (rows + p.B * p.H * Sq2 * 2) * cx.Dvp / 2 : 0;
  // Packed Q and dO, L and delta (and the dQ partials below): sized by the caller's shapes, so
  // refused (qkv::OutOfMemory) rather than killed when they cannot fit.
  check_memory("qkv::attention_backward", "work copies of q and dout, lse and delta",
               bytes_of({qb_floats + ob_floats + rows * ((q_direct || bf16_tiles ? 0 : cx.Dp) +
                                                         (o_direct || bf16_tiles ? 0 : cx.Dvp) + 2)},
                        4));
  Floats q_pack(q_direct || bf16_tiles ? 0 : rows * cx.Dp), o_pack(o_direct || bf16_tiles ? 0 : rows * cx.Dvp);
  Floats qb_pack(qb_floats), ob_pack(ob_floats);
  Floats L(rows), delta(rows);
  auto* qb = reinterpret_cast<std::uint16_t*>(qb_pack.get());
  auto* ob = reinterpret_cast<std::uint16_t*>(ob_pack.get());
  if (bf16_tiles) {
    cx.qb = qb, cx.qb2 = qb + rows * cx.Dp;
    cx.ob = ob, cx.ob2 = ob + rows * cx.Dvp;
  } else if (q_direct) {
    cx.q = p.q.ptr<float>(), cx.q_sb = p.q.stride(0), cx.q_sh = p.q.stride(1), cx.q_ld = p.q.stride(2);
  } else {
    cx.q = q_pack.get(), cx.q_sb = p.H * p.Sq * cx.Dp, cx.q_sh = p.Sq * cx.Dp, cx.q_ld = cx.Dp;
  }
  if (o_direct) {
    cx.dout = bp.dout.ptr<float>(), cx.o_sb = bp.dout.stride(0), cx.o_sh = bp.dout.stride(1),
    cx.o_ld = bp.dout.stride(2);
  } else if (!bf16_tiles) {
    cx.dout = o_pack.get(), cx.o_sb = p.H * p.Sq * cx.Dvp, cx.o_sh = p.Sq * cx.Dvp, cx.o_ld = cx.Dvp;
  }
  cx.L = L.get();
  cx.delta = delta.get();
  parallel_for(p.B * p.H, p.threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    std::vector<float> orow(static_cast<std::size_t>(p.Dv)), dorow(static_cast<std::size_t>(cx.Dvp), 0.0f);
    if (bf16_tiles) {  // pair rows: zero padding (past D, Dv, and the row past an odd Sq)
      std::memset(qb + rows * cx.Dp + bh * Sq2 * 2 * cx.Dp, 0, static_cast<std::size_t>(Sq2 * 2 * cx.Dp) * 2);
      std::memset(ob + rows * cx.Dvp + bh * Sq2 * 2 * cx.Dvp, 0, static_cast<std::size_t>(Sq2 * 2 * cx.Dvp) * 2);
    }
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      const std::int64_t r = bh * p.Sq + i;
      if (bf16_tiles) {
        const std::uint16_t* qs = p.q.ptr<std::uint16_t>() + p.q.offset(b, h, i, 0);
        const std::uint16_t* os = bp.dout.ptr<std::uint16_t>() + bp.dout.offset(b, h, i, 0);
        const std::int64_t qst = p.q.stride(3), ost = bp.dout.stride(3);
        std::uint16_t* qrow = qb + r * cx.Dp;
        std::uint16_t* q2 = qb + rows * cx.Dp + ((bh * Sq2 + i / 2) * cx.Dp * 2) + (i & 1);
        for (std::int64_t d = 0; d < p.D; ++d) {
          const std::uint16_t x = q_sanitize ? finite_or_zero_bf16(qs[d * qst]) : qs[d * qst];
          qrow[d] = x, q2[2 * d] = x;
        }
        for (std::int64_t d = p.D; d < cx.Dp; ++d) qrow[d] = 0;
        std::uint16_t* orow_b = ob + r * cx.Dvp;
        std::uint16_t* o2 = ob + rows * cx.Dvp + ((bh * Sq2 + i / 2) * cx.Dvp * 2) + (i & 1);
        for (std::int64_t e = 0; e < p.Dv; ++e) orow_b[e] = o2[2 * e] = os[e * ost];
        for (std::int64_t e = p.Dv; e < cx.Dvp; ++e) orow_b[e] = 0;
      } else if (!q_direct) {
        float* dst = q_pack.get() + r * cx.Dp;
        load_row(p.q, p.q.offset(b, h, i, 0), p.q.stride(3), p.D, dst);
        if (q_sanitize)
          for (std::int64_t d = 0; d < p.D; ++d) dst[d] = finite_or_zero(dst[d]);
        for (std::int64_t d = p.D; d < cx.Dp; ++d) dst[d] = 0.0f;
      }
      // dO and O rows as f32: in place when they are f32 with unit stride (no memcpy call per row).
      const float* dor = dorow.data();
      if (o_direct) {
        dor = bp.dout.ptr<float>() + bp.dout.offset(b, h, i, 0);
      } else {
        load_row(bp.dout, bp.dout.offset(b, h, i, 0), bp.dout.stride(3), p.Dv, dorow.data());
        if (!bf16_tiles)
          std::memcpy(o_pack.get() + r * cx.Dvp, dorow.data(), static_cast<std::size_t>(cx.Dvp) * sizeof(float));
      }
      const float* orw = orow.data();
      if (out_direct)
        orw = p.out.ptr<float>() + p.out.offset(b, h, i, 0);
      else
        load_row(p.out, p.out.offset(b, h, i, 0), p.out.stride(3), p.Dv, orow.data());
      double dot = 0.0;
      for (std::int64_t e = 0; e < p.Dv; ++e) dot += static_cast<double>(orw[e]) * dor[e];
      // A row with no allowed key has lse = −∞ and P = 0: L = +∞ makes every 2^(s − L) zero.
      // A NaN row (lse NaN, the policy of qkv/attention.hpp) keeps L = NaN: P = 2^(s − L) is NaN
      // on its allowed keys, so its dq and their dk, dv come out NaN. Its delta (NaN, from the
      // NaN out) is set to 0 so that dS = P (dP − delta) stays 0 on the keys it masks (P = 0).
      const double lse = p.lse.load(p.lse.offset(b, h, i));
      L.get()[r] = lse == -kInf ? kInf : static_cast<float>(lse * 1.4426950408889634);
      delta.get()[r] = std::isnan(lse) ? 0.0f : static_cast<float>(dot);
    }
  });

  // Key chunks: enough tasks to balance the threads even for small B·Hkv (kTargetTasks), but
  // fewer, down to kMinTasks, while the dQ partials would take 32 MiB or more, and never more
  // than 256 MiB of them. glibc serves blocks of 32 MiB and up with fresh pages on every call
  // (its mmap threshold stops rising there), and GQA needs G times the chunks of MHA for the
  // same tasks: B = 1, H = 8, Hkv = 2, S = 2048, D = 128 took 7 partials (56 MiB, ≈ 14k page
  // faults per call) and now 3 (24 MiB, reused). The choice depends on the shapes only, never
  // on the thread count (determinism).
  cx.key_blocks = (p.Skv + kBk - 1) / kBk;
  if (usable_in_place(bp.dq, p.D)) {
    cx.dq0 = bp.dq.ptr<float>(), cx.dq0_sb = bp.dq.stride(0), cx.dq0_sh = bp.dq.stride(1), cx.dq0_ld = bp.dq.stride(2);
  }
  const std::int64_t bhk = p.B * p.Hkv;
  const std::int64_t part_floats = rows * cx.Dp;
  auto part_bytes = [&](std::int64_t c) { return (c - (cx.dq0 ? 1 : 0)) * part_floats * std::int64_t{4}; };
  std::int64_t C = bhk > 0 ? (kTargetTasks + bhk - 1) / bhk : 1;
  const std::int64_t c_min = bhk > 0 ? (kMinTasks + bhk - 1) / bhk : 1;
  while (C > c_min && part_bytes(C) >= (std::int64_t{32} << 20)) --C;
  while (C > 1 && part_bytes(C) > (std::int64_t{256} << 20)) --C;
  if (C > cx.key_blocks) C = cx.key_blocks;
  cx.chunks = C < 1 ? 1 : C;
  check_memory("qkv::attention_backward", "dq partial sums", bytes_of({cx.chunks - (cx.dq0 ? 1 : 0), part_floats}, 4));
  Floats dq_part((cx.chunks - (cx.dq0 ? 1 : 0)) * part_floats);
  cx.dq_part = dq_part.get();

  // Work of each key block (tiles the mask rule does not skip), chunk cuts at equal shares of
  // it, and the tasks run largest first so the last ones to finish are short.
  std::vector<std::int64_t> cuts(static_cast<std::size_t>(p.B * (cx.chunks + 1)));
  std::vector<std::int64_t> task_cost(static_cast<std::size_t>(cx.tasks()));
  std::vector<std::int64_t> block_cost(static_cast<std::size_t>(cx.key_blocks));
  for (std::int64_t b = 0; b < p.B; ++b) {
    std::int64_t total = 0;
    for (std::int64_t kb = 0; kb < cx.key_blocks; ++kb) {
      block_cost[static_cast<std::size_t>(kb)] = live_query_blocks(p, b, kb * kBk, std::min(kBk, p.Skv - kb * kBk));
      total += block_cost[static_cast<std::size_t>(kb)];
    }
    std::int64_t* cut = cuts.data() + b * (cx.chunks + 1);
    cut[0] = 0;
    std::int64_t kb = 0, acc = 0;
    for (std::int64_t c = 0; c < cx.chunks; ++c) {
      const std::int64_t start_acc = acc;
      while (kb < cx.key_blocks && (c + 1 == cx.chunks || acc * cx.chunks < total * (c + 1)))
        acc += block_cost[static_cast<std::size_t>(kb++)];
      cut[c + 1] = kb;
      for (std::int64_t hk = 0; hk < p.Hkv; ++hk)
        task_cost[static_cast<std::size_t>((b * p.Hkv + hk) * cx.chunks + c)] = acc - start_acc;
    }
  }
  cx.chunk_begin = cuts.data();
  std::vector<std::int64_t> order(task_cost.size());
  for (std::size_t t = 0; t < order.size(); ++t) order[t] = static_cast<std::int64_t>(t);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return task_cost[static_cast<std::size_t>(a)] > task_cost[static_cast<std::size_t>(b)];
  });

  cx.arena_floats = arena_size(p.D, p.Dv);
  Floats arenas(cx.arena_floats * p.threads);
  void (*const task_fn)(const Context&, float*, std::int64_t) =
      bf16_tiles         ? backward_task_avx512_bf16
      : isa == Isa::avx512 ? backward_task_avx512
      : isa == Isa::avx2   ? backward_task_avx2
                           : backward_task_scalar;
  parallel_for(cx.tasks(), p.threads, [&](std::int64_t t) {
    assert(thread_index() < p.threads);
    task_fn(cx, arenas.get() + thread_index() * cx.arena_floats, order[static_cast<std::size_t>(t)]);
  });

  // Reduce: dq = Σ_c dQ_c in increasing c, rounded once to dq's dtype (nothing left to do when
  // the only chunk accumulated in dq itself).
  const std::int64_t reduce_tasks = cx.dq0 && cx.chunks == 1 ? 0 : p.B * p.H;
  parallel_for(reduce_tasks, p.threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    std::vector<float> acc(static_cast<std::size_t>(cx.Dp));
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      const float* first = cx.dq_rows(0, b, h) + i * cx.dq_ld(0);
      if (cx.dq0) {  // chunk 0 is dq itself: add the others to it, in increasing c
        float* row = cx.dq_rows(0, b, h) + i * cx.dq_ld(0);
        for (std::int64_t c = 1; c < cx.chunks; ++c) {
          const float* part = cx.dq_rows(c, b, h) + i * cx.Dp;
          for (std::int64_t d = 0; d < p.D; ++d) row[d] += part[d];
        }
        continue;
      }
      if (cx.chunks == 1) {
        store_row(bp.dq, bp.dq.offset(b, h, i, 0), bp.dq.stride(3), p.D, first);
        continue;
      }
      std::memcpy(acc.data(), first, static_cast<std::size_t>(cx.Dp) * sizeof(float));
      for (std::int64_t c = 1; c < cx.chunks; ++c) {
        const float* part = cx.dq_rows(c, b, h) + i * cx.Dp;
        for (std::int64_t d = 0; d < cx.Dp; ++d) acc[static_cast<std::size_t>(d)] += part[d];
      }
      store_row(bp.dq, bp.dq.offset(b, h, i, 0), bp.dq.stride(3), p.D, acc.data());
    }
  });
}

}  // namespace qkv::kernels
