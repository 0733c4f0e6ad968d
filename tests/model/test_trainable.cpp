// The training forward/backward of qkv::Config's model (model/trainable.hpp) over the configurations
// it implements: against central finite differences of its f64 twin (every layer's backward: the
// embeddings, LayerNorm/RMSNorm, rotary, GQA causal attention, GELU/SwiGLU, biases, tied or separate
// unembedding, cross-entropy at every position; for encoders token types, the embedding norm,
// bidirectional attention, post-norm blocks and the masked-LM head on the predicted positions only),
// the f32 model against the f64 twin, and the f32 model's loss against qkv::Model's logits for the
// same weights (one model, trained and served).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/trainable.hpp"
#include "qkv/attention.hpp"
#include "qkv/model.hpp"
#include "train/rng.hpp"

namespace {

using qkv::Config;
using qkv::Trainable;
using qkv::train::Rng;

struct Case {
  const char* name;
  Config cfg;
};

// Tiny models of each family and a mixture, so every branch of the forward/backward runs.
std::vector<Case> cases() {
  Config gpt2;  // nanoGPT: learned positions, LayerNorm with biases, exact GELU, tied
  gpt2.dim = 8, gpt2.hidden_dim = 32, gpt2.n_layers = 2, gpt2.n_heads = 2, gpt2.n_kv_heads = 2;
  gpt2.vocab_size = 7, gpt2.seq_len = 6, gpt2.pos = qkv::PosEncoding::learned, gpt2.norm = qkv::NormKind::layernorm;
  gpt2.mlp = qkv::MlpKind::gelu_exact, gpt2.tied_embeddings = true, gpt2.bias = true;
  Config llama;  // rotary, RMSNorm, SwiGLU, GQA (4 query heads over 2 kv heads), untied, no biases
  llama.dim = 16, llama.hidden_dim = 24, llama.n_layers = 2, llama.n_heads = 4, llama.n_kv_heads = 2;
  llama.vocab_size = 9, llama.seq_len = 6, llama.pos = qkv::PosEncoding::rotary, llama.norm = qkv::NormKind::rmsnorm;
  llama.mlp = qkv::MlpKind::swiglu, llama.tied_embeddings = false, llama.bias = false;
  Config mixed = llama;  // rotary with LayerNorm, tanh GELU, biases, MQA, tied, eps and theta off their defaults
  mixed.n_kv_heads = 1, mixed.norm = qkv::NormKind::layernorm, mixed.mlp = qkv::MlpKind::gelu;
  mixed.bias = true, mixed.tied_embeddings = true, mixed.norm_eps = 1e-3f, mixed.rope_theta = 500.0f;
  Config nopos = gpt2;  // no positions at all, RMSNorm with biases on the projections
  nopos.pos = qkv::PosEncoding::none, nopos.norm = qkv::NormKind::rmsnorm, nopos.mlp = qkv::MlpKind::swiglu;
  return {{"gpt2", gpt2}, {"llama", llama}, {"mixed", mixed}, {"nopos", nopos}};
}

// Weights of order 1 (not 0.02) so every path — attention patterns far from uniform, GELU and SiLU
// curvature, norm gains — carries a gradient well above rounding.
void random_weights(std::vector<double>& p, std::uint64_t seed) {
  Rng rng(seed);
  for (auto& w : p) w = 0.5 * rng.normal();
}

// Random tokens and targets; an encoder's targets are kIgnoreTarget except at about a third of the
// positions (and always at position 1), its token types random in [0, type_vocab_size).
void batch(const Config& c, std::int64_t N, std::vector<std::int32_t>& x, std::vector<std::int32_t>& y,
           std::vector<std::int32_t>* types = nullptr) {
  Rng rng(99);
  const auto V = static_cast<std::uint64_t>(c.vocab_size);
  x.resize(static_cast<std::size_t>(N));
  y.resize(static_cast<std::size_t>(N));
  if (types) types->resize(static_cast<std::size_t>(N));
  for (std::int64_t n = 0; n < N; ++n) {
    const auto i = static_cast<std::size_t>(n);
    x[i] = static_cast<std::int32_t>(rng.below(V));
    y[i] = static_cast<std::int32_t>(rng.below(V));
    if (c.mlm_head && n != 1 && rng.below(3) != 0) y[i] = qkv::kIgnoreTarget;
    if (types) (*types)[i] = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(c.type_vocab_size)));
  }
}

