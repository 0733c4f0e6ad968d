// The fast attention backward: the portable driver (attention_backward_flash: prepass, chunk plan,
// tasks, reduce — attention_backward.hpp lists the parts and their files), the row helpers every
// part uses, the tasks' portable helpers (packing K and V, mask rows, storing dK and dV) and the
// reduction of the dQ partials.
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

}  // namespace

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

bool usable_in_place(const View& t, std::int64_t n) {
  return t.dtype == DType::f32 && (t.stride(3) == 1 || n == 1) && n % 16 == 0;
}

std::int64_t arena_size(std::int64_t D, std::int64_t Dv) {
  return 3 * kBq * kBk + kBk + kPassBlocks * pass_block_floats(D, Dv);
}

void pack_kv_block(const Context& cx, std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk, float* KT,
                   float* Kr, float* VT) {
  // Kr (finite_or_zero) is the K operand of dQ += dS·K only: there a key with dS = 0 (masked for
  // the row) must add 0 even if its K is not finite, not 0·NaN = NaN. Rows that do attend such a
  // key are NaN rows (qkv/attention.hpp), whose dS is NaN already. (KT, for the scores, keeps K.)
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

void reduce_dq(const AttnBwdParams& bp, const Context& cx, Isa isa) {
  const AttnParams& p = bp.fwd;
  // Nothing left to do when the only chunk accumulated in dq itself.
  const std::int64_t reduce_tasks = cx.dq0 && cx.chunks == 1 ? 0 : p.B * p.H;
  // bf16 rows of dq in place on the avx512_bf16 tiles: summed and rounded 16 values at a time.
  const bool bf16_rows = isa == Isa::avx512_bf16 && !cx.dq0 && (bp.dq.stride(3) == 1 || p.D == 1);
  const std::int64_t chunk_stride = p.B * p.H * p.Sq * cx.Dp;  // between the partials of a row (no dq0)
  parallel_for(reduce_tasks, p.threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    std::vector<float> acc(static_cast<std::size_t>(cx.Dp));
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      const float* first = cx.dq_rows(0, b, h) + i * cx.dq_ld(0);
      if (bf16_rows) {
        sum_rows_bf16_avx512_bf16(first, chunk_stride, cx.chunks, p.D,
                                  bp.dq.ptr<std::uint16_t>() + bp.dq.offset(b, h, i, 0));
        continue;
      }
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

  const Prepass prepass(bp, isa, cx);  // 1. Q and dO rows, L, delta
  const ChunkPlan plan(bp, cx);        // 2. key chunks, the tasks' order, dQ partials

  // 3. The tasks, largest first, each on its thread's arena.
  cx.arena_floats = arena_size(p.D, p.Dv);
  Floats arenas(cx.arena_floats * p.threads);
  void (*const task_fn)(const Context&, float*, std::int64_t) =
      isa == Isa::avx512_bf16 ? backward_task_avx512_bf16
      : isa == Isa::avx512    ? backward_task_avx512
      : isa == Isa::avx2      ? backward_task_avx2
                              : backward_task_scalar;
  parallel_for(cx.tasks(), p.threads, [&](std::int64_t t) {
    assert(thread_index() < p.threads);
    task_fn(cx, arenas.get() + thread_index() * cx.arena_floats, plan.order()[static_cast<std::size_t>(t)]);
  });

  reduce_dq(bp, cx, isa);  // 4. dq = Σ_c dQ_c in increasing c
}

}  // namespace qkv::kernels
