#include "blocks/training_layers.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "blocks/layers.hpp"
#include "blocks/linear.hpp"
#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks::typed {
namespace {

// e^x in f32, written so that `omp simd` loops calling it vectorise: x = k·ln2 + r with
// |r| ≤ ln2/2 (ln2 split in two for an exact k·ln2; k rounded by the 1.5·2^23 trick), e^r by its
// degree-7 Taylor polynomial (truncation r⁸/8! < 6e-9 relative), 2^k put in the exponent bits.
// Inputs are clamped to [−87, 88], where 2^k stays a normal float.
[[gnu::always_inline]] inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  const float kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(kf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// GELU, exact (erf) form, as torch.nn.GELU() and nanoGPT:  gelu(x) = ½x(1 + erf(x/√2)) = x·Φ(x).
// f32 forward and backward over [0, n). The bodies are inlined into one wrapper per instruction set
// (core/per_isa.hpp), and kernels() picks one at run time (qkv::active_isa(), overridable by QKV_ISA).
//
// 1 + erf(x/√2) = 2 − q for x ≥ 0 and q for x < 0, with q = erfc(|x|/√2) from Abramowitz & Stegun
// 7.1.26: erfc(z) ≈ t·(a1 + t·(a2 + t·(a3 + t·(a4 + t·a5))))·e^(−z²), t = 1/(1 + p·z), absolute
// error ≤ 1.5e-7, so |gelu error| ≤ 0.75e-7·|x| (f32 rounding of x is 6e-8·|x|). Writing the x < 0
// branch as q itself avoids the cancellation of 1 − erf. e^(−z²) = e^(−x²/2) is also the Gaussian
// density's, which the slope reuses: gelu'(x) = Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π).
constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;

struct GeluParts {
  float cdf2;  // 1 + erf(x/√2) = 2Φ(x)
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
[[gnu::always_inline]] inline void gelu_fwd_body(float* out, float* slope, const float* x, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = x[i];
    const GeluParts g = gelu_parts(xi);
    out[i] = 0.5f * xi * g.cdf2;
    slope[i] = 0.5f * g.cdf2 + xi * kInvSqrt2Pi * g.gauss;
  }
}

// Softmax cross-entropy rows (crossentropy_forward's contract), f32.
[[gnu::always_inline]] inline void softmax_xent_body(float* probs, float* losses, const float* logits,
                                                     const std::int32_t* targets, std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    float* p = probs + n * V;
    const float target_logit = l[targets[n]];  // read first: probs may alias logits
    float m = l[0];
#pragma omp simd reduction(max : m)
    for (std::int64_t v = 1; v < V; ++v) m = std::max(m, l[v]);
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t v = 0; v < V; ++v) {
      p[v] = exp_f32(l[v] - m);
      sum += p[v];
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (std::int64_t v = 0; v < V; ++v) p[v] *= inv;
    // −log p_target computed from the logits (not from p, which may underflow to 0).
    losses[n] = m + std::log(sum) - target_logit;
  }
}

// LayerNorm's backward over rows of C, f32: layernorm_backward's contract (the forward is
// blocks::layernorm_forward, vectorised per ISA in layers.cpp).
[[gnu::always_inline]] inline void layernorm_bwd_body(float* dx, float* dw, float* db, const float* dout,
                                                      const float* x, const float* w, const float* mean,
                                                      const float* rstd, std::int64_t N, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {  // the derivation is at the generic layernorm_backward
    const float* xn = x + n * C;
    const float* dn = dout + n * C;
    const float mn = mean[n], rs = rstd[n];
    float sum_d = 0, sum_dn = 0;
#pragma omp simd reduction(+ : sum_d, sum_dn)
    for (std::int64_t c = 0; c < C; ++c) {
      const float d = dn[c] * w[c];
      sum_d += d;
      sum_dn += d * ((xn[c] - mn) * rs);
    }
    sum_d /= static_cast<float>(C);
    sum_dn /= static_cast<float>(C);
    float* dxn = dx + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const float norm = (xn[c] - mn) * rs;
      dxn[c] += (dn[c] * w[c] - sum_d - norm * sum_dn) * rs;
      dw[c] += dn[c] * norm;
    }
    if (db)
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) db[c] += dn[c];
  }
}