// Central differences in f64 with step h = 1e-5: truncation ~h²·|f'''| ≈ 1e-10 and rounding
// ~1e-16/h ≈ 1e-11, so analytic and numeric gradients agree to ~1e-9; 1e-6 of the largest gradient
// is a bound any real mistake — a missing path, a wrong sign, a transposed rotation — exceeds by orders.
// Every parameter group must carry a gradient (a group left at zero is a path the backward missed),
// except W_K's bias: it adds q·b_K to every score of a query's row, which softmax cancels, so its true
// gradient is 0 (seen: ~1e-18).
void check_finite_differences(const char* name, const Config& cfg) {
  const std::int64_t B = 2, T = 5;
  const int threads = qkv::num_threads();
  qkv::set_num_threads(1);  // thousands of forwards of a tiny model: a second thread costs more than it does
  Trainable<double> m(cfg, B, T);
  random_weights(m.params, 1);
  std::vector<std::int32_t> x, y, types;
  const bool typed = cfg.type_vocab_size > 0;
  batch(cfg, B * T, x, y, typed ? &types : nullptr);
  const std::int32_t* tt = typed ? types.data() : nullptr;
  m.zero_grad();
  m.forward(x.data(), y.data(), tt);
  m.backward(1.0);
  double gmax = 0, err = 0;
  std::string worst;
  for (double g : m.grads) gmax = std::max(gmax, std::abs(g));
  const double h = 1e-5;
  for (const auto& p : m.layout()) {
    double group = 0;
    for (std::int64_t e = 0; e < p.numel; ++e) {
      const auto i = static_cast<std::size_t>(p.offset + e);
      group = std::max(group, std::abs(m.grads[i]));
      const double w = m.params[i];
      m.params[i] = w + h;
      const double lp = m.forward(x.data(), y.data(), tt);
      m.params[i] = w - h;
      const double lm = m.forward(x.data(), y.data(), tt);
      m.params[i] = w;
      const double d = std::abs((lp - lm) / (2 * h) - m.grads[i]);
      if (d > err) err = d, worst = p.name;
    }
    if (!p.name.ends_with("attention.wk.bias")) {
      EXPECT_GT(group, 1e-6) << name << ": no gradient reaches " << p.name;
    }
  }
  qkv::set_num_threads(threads);
  std::printf("%s: %zu parameters, max |grad| %.3g, max |analytic − finite difference| %.3g (%s)\n", name,
              m.params.size(), gmax, err, worst.c_str());
  EXPECT_GT(gmax, 1e-2);
  EXPECT_LT(err, 1e-6 * gmax) << worst;
}

// The f32 model (oneDNN sgemm, fast erf/exp, the f32 flash kernels) against the f64 twin on the same
// weights: f32 rounding (2^-24 ≈ 6e-8) grows through ~2L+2 layers of sums of ≤ Hd terms; 1e-4 of the
// largest gradient leaves a margin of ~100× over that, and loss agreement 1e-5 likewise.
void check_f32_against_f64(const char* name, const Config& cfg) {
  const std::int64_t B = 3, T = 6;
  Trainable<double> m64(cfg, B, T);
  Trainable<float> m32(cfg, B, T);
  random_weights(m64.params, 2);
  for (std::size_t i = 0; i < m64.params.size(); ++i) {
    m32.params[i] = static_cast<float>(m64.params[i]);
    m64.params[i] = m32.params[i];  // both see exactly the same (f32-representable) weights
  }
  std::vector<std::int32_t> x, y, types;
  const bool typed = cfg.type_vocab_size > 0;
  batch(cfg, B * T, x, y, typed ? &types : nullptr);
  const std::int32_t* tt = typed ? types.data() : nullptr;
  m64.zero_grad();
  m32.zero_grad();
  const double l64 = m64.forward(x.data(), y.data(), tt), l32 = m32.forward(x.data(), y.data(), tt);
  m64.backward(1.0);
  m32.backward(1.0f);
  double gmax = 0, err = 0;
  for (std::size_t i = 0; i < m64.grads.size(); ++i) {
    gmax = std::max(gmax, std::abs(m64.grads[i]));
    err = std::max(err, std::abs(m64.grads[i] - m32.grads[i]));
  }
  std::printf("%s: loss f64 %.9f f32 %.9f; max |grad| %.3g, max |grad f32 − f64| %.3g\n", name, l64, l32, gmax, err);
  EXPECT_LT(std::abs(l64 - l32), 1e-5 * l64);
  EXPECT_LT(err, 1e-4 * gmax);
}

