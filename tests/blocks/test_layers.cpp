// The layer forwards of blocks/layers.hpp against f64 closed forms computed here, element by
// element. f32 kernels vs f64 formulas: the tolerances are a few ulps of the values involved,
// stated beside each check.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "blocks/layers.hpp"
#include "qkv/attention.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::testing::randn;

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - b[i]));
  return e;
}

using namespace qkv::blocks;

TEST(Layers, EmbeddingAddsLearnedPositions) {
  const std::int64_t V = 11, C = 5, P = 9, N = 4, pos0 = 3;
  auto wte = randn(V * C, 1), wpe = randn(P * C, 2);
  const int tokens[N] = {7, 0, 10, 7};
  std::vector<float> out(N * C), out_nopos(N * C);
  embedding_forward(out.data(), tokens, wte.data(), wpe.data(), N, C, pos0);
  embedding_forward(out_nopos.data(), tokens, wte.data(), nullptr, N, C, pos0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t c = 0; c < C; ++c) {
      // One f32 addition each: exactly what a + b rounds to.
      EXPECT_EQ(out[n * C + c], wte[tokens[n] * C + c] + wpe[(pos0 + n) * C + c]);
      EXPECT_EQ(out_nopos[n * C + c], wte[tokens[n] * C + c]);
    }
}

TEST(Layers, RmsNormMatchesF64) {
  const std::int64_t N = 6, C = 67;
  auto x = randn(N * C, 3), w = randn(C, 4);
  std::vector<float> out(N * C), rstd(N);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f);
  std::vector<double> ref(N * C);
  for (std::int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (std::int64_t c = 0; c < C; ++c) ss += double(x[n * C + c]) * x[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + 1e-5);
    EXPECT_NEAR(rstd[n], r, 1e-5 * r);
    for (std::int64_t c = 0; c < C; ++c) ref[n * C + c] = x[n * C + c] * r * w[c];
  }
  const double err = max_abs_diff(out, ref);
  std::printf("rmsnorm max |err| = %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // outputs are O(3); a sum of 67 squares in f32 errs ~1e-6 relative
}

// Every ISA's build of the loop (QKV_PER_ISA), at C = 33 (SIMD tails) and 768 (GPT-2's width).
TEST(Layers, LayerNormMatchesF64) {
  for (const qkv::Isa isa : {qkv::Isa::scalar, qkv::Isa::avx2, qkv::Isa::avx512}) {
    if (isa > qkv::cpu_isa()) continue;
    qkv::set_isa(isa);
    for (const std::int64_t C : {33, 768}) {
      const std::int64_t N = 5;
      auto x = randn(N * C, 5, 3.0f), w = randn(C, 6), b = randn(C, 7);
      for (auto& v : x) v += 2.0f;  // a non-zero mean on purpose
      std::vector<float> out(N * C), mean(N), rstd(N);
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
      std::vector<double> ref(N * C);
      for (std::int64_t n = 0; n < N; ++n) {
        double m = 0, v = 0;
        for (std::int64_t c = 0; c < C; ++c) m += x[n * C + c];
        m /= C;
        for (std::int64_t c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
        v /= C;
        const double r = 1.0 / std::sqrt(v + 1e-5);
        EXPECT_NEAR(mean[n], m, 1e-5);
        for (std::int64_t c = 0; c < C; ++c) ref[n * C + c] = (x[n * C + c] - m) * r * w[c] + b[c];
      }
      const double err = max_abs_diff(out, ref);
      std::printf("layernorm isa %d, C = %lld: max |err| = %.3g\n", static_cast<int>(isa), static_cast<long long>(C),
                  err);
      EXPECT_LT(err, 2e-5);  // values O(10), f32 sums of ≤ 768 terms in lanes: a few 1e-6
    }
  }
  qkv::set_isa(qkv::cpu_isa());
}

// Rotary: each pair turns by pos·θ^(−2i/hs); checked against f64 rotation, and the defining
// property: q·k after rotation depends only on the distance between the positions.
TEST(Layers, RopeMatchesF64AndIsRelative) {
  const std::int64_t N = 7, nh = 3, hs = 8, pos0 = 5;
  auto x = randn(N * nh * hs, 8);
  auto y = x;
  rope_forward(y.data(), N, nh, hs, pos0, 10000.0f);
  std::vector<double> ref(x.size());
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t h = 0; h < nh; ++h)
      for (std::int64_t i = 0; i < hs; i += 2) {
        const double a = (pos0 + n) * std::pow(10000.0, -double(i) / hs);
        const std::int64_t o = (n * nh + h) * hs + i;
        ref[o] = x[o] * std::cos(a) - x[o + 1] * std::sin(a);
        ref[o + 1] = x[o] * std::sin(a) + x[o + 1] * std::cos(a);
      }
  const double err = max_abs_diff(y, ref);
  std::printf("rope max |err| = %.3g\n", err);
  EXPECT_LT(err, 1e-5);  // angles ≤ 11 rad in f32 carry ~1e-6 error; values O(3)

  // Same pair of vectors placed at positions (2, 0) and (9, 7): equal dot products.
  auto q = randn(hs, 9), k = randn(hs, 10);
  auto dot_at = [&](std::int64_t pq, std::int64_t pk) {
    auto qq = q, kk = k;
    rope_forward(qq.data(), 1, 1, hs, pq, 10000.0f);
    rope_forward(kk.data(), 1, 1, hs, pk, 10000.0f);
    double s = 0;
    for (std::int64_t i = 0; i < hs; ++i) s += double(qq[i]) * kk[i];
    return s;
  };
  EXPECT_NEAR(dot_at(2, 0), dot_at(9, 7), 1e-5);

  // Decoding's split form (angles once, then applied to each head) within the same f64 bound, and
  // the same bits as rope_forward (the greedy story must not move with the path).
  for (std::int64_t n = 0; n < N; ++n) {
    std::vector<float> cs(hs), z(x.begin() + n * nh * hs, x.begin() + (n + 1) * nh * hs);
    rope_angles(cs.data(), hs, pos0 + n, 10000.0f);
    rope_apply(z.data(), nh, hs, cs.data());
    for (std::int64_t j = 0; j < nh * hs; ++j) {
      EXPECT_NEAR(z[j], ref[n * nh * hs + j], 1e-5) << "n " << n << " j " << j;
      EXPECT_EQ(z[j], y[n * nh * hs + j]) << "n " << n << " j " << j;
    }
  }
}