// SwiGLU over [0, n), f32 (swiglu_forward / swiglu_backward's contracts) with exp_f32: its clamp to
// [−87, 88] only changes σ(g) where it is below 1e-38 or within 1e-38 of 1.
[[gnu::always_inline]] inline void swiglu_fwd_body(float* out, const float* gate, const float* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_f32(-g)) * up[i];
  }
}
[[gnu::always_inline]] inline void swiglu_bwd_body(float* dgate, float* dup, const float* dout, const float* gate,
                                                   const float* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + exp_f32(-g));
    dup[i] = dout[i] * g * sig;
    dgate[i] = dout[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

QKV_PER_ISA(gelu_fwd, gelu_fwd_body, (float* o, float* s, const float* x, std::int64_t n), (o, s, x, n))
QKV_PER_ISA(swiglu_fwd, swiglu_fwd_body, (float* o, const float* g, const float* u, std::int64_t n), (o, g, u, n))
QKV_PER_ISA(swiglu_bwd, swiglu_bwd_body,
            (float* dg, float* du, const float* d, const float* g, const float* u, std::int64_t n),
            (dg, du, d, g, u, n))
QKV_PER_ISA(xent, softmax_xent_body,
            (float* p, float* loss, const float* l, const std::int32_t* t, std::int64_t N, std::int64_t V),
            (p, loss, l, t, N, V))
QKV_PER_ISA(ln_bwd, layernorm_bwd_body,
            (float* dx, float* dw, float* db, const float* d, const float* x, const float* w, const float* m,
             const float* r, std::int64_t N, std::int64_t C),
            (dx, dw, db, d, x, w, m, r, N, C))

struct Kernels {
  decltype(&gelu_fwd_base) gelu_fwd;
  decltype(&xent_base) xent;
  decltype(&ln_bwd_base) ln_bwd;
  decltype(&swiglu_fwd_base) swiglu_fwd;
  decltype(&swiglu_bwd_base) swiglu_bwd;
};
Kernels kernels() {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return {gelu_fwd_avx512, xent_avx512, ln_bwd_avx512, swiglu_fwd_avx512, swiglu_bwd_avx512};
  if (isa >= Isa::avx2) return {gelu_fwd_avx2, xent_avx2, ln_bwd_avx2, swiglu_fwd_avx2, swiglu_bwd_avx2};
  return {gelu_fwd_base, xent_base, ln_bwd_base, swiglu_fwd_base, swiglu_bwd_base};
}

}  // namespace

template <class S>
void embedding_forward(S* out, const std::int32_t* tok, const S* wte, const S* wpe, std::int64_t N, std::int64_t T,
                       std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* e = wte + static_cast<std::int64_t>(tok[n]) * C;
    S* o = out + n * C;
    if (wpe) {
      const S* p = wpe + (n % T) * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <>
void embedding_forward<float>(float* out, const std::int32_t* tok, const float* wte, const float* wpe,
                              std::int64_t N, std::int64_t T, std::int64_t C) {
  for (std::int64_t s0 = 0; s0 < N; s0 += T) blocks::embedding_forward(out + s0 * C, tok + s0, wte, wpe, T, C, 0);
}

template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tok, std::int64_t N, std::int64_t T,
                        std::int64_t C) {
  // Serial on purpose: several positions may share a token row, and a fixed order of the sums
  // keeps a training run bit-for-bit reproducible.
  for (std::int64_t n = 0; n < N; ++n) {
    S* de = dwte + static_cast<std::int64_t>(tok[n]) * C;
    const S* d = dout + n * C;
    for (std::int64_t c = 0; c < C; ++c) de[c] += d[c];
    if (dwpe) {
      S* dp = dwpe + (n % T) * C;
      for (std::int64_t c = 0; c < C; ++c) dp[c] += d[c];
    }
  }
}

template <class S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b, std::int64_t N,
                       std::int64_t C, S eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    S m = 0;
#pragma omp simd reduction(+ : m)
    for (std::int64_t c = 0; c < C; ++c) m += xn[c];
    m /= static_cast<S>(C);
    S var = 0;
#pragma omp simd reduction(+ : var)
    for (std::int64_t c = 0; c < C; ++c) var += (xn[c] - m) * (xn[c] - m);
    var /= static_cast<S>(C);
    const S rs = S(1) / std::sqrt(var + eps);
    S* o = out + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) o[c] = (xn[c] - m) * rs * w[c] + (b ? b[c] : S(0));
    mean[n] = m;
    rstd[n] = rs;
  }
}