class TrainableGrad : public ::testing::TestWithParam<Case> {};

TEST_P(TrainableGrad, MatchesFiniteDifferencesInF64) { check_finite_differences(GetParam().name, GetParam().cfg); }
TEST_P(TrainableGrad, F32MatchesF64Twin) { check_f32_against_f64(GetParam().name, GetParam().cfg); }

// The weights the trainer holds, served by qkv::Model: its logits for each sequence (a fresh cache,
// all positions) give the same mean cross-entropy as the training forward computes. Both are f32 with
// different summation orders and kernels (GEMM vs GEMV, flash vs decode attention): 1e-5 relative.
TEST_P(TrainableGrad, ServedByModel) {
  const Config cfg = GetParam().cfg;
  const std::int64_t B = 2, T = 6;
  Trainable<float> t(cfg, B, T);
  Rng rng(3);
  for (auto& w : t.params) w = static_cast<float>(0.5 * rng.normal());
  std::vector<std::int32_t> x, y;
  batch(cfg, B * T, x, y);
  const double loss = t.forward(x.data(), y.data());
  qkv::Model model(t.to_weights());
  const std::int64_t V = cfg.vocab_size;
  std::vector<float> logits(static_cast<std::size_t>(T * V));
  double sum = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    qkv::KvCache cache(cfg);
    const std::vector<int> seq(x.begin() + b * T, x.begin() + (b + 1) * T);
    model.forward(seq, cache, logits.data(), true);
    for (std::int64_t i = 0; i < T; ++i) {
      const float* l = logits.data() + i * V;
      double m = l[0], s = 0;
      for (std::int64_t v = 1; v < V; ++v) m = std::max<double>(m, l[v]);
      for (std::int64_t v = 0; v < V; ++v) s += std::exp(l[v] - m);
      sum += m + std::log(s) - l[y[static_cast<std::size_t>(b * T + i)]];
    }
  }
  const double served = sum / static_cast<double>(B * T);
  std::printf("%s: training loss %.9f, qkv::Model's %.9f\n", GetParam().name, loss, served);
  EXPECT_LT(std::abs(loss - served), 1e-5 * served);
}

INSTANTIATE_TEST_SUITE_P(Configs, TrainableGrad, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return std::string(p.param.name); });

// BERT-style encoders (bidirectional, post-norm, token types, the masked-LM head): BertForMaskedLM's
// configuration (tied decoder, exact GELU, eps 1e-12) and one with a separate decoder, tanh GELU,
// three token types and another eps.
std::vector<Case> encoder_cases() {
  Config bert;
  bert.dim = 8, bert.hidden_dim = 16, bert.n_layers = 2, bert.n_heads = 2, bert.n_kv_heads = 2;
  bert.vocab_size = 11, bert.seq_len = 6, bert.type_vocab_size = 2, bert.pos = qkv::PosEncoding::learned;
  bert.norm = qkv::NormKind::layernorm, bert.mlp = qkv::MlpKind::gelu_exact, bert.tied_embeddings = true;
  bert.bias = true, bert.causal = false, bert.post_norm = true, bert.mlm_head = true, bert.norm_eps = 1e-12f;
  Config untied = bert;
  untied.tied_embeddings = false, untied.mlp = qkv::MlpKind::gelu, untied.norm_eps = 1e-3f;
  untied.type_vocab_size = 3, untied.n_layers = 1;
  return {{"bert", bert}, {"bert_untied", untied}};
}

