#include "blocks/activation.hpp"

#include <cmath>

#include "blocks/exp_f32.hpp"
#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks {
namespace {

template <class S>
void gelu_tanh(S* out, const S* x, std::int64_t n, S* slope) {
  const S k = static_cast<S>(0.79788456080286535588);  // √(2/π)
  const S a = static_cast<S>(0.044715);
  for (std::int64_t i = 0; i < n; ++i) {
    const S v = x[i];
    const S th = std::tanh(k * (v + a * v * v * v));
    out[i] = S(0.5) * v * (S(1) + th);
    if (slope) slope[i] = S(0.5) * (S(1) + th) + S(0.5) * v * (S(1) - th * th) * k * (S(1) + S(3) * a * v * v);
  }
}

// The exact GELU in f32 (gelu_exact_forward's contract). 1 + erf(x/√2) = 2 − q for x ≥ 0 and q for
// x < 0, with q = erfc(|x|/√2) ≈ t·(a1 + t·(a2 + t·(a3 + t·(a4 + t·a5))))·e^(−z²), t = 1/(1 + p·z):
// writing the x < 0 branch as q itself avoids the cancellation of 1 − erf. e^(−z²) = e^(−x²/2) is
// also the Gaussian density's, which the slope reuses.
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

struct GeluParts {
  float cdf2;   // 1 + erf(x/√2) = 2Φ(x)
  float gauss;  // e^(−x²/2)
};
[[gnu::always_inline]] inline GeluParts gelu_parts(float x) {
  const float z = std::fabs(x) * kInvSqrt2;
  const float t = 1.0f / (1.0f + 0.3275911f * z);
  const float poly =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float gauss = exp_f32(-z * z);
  const float q = poly * gauss;
  return {x < 0.0f ? q : 2.0f - q, gauss};
}

// slope may alias x: element i is read before it is written, and no other element is touched.
[[gnu::always_inline]] inline void gelu_exact_body(float* out, const float* x, std::int64_t n, float* slope) {
  if (!slope) {
#pragma omp simd
    for (std::int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * gelu_parts(x[i]).cdf2;
    return;
  }
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const GeluParts g = gelu_parts(xi);
    out[i] = 0.5f * xi * g.cdf2;
    slope[i] = 0.5f * g.cdf2 + xi * kInvSqrt2Pi * g.gauss;
  }
}

// SwiGLU in f32 with exp_f32: its clamp to [−87, 88] only changes σ(g) where it is below 1e-38 or
// within 1e-38 of 1.
template <class S>
[[gnu::always_inline]] inline S sigmoid(S g) {
  if constexpr (sizeof(S) == 4) return S(1) / (S(1) + exp_f32(-g));
  else return S(1) / (S(1) + std::exp(-g));
}
template <class S>
[[gnu::always_inline]] inline void swiglu_fwd_body(S* out, const S* gate, const S* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    out[i] = g * sigmoid(g) * up[i];
  }
}
template <class S>
[[gnu::always_inline]] inline void swiglu_bwd_body(S* dgate, S* dup, const S* dout, const S* gate, const S* up,
                                                   std::int64_t n) {
  // In the forward pass this was out = g·σ(g) · u, so now du = dout · g·σ(g) and
  // dg = dout · u · (σ(g) + g·σ(g)(1 − σ(g))).
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    const S sig = sigmoid(g);
    dup[i] = dout[i] * g * sig;
    dgate[i] = dout[i] * up[i] * sig * (S(1) + g * (S(1) - sig));
  }
}

QKV_PER_ISA(gelu_exact_f32, gelu_exact_body, (float* o, const float* x, std::int64_t n, float* s), (o, x, n, s))
QKV_PER_ISA(swiglu_fwd_f32, swiglu_fwd_body<float>, (float* o, const float* g, const float* u, std::int64_t n),
            (o, g, u, n))
QKV_PER_ISA(swiglu_bwd_f32, swiglu_bwd_body<float>,
            (float* dg, float* du, const float* d, const float* g, const float* u, std::int64_t n),
            (dg, du, d, g, u, n))

// The instruction set's version of f (NAME_base, NAME_avx2, NAME_avx512 of QKV_PER_ISA).
template <class F>
F pick(F base, F avx2, F avx512) {
  const Isa isa = active_isa();
  return isa >= Isa::avx512 ? avx512 : isa >= Isa::avx2 ? avx2 : base;
}

}  // namespace

void gelu_tanh_forward(float* out, const float* x, std::int64_t n, float* slope) { gelu_tanh(out, x, n, slope); }
void gelu_tanh_forward(double* out, const double* x, std::int64_t n, double* slope) { gelu_tanh(out, x, n, slope); }

void gelu_exact_forward(float* out, const float* x, std::int64_t n, float* slope) {
  pick(gelu_exact_f32_base, gelu_exact_f32_avx2, gelu_exact_f32_avx512)(out, x, n, slope);
}
void gelu_exact_forward(double* out, const double* x, std::int64_t n, double* slope) {
  const double inv_sqrt_2pi = 0.39894228040143267794;
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double cdf = 0.5 * (1.0 + std::erf(v * M_SQRT1_2));
    out[i] = v * cdf;
    if (slope) slope[i] = cdf + v * inv_sqrt_2pi * std::exp(-0.5 * v * v);
  }
}

template <class S>
static void gelu_bwd(S* dx, const S* slope, const S* dout, std::int64_t n) {
  // In the forward pass this was out = gelu(x), whose derivative the forward kept as slope.
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dout[i] * slope[i];
}
void gelu_backward(float* dx, const float* slope, const float* dout, std::int64_t n) { gelu_bwd(dx, slope, dout, n); }
void gelu_backward(double* dx, const double* slope, const double* dout, std::int64_t n) {
  gelu_bwd(dx, slope, dout, n);
}

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  pick(swiglu_fwd_f32_base, swiglu_fwd_f32_avx2, swiglu_fwd_f32_avx512)(out, gate, up, n);
}
void swiglu_forward(double* out, const double* gate, const double* up, std::int64_t n) {
  swiglu_fwd_body(out, gate, up, n);
}
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::int64_t n) {
  pick(swiglu_bwd_f32_base, swiglu_bwd_f32_avx2, swiglu_bwd_f32_avx512)(dgate, dup, dout, gate, up, n);
}
void swiglu_backward(double* dgate, double* dup, const double* dout, const double* gate, const double* up,
                     std::int64_t n) {
  swiglu_bwd_body(dgate, dup, dout, gate, up, n);
}

}  // namespace qkv::blocks
