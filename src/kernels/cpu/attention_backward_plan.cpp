// The fast attention backward, part 2: the chunk plan (attention_backward.hpp, ChunkPlan). How many
// key chunks each (b, hk) is cut into, where the cuts fall, the dQ partial sums they need, and the
// order the tasks run in. Everything here depends on the shapes only, never on the thread count,
// so the result is bit-identical for any number of threads.
#include <algorithm>

#include "kernels/cpu/attention_backward.hpp"
#include "qkv/memory.hpp"

namespace qkv::kernels::bwd {
namespace {

// Tasks to aim for: 4 per thread on a 2-core machine, where largest-first dynamic scheduling ends
// within a small task of balance (B·Hkv = 8 equal heads: one task each). More chunks would cost
// more than they balance: each beyond the first is a dq-sized f32 partial to zero and reduce, and
// its task streams the Q, dO and dQ rows once more. At B = 1, H = 8, S = 1024, D = 64 (one Zen 4
// thread) the 16-task target's second chunk took 1.5–2 % of a step (bench/results/bwd2_2026-11-28.md).
constexpr std::int64_t kTargetTasks = 8;

// Query blocks of batch b whose allowed keys meet [k0, k0 + nk) (the tasks' skip test).
std::int64_t live_query_blocks(const AttnParams& p, std::int64_t b, std::int64_t k0, std::int64_t nk) {
  std::int64_t n = 0;
  for (std::int64_t i0 = 0; i0 < p.Sq; i0 += kBq) {
    const std::int64_t i1 = std::min(i0 + kBq, p.Sq) - 1;
    std::int64_t lo_first, hi_first, lo_last, hi_last;
    p.rule.range(i0, p.key_len[static_cast<std::size_t>(b)], &lo_first, &hi_first);
    p.rule.range(i1, p.key_len[static_cast<std::size_t>(b)], &lo_last, &hi_last);
    const bool kept = k0 < std::min(p.rule.keep_first, hi_last);  // keep_first's keys [0, min(n, hi))
    if (std::max(lo_first, k0) < std::min(hi_last, k0 + nk) || kept) ++n;
  }
  return n;
}

// C: enough tasks to balance the threads even for small B·Hkv (kTargetTasks), but never more than
// 256 MiB of dQ partials.
std::int64_t chunk_count(const AttnParams& p, const Context& cx) {
  const std::int64_t bhk = p.B * p.Hkv;
  const std::int64_t part_floats = p.B * p.H * p.Sq * cx.Dp;
  auto part_bytes = [&](std::int64_t c) { return (c - (cx.dq0 ? 1 : 0)) * part_floats * std::int64_t{4}; };
  std::int64_t C = bhk > 0 ? (kTargetTasks + bhk - 1) / bhk : 1;
  while (C > 1 && part_bytes(C) > (std::int64_t{256} << 20)) --C;
  if (C > cx.key_blocks) C = cx.key_blocks;
  return C < 1 ? 1 : C;
}

}  // namespace

ChunkPlan::ChunkPlan(const AttnBwdParams& bp, Context& cx) {
  const AttnParams& p = bp.fwd;
  cx.key_blocks = (p.Skv + kBk - 1) / kBk;
  if (usable_in_place(bp.dq, p.D)) {
    cx.dq0 = bp.dq.ptr<float>(), cx.dq0_sb = bp.dq.stride(0), cx.dq0_sh = bp.dq.stride(1), cx.dq0_ld = bp.dq.stride(2);
  }
  if (usable_in_place(bp.dk, p.D) && usable_in_place(bp.dv, p.Dv)) {
    cx.dk0 = bp.dk.ptr<float>(), cx.dk0_sb = bp.dk.stride(0), cx.dk0_sh = bp.dk.stride(1), cx.dk0_ld = bp.dk.stride(2);
    cx.dv0 = bp.dv.ptr<float>(), cx.dv0_sb = bp.dv.stride(0), cx.dv0_sh = bp.dv.stride(1), cx.dv0_ld = bp.dv.stride(2);
  }
  cx.chunks = chunk_count(p, cx);
  const std::int64_t part_floats = p.B * p.H * p.Sq * cx.Dp;
  check_memory("qkv::attention_backward", "dq partial sums", bytes_of({cx.chunks - (cx.dq0 ? 1 : 0), part_floats}, 4));
  dq_part_.emplace((cx.chunks - (cx.dq0 ? 1 : 0)) * part_floats);
  cx.dq_part = dq_part_->get();

  // Work of each key block (tiles the mask rule does not skip), chunk cuts at equal shares of
  // it, and the tasks run largest first so the last ones to finish are short.
  cuts_.resize(static_cast<std::size_t>(p.B * (cx.chunks + 1)));
  std::vector<std::int64_t> task_cost(static_cast<std::size_t>(cx.tasks()));
  std::vector<std::int64_t> block_cost(static_cast<std::size_t>(cx.key_blocks));
  for (std::int64_t b = 0; b < p.B; ++b) {
    std::int64_t total = 0;
    for (std::int64_t kb = 0; kb < cx.key_blocks; ++kb) {
      block_cost[static_cast<std::size_t>(kb)] = live_query_blocks(p, b, kb * kBk, std::min(kBk, p.Skv - kb * kBk));
      total += block_cost[static_cast<std::size_t>(kb)];
    }
    std::int64_t* cut = cuts_.data() + b * (cx.chunks + 1);
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
  cx.chunk_begin = cuts_.data();
  order_.resize(task_cost.size());
  for (std::size_t t = 0; t < order_.size(); ++t) order_[t] = static_cast<std::int64_t>(t);
  std::stable_sort(order_.begin(), order_.end(), [&](std::int64_t a, std::int64_t b) {
    return task_cost[static_cast<std::size_t>(a)] > task_cost[static_cast<std::size_t>(b)];
  });
}

}  // namespace qkv::kernels::bwd
