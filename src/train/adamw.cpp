#include "train/adamw.hpp"

#include <algorithm>
#include <cmath>

#include "core/parallel.hpp"
#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::train {

double lr_at(const AdamWConfig& c, std::int64_t step) {
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup + 1);
  if (step > c.decay_steps) return c.min_lr;
  const double span = static_cast<double>(c.decay_steps - c.warmup);
  const double ratio = span > 0 ? static_cast<double>(step - c.warmup) / span : 1.0;
  return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (c.lr - c.min_lr);
}

namespace {

// The flat parameter array is processed in chunks of this many elements spread over the threads;
// the chunking does not depend on the thread count, so neither do the results.
constexpr std::int64_t kChunk = 1 << 14;
std::int64_t chunks(std::int64_t n) { return (n + kChunk - 1) / kChunk; }
int threads_for(std::int64_t n) { return n < 4 * kChunk ? 1 : qkv::num_threads(); }

// Σ g² over [0, n) in f64.
[[gnu::always_inline]] inline void sumsq_body(double* out, const float* g, std::int64_t n) {
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(g[i]) * g[i];
  *out = ss;
}

// The AdamW update of [0, n) (adamw_step's comment), the decay factor `shrink` already applied.
struct AdamConsts {
  float b1, b2, step_size, inv_sqrt_bc2, eps;
};
[[gnu::always_inline]] inline void adam_body(float* p, const float* g, float* m, float* v, std::int64_t n,
                                             const AdamConsts& k) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = k.b1 * m[i] + (1.0f - k.b1) * g[i];
    v[i] = k.b2 * v[i] + (1.0f - k.b2) * g[i] * g[i];
    p[i] -= k.step_size * m[i] / (std::sqrt(v[i]) * k.inv_sqrt_bc2 + k.eps);
  }
}

QKV_PER_ISA(sumsq, sumsq_body, (double* out, const float* g, std::int64_t n), (out, g, n))
QKV_PER_ISA(adam, adam_body, (float* p, const float* g, float* m, float* v, std::int64_t n, const AdamConsts& k),
            (p, g, m, v, n, k))

}  // namespace

double clip_grad_norm(float* g, std::int64_t n, double max_norm) {
  const Isa isa = active_isa();
  const auto sumsq = isa >= Isa::avx512 ? sumsq_avx512 : isa >= Isa::avx2 ? sumsq_avx2 : sumsq_base;
  // Σ g² per chunk, then the chunk sums in order.
  std::vector<double> part(static_cast<std::size_t>(chunks(n)));
  parallel_for(chunks(n), threads_for(n), [&](std::int64_t c) {
    const std::int64_t lo = c * kChunk;
    sumsq(&part[static_cast<std::size_t>(c)], g + lo, std::min(kChunk, n - lo));
  });
  double ss = 0;
  for (double s : part) ss += s;
  const double norm = std::sqrt(ss);
  if (max_norm > 0 && norm > max_norm) {
    const auto coef = static_cast<float>(max_norm / (norm + 1e-6));
    parallel_for(chunks(n), threads_for(n), [&](std::int64_t c) {
      const std::int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
#pragma omp simd
      for (std::int64_t i = lo; i < hi; ++i) g[i] *= coef;
    });
  }
  return norm;
}

void adamw_step(float* p, const float* g, float* m, float* v, std::int64_t n, const std::vector<DecayRange>& decay,
                const AdamWConfig& c, double lr, std::int64_t t) {
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  const AdamConsts k{static_cast<float>(c.beta1), static_cast<float>(c.beta2), static_cast<float>(lr / bc1),
                     static_cast<float>(1.0 / std::sqrt(bc2)), static_cast<float>(c.eps)};
  const auto shrink = static_cast<float>(1.0 - lr * c.weight_decay);
  const Isa isa = active_isa();
  const auto adam = isa >= Isa::avx512 ? adam_avx512 : isa >= Isa::avx2 ? adam_avx2 : adam_base;
  parallel_for(chunks(n), threads_for(n), [&](std::int64_t ch) {
    const std::int64_t lo = ch * kChunk, hi = std::min(n, lo + kChunk);
    for (const auto& r : decay) {
      const std::int64_t a = std::max(lo, r.begin), b = std::min(hi, r.end);
#pragma omp simd
      for (std::int64_t i = a; i < b; ++i) p[i] *= shrink;
    }
    adam(p + lo, g + lo, m + lo, v + lo, hi - lo, k);
  });
}

}  // namespace qkv::train
