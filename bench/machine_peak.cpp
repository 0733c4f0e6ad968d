// The machine's own limits, measured where the benchmarks run: fp32 FMA peak (AVX-512 when the
// CPU has it, else AVX2), the bf16 dot-product (vdpbf16ps) peak, read bandwidth from memory and the
// STREAM triad, all on `threads` threads.
// Compiled with -mavx512f -mavx2 -mfma (bench only): needs AVX2; AVX-512 only when asked for; the
// bf16 loop carries its own target attribute and runs only where the CPU has AVX-512 BF16.
#include "machine_peak.hpp"

#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace qkv_bench {
namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// 16 independent FMA chains per thread (enough to cover 4-cycle latency on 2 pipes twice over).
template <class V, V (*Fma)(V, V, V), V (*Set)(float)>
float fma_loop(std::int64_t iters) {
  V acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = Set(0.001f * static_cast<float>(i));
  const V a = Set(0.999999f), b = Set(1e-7f);
  for (std::int64_t n = 0; n < iters; ++n)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = Fma(acc[i], a, b);
  V s = acc[0];
  for (int i = 1; i < 16; ++i) s = Fma(s, a, acc[i]);
  float out[16];
  std::memcpy(out, &s, sizeof(float) * (sizeof(V) / 4));
  return out[0];
}
__m512 fma512(__m512 x, __m512 a, __m512 b) { return _mm512_fmadd_ps(x, a, b); }
__m512 set512(float x) { return _mm512_set1_ps(x); }
__m256 fma256(__m256 x, __m256 a, __m256 b) { return _mm256_fmadd_ps(x, a, b); }
__m256 set256(float x) { return _mm256_set1_ps(x); }

}  // namespace

double fma_peak_gflops(int threads, bool avx512) {
  const std::int64_t iters = 100'000'000;
  volatile float sink = 0.0f;
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      const float r = avx512 ? fma_loop<__m512, fma512, set512>(iters) : fma_loop<__m256, fma256, set256>(iters);
      sink = sink + r;
    }
    const double t = now() - t0;
    const double flops = 2.0 * 16 * (avx512 ? 16 : 8) * static_cast<double>(iters) * threads;
    best = flops / t / 1e9 > best ? flops / t / 1e9 : best;
  }
  return best;
}

namespace {

// 16 independent vdpbf16ps chains per thread: each instruction is 16 lanes × (2 products + 2 sums)
// = 64 flops, the bf16 GEMMs' and kernels' instruction. Compiled for AVX-512 BF16 here only.
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_loop(std::int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);  // 1, 6e-8
  for (std::int64_t n = 0; n < iters; ++n)
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  __m512 s = acc[0];
  for (int i = 1; i < 16; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_cvtss_f32(s);
}

}  // namespace

double bf16_dot_peak_gflops(int threads) {
  const std::int64_t iters = 100'000'000;
  volatile float sink = 0.0f;
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      const float r = bf16_dot_loop(iters);
      sink = sink + r;
    }
    const double g = 64.0 * 16 * static_cast<double>(iters) * threads / (now() - t0) / 1e9;
    best = g > best ? g : best;
  }
  return best;
}

namespace {

constexpr std::size_t kProbeFloats = std::size_t{1} << 27;  // 512 MiB of floats: far beyond the LLC

float* probe_buffer_new(int threads) {
  auto* x = static_cast<float*>(std::aligned_alloc(64, kProbeFloats * sizeof(float)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < kProbeFloats; ++i) x[i] = 1.0f;
  return x;
}

// Best of `reps` sweeps reading x[0, kProbeFloats) on `threads` threads, GB/s.
double sweep_gbs(const float* x, int threads, int reps) {
  const std::size_t n = kProbeFloats;
  double best = 0.0;
  volatile float sink = 0.0f;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = now();
#pragma omp parallel num_threads(threads)
    {
      // 256-bit loads (AVX2) already saturate memory; 4 chains hide the add latency.
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
#pragma omp for schedule(static)
      for (std::size_t i = 0; i < n; i += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(x + i));
        s1 = _mm256_add_ps(s1, _mm256_load_ps(x + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(x + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_load_ps(x + i + 24));
      }
      float r[8];
      _mm256_storeu_ps(r, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
      sink = sink + r[0];
    }
    const double t = now() - t0;
    const double gbs = static_cast<double>(n * sizeof(float)) / t / 1e9;
    best = gbs > best ? gbs : best;
  }
  return best;
}

}  // namespace

double read_bandwidth_gbs(int threads) {
  float* x = probe_buffer_new(threads);
  const double best = sweep_gbs(x, threads, 5);
  std::free(x);
  return best;
}

// McCalpin's STREAM triad a[i] = b[i] + s·c[i] on f64 arrays of 128 MiB each (far beyond the LLC),
// counted as STREAM counts it: 3 × 8 bytes per element (the write-allocate read of a is not
// counted). This is "the stream bandwidth" of the usual sense; the read probe above is the higher
// bar for a kernel that only reads, as decode does.
double stream_triad_gbs(int threads) {
  const std::size_t n = std::size_t{1} << 24;
  auto* a = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
  auto* b = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
  auto* c = static_cast<double*>(std::aligned_alloc(64, n * sizeof(double)));
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::size_t i = 0; i < n; ++i) a[i] = 0.0, b[i] = 1.0, c[i] = 2.0;
  double best = 0.0;
  const double s = 3.0;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::size_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
    const double t = now() - t0;
    const double gbs = 3.0 * static_cast<double>(n * sizeof(double)) / t / 1e9;
    best = gbs > best ? gbs : best;
  }
  volatile double sink = a[n / 2];
  (void)sink;
  std::free(a);
  std::free(b);
  std::free(c);
  return best;
}

double read_probe_gbs(int threads) {
  static float* x = probe_buffer_new(threads);  // kept for the process: allocated and touched once
  return sweep_gbs(x, threads, 3);
}

}  // namespace qkv_bench
