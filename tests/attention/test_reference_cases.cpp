// The reference attention on cases whose answers are worked out by hand in the comments, then on
// every option against the independent naive oracle (tests/support/naive_attention.hpp).
//
// Most hand cases use q = 0: every allowed key then scores the same, the pattern is uniform over
// the allowed keys, and with v_j = j + 1 (Dv = 1) the output is the mean of (j + 1) over them —
// so each output names exactly which keys a mask rule let through.
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "support/core_testing.hpp"
#include "support/naive_attention.hpp"

namespace {

using qkv::Align;
using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::View;
using qkv::testing::fill_normal;
using qkv::testing::max_err;
using qkv::testing::naive_attention;

constexpr double kInf = std::numeric_limits<double>::infinity();
// f64 throughout the hand cases: the only error is the rounding of a softmax over ≤ 8 terms.
constexpr double kHandTol = 1e-13;

// q = 0 [B,H,Sq,1], k = 0 [B,Hkv,Skv,1], v_j = j + 1 (+ 100·kv head) [B,Hkv,Skv,1]; runs the reference.
struct Uniform {
  std::int64_t B, H, Hkv, Sq, Skv;
  Buffer q, k, v, out, lse, pat;
  Uniform(std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t sq, std::int64_t skv)
      : B(b), H(h), Hkv(hkv), Sq(sq), Skv(skv), q(DType::f64, {b, h, sq, 1}), k(DType::f64, {b, hkv, skv, 1}),
        v(DType::f64, {b, hkv, skv, 1}), out(DType::f64, {b, h, sq, 1}), lse(DType::f64, {b, h, sq}),
        pat(DType::f64, {b, h, sq, skv}) {
    for (std::int64_t bb = 0; bb < b; ++bb)
      for (std::int64_t g = 0; g < hkv; ++g)
        for (std::int64_t j = 0; j < skv; ++j) v.ptr<double>()[(bb * hkv + g) * skv + j] = static_cast<double>(j + 1 + 100 * g);
  }
  void run(AttentionOptions opt) {
    opt.kernel = qkv::Kernel::reference;
    qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view(), pat.view());
  }
  double o(std::int64_t b, std::int64_t h, std::int64_t i) const { return out.ptr<double>()[(b * H + h) * Sq + i]; }
  double l(std::int64_t b, std::int64_t h, std::int64_t i) const { return lse.ptr<double>()[(b * H + h) * Sq + i]; }
  double p(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return pat.ptr<double>()[((b * H + h) * Sq + i) * Skv + j];
  }
  // Mean of j + 1 over the allowed j of row i must be `want`; pattern 1/n on them, exactly 0 elsewhere.
  void expect_row(std::int64_t b, std::int64_t h, std::int64_t i, std::vector<std::int64_t> allowed) const {
    SCOPED_TRACE(testing::Message() << "b " << b << " h " << h << " query " << i);
    double mean = 0.0;
    for (auto j : allowed) mean += static_cast<double>(j + 1 + 100 * (h / (H / Hkv)));
    const double n = static_cast<double>(allowed.size());
    double err = 0.0;
    if (allowed.empty()) {
      EXPECT_EQ(o(b, h, i), 0.0);
      EXPECT_EQ(l(b, h, i), -kInf);
    } else {
      EXPECT_NEAR(o(b, h, i), mean / n, kHandTol);
      EXPECT_NEAR(l(b, h, i), std::log(n), kHandTol);  // all scores are 0: lse = log n
      err = std::max(std::abs(o(b, h, i) - mean / n), std::abs(l(b, h, i) - std::log(n)));
    }
    for (std::int64_t j = 0; j < Skv; ++j) {
      bool in = false;
      for (auto a : allowed) in = in || a == j;
      if (in) {
        EXPECT_NEAR(p(b, h, i, j), 1.0 / n, kHandTol);
        err = std::max(err, std::abs(p(b, h, i, j) - 1.0 / n));
      } else {
        EXPECT_EQ(p(b, h, i, j), 0.0) << "key " << j << " must be masked exactly";
      }
    }
    std::printf("b %lld h %lld query %lld: %zu keys allowed, max error %.3g\n", static_cast<long long>(b),
                static_cast<long long>(h), static_cast<long long>(i), allowed.size(), err);
  }
};

