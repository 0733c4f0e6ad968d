// The multi-head attention block against an f64 oracle written here from the definition (per-head
// loops, no qkv code), plus its structural promises: Σ_h Δe^h + b_o = Δe, the factored value map
// (value-down then value-up) equals the fused one, GQA equals repeated kv heads, cross-attention
// with other widths and lengths, strided inputs, the residual, and every rejection.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/mha.hpp"
#include "support/core_testing.hpp"
#include "support/expect_rejects.hpp"

namespace {

using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::MhaConfig;
using qkv::MultiHeadAttention;
using qkv::View;
using qkv::testing::expect_rejects;
using qkv::testing::fill_normal;
using qkv::testing::max_abs_diff;

// Δe by the definition, in f64. x [B,S,dm], s [B,Skv,ds] (x for self-attention), causal optional.
// Also returns each head's Δe^h [B,H,S,dm] and pattern [B,H,S,Skv].
struct Oracle {
  std::vector<double> delta, head_delta, pattern;
};
Oracle oracle(const MultiHeadAttention& m, const View& x, const View& s, bool causal) {
  const MhaConfig& c = m.config();
  const std::int64_t B = x.dim(0), S = x.dim(1), Skv = s.dim(1), H = c.n_heads, G = c.n_heads / c.n_kv_heads,
                     Dh = c.d_head, Dv = c.d_value, dm = c.d_model, ds = c.d_source;
  auto W = [](const Buffer& w, std::int64_t r, std::int64_t col) {
    return static_cast<double>(w.ptr<float>()[r * w.shape()[1] + col]);
  };
  auto bias = [&](const Buffer& b, std::int64_t i) { return c.bias ? static_cast<double>(b.ptr<float>()[i]) : 0.0; };
  Oracle o;
  o.delta.assign(static_cast<std::size_t>(B * S * dm), 0.0);
  o.head_delta.assign(static_cast<std::size_t>(B * H * S * dm), 0.0);
  o.pattern.assign(static_cast<std::size_t>(B * H * S * Skv), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / G;
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> q(static_cast<std::size_t>(Dh));
        for (std::int64_t d = 0; d < Dh; ++d) {
          double a = bias(m.b_q, h * Dh + d);
          for (std::int64_t e = 0; e < dm; ++e) a += W(m.w_q, h * Dh + d, e) * x.load(x.offset(b, i, e));
          q[static_cast<std::size_t>(d)] = a;
        }
        std::vector<double> score(static_cast<std::size_t>(Skv), -INFINITY);
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < Skv; ++j) {
          if (causal && j > i) continue;
          double dot = 0.0;
          for (std::int64_t d = 0; d < Dh; ++d) {
            double k = bias(m.b_k, g * Dh + d);
            for (std::int64_t e = 0; e < ds; ++e) k += W(m.w_k, g * Dh + d, e) * s.load(s.offset(b, j, e));
            dot += q[static_cast<std::size_t>(d)] * k;
          }
          score[static_cast<std::size_t>(j)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        double sum = 0.0;
        for (double& v : score) sum += (v = std::exp(v - mx));
        std::vector<double> head_out(static_cast<std::size_t>(Dv), 0.0);
        for (std::int64_t j = 0; j < Skv; ++j) {
          const double p = score[static_cast<std::size_t>(j)] / sum;
          o.pattern[static_cast<std::size_t>(((b * H + h) * S + i) * Skv + j)] = p;
          for (std::int64_t e = 0; e < Dv; ++e) {
            double v = bias(m.b_v, g * Dv + e);
            for (std::int64_t f = 0; f < ds; ++f) v += W(m.w_v, g * Dv + e, f) * s.load(s.offset(b, j, f));
            head_out[static_cast<std::size_t>(e)] += p * v;
          }
        }
        for (std::int64_t r = 0; r < dm; ++r) {
          double up = 0.0;
          for (std::int64_t e = 0; e < Dv; ++e) up += W(m.w_o, r, h * Dv + e) * head_out[static_cast<std::size_t>(e)];
          o.head_delta[static_cast<std::size_t>(((b * H + h) * S + i) * dm + r)] = up;
          o.delta[static_cast<std::size_t>((b * S + i) * dm + r)] += up;
        }
      }
    }
  for (std::int64_t n = 0; n < B * S; ++n)
    for (std::int64_t r = 0; r < dm; ++r) o.delta[static_cast<std::size_t>(n * dm + r)] += bias(m.b_o, r);
  return o;
}

double max_diff(const Buffer& got, const std::vector<double>& want) {
  double m = 0.0;
  for (std::int64_t i = 0; i < got.numel(); ++i)
    m = std::max(m, std::abs(got.view().load(i) - want[static_cast<std::size_t>(i)]));
  return m;
}

MultiHeadAttention make(MhaConfig c, std::uint64_t seed) {
  MultiHeadAttention m(c);
  m.init_random(seed);
  return m;
}

// Tolerance for f32 block outputs of magnitude ~1: each is a chain of three sums of ≤ 16 f32
// products (projection, attention, value-up); 2e-5 is ~100 f32 ulps of 1, far above that
// rounding and far below any indexing mistake (which errs by O(1)).
constexpr double kF32Tol = 2e-5;

TEST(Mha, SelfAttentionMatchesOracle) {
  // GQA (4 query heads on 2 kv heads), Dh ≠ Dv, biases, causal, two batches.
  MultiHeadAttention m = make({.d_model = 7, .n_heads = 4, .n_kv_heads = 2, .d_head = 5, .d_value = 3, .bias = true}, 1);
  Buffer x(DType::f32, {2, 6, 7}), delta(DType::f32, {2, 6, 7}), hd(DType::f32, {2, 4, 6, 7}),
      pat(DType::f64, {2, 4, 6, 6});
  fill_normal(x, 2);
  AttentionOptions opt;
  opt.causal = true;
  m.forward(x.view(), std::nullopt, opt, delta.view(), hd.view(), pat.view());
  const Oracle o = oracle(m, x.view(), x.view(), true);
  const double e1 = max_diff(delta, o.delta), e2 = max_diff(hd, o.head_delta), e3 = max_diff(pat, o.pattern);
  std::printf("max error: delta %.3g, head_delta %.3g, pattern %.3g\n", e1, e2, e3);
  EXPECT_LT(e1, kF32Tol);
  EXPECT_LT(e2, kF32Tol);
  EXPECT_LT(e3, kF32Tol);
}

TEST(Mha, CrossAttentionOtherWidthAndLength) {
  // Queries from a [2, 3, 6] sequence, keys/values from a [2, 11, 4] one (d_source ≠ d_model, Sq ≠ Skv).
  MultiHeadAttention m = make({.d_model = 6, .d_source = 4, .n_heads = 3, .d_head = 2, .d_value = 5, .bias = true}, 3);
  Buffer x(DType::f32, {2, 3, 6}), src(DType::f32, {2, 11, 4}), delta(DType::f32, {2, 3, 6}),
      pat(DType::f32, {2, 3, 3, 11});
  fill_normal(x, 4);
  fill_normal(src, 5);
  m.forward(x.view(), src.view(), {}, delta.view(), std::nullopt, pat.view());
  const Oracle o = oracle(m, x.view(), src.view(), false);
  const double e1 = max_diff(delta, o.delta), e2 = max_diff(pat, o.pattern);
  std::printf("max error: delta %.3g, pattern %.3g\n", e1, e2);
  EXPECT_LT(e1, kF32Tol);
  EXPECT_LT(e2, kF32Tol);
}

TEST(Mha, HeadDeltasSumToFusedOutput) {
  // Σ_h Δe^h + b_o = Δe: the per-head changes (each from its own W_O^h) add up to the stapled W_O product.
  MultiHeadAttention m = make({.d_model = 16, .n_heads = 4, .d_head = 4, .bias = true}, 6);
  Buffer x(DType::f32, {3, 5, 16}), delta(DType::f32, {3, 5, 16}), hd(DType::f32, {3, 4, 5, 16});
  fill_normal(x, 7);
  m.forward(x.view(), std::nullopt, {}, delta.view(), hd.view());
  double err = 0.0;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t i = 0; i < 5; ++i)
      for (std::int64_t r = 0; r < 16; ++r) {
        double sum = m.b_o.ptr<float>()[r];
        for (std::int64_t h = 0; h < 4; ++h) sum += hd.ptr<float>()[((b * 4 + h) * 5 + i) * 16 + r];
        err = std::max(err, std::abs(sum - delta.ptr<float>()[(b * 5 + i) * 16 + r]));
      }
  std::printf("max |Σ_h Δe^h + b_o − Δe| = %.3g\n", err);
  // Two f32 evaluations of the same 16-term sum in different orders (blocked per head vs fused):
  // differences are a few ulps of the partial sums (~1), so 1e-5.
  EXPECT_LT(err, 1e-5);
}