template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w, const S* mean, const S* rstd,
                        std::int64_t N, std::int64_t C) {
  // In the forward pass this was out = norm · w + b with norm = (x − mean) · rstd, so now
  //   dnorm = dout · w,   dx = rstd · (dnorm − mean(dnorm) − norm · mean(dnorm · norm)),
  // the two means being the paths through mean and rstd, which every x[c] of the row feeds;
  //   dw = Σ_n dout · norm,  db = Σ_n dout, summed over the rows in order (reproducible sums).
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    const S* dn = dout + n * C;
    const S mn = mean[n], rs = rstd[n];
    S sum_d = 0, sum_dn = 0;
#pragma omp simd reduction(+ : sum_d, sum_dn)
    for (std::int64_t c = 0; c < C; ++c) {
      const S norm = (xn[c] - mn) * rs;
      const S d = dn[c] * w[c];
      sum_d += d;
      sum_dn += d * norm;
    }
    sum_d /= static_cast<S>(C);
    sum_dn /= static_cast<S>(C);
    S* dxn = dx + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const S norm = (xn[c] - mn) * rs;
      dxn[c] += (dn[c] * w[c] - sum_d - norm * sum_dn) * rs;
      dw[c] += dn[c] * norm;
    }
    if (db)
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) db[c] += dn[c];
  }
}

template <>
void layernorm_forward<float>(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                              std::int64_t N, std::int64_t C, float eps) {
  blocks::layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);  // the loops above, vectorised per ISA
}

template <class S>
void rmsnorm_forward(S* out, S* rstd, const S* x, const S* w, std::int64_t N, std::int64_t C, S eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    S ss = 0;
#pragma omp simd reduction(+ : ss)
    for (std::int64_t c = 0; c < C; ++c) ss += xn[c] * xn[c];
    const S rs = S(1) / std::sqrt(ss / static_cast<S>(C) + eps);
    S* o = out + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) o[c] = xn[c] * rs * w[c];
    rstd[n] = rs;
  }
}

template <class S>
void rmsnorm_backward(S* dx, S* dw, const S* dout, const S* x, const S* w, const S* rstd, std::int64_t N,
                      std::int64_t C) {
  // In the forward pass this was out = x̂ ⊙ w with x̂ = x · rstd, rstd = (mean(x²) + eps)^(−½), so now
  //   dx̂ = dout ⊙ w,  dx = rstd · (dx̂ − x̂ · mean(dx̂ · x̂))  (the second term: the path through rstd),
  //   dw = Σ_n dout ⊙ x̂.
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    const S* dn = dout + n * C;
    const S rs = rstd[n];
    S sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < C; ++c) sum += dn[c] * w[c] * xn[c] * rs;
    sum /= static_cast<S>(C);
    S* dxn = dx + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const S xh = xn[c] * rs;
      dxn[c] += (dn[c] * w[c] - xh * sum) * rs;
      dw[c] += dn[c] * xh;
    }
  }
}

template <class S>
void rope_tables(S* cos, S* sin, std::int64_t T, std::int64_t hs, S theta) {
  // blocks::rope_forward's angle: freq = 1 / theta^(i / hs) for the even element index i, in S.
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < hs; i += 2) {
      const S freq = S(1) / std::pow(theta, static_cast<S>(i) / static_cast<S>(hs));
      const S angle = static_cast<S>(t) * freq;
      cos[t * (hs / 2) + i / 2] = std::cos(angle);
      sin[t * (hs / 2) + i / 2] = std::sin(angle);
    }
}

template <class S>
void rope_forward(S* x, const S* cos, const S* sin, std::int64_t N, std::int64_t T, std::int64_t nh,
                  std::int64_t hs) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* c = cos + (n % T) * (hs / 2);
    const S* s = sin + (n % T) * (hs / 2);
    for (std::int64_t h = 0; h < nh; ++h) {
      S* p = x + (n * nh + h) * hs;
      for (std::int64_t i = 0; i < hs / 2; ++i) {
        const S a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c[i] - b * s[i];
        p[2 * i + 1] = a * s[i] + b * c[i];
      }
    }
  }
}

template <class S>
void rope_backward(S* dx, const S* cos, const S* sin, std::int64_t N, std::int64_t T, std::int64_t nh,
                   std::int64_t hs) {
  // In the forward pass each pair was multiplied by the rotation R(angle); its transpose R(−angle)
  // carries the gradient back.
  for (std::int64_t n = 0; n < N; ++n) {
    const S* c = cos + (n % T) * (hs / 2);
    const S* s = sin + (n % T) * (hs / 2);
    for (std::int64_t h = 0; h < nh; ++h) {
      S* p = dx + (n * nh + h) * hs;
      for (std::int64_t i = 0; i < hs / 2; ++i) {
        const S a = p[2 * i], b = p[2 * i + 1];
        p[2 * i] = a * c[i] + b * s[i];
        p[2 * i + 1] = -a * s[i] + b * c[i];
      }
    }
  }
}