TEST(ReferenceHand, ExplicitScale) {
  // q = 1, k = [0, 1], scale = ln 3: scores [0, ln 3] → p = [1/4, 3/4]; v = [4, 8] → out = 1 + 6 = 7; lse = ln 4.
  Buffer q(DType::f64, {1, 1, 1, 1}), k(DType::f64, {1, 1, 2, 1}), v(DType::f64, {1, 1, 2, 1}), out(DType::f64, {1, 1, 1, 1}),
      lse(DType::f64, {1, 1, 1});
  q.ptr<double>()[0] = 1.0;
  k.ptr<double>()[1] = 1.0;
  v.ptr<double>()[0] = 4.0;
  v.ptr<double>()[1] = 8.0;
  AttentionOptions opt;
  opt.scale = std::log(3.0);
  opt.kernel = qkv::Kernel::reference;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
  std::printf("out %.17g (want 7), lse %.17g (want ln 4)\n", out.ptr<double>()[0], lse.ptr<double>()[0]);
  EXPECT_NEAR(out.ptr<double>()[0], 7.0, kHandTol);
  EXPECT_NEAR(lse.ptr<double>()[0], std::log(4.0), kHandTol);
}

TEST(ReferenceHand, DefaultScaleIsInverseSqrtD) {
  // D = 4, q = (1,1,1,1), k_0 = 0, k_1 = (ln 2 / 2)·(1,1,1,1): q·k_1 = 2 ln 2, times 1/√4 = ln 2
  // → p = [1/3, 2/3]; v = [3, 6] → out = 5.
  Buffer q(DType::f64, {1, 1, 1, 4}), k(DType::f64, {1, 1, 2, 4}), v(DType::f64, {1, 1, 2, 1}), out(DType::f64, {1, 1, 1, 1});
  for (int d = 0; d < 4; ++d) {
    q.ptr<double>()[d] = 1.0;
    k.ptr<double>()[4 + d] = std::log(2.0) / 2.0;
  }
  v.ptr<double>()[0] = 3.0;
  v.ptr<double>()[1] = 6.0;
  qkv::attention(q.view(), k.view(), v.view(), out.view());
  std::printf("out %.17g (want 5)\n", out.ptr<double>()[0]);
  EXPECT_NEAR(out.ptr<double>()[0], 5.0, kHandTol);
}

TEST(ReferenceHand, CausalTopLeftAndBottomRight) {
  // Sq = 3, Skv = 5 (the picture in attention.hpp). top_left: query i sees keys 0..i;
  // bottom_right: keys 0..i+2.
  Uniform a(1, 1, 1, 3, 5);
  AttentionOptions opt;
  opt.causal = true;
  a.run(opt);
  a.expect_row(0, 0, 0, {0});
  a.expect_row(0, 0, 1, {0, 1});
  a.expect_row(0, 0, 2, {0, 1, 2});
  opt.align = Align::bottom_right;
  a.run(opt);
  a.expect_row(0, 0, 0, {0, 1, 2});
  a.expect_row(0, 0, 1, {0, 1, 2, 3});
  a.expect_row(0, 0, 2, {0, 1, 2, 3, 4});
}

TEST(ReferenceHand, BottomRightWithMoreQueriesThanKeys) {
  // Sq = 4, Skv = 2, bottom_right: diag(i) = i − 2. Queries 0 and 1 see no key (zeros, lse −∞).
  Uniform a(1, 1, 1, 4, 2);
  AttentionOptions opt;
  opt.causal = true;
  opt.align = Align::bottom_right;
  a.run(opt);
  a.expect_row(0, 0, 0, {});
  a.expect_row(0, 0, 1, {});
  a.expect_row(0, 0, 2, {0});
  a.expect_row(0, 0, 3, {0, 1});
}