class EncoderGrad : public ::testing::TestWithParam<Case> {};
TEST_P(EncoderGrad, MatchesFiniteDifferencesInF64) { check_finite_differences(GetParam().name, GetParam().cfg); }
TEST_P(EncoderGrad, F32MatchesF64Twin) { check_f32_against_f64(GetParam().name, GetParam().cfg); }
INSTANTIATE_TEST_SUITE_P(Configs, EncoderGrad, ::testing::ValuesIn(encoder_cases()),
                         [](const auto& p) { return std::string(p.param.name); });

// Only the predicted positions count: the loss is their mean (two positions predicted alone and
// together, f64: equal to rounding). Every target ignored is an error, as are a token type out of
// range, token types given to a decoder, and an ignored target in a decoder.
TEST(Trainable, MaskedLmCountsOnlyPredictedPositions) {
  const Config cfg = encoder_cases()[0].cfg;
  Trainable<double> m(cfg, 1, 4);
  random_weights(m.params, 5);
  const std::int32_t I = qkv::kIgnoreTarget;
  const std::vector<std::int32_t> x = {2, 4, 7, 3}, t0 = {0, 0, 0, 0};
  const std::vector<std::int32_t> only1 = {I, 5, I, I}, only2 = {I, I, 9, I}, both = {I, 5, 9, I};
  const double l1 = m.forward(x.data(), only1.data(), t0.data()), l2 = m.forward(x.data(), only2.data(), t0.data());
  const double l12 = m.forward(x.data(), both.data(), t0.data());
  EXPECT_NEAR(l12, (l1 + l2) / 2, 1e-12);
  const std::vector<std::int32_t> none = {I, I, I, I}, bad_type = {0, 2, 0, 0};
  EXPECT_THROW(m.forward(x.data(), none.data(), t0.data()), std::invalid_argument);
  EXPECT_THROW(m.forward(x.data(), both.data(), bad_type.data()), std::invalid_argument);
  Trainable<double> d(cases()[0].cfg, 1, 4);
  EXPECT_THROW(d.forward(x.data(), t0.data(), t0.data()), std::invalid_argument);
  EXPECT_THROW(d.forward(x.data(), only1.data()), std::invalid_argument);
}

// The layout is Weights::tensors(), and Trainable refuses what it does not implement, naming the key.
TEST(Trainable, LayoutAndRefusals) {
  Config c = cases()[1].cfg;
  const auto w = qkv::Weights::allocate(c);
  const auto layout = qkv::param_layout(c);
  const auto t = w.tensors();
  ASSERT_EQ(layout.size(), t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(layout[i].name, t[i].name);
    EXPECT_EQ(layout[i].shape, t[i].shape);
  }
  EXPECT_EQ(qkv::param_count(c), w.num_params());
  auto refused = [&](Config bad, const char* key) {
    try {
      Trainable<float> m(bad, 1, 4);
      ADD_FAILURE() << "accepted " << key;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  // Features the trainer does not implement, one clear error each naming the key: an encoder without
  // its objective, a post-norm decoder, a pre-norm encoder, token types in a decoder; and a config
  // that is no model at all (a masked-LM head on a causal decoder).
  Config enc = encoder_cases()[0].cfg;
  enc.mlm_head = false;
  refused(enc, "mlm_head");
  enc = c;
  enc.post_norm = true;
  refused(enc, "post_norm");
  enc = encoder_cases()[0].cfg;
  enc.post_norm = false;
  refused(enc, "post_norm");
  enc = c;
  enc.type_vocab_size = 2;
  refused(enc, "type_vocab_size");
  enc = c;
  enc.mlm_head = true;
  refused(enc, "mlm_head");
  // The head's parameters are part of the layout (what the trainer counts and trains).
  const Config bert = encoder_cases()[0].cfg;
  std::int64_t head = 0;
  for (const auto& p : qkv::param_layout(bert))
    if (p.name.rfind("mlm_head.", 0) == 0 || p.name == "output.bias") head += p.numel;
  EXPECT_EQ(head, bert.dim * bert.dim + 3 * bert.dim + bert.vocab_size);
  EXPECT_EQ(qkv::param_count(bert), qkv::Weights::allocate(bert).num_params());
  EXPECT_THROW(Trainable<float>(c, 1, c.seq_len + 1), std::invalid_argument);  // T beyond the context
}

}  // namespace
