// The layers of the model (blocks/embedding, norm, rope, activation, crossentropy .hpp), used alike
// by serving (qkv::Model) and training (qkv::Trainable): each forward against f64 closed forms
// computed here, element by element (f32 vs f64 formulas: tolerances a few ulps of the values
// involved, stated beside each check), and each backward of the f64 twin against central finite
// differences of its forward, then the f32 backward against the f64 one on the same inputs.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "blocks/activation.hpp"
#include "blocks/crossentropy.hpp"
#include "blocks/embedding.hpp"
#include "blocks/norm.hpp"
#include "blocks/rope.hpp"
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
  gelu_tanh_forward(g.data(), x.data(), n);
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
  gelu_tanh_forward(&g1, &one, 1);
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
  std::vector<float> p(N * V), losses(N);
  const int targets[N] = {0, 36, 17};
  const double total = crossentropy_forward(p.data(), losses.data(), l.data(), targets, N, V);
  std::vector<double> pr(N * V);
  for (std::int64_t row = 0; row < N; ++row) {
    double sum = 0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(double(l[row * V + v]));
    for (std::int64_t v = 0; v < V; ++v) pr[row * V + v] = std::exp(double(l[row * V + v])) / sum;
  }
  const double ep = max_abs_diff(p, pr);
  std::printf("softmax max |err| = %.3g\n", ep);
  EXPECT_LT(ep, 1e-6);  // probabilities ≤ 1: a few f32 ulps
  double want = 0;
  for (std::int64_t row = 0; row < N; ++row) {
    const double lr = -std::log(pr[row * V + targets[row]]);
    EXPECT_NEAR(losses[row], lr, 1e-5 * std::max(1.0, lr));  // −log p of O(10): f32 rounding of the logits' sums
    want += lr;
  }
  EXPECT_NEAR(total, want, 1e-5 * want);
}


// ---- Backward: the f64 twin against finite differences, then f32 against f64 ----

using Vec = std::vector<double>;