TEST(ReferenceHand, SlidingWindow) {
  Uniform a(1, 1, 1, 6, 6);
  AttentionOptions opt;
  opt.causal = true;
  opt.window_left = 2;  // keys i−2 … i
  a.run(opt);
  a.expect_row(0, 0, 0, {0});
  a.expect_row(0, 0, 1, {0, 1});
  a.expect_row(0, 0, 2, {0, 1, 2});
  a.expect_row(0, 0, 5, {3, 4, 5});
  opt = {};
  opt.window_left = 0;
  opt.window_right = 1;  // keys i … i+1, no causal
  a.run(opt);
  a.expect_row(0, 0, 0, {0, 1});
  a.expect_row(0, 0, 4, {4, 5});
  a.expect_row(0, 0, 5, {5});
}

TEST(ReferenceHand, KeyLengths) {
  // Two batches of Skv = 5 keys, of which 2 and 5 are valid; i64 lengths.
  Uniform a(2, 1, 1, 2, 5);
  Buffer kl(DType::i64, {2});
  kl.ptr<std::int64_t>()[0] = 2;
  kl.ptr<std::int64_t>()[1] = 5;
  AttentionOptions opt;
  opt.key_lengths = kl.view();
  a.run(opt);
  a.expect_row(0, 0, 0, {0, 1});
  a.expect_row(0, 0, 1, {0, 1});
  a.expect_row(1, 0, 1, {0, 1, 2, 3, 4});
  // With causal too: query 1 of batch 1 sees keys 0, 1.
  opt.causal = true;
  a.run(opt);
  a.expect_row(1, 0, 1, {0, 1});
  a.expect_row(0, 0, 0, {0});
}

TEST(ReferenceHand, BoolMaskBroadcastOverBatchAndHeads) {
  // A [Sq, Skv] = [2, 4] mask shared by B = 2 and H = 3; then a [1, H, 1, Skv] one per head.
  Uniform a(2, 3, 3, 2, 4);
  Buffer m(DType::u8, {2, 4});
  const std::uint8_t allow[8] = {1, 0, 1, 0, 0, 1, 1, 1};
  for (int i = 0; i < 8; ++i) m.ptr<std::uint8_t>()[i] = allow[i];
  AttentionOptions opt;
  opt.mask = m.view();
  a.run(opt);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h) {
      a.expect_row(b, h, 0, {0, 2});
      a.expect_row(b, h, 1, {1, 2, 3});
    }
  Buffer mh(DType::u8, {1, 3, 1, 4});  // head h allows only key h
  for (int h = 0; h < 3; ++h) mh.ptr<std::uint8_t>()[h * 4 + h] = 1;
  opt.mask = mh.view();
  a.run(opt);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t i = 0; i < 2; ++i) a.expect_row(b, h, i, {h});
  // A mask with an explicit stride-0 batch dimension means the same as the [Sq, Skv] one.
  opt.mask = View::strided(m.data(), DType::u8, {2, 3, 2, 4}, {0, 0, 4, 1});
  a.run(opt);
  a.expect_row(1, 2, 0, {0, 2});
  a.expect_row(1, 2, 1, {1, 2, 3});
}

TEST(ReferenceHand, AdditiveMask) {
  // Additive mask [0, ln 2, ln 3, −∞] on equal scores: p = [1/6, 2/6, 3/6, 0]; v = j + 1 → out = (1 + 4 + 9)/6.
  Uniform a(1, 1, 1, 1, 4);
  Buffer m(DType::f32, {1, 4});
  const float add[4] = {0.0f, std::log(2.0f), std::log(3.0f), -INFINITY};
  for (int j = 0; j < 4; ++j) m.ptr<float>()[j] = add[j];
  AttentionOptions opt;
  opt.mask = m.view();
  a.run(opt);
  // The mask is f32: ln 2 and ln 3 are rounded to 24 bits (relative 6e-8), which moves p by ~1e-7.
  const double tol = 1e-6;
  const double want_p[4] = {1.0 / 6, 2.0 / 6, 3.0 / 6, 0.0};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(a.p(0, 0, 0, j), want_p[j], tol);
  EXPECT_EQ(a.p(0, 0, 0, 3), 0.0);
  EXPECT_NEAR(a.o(0, 0, 0), 14.0 / 6.0, tol);
  EXPECT_NEAR(a.l(0, 0, 0), std::log(6.0), tol);
  std::printf("out %.9g (want %.9g)\n", a.o(0, 0, 0), 14.0 / 6.0);
}