template <class S>
void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    out[i] = g / (S(1) + std::exp(-g)) * up[i];
  }
}

template <class S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n) {
  // In the forward pass this was out = g·σ(g) · u, so now du = dout · g·σ(g) and
  // dg = dout · u · (σ(g) + g·σ(g)(1 − σ(g))).
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const S g = gate[i];
    const S sig = S(1) / (S(1) + std::exp(-g));
    dup[i] = dout[i] * g * sig;
    dgate[i] = dout[i] * up[i] * sig * (S(1) + g * (S(1) - sig));
  }
}

// f32: the same arithmetic with exp_f32 (relative error ~1e-7 against std::exp), per ISA: a std::exp
// call per element keeps the loop scalar (≈ 20 % of a Llama training step here).
template <>
void swiglu_forward<float>(float* out, const float* gate, const float* up, std::int64_t n) {
  kernels().swiglu_fwd(out, gate, up, n);
}

template <>
void swiglu_backward<float>(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                            std::int64_t n) {
  kernels().swiglu_bwd(dgate, dup, dout, gate, up, n);
}

template <class S>
void gelu_tanh_forward(S* out, S* slope, const S* x, std::int64_t n) {
  const S k = static_cast<S>(0.79788456080286535588);  // √(2/π)
  const S a = static_cast<S>(0.044715);
  for (std::int64_t i = 0; i < n; ++i) {
    const S v = x[i];
    const S th = std::tanh(k * (v + a * v * v * v));
    out[i] = S(0.5) * v * (S(1) + th);
    slope[i] = S(0.5) * (S(1) + th) + S(0.5) * v * (S(1) - th * th) * k * (S(1) + S(3) * a * v * v);
  }
}

template <>
void layernorm_backward<float>(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                               const float* mean, const float* rstd, std::int64_t N, std::int64_t C) {
  kernels().ln_bwd(dx, dw, db, dout, x, w, mean, rstd, N, C);
}

template <class S>
void gelu_forward(S* out, S* slope, const S* x, std::int64_t n) {
  // d/dx x·Φ(x) = Φ(x) + x·φ(x), Φ the standard normal CDF ½(1 + erf(x/√2)) and φ(x) = e^(−x²/2)/√(2π)
  // its density.
  const S inv_sqrt_2pi = static_cast<S>(0.39894228040143267794);
  for (std::int64_t i = 0; i < n; ++i) {
    const S v = x[i];
    const S cdf = S(0.5) * (S(1) + std::erf(v * static_cast<S>(M_SQRT1_2)));
    out[i] = v * cdf;
    slope[i] = cdf + v * inv_sqrt_2pi * std::exp(-S(0.5) * v * v);
  }
}

// f32: the vectorised kernel (blocks::gelu_exact_forward, the inference layer, computes the same
// function with std::erf; the two differ by ≤ ~1e-7 · |x|).
template <>
void gelu_forward<float>(float* out, float* slope, const float* x, std::int64_t n) {
  kernels().gelu_fwd(out, slope, x, n);
}

template <class S>
void gelu_backward(S* dx, const S* slope, const S* dout, std::int64_t n) {
  // In the forward pass this was out = gelu(x), whose derivative the forward kept as slope.
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) dx[i] = dout[i] * slope[i];
}

template <class S>
double crossentropy_forward(S* probs, S* losses, const S* logits, const std::int32_t* targets, std::int64_t N,
                            std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* l = logits + n * V;
    S* p = probs + n * V;
    const S target_logit = l[targets[n]];  // read first: probs may alias logits
    S m = l[0];
    for (std::int64_t v = 1; v < V; ++v) m = std::max(m, l[v]);
    S sum = 0;
    for (std::int64_t v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - m);
      sum += p[v];
    }
    const S inv = S(1) / sum;
    for (std::int64_t v = 0; v < V; ++v) p[v] *= inv;
    // −log p_target computed from the logits (not from p, which may underflow to 0).
    losses[n] = m + std::log(sum) - target_logit;
  }
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) total += losses[n];
  return total;
}

