// Google Benchmark program for qkv's attention backward (bench/run_backward_bench.py drives it and
// times PyTorch in the same run). Three kinds of case:
//   bwd     attention_backward alone (dq, dk, dv from q, k, v, out, dout, lse)
//   fwdbwd  attention (out and lse) followed by attention_backward: one training step's attention
//   fwd     attention alone, with lse (the forward a training step runs; one-thread rows only, for
//           the forward's share of fwdbwd against the peak; run_backward_bench.py leaves them out)
// FLOP model (FlashAttention's convention): forward 4·B·H·S²·D, backward 2.5× that (five S×S×D
// products: S, dP, dV, dK, dQ), halved for causal; the counter GFLOPs is that over the time.
//
//   bench_backward [--peak]     also measure the machine's FMA peak (machine_peak.cpp); one-thread rows
//                               then report pct_peak_1t: their GFLOPs_cpu as % of the one-thread peak
//                               timed by the wall clock (on busy shared cores that peak reads low and
//                               the % high), and pct_peak_cpu: as % of the one-thread peak timed in
//                               CPU time (fma_peak_gflops_1t_cpu), both measured in CPU time
//   any Google Benchmark flag (--benchmark_filter, --benchmark_repetitions, ...)
//
// Case names: <bwd|fwdbwd|fwd>/qkv/<dtype>/B<B>/H<H>/Hkv<Hkv>/S<S>/D<D>/<causal|full>/T<threads>
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "machine_peak.hpp"
#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

double g_peak_1t = 0.0;      // fp32 FMA peak of one thread, GFLOP/s (--peak), 0 when not measured
double g_peak_1t_cpu = 0.0;  // the same loop per CPU-second of the thread that ran it

// CPU seconds of the calling thread: a one-thread row runs all its work here (parallel_for runs
// inline with one thread), so this time is insensitive to other processes sharing the cores.
double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double wall_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

enum class Kind { bwd, fwdbwd, fwd };

struct Shape {
  Kind kind;
  std::int64_t B, H, Hkv, S, D;
  bool causal;
  DType dtype;
  int threads;
};

void fill_random(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.view().store(i, u(rng));
}

void run(benchmark::State& st, Shape s) {
  const DType t = s.dtype;
  Buffer q(t, {s.B, s.H, s.S, s.D}), k(t, {s.B, s.Hkv, s.S, s.D}), v(t, {s.B, s.Hkv, s.S, s.D}), out(t, {s.B, s.H, s.S, s.D}),
      dout(t, {s.B, s.H, s.S, s.D}), dq(t, {s.B, s.H, s.S, s.D}), dk(t, {s.B, s.Hkv, s.S, s.D}), dv(t, {s.B, s.Hkv, s.S, s.D});
  Buffer lse(DType::f32, {s.B, s.H, s.S});
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3), fill_random(dout, 4);
  qkv::AttentionOptions o;
  o.causal = s.causal;
  o.num_threads = s.threads;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view());
  std::string name;
  const double cpu0 = thread_cpu_s();
  for (auto _ : st) {
    std::string fwd;
    if (s.kind != Kind::bwd) fwd = qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view()).name;
    if (s.kind == Kind::fwd) {
      name = fwd;
      continue;
    }
    const char* bwd = qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(),
                                              dq.view(), dk.view(), dv.view(), o)
                          .name;
    name = s.kind == Kind::fwdbwd ? fwd + " + " + bwd : bwd;
  }
  const double factor = s.kind == Kind::fwd ? 1.0 : s.kind == Kind::fwdbwd ? 3.5 : 2.5;
  double flops = 4.0 * static_cast<double>(s.B * s.H * s.S * s.S * s.D) * factor;
  if (s.causal) flops /= 2;
  const double cpu = thread_cpu_s() - cpu0;
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (s.threads == 1 && cpu > 0.0) {  // GFLOP per CPU-second of the thread that did all the work
    const double gflops_cpu = flops * 1e-9 * static_cast<double>(st.iterations()) / cpu;
    st.counters["GFLOPs_cpu"] = gflops_cpu;
    if (g_peak_1t > 0.0) st.counters["pct_peak_1t"] = 100.0 * gflops_cpu / g_peak_1t;
    if (g_peak_1t_cpu > 0.0) st.counters["pct_peak_cpu"] = 100.0 * gflops_cpu / g_peak_1t_cpu;
  }
  st.SetLabel(name);
}