TEST(ReferenceHand, FullyMaskedRowsGiveZerosAndMinusInfinity) {
  // Row 0 masked by a bool mask, row 1 by an additive −∞ everywhere, row 2 by an empty window; row 3 free.
  Uniform a(1, 1, 1, 4, 3);
  Buffer mb(DType::u8, {4, 3}), ma(DType::f64, {4, 3});
  for (int j = 0; j < 3; ++j) {
    for (int i = 1; i < 4; ++i) mb.ptr<std::uint8_t>()[i * 3 + j] = 1;
    ma.ptr<double>()[3 + j] = -kInf;
  }
  AttentionOptions opt;
  opt.mask = mb.view();
  a.run(opt);
  a.expect_row(0, 0, 0, {});
  opt.mask = ma.view();
  a.run(opt);
  a.expect_row(0, 0, 1, {});
  a.expect_row(0, 0, 0, {0, 1, 2});
  opt = {};
  opt.causal = true;
  opt.align = Align::bottom_right;
  opt.window_left = 0;
  opt.window_right = 0;  // only the diagonal key i − 1: query 0 has none
  a.run(opt);
  a.expect_row(0, 0, 0, {});
  a.expect_row(0, 0, 2, {1});
}

TEST(ReferenceHand, GroupedQueryHeadsReadTheirKvHead) {
  // H = 4 query heads on Hkv = 2 kv heads: heads 0, 1 read kv head 0 (v = j + 1), heads 2, 3 kv head 1
  // (v = j + 101). k and v are passed with their 2 heads; nothing is repeated.
  Uniform a(1, 4, 2, 1, 3);
  a.run({});
  for (std::int64_t h = 0; h < 4; ++h) a.expect_row(0, h, 0, {0, 1, 2});
  EXPECT_NEAR(a.o(0, 1, 0), 2.0, kHandTol);
  EXPECT_NEAR(a.o(0, 2, 0), 102.0, kHandTol);
}

// Every option and shape against the naive oracle, in each dtype.
struct Case {
  const char* name;
  std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  bool causal;
  Align align;
  std::int64_t wl, wr;
  int mask;  // 0 none, 1 bool [Sq,Skv], 2 additive [B,1,Sq,Skv], 3 bool [B,H,Sq,Skv]
  bool key_lengths;
};

const Case kCases[] = {
    {"plain", 2, 3, 3, 5, 5, 4, 4, false, Align::top_left, -1, -1, 0, false},
    {"d_ne_dv", 1, 2, 2, 4, 6, 3, 7, false, Align::top_left, -1, -1, 0, false},
    {"sq_ne_skv_causal_tl", 2, 2, 1, 3, 8, 5, 5, true, Align::top_left, -1, -1, 0, false},
    {"sq_ne_skv_causal_br", 2, 2, 1, 3, 8, 5, 5, true, Align::bottom_right, -1, -1, 0, false},
    {"sq_gt_skv_br", 1, 2, 2, 7, 3, 4, 2, true, Align::bottom_right, -1, -1, 0, false},
    {"gqa_window", 2, 6, 2, 9, 9, 4, 4, true, Align::top_left, 3, -1, 0, false},
    {"mqa_window_both", 1, 4, 1, 7, 7, 2, 3, false, Align::top_left, 2, 1, 0, false},
    {"bool_mask", 2, 2, 2, 4, 5, 3, 3, false, Align::top_left, -1, -1, 1, false},
    {"additive_mask_causal", 2, 2, 2, 5, 5, 3, 3, true, Align::top_left, -1, -1, 2, false},
    {"full_mask_keylen", 3, 4, 2, 4, 6, 5, 2, false, Align::top_left, -1, -1, 3, true},
    {"everything", 2, 4, 2, 5, 7, 3, 4, true, Align::bottom_right, 3, -1, 2, true},
};