TEST(Mha, FactoredValueMapEqualsFusedValueMatrix) {
  // Value-down (Dv × d_source) then value-up (d_model × Dv) equals one fused d_model × d_source value matrix
  // per head, W_O^h · W_V^h, of rank ≤ Dv: Δe_i = Σ_h Σ_j p^h_ij · (W_O^h W_V^h) s_j.
  MultiHeadAttention m = make({.d_model = 8, .d_source = 5, .n_heads = 2, .d_head = 3, .d_value = 2}, 8);
  Buffer x(DType::f32, {1, 4, 8}), src(DType::f32, {1, 6, 5}), delta(DType::f32, {1, 4, 8}), pat(DType::f64, {1, 2, 4, 6});
  fill_normal(x, 9);
  fill_normal(src, 10);
  m.forward(x.view(), src.view(), {}, delta.view(), std::nullopt, pat.view());
  double err = 0.0;
  for (std::int64_t i = 0; i < 4; ++i)
    for (std::int64_t r = 0; r < 8; ++r) {
      double want = 0.0;
      for (std::int64_t h = 0; h < 2; ++h) {
        // fused[r][f] = Σ_e W_O[r, h·Dv + e] · W_V[h·Dv + e, f]
        for (std::int64_t j = 0; j < 6; ++j) {
          double fs = 0.0;
          for (std::int64_t f = 0; f < 5; ++f) {
            double fused = 0.0;
            for (std::int64_t e = 0; e < 2; ++e)
              fused += static_cast<double>(m.w_o.ptr<float>()[r * 4 + h * 2 + e]) * m.w_v.ptr<float>()[(h * 2 + e) * 5 + f];
            fs += fused * src.ptr<float>()[j * 5 + f];
          }
          want += pat.ptr<double>()[(h * 4 + i) * 6 + j] * fs;
        }
      }
      err = std::max(err, std::abs(want - delta.ptr<float>()[i * 8 + r]));
    }
  std::printf("max |fused − factored| = %.3g\n", err);
  EXPECT_LT(err, kF32Tol);  // same f32 chain as SelfAttentionMatchesOracle
}

