// Google Benchmark program: the cost of the score variants (softcap, ALiBi, sinks; issue #19)
// over the plain flash forward at the same shape. FLOP model 4·B·H·Sq·Skv·D (no causal: the
// variants change no tile counts), reported as the counter GFLOPs. One thread, timed by its CPU
// time (Google Benchmark's CPU column): on a shared machine the wall clock moves with the load,
// a thread's own CPU time much less.
//
//   bench_variants [Google Benchmark flags]
//   e.g. --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//        --benchmark_report_aggregates_only=true   (rounds alternate between the variants)
//
// Case names: var/<variant>/<dtype>/B<B>/H<H>/S<S>/D<D>/T<threads>, variant ∈ plain, softcap,
// alibi, sinks, all.
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

void fill_random(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.view().store(i, u(rng));
}

void run(benchmark::State& st, const std::string& variant, DType dtype, std::int64_t B, std::int64_t H, std::int64_t S,
         std::int64_t D, int threads) {
  Buffer q(dtype, {B, H, S, D}), k(dtype, {B, H, S, D}), v(dtype, {B, H, S, D}), out(dtype, {B, H, S, D});
  fill_random(q, 1), fill_random(k, 2), fill_random(v, 3);
  Buffer slopes(DType::f64, {H}), sinks(DType::f32, {H});
  const auto st_slopes = qkv::alibi_standard_slopes(H);
  for (std::int64_t h = 0; h < H; ++h) slopes.ptr<double>()[h] = st_slopes[static_cast<std::size_t>(h)], sinks.ptr<float>()[h] = 0.5f;
  qkv::AttentionOptions o;
  o.kernel = qkv::Kernel::flash;
  o.num_threads = threads;
  if (variant == "softcap" || variant == "all") o.softcap = 30.0;
  if (variant == "alibi" || variant == "all") o.alibi_slopes = slopes.view();
  if (variant == "sinks" || variant == "all") o.sinks = sinks.view();
  for (auto _ : st) qkv::attention(q.view(), k.view(), v.view(), out.view(), o);
  st.counters["GFLOPs"] = benchmark::Counter(4.0 * static_cast<double>(B * H * S * S * D) * 1e-9,
                                             benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t B = 1, H = 8, S = 2048, D = 128;
  for (DType t : {DType::f32, DType::bf16})
    for (const char* variant : {"plain", "softcap", "alibi", "sinks", "all"})
      for (int threads : {1}) {
        const std::string name = std::string("var/") + variant + "/" + qkv::dtype_name(t) + "/B" + std::to_string(B) +
                                 "/H" + std::to_string(H) + "/S" + std::to_string(S) + "/D" + std::to_string(D) + "/T" +
                                 std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, variant, t, B, H, S, D, threads); })
            ->Unit(benchmark::kMillisecond);
      }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
