// The weight work of one decode step alone: blocks::gemv_batch_rows over a llama2.c-shaped model's
// matrices for B sequences (on one thread, or --threads), beside the machine's FMA peak and read
// bandwidth (machine_peak.cpp). It separates the GEMV kernel from the rest of Model::decode. Each
// pass is timed by the wall clock and by the thread's CPU time (CLOCK_THREAD_CPUTIME_ID: on a shared
// machine, time the thread spent descheduled does not count).
//
//   bench_gemv_step [--dim C] [--hidden Hd] [--layers L] [--vocab V] [--batch B] [--head-rows R] [--passes N]
//                   [--bf16 1] [--threads T]
//
// Per layer W_Q, W_K, W_V (in calls of R rows: a head's rows, as the step's stage A; default C),
// W_O [C, C], W1, W3 [Hd, C], W2 [C, Hd]; then W_cls [V, C]; f32 weights (--bf16 1: bf16, as
// `--dtype bf16` decodes) in one anonymous mapping with transparent huge pages asked for (as the
// loader's copy of checkpoints ≤ 64 MiB). --threads T > 1: each call's rows cut into T contiguous
// parts run by parallel_for (the threads meet once a call; decode meets once a stage, see
// src/model/decode.cpp), the CPU time then the calling thread's only. Defaults:
// the 6.1 M model of bench/decode_peers.py (288, 768, 6, 512). B = 1 walks W as decode would for these
// weights (blocks::gemv_walk; QKV_GEMV_WALK=blocks|rows|rows_ahead forces one). FLOP model 2·B·(weights); prints the
// best and the median of N passes (the weights of one pass stay in the last-level cache when they
// fit, as they do between decode steps), for both clocks.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <sys/mman.h>
#include <vector>

#include "blocks/dense.hpp"
#include "core/parallel.hpp"
#include "machine_peak.hpp"
#include "qkv/runtime.hpp"

int main(int argc, char** argv) {
  long C = 288, Hd = 768, L = 6, V = 512, B = 8, R = 0, N = 40, bf16 = 0, T = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (v <= 0) return std::fprintf(stderr, "bench_gemv_step: %s must be > 0, got %s\n", a.c_str(), argv[i + 1]), 2;
    if (a == "--dim") C = v;
    else if (a == "--hidden") Hd = v;
    else if (a == "--layers") L = v;
    else if (a == "--vocab") V = v;
    else if (a == "--batch") B = v;
    else if (a == "--head-rows") R = v;
    else if (a == "--passes") N = v;
    else if (a == "--bf16") bf16 = v;
    else if (a == "--threads") T = v;
    else return std::fprintf(stderr, "bench_gemv_step: unknown option %s\n", a.c_str()), 2;
  }
  if (R == 0 || C % R != 0) R = C;
  const long total = L * (4 * C * C + 3 * C * Hd) + V * C;
  const std::size_t wsize = bf16 ? 2 : 4, bytes = static_cast<std::size_t>(total) * wsize;
  void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return std::fprintf(stderr, "bench_gemv_step: cannot map %zu bytes\n", bytes), 1;
  madvise(map, bytes, MADV_HUGEPAGE);
  auto* W = static_cast<float*>(map);
  auto* Wb = static_cast<std::uint16_t*>(map);
  for (long i = 0; i < total; ++i) {
    const float w = static_cast<float>((i * 7919) % 13 - 6) * 0.01f;
    if (bf16) qkv::blocks::f32_to_bf16(Wb + i, &w, 1);
    else W[i] = w;
  }
  std::vector<float> x(static_cast<std::size_t>(B * std::max(C, Hd)), 0.01f), y(static_cast<std::size_t>(B * std::max(V, Hd)));
  const qkv::Isa isa = qkv::active_isa();
  const qkv::blocks::GemvWalk walk = qkv::blocks::gemv_walk(static_cast<std::int64_t>(bytes));  // as decode picks it
  // Rows [o0, o1) of the matrix at element offset w (f32 or bf16), cut into T parts.
  auto gemv = [&](long w, long in, long ld, long o0, long o1) {
    qkv::parallel_for(T, static_cast<int>(T), [&](std::int64_t part) {
      const auto [p0, p1] = qkv::blocks::gemv_part_rows(o1 - o0, static_cast<int>(part), static_cast<int>(T));
      qkv::blocks::gemv_batch_rows(x.data(), bf16 ? nullptr : W + w, bf16 ? Wb + w : nullptr, nullptr, y.data(), ld,
                                   B, in, 0.0f, isa, o0 + p0, o0 + p1, {0, B}, walk);
    });
  };
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  };
  std::vector<double> tc;  // thread CPU time of each pass
  auto pass = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    long p = 0;
    for (long l = 0; l < L; ++l) {
      for (int k = 0; k < 3; ++k, p += C * C)
        for (long h = 0; h < C; h += R) gemv(p, C, C, h, h + R);
      gemv(p, C, C, 0, C), p += C * C;
      gemv(p, C, Hd, 0, Hd), p += C * Hd;
      gemv(p, C, Hd, 0, Hd), p += C * Hd;
      gemv(p, Hd, C, 0, C), p += C * Hd;
    }
    gemv(p, C, V, 0, V);
    tc.push_back(cpu_now() - c0);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<double> t;
  for (long r = 0; r < N; ++r) t.push_back(pass());
  std::sort(t.begin(), t.end());
  std::sort(tc.begin(), tc.end());
  const double peak = qkv_bench::fma_peak_gflops(static_cast<int>(T), isa >= qkv::Isa::avx512);
  const double bw = qkv_bench::read_probe_gbs(static_cast<int>(T));
  const double flop = 2.0 * static_cast<double>(B) * static_cast<double>(total);
  std::printf("C %ld Hd %ld L %ld V %ld, B %ld, rows per W_Q/W_K/W_V call %ld, %.1f MB of %s weights, %ld thread%s, "
              "%s, %s walk%s\n",
              C, Hd, L, V, B, R, static_cast<double>(bytes) / 1e6, bf16 ? "bf16" : "f32", T, T > 1 ? "s" : "",
              qkv::isa_name(isa),
              walk == qkv::blocks::GemvWalk::rows_ahead ? "rows_ahead"
              : walk == qkv::blocks::GemvWalk::rows     ? "rows"
                                                        : "blocks", B == 1 ? "" : " (B = 1 only)");
  std::printf("best %.3f ms (%.1f GFLOP/s, %.0f %% of the FMA peak %.0f; %.1f GB/s of weights, read probe %.1f), "
              "median %.3f ms\n",
              t[0] * 1e3, flop / t[0] * 1e-9, 100.0 * flop / t[0] * 1e-9 / peak, peak,
              static_cast<double>(bytes) / t[0] * 1e-9, bw, t[static_cast<std::size_t>(N / 2)] * 1e3);
  std::printf("thread CPU time: best %.3f ms (%.1f GB/s of weights), median %.3f ms\n", tc[0] * 1e3,
              static_cast<double>(bytes) / tc[0] * 1e-9, tc[static_cast<std::size_t>(N / 2)] * 1e3);
  munmap(map, bytes);
  return 0;
}
