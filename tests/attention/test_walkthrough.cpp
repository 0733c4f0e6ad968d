// Seed 003's numerical walkthrough ("interaction matrices"), reproduced: numpy's numbers, written by
// tools/make_golden_walkthrough.py with np.random.seed(0) and the document's sequence of randn calls,
// are checked here twice:
//   1. the f64 attention on the document's Q, K, V (scale 1, as the document has no 1/√d) gives its
//      L after the softmax (our pattern), its L @ V (our output), and its L before the softmax
//      (log pattern + lse, on the entries the mask allows; −∞ where it does not);
//   2. the f32 multi-head attention block with one head, W_Q, W_K, W_V from the document (transposed
//      to the y = x·Wᵀ layout) and a value-up that copies the first d_model columns, gives the same
//      pattern and L @ V from X alone.
#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "qkv/mha.hpp"
#include "support/core_testing.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;
using qkv::testing::Matrix;
using qkv::testing::read_golden;

Buffer as_f64(const Matrix& m) {
  Buffer b(DType::f64, {1, 1, m.rows, m.cols});
  for (std::size_t i = 0; i < m.data.size(); ++i) b.ptr<double>()[i] = m.data[i];
  return b;
}

struct Golden {
  std::string file;
  bool masked;
};

class Walkthrough : public ::testing::TestWithParam<Golden> {};

TEST_P(Walkthrough, F64AttentionOnTheDocumentsQKV) {
  const auto g = read_golden(std::string(QKV_SOURCE_DIR) + "/tests/golden/" + GetParam().file);
  const Matrix &Q = g.at("Q"), &K = g.at("K"), &V = g.at("V"), &L = g.at("L"), &LV = g.at("LV"), &S = g.at("L_scores");
  const std::int64_t T = Q.rows;
  Buffer q = as_f64(Q), k = as_f64(K), v = as_f64(V), out(DType::f64, {1, 1, T, V.cols}), lse(DType::f64, {1, 1, T}),
         pat(DType::f64, {1, 1, T, T});
  qkv::AttentionOptions opt;
  opt.scale = 1.0;
  opt.causal = GetParam().masked;
  opt.kernel = qkv::Kernel::reference;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view(), pat.view());
  double e_pat = 0, e_out = 0, e_scores = 0;
  for (std::int64_t i = 0; i < T; ++i) {
    for (std::int64_t j = 0; j < T; ++j) {
      const double p = pat.ptr<double>()[i * T + j];
      e_pat = std::max(e_pat, std::abs(p - L.at(i, j)));
      if (S.at(i, j) == -INFINITY) {
        EXPECT_EQ(p, 0.0) << "masked entry (" << i << ", " << j << ") must be exactly 0";
      } else {
        // score = log p + lse, relative to the score's size (up to ~30 here)
        e_scores = std::max(e_scores, std::abs(std::log(p) + lse.ptr<double>()[i] - S.at(i, j)) / std::max(1.0, std::abs(S.at(i, j))));
      }
    }
    for (std::int64_t e = 0; e < V.cols; ++e) e_out = std::max(e_out, std::abs(out.ptr<double>()[i * V.cols + e] - LV.at(i, e)));
  }
  std::printf("%s: max error pattern %.3g, L@V %.3g, scores (relative) %.3g\n", GetParam().file.c_str(), e_pat, e_out,
              e_scores);
  // f64 on both sides, numpy's matmul and our loops summing 5–7 terms in different orders: a few ulps,
  // amplified at most by the exponent of scores of size ≤ 30 → 1e-12 for p and L@V, 1e-10 for log p.
  EXPECT_LT(e_pat, 1e-12);
  EXPECT_LT(e_out, 1e-12);
  EXPECT_LT(e_scores, 1e-10);
}

TEST_P(Walkthrough, F32BlockFromXAndWeights) {
  const auto g = read_golden(std::string(QKV_SOURCE_DIR) + "/tests/golden/" + GetParam().file);
  const Matrix &X = g.at("X"), &WQ = g.at("W_Q"), &WK = g.at("W_K"), &WV = g.at("W_V"), &L = g.at("L"), &LV = g.at("LV");
  const std::int64_t T = X.rows, E = X.cols, H2 = WQ.cols, H1 = WV.cols;
  qkv::MultiHeadAttention m({.d_model = E, .n_heads = 1, .d_head = H2, .d_value = H1});
  // The document right-multiplies (Q = X @ W_Q, W_Q [E, H2]); the block stores W_Qᵀ [H2, E].
  for (std::int64_t r = 0; r < E; ++r) {
    for (std::int64_t c = 0; c < H2; ++c) {
      m.w_q.ptr<float>()[c * E + r] = static_cast<float>(WQ.at(r, c));
      m.w_k.ptr<float>()[c * E + r] = static_cast<float>(WK.at(r, c));
    }
    for (std::int64_t c = 0; c < H1; ++c) m.w_v.ptr<float>()[c * E + r] = static_cast<float>(WV.at(r, c));
    m.w_o.ptr<float>()[r * H1 + r] = 1.0f;  // value-up: copy column r of L @ V into Δe
  }
  Buffer x(DType::f32, {1, T, E}), delta(DType::f32, {1, T, E}), pat(DType::f64, {1, 1, T, T});
  for (std::int64_t i = 0; i < T * E; ++i) x.ptr<float>()[i] = static_cast<float>(X.data[static_cast<std::size_t>(i)]);
  qkv::AttentionOptions opt;
  opt.scale = 1.0;
  opt.causal = GetParam().masked;
  m.forward(x.view(), std::nullopt, opt, delta.view(), std::nullopt, pat.view());
  double e_pat = 0, e_out = 0;
  for (std::int64_t i = 0; i < T; ++i) {
    for (std::int64_t j = 0; j < T; ++j) e_pat = std::max(e_pat, std::abs(pat.ptr<double>()[i * T + j] - L.at(i, j)));
    for (std::int64_t e = 0; e < E; ++e) e_out = std::max(e_out, std::abs(delta.ptr<float>()[i * E + e] - LV.at(i, e)));
  }
  std::printf("%s: f32 block max error pattern %.3g, L@V %.3g\n", GetParam().file.c_str(), e_pat, e_out);
  // Inputs rounded to f32 (relative 6e-8) pass through two 5–7 term products to scores of size up to
  // ~30, which err by ~30·1e-6; exp turns that into a relative error of p of the same size: 1e-4.
  EXPECT_LT(e_pat, 1e-4);
  EXPECT_LT(e_out, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Seed003, Walkthrough,
                         ::testing::Values(Golden{"walkthrough_h1_h2.txt", false}, Golden{"walkthrough_unmasked.txt", false},
                                           Golden{"walkthrough_masked.txt", true}),
                         [](const auto& param_info) {
                           std::string n = param_info.param.file.substr(12);
                           return n.substr(0, n.size() - 4);
                         });

}  // namespace