TEST(Mha, GroupedQueryEqualsRepeatedKvHeads) {
  // 6 query heads on 2 kv heads, against plain multi-head attention whose 6 kv heads repeat each of
  // the 2 three times (rows of w_k, w_v and b_k, b_v copied).
  MultiHeadAttention gqa = make({.d_model = 12, .n_heads = 6, .n_kv_heads = 2, .d_head = 3, .d_value = 4, .bias = true}, 11);
  MultiHeadAttention mha({.d_model = 12, .n_heads = 6, .d_head = 3, .d_value = 4, .bias = true});
  auto copy = [](const Buffer& from, Buffer& to) {
    for (std::int64_t i = 0; i < from.numel(); ++i) to.ptr<float>()[i] = from.ptr<float>()[i];
  };
  copy(gqa.w_q, mha.w_q);
  copy(gqa.b_q, mha.b_q);
  copy(gqa.w_o, mha.w_o);
  copy(gqa.b_o, mha.b_o);
  for (std::int64_t h = 0; h < 6; ++h) {
    const std::int64_t g = h / 3;
    for (std::int64_t d = 0; d < 3; ++d) {
      for (std::int64_t e = 0; e < 12; ++e) mha.w_k.ptr<float>()[(h * 3 + d) * 12 + e] = gqa.w_k.ptr<float>()[(g * 3 + d) * 12 + e];
      mha.b_k.ptr<float>()[h * 3 + d] = gqa.b_k.ptr<float>()[g * 3 + d];
    }
    for (std::int64_t d = 0; d < 4; ++d) {
      for (std::int64_t e = 0; e < 12; ++e) mha.w_v.ptr<float>()[(h * 4 + d) * 12 + e] = gqa.w_v.ptr<float>()[(g * 4 + d) * 12 + e];
      mha.b_v.ptr<float>()[h * 4 + d] = gqa.b_v.ptr<float>()[g * 4 + d];
    }
  }
  Buffer x(DType::f32, {2, 5, 12}), d1(DType::f32, {2, 5, 12}), d2(DType::f32, {2, 5, 12});
  fill_normal(x, 12);
  AttentionOptions opt;
  opt.causal = true;
  gqa.forward(x.view(), std::nullopt, opt, d1.view());
  mha.forward(x.view(), std::nullopt, opt, d2.view());
  const double err = max_abs_diff(d1.view(), d2.view());
  std::printf("max |GQA − repeated kv heads| = %.3g\n", err);
  // The same numbers through projections of different widths: sgemm may block the sums differently,
  // so a few f32 ulps (not exact equality).
  EXPECT_LT(err, 1e-5);
}

