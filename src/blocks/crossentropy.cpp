#include "blocks/crossentropy.hpp"

#include <algorithm>
#include <cmath>

#include "blocks/exp_f32.hpp"
#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks {
namespace {

template <class S>
[[gnu::always_inline]] inline S exp_of(S x) {
  if constexpr (sizeof(S) == 4) return exp_f32(x);
  else return std::exp(x);
}

template <class S>
[[gnu::always_inline]] inline void forward_body(S* probs, S* losses, const S* logits, const int* targets,
                                                std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* l = logits + n * V;
    S* p = probs + n * V;
    const S target_logit = l[targets[n]];  // read first: probs may alias logits
    S m = l[0];
#pragma omp simd reduction(max : m)
    for (std::int64_t v = 1; v < V; ++v) m = std::max(m, l[v]);
    S sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t v = 0; v < V; ++v) {
      p[v] = exp_of(l[v] - m);
      sum += p[v];
    }
    const S inv = S(1) / sum;
#pragma omp simd
    for (std::int64_t v = 0; v < V; ++v) p[v] *= inv;
    losses[n] = m + std::log(sum) - target_logit;
  }
}

QKV_PER_ISA(xent_f32, forward_body<float>,
            (float* p, float* loss, const float* l, const int* t, std::int64_t N, std::int64_t V),
            (p, loss, l, t, N, V))

template <class S>
double total(const S* losses, std::int64_t N) {
  double t = 0;
  for (std::int64_t n = 0; n < N; ++n) t += losses[n];
  return t;
}

template <class S>
void backward(S* dlogits, const S* probs, const int* targets, std::int64_t N, std::int64_t V, S scale) {
  // In the forward pass this was loss = logsumexp(logits) − logits[target], so now
  // ∂loss/∂logits = softmax(logits) − onehot(target).
  for (std::int64_t n = 0; n < N; ++n) {
    const S* p = probs + n * V;
    S* d = dlogits + n * V;
    for (std::int64_t v = 0; v < V; ++v) d[v] = scale * p[v];
    d[targets[n]] -= scale;
  }
}

}  // namespace

double crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, std::int64_t N,
                            std::int64_t V) {
  const Isa isa = active_isa();
  (isa >= Isa::avx512 ? xent_f32_avx512 : isa >= Isa::avx2 ? xent_f32_avx2 : xent_f32_base)(probs, losses, logits,
                                                                                         targets, N, V);
  return total(losses, N);
}
double crossentropy_forward(double* probs, double* losses, const double* logits, const int* targets,
                            std::int64_t N, std::int64_t V) {
  forward_body(probs, losses, logits, targets, N, V);
  return total(losses, N);
}
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, std::int64_t N, std::int64_t V,
                           float scale) {
  backward(dlogits, probs, targets, N, V, scale);
}
void crossentropy_backward(double* dlogits, const double* probs, const int* targets, std::int64_t N, std::int64_t V,
                           double scale) {
  backward(dlogits, probs, targets, N, V, scale);
}

}  // namespace qkv::blocks