// f32: the same rows with the vectorised exp_f32 (relative error ~1e-7 against std::exp).
template <>
double crossentropy_forward<float>(float* probs, float* losses, const float* logits, const std::int32_t* targets,
                                   std::int64_t N, std::int64_t V) {
  kernels().xent(probs, losses, logits, targets, N, V);
  double total = 0;
  for (std::int64_t n = 0; n < N; ++n) total += losses[n];
  return total;
}

template <class S>
void crossentropy_backward(S* dlogits, const S* probs, const std::int32_t* targets, std::int64_t N, std::int64_t V,
                           S scale) {
  // In the forward pass this was loss = logsumexp(logits) − logits[target], so now
  // ∂loss/∂logits = softmax(logits) − onehot(target).
  for (std::int64_t n = 0; n < N; ++n) {
    const S* p = probs + n * V;
    S* d = dlogits + n * V;
    for (std::int64_t v = 0; v < V; ++v) d[v] = scale * p[v];
    d[targets[n]] -= scale;
  }
}

template <>
void dense_forward<float>(const float* x, const float* W, const float* b, float* y, std::int64_t N, std::int64_t in,
                          std::int64_t out, bool accumulate) {
  linear_forward(x, W, b, y, N, in, out, accumulate ? 1.0f : 0.0f);
}

template <>
void dense_forward<double>(const double* x, const double* W, const double* b, double* y, std::int64_t N,
                           std::int64_t in, std::int64_t out, bool accumulate) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) s += x[n * in + i] * W[o * in + i];
      y[n * out + o] = accumulate ? y[n * out + o] + s : s;
    }
}

template <>
void dense_backward<float>(const float* x, const float* W, const float* dy, float* dx, float* dW, float* db,
                           std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx) {
  linear_backward(x, W, dy, dx, dW, db, N, in, out, accumulate_dx);
}

template <>
void dense_backward<double>(const double* x, const double* W, const double* dy, double* dx, double* dW, double* db,
                            std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx) {
  // In the forward pass this was y = x·Wᵀ + b, so now dx = dy·W, dW += dyᵀ·x, db += Σ_n dy.
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (std::int64_t o = 0; o < out; ++o) s += dy[n * out + o] * W[o * in + i];
      dx[n * in + i] = accumulate_dx ? dx[n * in + i] + s : s;
    }
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t n = 0; n < N; ++n) {
      const double d = dy[n * out + o];
      if (db) db[o] += d;
      for (std::int64_t i = 0; i < in; ++i) dW[o * in + i] += d * x[n * in + i];
    }
}

#define QKV_INSTANTIATE(S)                                                                                      \
  template void embedding_forward<S>(S*, const std::int32_t*, const S*, const S*, std::int64_t, std::int64_t,   \
                                     std::int64_t);                                                             \
  template void embedding_backward<S>(S*, S*, const S*, const std::int32_t*, std::int64_t, std::int64_t,        \
                                      std::int64_t);                                                            \
  template void layernorm_forward<S>(S*, S*, S*, const S*, const S*, const S*, std::int64_t, std::int64_t, S);  \
  template void rmsnorm_forward<S>(S*, S*, const S*, const S*, std::int64_t, std::int64_t, S);                  \
  template void rmsnorm_backward<S>(S*, S*, const S*, const S*, const S*, const S*, std::int64_t, std::int64_t); \
  template void rope_tables<S>(S*, S*, std::int64_t, std::int64_t, S);                                          \
  template void rope_forward<S>(S*, const S*, const S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t); \
  template void rope_backward<S>(S*, const S*, const S*, std::int64_t, std::int64_t, std::int64_t, std::int64_t); \
  template void swiglu_forward<S>(S*, const S*, const S*, std::int64_t);                                        \
  template void swiglu_backward<S>(S*, S*, const S*, const S*, const S*, std::int64_t);                         \
  template void gelu_tanh_forward<S>(S*, S*, const S*, std::int64_t);                                           \
  template void layernorm_backward<S>(S*, S*, S*, const S*, const S*, const S*, const S*, const S*,             \
                                      std::int64_t, std::int64_t);                                              \
  template void gelu_forward<S>(S*, S*, const S*, std::int64_t);                                                \
  template void gelu_backward<S>(S*, const S*, const S*, std::int64_t);                                         \
  template double crossentropy_forward<S>(S*, S*, const S*, const std::int32_t*, std::int64_t, std::int64_t);   \
  template void crossentropy_backward<S>(S*, const S*, const std::int32_t*, std::int64_t, std::int64_t, S);
QKV_INSTANTIATE(float)
QKV_INSTANTIATE(double)
#undef QKV_INSTANTIATE

}  // namespace qkv::blocks::typed
