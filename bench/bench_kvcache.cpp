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
//
// Case names: kv/<layout>/<dtype>/Sc<Sc>/Skv<Skv>/T<threads>.
#include <benchmark/benchmark.h>

#include <algorithm>
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

}  // namespace

int main(int argc, char** argv) {
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