Vec widen(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

// ∂L/∂θ by central differences, L(θ) = loss() reading theta: the truncation error is h²/6·|L‴| and
// the rounding ε·|L|/h; at h = 1e-5 both are below 1e-9 for these smooth layers of O(1) values.
template <class F>
Vec numeric_grad(Vec& theta, F&& loss) {
  Vec g(theta.size());
  const double h = 1e-5;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double keep = theta[i];
    theta[i] = keep + h;
    const double lp = loss();
    theta[i] = keep - h;
    const double lm = loss();
    theta[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
  return g;
}

double max_diff(const Vec& a, const Vec& b) {
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}
double max_diff(const std::vector<float>& a, const Vec& b) { return max_diff(widen(a), b); }

// L = Σ r ⊙ out for a fixed random r (so ∂L/∂out = r).
double dot(const Vec& r, const Vec& out) {
  double s = 0;
  for (std::size_t i = 0; i < r.size(); ++i) s += r[i] * out[i];
  return s;
}

constexpr double kFdTol = 1e-7;  // finite differences of f64 (see numeric_grad): 100× their error
// f32 gradients of O(1–10) values, each a sum of ≤ C products: a few f32 ulps relative.
constexpr double kF32Tol = 5e-6;

TEST(LayersBackward, Embedding) {
  const std::int64_t V = 7, C = 5, P = 9, N = 6, pos0 = 2;
  Vec wte = widen(randn(V * C, 21)), wpe = widen(randn(P * C, 22)), r = widen(randn(N * C, 23));
  const int tok[N] = {3, 0, 3, 6, 1, 3};  // a repeated token: its gradient rows add up
  auto loss = [&] {
    Vec out(N * C);
    embedding_forward(out.data(), tok, wte.data(), wpe.data(), N, C, pos0);
    return dot(r, out);
  };
  Vec dwte(V * C, 0.0), dwpe(P * C, 0.0);
  embedding_backward(dwte.data(), dwpe.data(), r.data(), tok, N, C, pos0);
  const double e = std::max(max_diff(dwte, numeric_grad(wte, loss)), max_diff(dwpe, numeric_grad(wpe, loss)));
  std::printf("embedding: f64 backward vs finite differences %.3g\n", e);
  EXPECT_LT(e, kFdTol);
}

TEST(LayersBackward, LayerNormAndRmsNorm) {
  const std::int64_t N = 4, C = 37;
  Vec x = widen(randn(N * C, 31, 2.0f)), w = widen(randn(C, 32)), b = widen(randn(C, 33)), r = widen(randn(N * C, 34));
  for (auto& v : x) v += 1.5;  // a non-zero mean on purpose
  for (const bool rms : {false, true}) {
    auto loss = [&] {
      Vec out(N * C), mean(N), rstd(N);
      if (rms) rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
      else layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
      return dot(r, out);
    };
    Vec out(N * C), mean(N), rstd(N), dx(N * C, 0.0), dw(C, 0.0), db(C, 0.0);
    if (rms) {
      rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
      rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C);
    } else {
      layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5);
      layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    }
    double e = std::max(max_diff(dx, numeric_grad(x, loss)), max_diff(dw, numeric_grad(w, loss)));
    if (!rms) e = std::max(e, max_diff(db, numeric_grad(b, loss)));
    std::printf("%s: f64 backward vs finite differences %.3g\n", rms ? "rmsnorm" : "layernorm", e);
    EXPECT_LT(e, kFdTol);

    // f32 on every instruction set (LayerNorm's loops are built per ISA) against the f64 gradients.
    for (const qkv::Isa isa : {qkv::Isa::scalar, qkv::Isa::avx2, qkv::Isa::avx512}) {
      if (isa > qkv::cpu_isa()) continue;
      qkv::set_isa(isa);
      const std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), bf(b.begin(), b.end()),
          rf(r.begin(), r.end());
      std::vector<float> of(N * C), mf(N), sf(N), dxf(N * C, 0.0f), dwf(C, 0.0f), dbf(C, 0.0f);
      if (rms) {
        rmsnorm_forward(of.data(), sf.data(), xf.data(), wf.data(), N, C, 1e-5f);
        rmsnorm_backward(dxf.data(), dwf.data(), rf.data(), xf.data(), wf.data(), sf.data(), N, C);
      } else {
        layernorm_forward(of.data(), mf.data(), sf.data(), xf.data(), wf.data(), bf.data(), N, C, 1e-5f);
        layernorm_backward(dxf.data(), dwf.data(), dbf.data(), rf.data(), xf.data(), wf.data(), mf.data(), sf.data(), N,
                           C);
      }
      const double e32 = std::max({max_diff(dxf, dx), max_diff(dwf, dw), rms ? 0.0 : max_diff(dbf, db)});
      std::printf("  f32 (isa %d) vs f64: %.3g\n", static_cast<int>(isa), e32);
      EXPECT_LT(e32, kF32Tol);
    }
    qkv::set_isa(qkv::cpu_isa());
  }
}

TEST(LayersBackward, Rope) {
  const std::int64_t nh = 3, hs = 10, pos = 13;
  Vec x = widen(randn(nh * hs, 41)), r = widen(randn(nh * hs, 42)), cs(hs);
  rope_angles(cs.data(), hs, pos, 10000.0);
  auto loss = [&] {
    Vec y = x;
    rope_apply(y.data(), nh, hs, cs.data());
    return dot(r, y);
  };
  Vec dx = r;
  rope_apply_backward(dx.data(), nh, hs, cs.data());
  const double e = max_diff(dx, numeric_grad(x, loss));
  std::printf("rope: f64 backward vs finite differences %.3g\n", e);
  EXPECT_LT(e, kFdTol);
  std::vector<float> csf(hs), dxf(r.begin(), r.end());
  rope_angles(csf.data(), hs, pos, 10000.0f);
  rope_apply_backward(dxf.data(), nh, hs, csf.data());
  const double e32 = max_diff(dxf, dx);
  std::printf("  f32 vs f64: %.3g\n", e32);
  EXPECT_LT(e32, kF32Tol);  // f32 angles of ≤ 13 rad carry ~1e-6 error
}

