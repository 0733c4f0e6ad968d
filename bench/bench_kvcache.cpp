// Google Benchmark program: decode against a KV cache (issue #19 item 6) — one query row per head
// (B = 1, H = 16, Hkv = 4, D = Dv = 128) against Skv cached keys, through qkv::attention_kvcache:
//   contig : one contiguous cache [1, Skv, Hkv, D] (f32 or bf16)
//   paged  : the same rows in a shuffled pool of blocks of Sc rows, through a block table
//   paged-seq : blocks of Sc rows through a block table in pool order (block i of the sequence
//            is block i of the pool): contiguous memory read through the paged path, so that
//            paged-seq − contig is the page table's own cost and paged − paged-seq the cost of
//            scattered blocks
//   int8   : int8 rows with an f32 scale per (row, head), contiguous or paged
//   f16    : binary16 rows widened to f32 in the kernel (f32 queries), contiguous or paged
// Decode reads the cache once, so the counter GB/s = cache bytes read per second (K, V and the
// scales) is the figure to set beside the machine's read bandwidth (bench/machine_peak), and the
// time the one to compare between layouts. Skv = 2048 keeps the cache in L2/L3 (the kernel's own
// cost per key); 16384 and 32768 read it from memory (the bandwidth-bound case). One thread, timed by its CPU time (Google Benchmark's
// CPU column), as bench_variants: on the shared machine the wall clock moves with the load.
//
//   bench_kvcache [Google Benchmark flags]
//   e.g. --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true
//        --benchmark_report_aggregates_only=true
//   bench_kvcache --pair [BATCHES [DTYPE...]]   (default 20 batches; f32 bf16 i8)
//
// Case names: kv/<layout>/<dtype>/Sc<Sc>/Skv<Skv>/T<threads>.
//
// --pair measures issue #19's ratio, paged / contiguous decode time, in one process: for each
// dtype and Skv ∈ {16384, 32768}, the contiguous cache and the paged ones (by 16 rows shuffled and
// in order, by 256 rows shuffled) take turns in random order, BATCHES times, each turn ≈ 60 ms of
// CPU time of back-to-back calls after 3 untimed ones (the cache state of a repeated call, as
// Google Benchmark's). Per turn the median call; per layout the median over turns, and the ratio
// as the median of the per-batch ratios. Runs of separate cases minutes apart (Google Benchmark
// above, one process per binary, 8 rounds) gave the same code's int8 ratio by 16 rows at Skv
// 32768 as 1.21–1.42 on the shared 2-core machine; turns of 60 ms see the same load, and four runs
// of --pair 20–30 gave 1.15–1.21 (bench/results/kvcache_pg16_2026-11-28.md).
#include <benchmark/benchmark.h>

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

constexpr std::int64_t kH = 16, kHkv = 4, kD = 128;

void fill_random(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < b.numel(); ++i) b.view().store(i, u(rng));
}

// Layouts of the cache (see the top of the file).
enum class Layout { contig, paged, paged_seq };
const char* layout_name(Layout l) { return l == Layout::contig ? "contig" : l == Layout::paged ? "paged" : "paged-seq"; }

// One case's inputs: q, out and the cache (K, V, their int8 scales, the block table), filled once.
struct Setup {
  Buffer q, out, k, v, ks, vs, table;
  std::optional<qkv::View> ksv, vsv, tv;
  double bytes = 0.0;  // cache bytes decode reads: K, V and the scales
};

