// qkv's training against PyTorch: the gradient of a whole model of each family (gpt2, llama and a
// mixture of the remaining features) from torch autograd (tools/torch_train_twin.py), the masked-LM
// loss and gradients of transformers' BertForMaskedLM (the encoder configuration), and
// torch.optim.AdamW with clip_grad_norm_, all from golden files tests/train/make_golden.py writes.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/hf_layout.hpp"
#include "model/trainable.hpp"
#include "train/adamw.hpp"

namespace {

nlohmann::json golden(const std::string& name) {
  std::ifstream f(std::string(QKV_SOURCE_DIR) + "/tests/train/golden/" + name);
  EXPECT_TRUE(f.good()) << name;
  std::stringstream s;
  s << f.rdbuf();
  return nlohmann::json::parse(s.str());
}

template <class S>
void check_model(const std::string& arch, double loss_tol, double grad_tol) {
  const auto g = golden("model_grads_" + arch + ".json");
  const qkv::Config cfg = qkv::config_from_json(g["config"].dump(), "golden config");
  const std::int64_t B = g["batch"];
  qkv::Trainable<S> m(cfg, B, cfg.seq_len);
  ASSERT_EQ(m.layout().size(), g["params"].size());
  for (const auto& p : m.layout()) {
    const auto& w = g["params"][p.name];
    ASSERT_EQ(static_cast<std::int64_t>(w.size()), p.numel) << p.name;
    for (std::int64_t i = 0; i < p.numel; ++i) m.params[static_cast<std::size_t>(p.offset + i)] = static_cast<S>(w[i].template get<double>());
  }
  const auto x = g["tokens"].get<std::vector<std::int32_t>>(), y = g["targets"].get<std::vector<std::int32_t>>();
  m.zero_grad();
  const double loss = m.forward(x.data(), y.data());
  m.backward(S(1));
  double gmax = 0, err = 0;
  for (const auto& p : m.layout()) {
    const auto& gr = g["grads"][p.name];
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double want = gr[i].template get<double>();
      gmax = std::max(gmax, std::abs(want));
      err = std::max(err, std::abs(want - static_cast<double>(m.grads[static_cast<std::size_t>(p.offset + i)])));
    }
  }
  const double want_loss = g["loss"].get<double>();
  std::printf("%s: loss qkv %.9f torch %.9f; max |grad| %.3g, max |grad qkv − torch| %.3g\n", arch.c_str(), loss,
              want_loss, gmax, err);
  EXPECT_LT(std::abs(loss - want_loss), loss_tol * want_loss);
  EXPECT_LT(err, grad_tol * gmax);
}

// torch computed in f64 on the same f32-representable weights. The f64 twin agrees up to f64
// rounding through the network (~1e-15 relative; 1e-10 leaves room for summation order); the f32
// model carries f32 rounding, 2^-24 grown over ~2L+2 layers, so 1e-4 of the largest gradient.
class TorchParity : public ::testing::TestWithParam<const char*> {};
TEST_P(TorchParity, GradientsF64) { check_model<double>(GetParam(), 1e-12, 1e-10); }
TEST_P(TorchParity, GradientsF32) { check_model<float>(GetParam(), 1e-5, 1e-4); }
INSTANTIATE_TEST_SUITE_P(Archs, TorchParity, ::testing::Values("gpt2", "llama", "mixed"),
                         [](const auto& p) { return std::string(p.param); });

