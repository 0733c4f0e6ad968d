// Attention backward speed: qkv::attention_backward alone and forward + backward together,
// B = 1, H = 8, D = Dv = 128 unless the name says otherwise, f32 or bf16, 2 threads by default
// (QKV_NUM_THREADS). The peer (torch scaled_dot_product_attention forward + backward) is
// bench/backward_torch.py, run on the same shapes; BENCHMARKS.md has both side by side.
//
// FLOP model (FlashAttention's convention): forward 4·B·H·Sq·Skv·D, backward 2.5× that
// (five Sq×Skv×D products: S, dP, dV, dK, dQ), halved for causal. Counter "GFLOPs" is that
// model divided by the measured time.
#include <cstdint>
#include <random>
#include <string>

#include <benchmark/benchmark.h>

#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

struct Inputs {
  Buffer q, k, v, out, dout, lse, dq, dk, dv;
  Inputs(DType t, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D)
      : q(t, {B, H, S, D}), k(t, {B, H, S, D}), v(t, {B, H, S, D}), out(t, {B, H, S, D}), dout(t, {B, H, S, D}),
        lse(DType::f32, {B, H, S}), dq(t, {B, H, S, D}), dk(t, {B, H, S, D}), dv(t, {B, H, S, D}) {
    std::mt19937 g(1);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (const Buffer* b : {&q, &k, &v, &dout})
      for (std::int64_t e = 0; e < b->numel(); ++e) b->view().store(e, nd(g));
  }
};

// args: S, causal (0/1), bf16 (0/1), with_forward (0/1)
void BM_attention_backward(benchmark::State& st) {
  const std::int64_t B = 1, H = 8, D = 128, S = st.range(0);
  const bool causal = st.range(1) != 0, bf16 = st.range(2) != 0, with_forward = st.range(3) != 0;
  Inputs in(bf16 ? DType::bf16 : DType::f32, B, H, S, D);
  qkv::AttentionOptions opt;
  opt.causal = causal;
  qkv::attention(in.q.view(), in.k.view(), in.v.view(), in.out.view(), opt, in.lse.view());
  const char* name = "";
  for (auto _ : st) {
    if (with_forward) qkv::attention(in.q.view(), in.k.view(), in.v.view(), in.out.view(), opt, in.lse.view());
    name = qkv::attention_backward(in.q.view(), in.k.view(), in.v.view(), in.out.view(), in.dout.view(),
                                   in.lse.view(), in.dq.view(), in.dk.view(), in.dv.view(), opt)
               .name;
    benchmark::DoNotOptimize(in.dq.data());
  }
  const double fwd_flops = 4.0 * B * H * static_cast<double>(S) * S * D * (causal ? 0.5 : 1.0);
  const double flops = fwd_flops * (with_forward ? 3.5 : 2.5);
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(std::string(name) + (with_forward ? " +fwd" : " bwd only") + (causal ? " causal" : ""));
}

BENCHMARK(BM_attention_backward)
    ->ArgNames({"S", "causal", "bf16", "fwd"})
    ->ArgsProduct({{1024, 2048, 4096}, {0, 1}, {0}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_attention_backward)
    ->ArgNames({"S", "causal", "bf16", "fwd"})
    ->ArgsProduct({{2048}, {0, 1}, {1}, {0}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