// dt: the cache's dtype (f32, bf16, or i8 / f16 with f32 queries).
std::unique_ptr<Setup> make_setup(Layout layout, DType dt, std::int64_t Sc, std::int64_t Skv) {
  auto s = std::make_unique<Setup>();
  const DType qt = dt == DType::i8 || dt == DType::f16 ? DType::f32 : dt;
  const bool paged = layout != Layout::contig;
  const std::int64_t rows = paged ? Sc : Skv, blocks = paged ? Skv / Sc : 1;
  s->q = Buffer(qt, {1, kH, 1, kD}), s->out = Buffer(qt, {1, kH, 1, kD});
  fill_random(s->q, 1);
  s->k = Buffer(dt, {blocks, rows, kHkv, kD}), s->v = Buffer(dt, {blocks, rows, kHkv, kD});
  if (paged) {
    s->table = Buffer(DType::i32, {1, blocks});
    std::vector<std::int32_t> ids(static_cast<std::size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    if (layout == Layout::paged) std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
    std::copy(ids.begin(), ids.end(), s->table.ptr<std::int32_t>());
    s->tv = s->table.view();
  }
  if (dt == DType::i8) {
    s->ks = Buffer(DType::f32, {blocks, rows, kHkv}), s->vs = Buffer(DType::f32, {blocks, rows, kHkv});
    s->ksv = s->ks.view(), s->vsv = s->vs.view();
    Buffer kn(DType::f32, {1, Skv, kHkv, kD}), vn(DType::f32, {1, Skv, kHkv, kD}), pos(DType::i64, {1});
    fill_random(kn, 2), fill_random(vn, 3);
    qkv::kvcache_append({s->k.view(), s->v.view(), s->tv, s->ksv, s->vsv}, kn.view(), vn.view(), pos.view());
  } else {
    fill_random(s->k, 2), fill_random(s->v, 3);
  }
  s->bytes = static_cast<double>(s->k.bytes() + s->v.bytes() + s->ks.bytes() + s->vs.bytes());
  return s;
}

// Google Benchmark calls a case several times (growing iteration counts until min_time): the
// last case's setup is kept for its next call, so that a profile of one case (perf record on a
// --benchmark_filter of it) sees the decode rather than the setup. One setup at a time: the
// previous case's is freed first.
void run(benchmark::State& st, Layout layout, DType dt, std::int64_t Sc, std::int64_t Skv, int threads) {
  using Key = std::tuple<Layout, DType, std::int64_t, std::int64_t>;
  static Key last_key;
  static std::unique_ptr<Setup> last;
  const Key key{layout, dt, Sc, Skv};
  if (!last || key != last_key) {
    last.reset();
    last = make_setup(layout, dt, Sc, Skv);
    last_key = key;
  }
  const Setup& s = *last;
  const qkv::KvCacheView cache{s.k.view(), s.v.view(), s.tv, s.ksv, s.vsv};
  qkv::AttentionOptions o;
  o.num_threads = threads;
  o.kernel = qkv::Kernel::flash_decode;
  for (auto _ : st) qkv::attention_kvcache(s.q.view(), cache, s.out.view(), o);
  st.counters["GB/s"] = benchmark::Counter(s.bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// One thread's CPU time in ms (CLOCK_THREAD_CPUTIME_ID), Google Benchmark's CPU column.
double thread_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --pair (see the top of the file): one table row per (dtype, Skv, paged layout).
int pair(int batches, const std::vector<DType>& dtypes) {
  struct Case {
    Layout layout;
    std::int64_t Sc;
  };
  const Case cases[] = {{Layout::contig, 0}, {Layout::paged, 16}, {Layout::paged_seq, 16}, {Layout::paged, 256}};
  constexpr int kCases = 4;
  constexpr double kTurnMs = 60.0;
  std::printf("one thread, B 1, H %ld, Hkv %ld, D %ld, %d batches; ms = median call, ratio = median of per-batch ratios\n",
              static_cast<long>(kH), static_cast<long>(kHkv), static_cast<long>(kD), batches);
  std::printf("%-6s %-6s %-10s %5s %10s %10s %16s\n", "dtype", "Skv", "layout", "Sc", "contig ms", "paged ms", "paged / contig");
  std::mt19937 rng(1);
  for (DType dt : dtypes)
    for (std::int64_t Skv : {16384, 32768}) {
      std::unique_ptr<Setup> s[kCases];
      for (int c = 0; c < kCases; ++c) s[c] = make_setup(cases[c].layout, dt, cases[c].Sc, Skv);
      qkv::AttentionOptions o;
      o.num_threads = 1;
      o.kernel = qkv::Kernel::flash_decode;
      std::vector<double> ms[kCases];  // [case][batch]: the turn's median call
      for (int bt = 0; bt < batches; ++bt) {
        int order[kCases] = {0, 1, 2, 3};
        std::shuffle(order, order + kCases, rng);
        for (int c : order) {
          const Setup& x = *s[c];
          const qkv::KvCacheView cache{x.k.view(), x.v.view(), x.tv, x.ksv, x.vsv};
          for (int w = 0; w < 3; ++w) qkv::attention_kvcache(x.q.view(), cache, x.out.view(), o);
          std::vector<double> calls;
          for (const double t0 = thread_ms(); thread_ms() - t0 < kTurnMs;) {
            const double a = thread_ms();
            qkv::attention_kvcache(x.q.view(), cache, x.out.view(), o);
            calls.push_back(thread_ms() - a);
          }
          ms[c].push_back(median(calls));
        }
      }
      for (int c = 1; c < kCases; ++c) {
        std::vector<double> r;
        for (int bt = 0; bt < batches; ++bt) r.push_back(ms[c][bt] / ms[0][bt]);
        std::printf("%-6s %-6ld %-10s %5ld %10.3f %10.3f %16.3f\n", qkv::dtype_name(dt), static_cast<long>(Skv),
                    layout_name(cases[c].layout), static_cast<long>(cases[c].Sc), median(ms[0]), median(ms[c]), median(r));
      }
      std::fflush(stdout);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--pair") == 0) {
    const int batches = argc > 2 ? std::atoi(argv[2]) : 20;
    std::vector<DType> dtypes;
    for (int i = 3; i < argc; ++i)
      dtypes.push_back(std::strcmp(argv[i], "i8") == 0 ? DType::i8 : std::strcmp(argv[i], "bf16") == 0 ? DType::bf16 : DType::f32);
    if (dtypes.empty()) dtypes = {DType::f32, DType::bf16, DType::i8};
    return pair(batches > 0 ? batches : 20, dtypes);
  }
  for (std::int64_t Skv : {2048, 16384, 32768})
    for (int threads : {1})
      for (DType t : {DType::f32, DType::bf16, DType::i8, DType::f16})
        for (auto [layout, Sc] : {std::pair{Layout::contig, std::int64_t{0}}, std::pair{Layout::paged, std::int64_t{16}},
                                  std::pair{Layout::paged_seq, std::int64_t{16}}, std::pair{Layout::paged, std::int64_t{64}},
                                  std::pair{Layout::paged, std::int64_t{128}}, std::pair{Layout::paged, std::int64_t{256}}}) {
          const std::string name = std::string("kv/") + layout_name(layout) + "/" + qkv::dtype_name(t) + "/Sc" +
                                   std::to_string(Sc) + "/Skv" + std::to_string(Skv) + "/T" + std::to_string(threads);
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, layout, t, Sc, Skv, threads); })
              ->Unit(benchmark::kMillisecond);
        }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
