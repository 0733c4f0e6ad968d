// The backward of the whole GPT (embeddings, LayerNorms, causal attention, GELU MLP, tied
// unembedding, cross-entropy at every position) against central finite differences of the f64
// twin, and the f32 model against the f64 one for the same weights and batch.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "train/gpt.hpp"
#include "train/rng.hpp"

namespace {

using qkv::train::Gpt;
using qkv::train::GptConfig;
using qkv::train::Rng;

GptConfig tiny(bool bias) {
  GptConfig c;
  c.vocab = 7, c.context = 6, c.layers = 2, c.heads = 2, c.embd = 8, c.bias = bias;
  return c;
}

// Weights of order 1 (not nanoGPT's 0.02) so every path — attention patterns far from uniform,
// GELU curvature, LayerNorm gains — carries a gradient well above rounding.
void random_weights(std::vector<double>& p, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& w : p) w = 0.5 * rng.normal();
}

void batch(std::int64_t N, std::int64_t V, std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
  Rng rng(99);
  x.resize(static_cast<std::size_t>(N));
  y.resize(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n) {
    x[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(V)));
    y[static_cast<std::size_t>(n)] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(V)));
  }
}

class GptGrad : public ::testing::TestWithParam<bool> {};

// Central differences in f64 with step h = 1e-5: truncation ~h²·|f'''| ≈ 1e-10 and rounding
// ~1e-16/h ≈ 1e-11, so analytic and numeric gradients agree to ~1e-9; 1e-6 of the largest gradient
// (≈ 0.1 here) is a bound any real mistake — a missing path, a wrong sign — exceeds by orders.
TEST_P(GptGrad, MatchesFiniteDifferencesInF64) {
  const GptConfig cfg = tiny(GetParam());
  const std::int64_t B = 2, T = 5;
  // One thread: 2 × 1,800 forwards of a tiny model, where waking a second thread costs more than
  // the work (and on a loaded machine much more).
  const int threads = qkv::num_threads();
  qkv::set_num_threads(1);
  Gpt<double> m(cfg, B, T);
  random_weights(m.params, 1);
  std::vector<std::int32_t> x, y;
  batch(B * T, cfg.vocab, x, y);
  m.zero_grad();
  m.forward(x.data(), y.data());
  m.backward(1.0);
  double gmax = 0, err = 0;
  for (double g : m.grads) gmax = std::max(gmax, std::abs(g));
  const double h = 1e-5;
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    const double w = m.params[i];
    m.params[i] = w + h;
    const double lp = m.forward(x.data(), y.data());
    m.params[i] = w - h;
    const double lm = m.forward(x.data(), y.data());
    m.params[i] = w;
    err = std::max(err, std::abs((lp - lm) / (2 * h) - m.grads[i]));
  }
  qkv::set_num_threads(threads);
  std::printf("%zu parameters, max |grad| %.3g, max |analytic − finite difference| %.3g\n", m.params.size(), gmax,
              err);
  EXPECT_GT(gmax, 1e-2);
  EXPECT_LT(err, 1e-6 * gmax);
}

// The f32 model (oneDNN sgemm, fast erf/exp, the f32 attention kernels) against the f64 twin on the
// same weights: f32 rounding (2^-24 ≈ 6e-8) grows through ~2L+2 layers of sums of ≤ 4C terms; 1e-4
// of the largest gradient leaves a margin of ~100× over that, and loss agreement 1e-5 likewise.
TEST_P(GptGrad, F32MatchesF64Twin) {
  const GptConfig cfg = tiny(GetParam());
  const std::int64_t B = 3, T = 6;
  Gpt<double> m64(cfg, B, T);
  Gpt<float> m32(cfg, B, T);
  random_weights(m64.params, 2);
  for (std::size_t i = 0; i < m64.params.size(); ++i) {
    m32.params[i] = static_cast<float>(m64.params[i]);
    m64.params[i] = m32.params[i];  // both see exactly the same (f32-representable) weights
  }
  std::vector<std::int32_t> x, y;
  batch(B * T, cfg.vocab, x, y);
  m64.zero_grad();
  m32.zero_grad();
  const double l64 = m64.forward(x.data(), y.data()), l32 = m32.forward(x.data(), y.data());
  m64.backward(1.0);
  m32.backward(1.0f);
  double gmax = 0, err = 0;
  for (std::size_t i = 0; i < m64.grads.size(); ++i) {
    gmax = std::max(gmax, std::abs(m64.grads[i]));
    err = std::max(err, std::abs(m64.grads[i] - m32.grads[i]));
  }
  std::printf("loss f64 %.9f f32 %.9f; max |grad| %.3g, max |grad f32 − f64| %.3g\n", l64, l32, gmax, err);
  EXPECT_LT(std::abs(l64 - l32), 1e-5 * l64);
  EXPECT_LT(err, 1e-4 * gmax);
}

INSTANTIATE_TEST_SUITE_P(Bias, GptGrad, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "with_bias" : "no_bias"; });

}  // namespace