// transformers' BertForMaskedLM (tests/train/golden/bert_mlm: its save_pretrained folder, read by
// qkv's safetensors loader as a Config with mlm_head) on one batch with token types and labels −100
// where not predicted: the masked-LM loss and the gradient of every parameter, transformers' computed
// in f64, matched by name through the loader's own HF ↔ qkv mapping. Tolerances as TorchParity's:
// f64 1e-10 (the rounding of two f64 computations; the LayerNorm eps 1e-12 held as a float differs
// from torch's double by 4e-21, far below it); f32 1e-5 on the loss and 1e-4 of the largest gradient
// (f32 rounding through 2 post-norm layers and the head).
template <class S>
void check_bert(double loss_tol, double grad_tol) {
  const auto g = golden("bert_mlm.json");
  const qkv::Weights w = qkv::load_weights(std::string(QKV_SOURCE_DIR) + "/tests/train/golden/bert_mlm");
  const qkv::Config& cfg = w.config;
  ASSERT_TRUE(!cfg.causal && cfg.post_norm && cfg.mlm_head && cfg.tied_embeddings && cfg.type_vocab_size == 2);
  qkv::Trainable<S> m(cfg, g["batch"].get<std::int64_t>(), g["seq"].get<std::int64_t>());
  m.set_weights(w, "golden bert_mlm");
  const auto x = g["tokens"].get<std::vector<std::int32_t>>(), y = g["targets"].get<std::vector<std::int32_t>>(),
             t = g["types"].get<std::vector<std::int32_t>>();
  m.zero_grad();
  const double loss = m.forward(x.data(), y.data(), t.data());
  m.backward(S(1));
  const qkv::detail::FileLayout hf{qkv::detail::Layout::hf_bert, "bert."};
  double gmax = 0, err = 0;
  std::string worst;
  std::size_t matched = 0;
  for (const auto& p : m.layout()) {
    const std::string name = qkv::detail::source_of(hf, cfg, p.name, p.shape).tensor;
    ASSERT_TRUE(g["grads"].contains(name)) << p.name << " → " << name;
    const auto& gr = g["grads"][name];
    ASSERT_EQ(static_cast<std::int64_t>(gr.size()), p.numel) << name;
    ++matched;
    for (std::int64_t i = 0; i < p.numel; ++i) {
      const double want = gr[i].template get<double>();
      gmax = std::max(gmax, std::abs(want));
      const double d = std::abs(want - static_cast<double>(m.grads[static_cast<std::size_t>(p.offset + i)]));
      if (d > err) err = d, worst = p.name;
    }
  }
  EXPECT_EQ(matched, g["grads"].size());  // every parameter transformers trains, and no other
  const double want_loss = g["loss"].get<double>();
  std::printf("bert (%s): loss qkv %.9f transformers %.9f; max |grad| %.3g, max |grad qkv − transformers| %.3g (%s)\n",
              sizeof(S) == 8 ? "f64" : "f32", loss, want_loss, gmax, err, worst.c_str());
  EXPECT_LT(std::abs(loss - want_loss), loss_tol * want_loss);
  EXPECT_LT(err, grad_tol * gmax) << worst;
}
TEST(TransformersParity, BertForMaskedLmF64) { check_bert<double>(1e-12, 1e-10); }
TEST(TransformersParity, BertForMaskedLmF32) { check_bert<float>(1e-5, 1e-4); }

// Three AdamW steps with clipping on a split decay/no-decay parameter set. Both sides run in f32;
// torch updates m by lerp, qkv by β1·m + (1−β1)·g, which differ in the last bit, so parameters
// (|p| ~ 1, moved by ~lr per step) agree to ~1e-7; 1e-6 absolute is the bound.
TEST(TorchOptimizer, AdamWWithClipping) {
  const auto g = golden("adamw.json");
  auto p = g["p0"].get<std::vector<float>>();
  const auto n = static_cast<std::int64_t>(p.size());
  const std::int64_t n_decay = g["n_decay"];
  std::vector<float> m(p.size()), v(p.size());
  qkv::train::AdamWConfig cfg;
  cfg.beta1 = g["config"]["beta1"], cfg.beta2 = g["config"]["beta2"], cfg.eps = g["config"]["eps"];
  cfg.weight_decay = g["config"]["weight_decay"], cfg.clip = g["config"]["clip"];
  double norm_err = 0;
  for (std::size_t t = 0; t < g["grads"].size(); ++t) {
    auto grad = g["grads"][t].get<std::vector<float>>();
    const double norm = qkv::train::clip_grad_norm(grad.data(), n, cfg.clip);
    norm_err = std::max(norm_err, std::abs(norm - g["norms"][t].get<double>()) / norm);
    qkv::train::adamw_step(p.data(), grad.data(), m.data(), v.data(), n, {{0, n_decay}}, cfg, g["lrs"][t].get<double>(),
                           static_cast<std::int64_t>(t) + 1);
  }
  const auto want = g["p"].get<std::vector<float>>();
  double err = 0;
  for (std::size_t i = 0; i < p.size(); ++i) err = std::max(err, std::abs(double(p[i]) - want[i]));
  std::printf("max |p qkv − torch| after 3 steps %.3g; max relative gradient-norm error %.3g\n", err, norm_err);
  EXPECT_LT(err, 1e-6);
  EXPECT_LT(norm_err, 1e-6);  // f64 vs f32 accumulation of 12 squares
}

// nanoGPT's get_lr at hand-computed points: warmup (lr·1/101 at step 0), the cosine midpoint
// (min + ½(lr − min)), the end (min_lr), and past the end.
TEST(Schedule, WarmupCosine) {
  qkv::train::AdamWConfig c;
  c.lr = 1e-3, c.min_lr = 1e-4, c.warmup = 100, c.decay_steps = 2000;
  EXPECT_DOUBLE_EQ(qkv::train::lr_at(c, 0), 1e-3 / 101);
  EXPECT_DOUBLE_EQ(qkv::train::lr_at(c, 99), 1e-3 * 100 / 101);
  EXPECT_NEAR(qkv::train::lr_at(c, 1050), 1e-4 + 0.5 * 9e-4, 1e-15);
  EXPECT_NEAR(qkv::train::lr_at(c, 2000), 1e-4, 1e-15);
  EXPECT_DOUBLE_EQ(qkv::train::lr_at(c, 5000), 1e-4);
}

}  // namespace