TEST(Mha, StridedInputEqualsContiguous) {
  MultiHeadAttention m = make({.d_model = 6, .n_heads = 2, .d_head = 3}, 13);
  // x as a [2, 4, 6] window with every other row of a [2, 8, 6] buffer and a transposed source.
  Buffer big(DType::f32, {2, 8, 6}), x(DType::f32, {2, 4, 6}), d1(DType::f32, {2, 4, 6}), d2(DType::f32, {2, 4, 6});
  fill_normal(big, 14);
  const View xs = View::strided(big.data(), DType::f32, {2, 4, 6}, {48, 12, 1});
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t e = 0; e < 6; ++e) x.ptr<float>()[(b * 4 + i) * 6 + e] = big.ptr<float>()[b * 48 + i * 12 + e];
  m.forward(xs, std::nullopt, {}, d1.view());
  m.forward(x.view(), std::nullopt, {}, d2.view());
  const double err = max_abs_diff(d1.view(), d2.view());
  std::printf("max |strided − contiguous| = %.3g\n", err);
  EXPECT_EQ(err, 0.0);  // the strided input is packed to the very same numbers first
}

TEST(Mha, ResidualAddsDelta) {
  Buffer e(DType::f32, {2, 3, 4}), d(DType::f32, {2, 3, 4}), out(DType::f32, {2, 3, 4});
  fill_normal(e, 15);
  fill_normal(d, 16);
  qkv::add_residual(e.view(), d.view(), out.view());
  for (std::int64_t i = 0; i < 24; ++i) EXPECT_EQ(out.ptr<float>()[i], e.ptr<float>()[i] + d.ptr<float>()[i]);
  qkv::add_residual(e.view(), d.view(), e.view());  // in place
  for (std::int64_t i = 0; i < 24; ++i) EXPECT_EQ(out.ptr<float>()[i], e.ptr<float>()[i]);
}