void add(const Shape& s) {
  char n[200];
  const char* kind = s.kind == Kind::fwd ? "fwd" : s.kind == Kind::fwdbwd ? "fwdbwd" : "bwd";
  std::snprintf(n, sizeof n, "%s/qkv/%s/B%lld/H%lld/Hkv%lld/S%lld/D%lld/%s/T%d", kind,
                s.dtype == DType::bf16 ? "bf16" : "f32", (long long)s.B, (long long)s.H, (long long)s.Hkv,
                (long long)s.S, (long long)s.D, s.causal ? "causal" : "full", s.threads);
  benchmark::RegisterBenchmark(n, run, s)->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The grid: B = 1, H = 8 (PyTorch's CPU backward is slow enough that H = 16 at S = 4096 would
// take minutes per repeat), 2 threads:
//   f32 D = 128, S ∈ {1024, 2048, 4096}, causal and not, forward + backward and backward alone
//   forward + backward in bf16 at the same S (D = 128) and in f32 and bf16 at S ∈ {1024, 2048}
//   (D = 64): the bf16 rows against torch's bf16 and qkv's own f32; bf16 backward alone at 2048
//   GQA (Hkv = 2) at S = 2048, D = 128; one thread at S = 2048 (D = 128) and S ∈ {1024, 2048}
//   (D = 64), f32 and bf16 (whose CPU times run_backward_bench.py also compares: they do not
//   depend on other load); one thread f32 forward + backward at S = 4096 (D = 64, 128) and
//   S = 1024 (D = 128): with the rows above, S ∈ {1024, 2048, 4096} × D ∈ {64, 128} against the
//   one-thread FMA peak (issue #18's 85 %); the f32 forward alone on one thread at the same
//   S ∈ {1024, 2048, 4096} × D ∈ {64, 128}, causal and not
void register_grid() {
  constexpr Kind bwd = Kind::bwd, fwdbwd = Kind::fwdbwd;
  for (Kind kind : {fwdbwd, bwd})
    for (std::int64_t S : {1024, 2048, 4096})
      for (bool c : {false, true}) add({kind, 1, 8, 8, S, 128, c, DType::f32, 2});
  for (std::int64_t S : {1024, 2048, 4096})
    for (bool c : {false, true}) add({fwdbwd, 1, 8, 8, S, 128, c, DType::bf16, 2});
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t S : {1024, 2048})
      for (bool c : {false, true}) add({fwdbwd, 1, 8, 8, S, 64, c, t, 2});
  for (bool c : {false, true}) {
    add({bwd, 1, 8, 8, 2048, 128, c, DType::bf16, 2});
    add({fwdbwd, 1, 8, 2, 2048, 128, c, DType::f32, 2});
  }
  for (DType t : {DType::f32, DType::bf16})
    for (Kind kind : {fwdbwd, bwd})
      for (bool c : {false, true}) add({kind, 1, 8, 8, 2048, 128, c, t, 1});
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t S : {1024, 2048})
      for (Kind kind : {fwdbwd, bwd})
        for (bool c : {false, true}) add({kind, 1, 8, 8, S, 64, c, t, 1});
  for (bool c : {false, true}) {
    add({fwdbwd, 1, 8, 8, 1024, 128, c, DType::f32, 1});
    for (std::int64_t D : {64, 128}) add({fwdbwd, 1, 8, 8, 4096, D, c, DType::f32, 1});
  }
  for (std::int64_t S : {1024, 2048, 4096})
    for (std::int64_t D : {64, 128})
      for (bool c : {false, true}) add({Kind::fwd, 1, 8, 8, S, D, c, DType::f32, 1});
}

}  // namespace

int main(int argc, char** argv) {
  bool peak = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peak") == 0) peak = true;
    else rest.push_back(argv[i]);
  }
  if (peak) {
    const bool avx512 = qkv::cpu_isa() >= qkv::Isa::avx512;
    benchmark::AddCustomContext("fma_peak_gflops_2t", std::to_string(qkv_bench::fma_peak_gflops(2, avx512)));
    // With one thread the loop runs on this thread, so the call's CPU time is the loop's. Per
    // CPU-second: the best repeat's rate × the call's wall / CPU time (equal on an idle core; on a
    // shared one the best repeat's rate is at least the mean's, so this errs high, the % low).
    const double c0 = thread_cpu_s(), w0 = wall_s();
    g_peak_1t = qkv_bench::fma_peak_gflops(1, avx512);
    const double cpu = thread_cpu_s() - c0, wall = wall_s() - w0;
    g_peak_1t_cpu = g_peak_1t * wall / cpu;
    benchmark::AddCustomContext("fma_peak_gflops_1t", std::to_string(g_peak_1t));
    benchmark::AddCustomContext("fma_peak_gflops_1t_cpu", std::to_string(g_peak_1t_cpu));
  }
  benchmark::AddCustomContext("qkv_isa", qkv::isa_name(qkv::active_isa()));
  register_grid();
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
