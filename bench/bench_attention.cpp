// Google Benchmark program for qkv's attention forward (bench/run_bench.py drives it and times
// PyTorch in the same run). Reports, per case, FLOP = 4·B·H·Sq·Skv·D (halved for causal) as the
// counter GFLOPs (a rate), and for decode the bytes of K and V read as GBs, the read probe measured
// just before the row (probe_GBs) and the row's rate as a % of it (pct_probe).
//
//   bench_attention [--peak]            also measure the machine's FMA peak (and bf16 dot-product peak), read bandwidth and STREAM triad
//   bench_attention --memory-probe      S = 65536, B = H = 1, D = 64: extra peak memory of one call
//   bench_attention --small-grid        only the short sequences, where per-call costs show (run_bench.py --small)
//   any Google Benchmark flag (--benchmark_filter, --benchmark_repetitions, ...)
//
// Case names: fwd/<kernel>/<dtype>/B<B>/H<H>/Hkv<Hkv>/S<S>/D<D>/<causal|full>/T<threads>
//             dec/<kernel>/<dtype>/B<B>/H<H>/Hkv<Hkv>/Skv<Skv>/D<D>/T<threads>
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "machine_peak.hpp"
#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;
using qkv::Kernel;

struct Shape {
  std::int64_t B, H, Hkv, Sq, Skv, D;
  bool causal;
  DType dtype;
  Kernel kernel;
  int threads;
};

void fill_random(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.view().store(i, u(rng));
}

// decode: also measure the read probe (machine_peak.cpp) right before the timed loop, and report
// the K/V read rate as a % of that same-minute probe (counter pct_probe), since the machine's
// bandwidth moves by tens of % from hour to hour on this shared host.
void run(benchmark::State& st, Shape s, bool decode) {
  Buffer q(s.dtype, {s.B, s.H, s.Sq, s.D}), k(s.dtype, {s.B, s.Hkv, s.Skv, s.D}), v(s.dtype, {s.B, s.Hkv, s.Skv, s.D}),
      out(s.dtype, {s.B, s.H, s.Sq, s.D});
  Buffer lse(DType::f32, {s.B, s.H, s.Sq});
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3);
  qkv::AttentionOptions o;
  o.causal = s.causal;
  o.align = qkv::Align::bottom_right;  // = top-left when Sq = Skv; the KV-cache convention for decode
  o.kernel = s.kernel;
  o.num_threads = s.threads;
  const char* name = "";
  const double probe = decode ? qkv_bench::read_probe_gbs(s.threads) : 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : st) name = qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view()).name;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double flops = 4.0 * static_cast<double>(s.B * s.H * s.Sq * s.Skv * s.D);
  if (s.causal) flops /= 2;
  st.counters["GFLOPs"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  const double kv_bytes = 2.0 * static_cast<double>(s.B * s.Hkv * s.Skv * s.D) * (s.dtype == DType::bf16 ? 2 : 4);
  st.counters["GBs"] = benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (decode) {
    st.counters["probe_GBs"] = probe;
    st.counters["pct_probe"] = 100.0 * kv_bytes * static_cast<double>(st.iterations()) / secs * 1e-9 / probe;
  }
  st.SetLabel(name);
}

const char* dt(DType t) { return t == DType::bf16 ? "bf16" : "f32"; }

void add(const Shape& s, bool decode) {
  char n[200];
  const char* kn = s.kernel == Kernel::reference ? "reference" : "qkv";
  if (decode)
    std::snprintf(n, sizeof n, "dec/%s/%s/B%lld/H%lld/Hkv%lld/Skv%lld/D%lld/T%d", kn, dt(s.dtype), (long long)s.B,
                  (long long)s.H, (long long)s.Hkv, (long long)s.Skv, (long long)s.D, s.threads);
  else
    std::snprintf(n, sizeof n, "fwd/%s/%s/B%lld/H%lld/Hkv%lld/S%lld/D%lld/%s/T%d", kn, dt(s.dtype), (long long)s.B,
                  (long long)s.H, (long long)s.Hkv, (long long)s.Sq, (long long)s.D, s.causal ? "causal" : "full",
                  s.threads);
  benchmark::RegisterBenchmark(n, run, s, decode)->UseRealTime()->Unit(benchmark::kMillisecond);
}