TEST(Mha, BackwardMatchesCentralDifferencesOfTheOracle) {
  // L = Σ Δe ⊙ w, Δe from the f64 oracle above (on the block's f32 weights and inputs); each f32
  // number is moved by ±h and the two losses differenced. The f32 rounding of x ± h is taken into
  // account by dividing by the step actually taken.
  for (bool cross : {false, true}) {
    SCOPED_TRACE(cross ? "cross-attention" : "causal self-attention");
    const MhaConfig c = cross ? MhaConfig{.d_model = 4, .d_source = 3, .n_heads = 2, .n_kv_heads = 1, .d_head = 3, .d_value = 2, .bias = true}
                              : MhaConfig{.d_model = 4, .n_heads = 4, .n_kv_heads = 2, .d_head = 3, .d_value = 2, .bias = true};
    MultiHeadAttention m = make(c, cross ? 70 : 71);
    const std::int64_t B = 2, S = 3, Skv = cross ? 5 : 3;
    Buffer x(DType::f32, {B, S, 4}), src(DType::f32, {B, Skv, 3}), w(DType::f32, {B, S, 4}), dx(DType::f32, {B, S, 4}),
        dsrc(DType::f32, {B, Skv, 3});
    fill_normal(x, 72);
    fill_normal(src, 73);
    fill_normal(w, 74);
    AttentionOptions opt;
    opt.causal = !cross;
    qkv::MhaGrads g = m.make_grads();
    std::optional<View> source, d_source;
    if (cross) source = src.view(), d_source = dsrc.view();
    m.backward(x.view(), source, opt, w.view(), dx.view(), d_source, g);
    auto loss = [&] {
      const Oracle o = oracle(m, x.view(), cross ? src.view() : x.view(), !cross);
      double l = 0.0;
      for (std::size_t i = 0; i < o.delta.size(); ++i) l += o.delta[i] * w.ptr<float>()[i];
      return l;
    };
    // h = 1e-3: truncation ~h² times the third derivative ≈ 1e-6; the oracle is f64, so rounding adds
    // ~1e-13/h. The analytic gradient is f32 (relative 1e-6 on |g| ≲ 5): 1e-4 covers all three with
    // room, while any wrong index errs by O(0.1).
    const float h = 1e-3f;
    const double tol = 1e-4;
    std::vector<std::tuple<const char*, Buffer*, const Buffer*>> params = {
        {"x", &x, &dx}, {"w_q", &m.w_q, &g.w_q}, {"w_k", &m.w_k, &g.w_k}, {"w_v", &m.w_v, &g.w_v}, {"w_o", &m.w_o, &g.w_o},
        {"b_q", &m.b_q, &g.b_q}, {"b_k", &m.b_k, &g.b_k}, {"b_v", &m.b_v, &g.b_v}, {"b_o", &m.b_o, &g.b_o}};
    if (cross) params.emplace_back("source", &src, &dsrc);
    for (auto& [name, p, grad] : params) {
      double err = 0.0;
      for (std::int64_t i = 0; i < p->numel(); ++i) {
        float& v = p->ptr<float>()[i];
        const float v0 = v;
        v = v0 + h;
        const double up = static_cast<double>(v) - v0;
        const double lp = loss();
        v = v0 - h;
        const double down = v0 - static_cast<double>(v);
        const double lm = loss();
        v = v0;
        err = std::max(err, std::abs((lp - lm) / (up + down) - grad->ptr<float>()[i]));
      }
      std::printf("%-6s %-6s max |analytic − central difference| = %.3g\n", cross ? "cross" : "self", name, err);
      EXPECT_LT(err, tol) << name;
    }
  }
}

TEST(Mha, BackwardRejectsBadArguments) {
  MultiHeadAttention m = make({.d_model = 4, .n_heads = 2, .d_head = 2}, 75);
  Buffer x(DType::f32, {1, 3, 4}), dd(DType::f32, {1, 3, 4}), dx(DType::f32, {1, 3, 4}), wrong(DType::f32, {1, 3, 5}),
      src(DType::f32, {1, 2, 4}), dsrc(DType::f32, {1, 2, 4});
  qkv::MhaGrads g = m.make_grads();
  const char* fn = "[qkv::MultiHeadAttention::backward]";
  expect_rejects([&] { m.backward(x.view(), std::nullopt, {}, wrong.view(), dx.view(), std::nullopt, g); },
                 {fn, "d_delta: expected f32 [1, 3, 4]", "[1, 3, 5]"});
  expect_rejects([&] { m.backward(x.view(), std::nullopt, {}, dd.view(), wrong.view(), std::nullopt, g); },
                 {fn, "dx: expected contiguous f32 [1, 3, 4]"});
  expect_rejects([&] { m.backward(x.view(), std::nullopt, {}, dd.view(), x.view(), std::nullopt, g); }, {fn, "dx: output memory overlaps"});
  expect_rejects([&] { m.backward(x.view(), src.view(), {}, dd.view(), dx.view(), std::nullopt, g); },
                 {fn, "d_source: required with a source"});
  expect_rejects([&] { m.backward(x.view(), std::nullopt, {}, dd.view(), dx.view(), dsrc.view(), g); },
                 {fn, "d_source: given without a source"});
  qkv::MhaGrads bad = m.make_grads();
  bad.w_k = Buffer(DType::f32, {3, 4});
  expect_rejects([&] { m.backward(x.view(), std::nullopt, {}, dd.view(), dx.view(), std::nullopt, bad); },
                 {fn, "grads.w_k: expected f32 [4, 4] (use make_grads()), got f32[3, 4]"});
}