TEST(LayersBackward, GeluBothFormsAndSwiglu) {
  const std::int64_t n = 67;
  Vec x = widen(randn(n, 51, 2.0f)), u = widen(randn(n, 52)), r = widen(randn(n, 53));
  for (const bool exact : {false, true}) {
    auto forward = [&](Vec& out, Vec* slope) {
      if (exact) gelu_exact_forward(out.data(), x.data(), n, slope ? slope->data() : nullptr);
      else gelu_tanh_forward(out.data(), x.data(), n, slope ? slope->data() : nullptr);
    };
    auto loss = [&] {
      Vec out(n);
      forward(out, nullptr);
      return dot(r, out);
    };
    Vec out(n), slope(n), dx(n);
    forward(out, &slope);
    gelu_backward(dx.data(), slope.data(), r.data(), n);
    const double e = max_diff(dx, numeric_grad(x, loss));
    std::printf("gelu %s: f64 backward vs finite differences %.3g\n", exact ? "exact" : "tanh", e);
    EXPECT_LT(e, kFdTol);
    // f32 with the slope kept in x's own memory, as training does.
    std::vector<float> xf(x.begin(), x.end()), of(n), dxf(n);
    const std::vector<float> rf(r.begin(), r.end());
    if (exact) gelu_exact_forward(of.data(), xf.data(), n, xf.data());
    else gelu_tanh_forward(of.data(), xf.data(), n, xf.data());
    gelu_backward(dxf.data(), xf.data(), rf.data(), n);
    const double e32 = std::max(max_diff(dxf, dx), max_diff(of, out));
    std::printf("  f32 vs f64 (output and gradient): %.3g\n", e32);
    EXPECT_LT(e32, kF32Tol);
  }
  auto loss = [&] {
    Vec out(n);
    swiglu_forward(out.data(), x.data(), u.data(), n);
    return dot(r, out);
  };
  Vec dg(n), du(n);
  swiglu_backward(dg.data(), du.data(), r.data(), x.data(), u.data(), n);
  const double e = std::max(max_diff(dg, numeric_grad(x, loss)), max_diff(du, numeric_grad(u, loss)));
  std::printf("swiglu: f64 backward vs finite differences %.3g\n", e);
  EXPECT_LT(e, kFdTol);
  const std::vector<float> xf(x.begin(), x.end()), uf(u.begin(), u.end()), rf(r.begin(), r.end());
  std::vector<float> dgf(n), duf(n);
  swiglu_backward(dgf.data(), duf.data(), rf.data(), xf.data(), uf.data(), n);
  const double e32 = std::max(max_diff(dgf, dg), max_diff(duf, du));
  std::printf("  f32 vs f64: %.3g\n", e32);
  EXPECT_LT(e32, kF32Tol);
}

TEST(LayersBackward, CrossEntropy) {
  const std::int64_t N = 3, V = 29;
  Vec l = widen(randn(N * V, 61, 3.0f));
  const int targets[N] = {4, 0, 28};
  auto loss = [&] {
    Vec p(N * V), losses(N);
    return crossentropy_forward(p.data(), losses.data(), l.data(), targets, N, V);
  };
  Vec p(N * V), losses(N), dl(N * V);
  crossentropy_forward(p.data(), losses.data(), l.data(), targets, N, V);
  crossentropy_backward(dl.data(), p.data(), targets, N, V, 1.0);
  const double e = max_diff(dl, numeric_grad(l, loss));
  std::printf("cross-entropy: f64 backward vs finite differences %.3g\n", e);
  EXPECT_LT(e, kFdTol);
  const std::vector<float> lf(l.begin(), l.end());
  std::vector<float> pf(N * V), lossf(N), dlf(N * V);
  crossentropy_forward(pf.data(), lossf.data(), lf.data(), targets, N, V);
  crossentropy_backward(dlf.data(), pf.data(), targets, N, V, 1.0f);
  const double e32 = max_diff(dlf, dl);
  std::printf("  f32 vs f64: %.3g\n", e32);
  EXPECT_LT(e32, 1e-6);  // probabilities ≤ 1 through exp_f32 (≈1e-7 relative): a few f32 ulps
}

}  // namespace