TEST(Layers, GeluSwigluSoftmaxResidualMatchF64) {
  const std::int64_t n = 101;
  auto x = randn(n, 11, 2.0f), u = randn(n, 12);
  std::vector<float> g(n), s(n), r(n);
  gelu_forward(g.data(), x.data(), n);
  swiglu_forward(s.data(), x.data(), u.data(), n);
  residual_forward(r.data(), x.data(), u.data(), n);
  std::vector<double> gr(n), sr(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    gr[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    sr[i] = v / (1 + std::exp(-v)) * u[i];
    EXPECT_EQ(r[i], x[i] + u[i]);
  }
  // Published value of the tanh-approximate GELU at 1 (torch.nn.functional.gelu(1, approximate="tanh")).
  float one = 1.0f, g1;
  gelu_forward(&g1, &one, 1);
  EXPECT_NEAR(g1, 0.8411920, 1e-6);
  const double eg = max_abs_diff(g, gr), es = max_abs_diff(s, sr);
  std::printf("gelu max |err| = %.3g, swiglu max |err| = %.3g\n", eg, es);
  EXPECT_LT(eg, 1e-5);  // |x| ≤ ~8: a few f32 ulps of the result
  EXPECT_LT(es, 1e-5);
  // The exact GELU against ½x(1 + erf(x/√2)) in f64, and torch.nn.functional.gelu(1.0) = 0.8413447.
  std::vector<float> ge(n);
  gelu_exact_forward(ge.data(), x.data(), n);
  for (std::int64_t i = 0; i < n; ++i) gr[i] = 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)));
  gelu_exact_forward(&g1, &one, 1);
  EXPECT_NEAR(g1, 0.8413447, 1e-6);
  const double ee = max_abs_diff(ge, gr);
  std::printf("exact gelu max |err| = %.3g\n", ee);
  EXPECT_LT(ee, 1e-5);  // as the tanh form: a few f32 ulps of the result

  const std::int64_t N = 3, V = 37;
  auto l = randn(N * V, 13, 5.0f);
  std::vector<float> p(N * V);
  softmax_forward(p.data(), l.data(), N, V);
  std::vector<double> pr(N * V);
  for (std::int64_t row = 0; row < N; ++row) {
    double sum = 0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double(l[row * V + v]));
    for (std::int64_t v = 0; v < V; ++v) pr[row * V + v] = std::exp(double(l[row * V + v])) / sum;
  }
  const double ep = max_abs_diff(p, pr);
  std::printf("softmax max |err| = %.3g\n", ep);
  EXPECT_LT(ep, 1e-6);  // probabilities ≤ 1: a few f32 ulps
}

}  // namespace