// The grid (trimmed so that one run of run_bench.py, PyTorch included, stays near 15 minutes):
//   B = 1, H = 16, D ∈ {64, 128}, S ∈ {256 … 8192}, causal and not  — the main sweep
//   S = 16384 at D = 128 only; B = 4 at S ∈ {512, 2048}; GQA Hkv = 4 at S ∈ {1024, 4096}
//   each of those shapes in f32 and in bf16 (the grid takes both dtypes at every shape)
//   one thread at S ∈ {2048, 4096}, D = 128
//   the other head dims the kernels are built for, D ∈ {32, 80, 96, 256}, at S = 2048, f32, non-causal
//   reference (f64 oracle) at S = 256 only; decode Sq = 1, Skv ∈ {1024 … 32768}, Hkv ∈ {16, 4}
void register_grid() {
  const Kernel A = Kernel::automatic;
  for (DType t : {DType::f32, DType::bf16}) {
    for (std::int64_t D : {64, 128})
      for (std::int64_t S : {256, 512, 1024, 2048, 4096, 8192})
        for (bool c : {false, true}) add({1, 16, 16, S, S, D, c, t, A, 2}, false);
    for (bool c : {false, true}) add({1, 16, 16, 16384, 16384, 128, c, t, A, 2}, false);
    for (std::int64_t S : {512, 2048})
      for (bool c : {false, true}) add({4, 16, 16, S, S, 128, c, t, A, 2}, false);
    for (std::int64_t S : {1024, 4096})
      for (bool c : {false, true}) add({1, 16, 4, S, S, 128, c, t, A, 2}, false);
  }
  for (std::int64_t S : {2048, 4096}) add({1, 16, 16, S, S, 128, false, DType::f32, A, 1}, false);
  for (std::int64_t D : {32, 80, 96, 256}) add({1, 16, 16, 2048, 2048, D, false, DType::f32, A, 2}, false);
  for (bool c : {false, true}) add({1, 16, 16, 256, 256, 64, c, DType::f32, Kernel::reference, 2}, false);
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t hkv : {16, 4})
      for (std::int64_t S : {1024, 4096, 16384, 32768}) add({1, 16, hkv, 1, S, 128, false, t, A, 2}, true);
}

// The short sequences (run_bench.py --small), where per-call costs and the split of few work items
// over the threads matter: B ∈ {1, 4}, H = 16, D ∈ {64, 128}, S ∈ {256, 512}, causal and not,
// f32 and bf16, 2 threads.
void register_small_grid() {
  for (DType t : {DType::f32, DType::bf16})
    for (std::int64_t B : {1, 4})
      for (std::int64_t D : {64, 128})
        for (std::int64_t S : {256, 512})
          for (bool c : {false, true}) add({B, 16, 16, S, S, D, c, t, Kernel::automatic, 2}, false);
}

long max_rss_kb() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return r.ru_maxrss;
}

// Extra peak memory of one S = 65536, B = H = 1, D = 64 causal and non-causal call, beyond its
// inputs and output (which are allocated and touched first).
int memory_probe() {
  const std::int64_t S = 65536, D = 64;
  Buffer q(DType::f32, {1, 1, S, D}), k(DType::f32, {1, 1, S, D}), v(DType::f32, {1, 1, S, D}), out(DType::f32, {1, 1, S, D});
  Buffer lse(DType::f32, {1, 1, S});
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3);
  std::memset(out.data(), 0, out.bytes());
  const long before = max_rss_kb();
  qkv::AttentionOptions o;
  o.num_threads = 2;
  const char* name = qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view()).name;
  o.causal = true;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view());
  const long after = max_rss_kb();
  std::printf("{\"memory_probe\": {\"S\": %lld, \"D\": %lld, \"kernel\": \"%s\", \"extra_peak_MB\": %.2f, \"inputs_MB\": %.2f}}\n",
              (long long)S, (long long)D, name, (after - before) / 1024.0, 4.0 * S * D * 4 / 1048576.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool peak = false, small = false;
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peak") == 0) peak = true;
    else if (std::strcmp(argv[i], "--small-grid") == 0) small = true;
    else if (std::strcmp(argv[i], "--memory-probe") == 0) return memory_probe();
    else rest.push_back(argv[i]);
  }
  if (peak) {
    const bool avx512 = qkv::cpu_isa() >= qkv::Isa::avx512;
    benchmark::AddCustomContext("fma_peak_gflops_2t", std::to_string(qkv_bench::fma_peak_gflops(2, avx512)));
    benchmark::AddCustomContext("fma_peak_gflops_1t", std::to_string(qkv_bench::fma_peak_gflops(1, avx512)));
    benchmark::AddCustomContext("fma_peak_avx2_gflops_2t", std::to_string(qkv_bench::fma_peak_gflops(2, false)));
    if (qkv::cpu_isa() == qkv::Isa::avx512_bf16) {
      benchmark::AddCustomContext("bf16_dot_peak_gflops_2t", std::to_string(qkv_bench::bf16_dot_peak_gflops(2)));
      benchmark::AddCustomContext("bf16_dot_peak_gflops_1t", std::to_string(qkv_bench::bf16_dot_peak_gflops(1)));
    }
    benchmark::AddCustomContext("read_bandwidth_gbs_2t", std::to_string(qkv_bench::read_bandwidth_gbs(2)));
    // One thread's read bandwidth beside two: how much a second thread can add to memory-bound work
    // (decode of a model whose weights do not fit the caches).
    benchmark::AddCustomContext("read_bandwidth_gbs_1t", std::to_string(qkv_bench::read_bandwidth_gbs(1)));
    benchmark::AddCustomContext("stream_triad_gbs_2t", std::to_string(qkv_bench::stream_triad_gbs(2)));
  }
  benchmark::AddCustomContext("qkv_isa", qkv::isa_name(qkv::active_isa()));
  if (small) register_small_grid();
  else register_grid();
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