TEST(Mha, RejectsBadConfig) {
  expect_rejects([] { MultiHeadAttention m({.d_model = 0, .n_heads = 2, .d_head = 2}); },
                 {"[qkv::MultiHeadAttention]", "config.d_model", "got 0"});
  expect_rejects([] { MultiHeadAttention m({.d_model = 8, .n_heads = 0, .d_head = 2}); }, {"config.n_heads"});
  expect_rejects([] { MultiHeadAttention m({.d_model = 8, .n_heads = 2, .d_head = -1}); }, {"config.d_head"});
  expect_rejects([] { MultiHeadAttention m({.d_model = 8, .n_heads = 6, .n_kv_heads = 4, .d_head = 2}); },
                 {"config.n_kv_heads", "must divide", "n_heads 6", "n_kv_heads 4"});
  expect_rejects([] { MultiHeadAttention m({.d_model = 8, .d_source = -2, .n_heads = 2, .d_head = 2}); },
                 {"config.d_source"});
  const std::int64_t huge = std::int64_t{1} << 40;
  expect_rejects([&] { MultiHeadAttention m({.d_model = huge, .n_heads = huge, .d_head = 2}); }, {"overflows 64 bits"});
}

TEST(Mha, RejectsBadArguments) {
  MultiHeadAttention m = make({.d_model = 4, .n_heads = 2, .d_head = 2}, 17);
  MultiHeadAttention cross = make({.d_model = 4, .d_source = 3, .n_heads = 2, .d_head = 2}, 18);
  Buffer x(DType::f32, {1, 3, 4}), xd(DType::f64, {1, 3, 4}), x5(DType::f32, {1, 3, 5}), delta(DType::f32, {1, 3, 4}),
      wrong(DType::f32, {1, 2, 4}), hd(DType::f32, {1, 1, 3, 4}), pat(DType::f32, {1, 2, 3, 2}),
      src(DType::f32, {2, 5, 3}), mask(DType::u8, {2, 2});
  const char* fn = "[qkv::MultiHeadAttention::forward]";
  expect_rejects([&] { m.forward(xd.view(), std::nullopt, {}, delta.view()); }, {fn, "x:", "f64[1, 3, 4]"});
  expect_rejects([&] { m.forward(x5.view(), std::nullopt, {}, delta.view()); }, {fn, "x:", "d_model = 4", "[1, 3, 5]"});
  expect_rejects([&] { m.forward(x.view(), std::nullopt, {}, wrong.view()); }, {fn, "delta:", "[1, 3, 4]", "[1, 2, 4]"});
  expect_rejects([&] { m.forward(x.view(), std::nullopt, {}, delta.view(), hd.view()); }, {fn, "head_delta:", "[1, 2, 3, 4]"});
  expect_rejects([&] { m.forward(x.view(), std::nullopt, {}, delta.view(), std::nullopt, pat.view()); },
                 {fn, "pattern:", "[1, 2, 3, 3]", "[1, 2, 3, 2]"});
  expect_rejects([&] { m.forward(x.view(), std::nullopt, {}, x.view()); }, {fn, "delta:", "overlaps"});
  expect_rejects([&] { cross.forward(x.view(), std::nullopt, {}, delta.view()); }, {fn, "source:", "required", "d_source 3"});
  expect_rejects([&] { cross.forward(x.view(), src.view(), {}, delta.view()); }, {fn, "source:", "B = 1", "[2, 5, 3]"});
  AttentionOptions opt;
  opt.mask = mask.view();
  expect_rejects([&] { m.forward(x.view(), std::nullopt, opt, delta.view()); }, {fn, "opt.mask", "[2, 2]"});
  expect_rejects([&] { qkv::add_residual(x.view(), wrong.view(), x.view()); }, {"[qkv::add_residual]", "shapes differ"});
  expect_rejects([&] { qkv::add_residual(xd.view(), xd.view(), xd.view()); }, {"[qkv::add_residual]", "e:", "f32"});
}

}  // namespace
