#include "blocks/layers.hpp"

#include <cmath>

#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks {

void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* e = wte + static_cast<std::int64_t>(tokens[n]) * C;
    float* o = out + n * C;
    if (wpe) {
      const float* p = wpe + (pos0 + n) * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, std::int64_t N, std::int64_t C,
                     float eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* o = out + n * C;
    float ss = 0.0f;
    for (std::int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
    for (std::int64_t c = 0; c < C; ++c) o[c] = w[c] * (r * xr[c]);
    if (rstd) rstd[n] = r;
  }
}

namespace {

// LayerNorm of rows [0, N), the two sums and the output loop in SIMD lanes of the ISA it is
// compiled for (QKV_PER_ISA): a serial f32 sum waits one add latency per element, and so the
// baseline build's LayerNorm took ≈ 4% of a GPT-2-small prefill (perf record -e cpu-clock).
[[gnu::always_inline]] inline void layernorm_body(float* out, float* mean, float* rstd, const float* x, const float* w,
                                                  const float* b, std::int64_t N, std::int64_t C, float eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* xr = x + n * C;
    float* o = out + n * C;
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (std::int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (std::int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<float>(C);
    const float r = 1.0f / std::sqrt(v + eps);
    // Two loops, not `b ? b[c] : 0` in one: that vectorises into a masked load from b, and a masked
    // load from a null b (all lanes off) costs a fault-suppression assist per vector on Zen 4.
    if (b) {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * r * w[c] + b[c];
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * r * w[c] + 0.0f;  // as before: −0 becomes +0
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

QKV_PER_ISA(layernorm, layernorm_body,
            (float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, std::int64_t N,
             std::int64_t C, float eps),
            (out, mean, rstd, x, w, b, N, C, eps))

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       std::int64_t N, std::int64_t C, float eps) {
  const Isa isa = active_isa();
  const auto f = isa >= Isa::avx512 ? layernorm_avx512 : isa >= Isa::avx2 ? layernorm_avx2 : layernorm_base;
  f(out, mean, rstd, x, w, b, N, C, eps);
}

namespace {
// llama2.c: freq = 1 / theta^(i / hs) with i the even element index, all in f32.
void rope_cos_sin(std::int64_t i, std::int64_t hs, float pos, float theta, float& c, float& s) {
  const float freq = 1.0f / std::pow(theta, static_cast<float>(i) / static_cast<float>(hs));
  const float angle = pos * freq;
  c = std::cos(angle), s = std::sin(angle);
}
void rope_turn(float* p, float c, float s) {
  const float a = p[0], bb = p[1];
  p[0] = a * c - bb * s;
  p[1] = a * s + bb * c;
}
}  // namespace

void rope_forward(float* x, std::int64_t N, std::int64_t nh, std::int64_t hs, std::int64_t pos0, float theta) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float pos = static_cast<float>(pos0 + n);
    for (std::int64_t i = 0; i < hs; i += 2) {
      float c, s;
      rope_cos_sin(i, hs, pos, theta, c, s);
      for (std::int64_t h = 0; h < nh; ++h) rope_turn(x + (n * nh + h) * hs + i, c, s);
    }
  }
}

void rope_angles(float* cs, std::int64_t hs, std::int64_t pos, float theta) {
  for (std::int64_t i = 0; i < hs; i += 2) rope_cos_sin(i, hs, static_cast<float>(pos), theta, cs[i], cs[i + 1]);
}

void rope_apply(float* x, std::int64_t nh, std::int64_t hs, const float* cs) {
  for (std::int64_t h = 0; h < nh; ++h)
    for (std::int64_t i = 0; i < hs; i += 2) rope_turn(x + h * hs + i, cs[i], cs[i + 1]);
}

void gelu_forward(float* out, const float* x, std::int64_t n) {
  const float k = std::sqrt(2.0f / static_cast<float>(M_PI));
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
  }
}

void gelu_exact_forward(float* out, const float* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
}

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g * (1.0f / (1.0f + std::exp(-g))) * up[i];
  }
}

void softmax_forward(float* probs, const float* logits, std::int64_t N, std::int64_t V) {
  for (std::int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * V;
    float* p = probs + n * V;
    float mx = l[0];
    for (std::int64_t v = 1; v < V; ++v) mx = l[v] > mx ? l[v] : mx;
    float sum = 0.0f;
    for (std::int64_t v = 0; v < V; ++v) {
      p[v] = std::exp(l[v] - mx);
      sum += p[v];
    }
    const float inv = 1.0f / sum;
    for (std::int64_t v = 0; v < V; ++v) p[v] *= inv;
  }
}

void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace qkv::blocks
