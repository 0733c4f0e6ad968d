#include "train/adamw.hpp"

#include <cmath>

namespace qkv::train {

double lr_at(const AdamWConfig& c, std::int64_t step) {
  if (step < c.warmup) return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup + 1);
  if (step > c.decay_steps) return c.min_lr;
  const double span = static_cast<double>(c.decay_steps - c.warmup);
  const double ratio = span > 0 ? static_cast<double>(step - c.warmup) / span : 1.0;
  return c.min_lr + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (c.lr - c.min_lr);
}

double clip_grad_norm(float* g, std::int64_t n, double max_norm) {
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (std::int64_t i = 0; i < n; ++i) ss += static_cast<double>(g[i]) * g[i];
  const double norm = std::sqrt(ss);
  if (max_norm > 0 && norm > max_norm) {
    const auto coef = static_cast<float>(max_norm / (norm + 1e-6));
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) g[i] *= coef;
  }
  return norm;
}

void adamw_step(float* p, const float* g, float* m, float* v, std::int64_t n, const std::vector<DecayRange>& decay,
                const AdamWConfig& c, double lr, std::int64_t t) {
  const auto b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const double bc1 = 1.0 - std::pow(c.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(c.beta2, static_cast<double>(t));
  const auto step_size = static_cast<float>(lr / bc1);
  const auto inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const auto eps = static_cast<float>(c.eps);
  const auto shrink = static_cast<float>(1.0 - lr * c.weight_decay);
  for (const auto& r : decay)
#pragma omp simd
    for (std::int64_t i = r.begin; i < r.end; ++i) p[i] *= shrink;
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1.0f - b1) * g[i];
    v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
    p[i] -= step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + eps);
  }
}

}  // namespace qkv::train
