// Google Benchmark program for the cost of attention dropout: forward (attention) and one
// training step's attention (attention + attention_backward) with dropout_p = 0.1 beside p = 0,
// at B = 1, H = 8, S = 2048, D ∈ {64, 128}, f32, non-causal, on 2 threads (wall time) and on one
// (whose CPU time, the "CPU" column, other processes sharing the cores do not inflate). Dropout costs one hash
// per probability (kernels/dropout.hpp) in the forward and again in the backward, where the
// mask is regenerated rather than stored; the FLOP count is the same, so the ratio of times is
// the cost.
//
//   bench_dropout [Google Benchmark flags: --benchmark_repetitions, --benchmark_filter, ...]
//
// Case names: <fwd|fwdbwd>/p<dropout_p>/S<S>/D<D>/T<threads>
#include <benchmark/benchmark.h>

#include <cstdio>
#include <random>
#include <string>

#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

constexpr std::int64_t kB = 1, kH = 8, kS = 2048;

void fill_random(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.view().store(i, u(rng));
}

void run(benchmark::State& st, bool with_backward, double p, std::int64_t D, int threads) {
  const DType t = DType::f32;
  Buffer q(t, {kB, kH, kS, D}), k(t, {kB, kH, kS, D}), v(t, {kB, kH, kS, D}), out(t, {kB, kH, kS, D}),
      dout(t, {kB, kH, kS, D}), dq(t, {kB, kH, kS, D}), dk(t, {kB, kH, kS, D}), dv(t, {kB, kH, kS, D});
  Buffer lse(DType::f32, {kB, kH, kS});
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3), fill_random(dout, 4);
  qkv::AttentionOptions o;
  o.num_threads = threads;
  o.dropout_p = p;
  o.dropout_seed = 1234;
  std::string name;
  for (auto _ : st) {
    name = qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view()).name;
    if (with_backward)
      name += std::string(" + ") + qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(),
                                                             lse.view(), dq.view(), dk.view(), dv.view(), o)
                                       .name;
  }
  // FlashAttention's FLOP model: forward 4·B·H·S²·D, backward 2.5× that.
  const double flops = 4.0 * static_cast<double>(kB * kH * kS * kS * D) * (with_backward ? 3.5 : 1.0);
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  st.SetLabel(name);
}

}  // namespace

int main(int argc, char** argv) {
  for (int threads : {2, 1})
    for (bool bwd : {false, true})
      for (std::int64_t D : {64, 128})
        for (double p : {0.0, 0.1}) {
          char n[100];
          std::snprintf(n, sizeof n, "%s/p%.1f/S%lld/D%lld/T%d", bwd ? "fwdbwd" : "fwd", p, static_cast<long long>(kS),
                        static_cast<long long>(D), threads);
          benchmark::RegisterBenchmark(n, run, bwd, p, D, threads)->UseRealTime()->Unit(benchmark::kMillisecond);
        }
  benchmark::AddCustomContext("qkv_isa", qkv::isa_name(qkv::active_isa()));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