TEST(ReferenceVsNaive, EveryOptionEveryDtype) {
  std::uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (DType t : {DType::f64, DType::f32, DType::bf16}) {
      SCOPED_TRACE(testing::Message() << c.name << " " << qkv::dtype_name(t));
      Buffer q(t, {c.B, c.H, c.Sq, c.D}), k(t, {c.B, c.Hkv, c.Skv, c.D}), v(t, {c.B, c.Hkv, c.Skv, c.Dv}),
          out(t, {c.B, c.H, c.Sq, c.Dv}), lse(DType::f64, {c.B, c.H, c.Sq}), pat(DType::f32, {c.B, c.H, c.Sq, c.Skv});
      fill_normal(q, ++seed);
      fill_normal(k, ++seed);
      fill_normal(v, ++seed);
      AttentionOptions opt;
      opt.kernel = qkv::Kernel::reference;
      opt.causal = c.causal;
      opt.align = c.align;
      opt.window_left = c.wl;
      opt.window_right = c.wr;
      Buffer mask;
      if (c.mask == 1) {
        mask = Buffer(DType::u8, {c.Sq, c.Skv});
        for (std::int64_t i = 0; i < mask.numel(); ++i) mask.ptr<std::uint8_t>()[i] = (i * 7 + 3) % 5 != 0;
      } else if (c.mask == 2) {
        mask = Buffer(DType::f32, {c.B, 1, c.Sq, c.Skv});
        fill_normal(mask, ++seed);
        mask.ptr<float>()[1] = -INFINITY;
      } else if (c.mask == 3) {
        mask = Buffer(DType::u8, {c.B, c.H, c.Sq, c.Skv});
        for (std::int64_t i = 0; i < mask.numel(); ++i) mask.ptr<std::uint8_t>()[i] = (i * 5 + 1) % 3 != 0;
        for (std::int64_t j = 0; j < c.Skv; ++j) mask.ptr<std::uint8_t>()[j] = 0;  // row (0,0,0) fully masked
      }
      if (c.mask) opt.mask = mask.view();
      Buffer kl(DType::i32, {c.B});
      if (c.key_lengths) {
        for (std::int64_t b = 0; b < c.B; ++b) kl.ptr<std::int32_t>()[b] = static_cast<std::int32_t>((b * 3 + 2) % (c.Skv + 1));
        opt.key_lengths = kl.view();
      }
      qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view(), pat.view());
      const auto want = naive_attention(q.view(), k.view(), v.view(), opt);
      const double e_out = max_err(out.view(), want.out), e_lse = max_err(lse.view(), want.lse),
                   e_pat = max_err(pat.view(), want.pattern);
      // Both sides read the same rounded inputs and compute in f64; what differs is the rounding of the
      // stored result, half an ulp: f64 2^-53, f32 2^-24, bf16 2^-9 relative, on outputs |out| < 4
      // (weighted means of N(0,1) draws): f32 < 2.4e-7, bf16 < 7.8e-3.
      const double tol = t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-6 : 1e-2;
      std::printf("%-22s %-4s max error out %.3g lse %.3g pattern %.3g\n", c.name, qkv::dtype_name(t), e_out, e_lse, e_pat);
      EXPECT_LE(e_out, tol);
      EXPECT_LE(e_lse, 1e-12);  // lse is f64 in every case
      EXPECT_LE(e_pat, 1e-6);   // pattern is stored as f32
    }
  }
}

}  // namespace
