// A model trained by qkv train (--arch gpt2 and llama) loads in the inference model (qkv::load_weights + qkv::Model, what
// `qkv generate` runs) and computes the same function: the training forward's loss on a sequence
// against the cross-entropy of the inference logits.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "qkv/model.hpp"
#include "model/safetensors.hpp"
#include "model/trainable.hpp"
#include "train/trainer.hpp"

namespace {

class TrainExport : public ::testing::TestWithParam<const char*> {};

TEST_P(TrainExport, TrainedModelRunsInTheInferenceModel) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("qkv_train_export_" + std::string(GetParam()) + std::to_string(::getpid()));
  fs::remove_all(dir);
  qkv::train::TrainOptions o;
  o.data_path = std::string(QKV_SOURCE_DIR) + "/data/tinyshakespeare/input.txt";
  o.out_dir = dir.string();
  o.model.arch = GetParam();
  o.model.layers = 2, o.model.heads = 2, o.model.embd = 32, o.model.context = 16, o.model.bias = true;
  if (o.model.arch == "llama") o.model.heads = 4, o.model.kv_heads = 2, o.model.bias = false;
  o.batch = 4, o.steps = 5, o.eval_interval = 5, o.eval_batches = 1, o.opt.warmup = 1, o.opt.decay_steps = 5;
  qkv::train::train(o);

  qkv::Model inference(qkv::load_weights((dir / "model.safetensors").string()));
  ASSERT_EQ(inference.config().vocab_size, 65);

  const qkv::Config cfg = qkv::train::model_config(o.model, 65);
  EXPECT_EQ(qkv::config_to_json(cfg), qkv::config_to_json(inference.config()));
  const std::int64_t T = cfg.seq_len;
  qkv::Trainable<float> train_model(cfg, 1, T);
  const auto ckpt = qkv::detail::read_safetensors((dir / "checkpoint.safetensors").string());
  for (const auto& p : train_model.layout())
    qkv::detail::st_copy_f32(ckpt, p.name, train_model.params.data() + p.offset, p.numel, "test");

  std::vector<std::int32_t> x(static_cast<std::size_t>(T)), y(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    x[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((7 * t + 3) % 65);
    y[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((5 * t + 1) % 65);
  }
  const double loss_train = train_model.forward(x.data(), y.data());

  qkv::KvCache cache(inference.config());
  std::vector<float> logits(static_cast<std::size_t>(T * 65));
  const std::vector<int> tokens(x.begin(), x.end());
  inference.forward(tokens, cache, logits.data(), true);
  double loss_inf = 0;
  for (std::int64_t t = 0; t < T; ++t) {
    const float* l = logits.data() + t * 65;
    double m = l[0], s = 0;
    for (int v = 1; v < 65; ++v) m = std::max(m, double(l[v]));
    for (int v = 0; v < 65; ++v) s += std::exp(l[v] - m);
    loss_inf += m + std::log(s) - l[y[static_cast<std::size_t>(t)]];
  }
  loss_inf /= static_cast<double>(T);
  std::printf("mean cross-entropy: training forward %.7f, inference model %.7f\n", loss_train, loss_inf);
  // Both are f32 forwards of the same weights; they differ only in summation order and in the exact
  // GELU (std::erf vs the training kernel's, ≤ ~1e-7·|x|), so 1e-5 relative is ample.
  EXPECT_LT(std::abs(loss_train - loss_inf), 1e-5 * loss_train);
  fs::remove_all(dir);
}

// --arch gpt2 at GPT-2 small's sizes is the one GPT-2 preset, Config::gpt2_small(), but for nanoGPT's
// exact GELU; without --bias it differs only in the biases as well. The preset's values are
// written here by hand (Radford et al. 2019 and HF's gpt2 config.json), so a change to either side shows.
TEST(TrainConfig, Gpt2ArchIsTheOneGpt2Preset) {
  qkv::train::ModelFlags f;
  f.arch = "gpt2", f.layers = 12, f.heads = 12, f.embd = 768, f.context = 1024, f.bias = true;
  const qkv::Config c = qkv::train::model_config(f, 50257);
  qkv::Config want = qkv::Config::gpt2_small();
  EXPECT_EQ(want.dim, 768);
  EXPECT_EQ(want.hidden_dim, 3072);
  EXPECT_EQ(want.pos, qkv::PosEncoding::learned);
  EXPECT_EQ(want.norm, qkv::NormKind::layernorm);
  EXPECT_EQ(want.mlp, qkv::MlpKind::gelu);
  EXPECT_TRUE(want.bias && want.tied_embeddings);
  want.mlp = qkv::MlpKind::gelu_exact;
  EXPECT_EQ(qkv::config_to_json(c), qkv::config_to_json(want));
  EXPECT_EQ(qkv::train::arch_of(c), "gpt2");
  f.bias = false;
  want.bias = false;
  EXPECT_EQ(qkv::config_to_json(qkv::train::model_config(f, 50257)), qkv::config_to_json(want));
}

INSTANTIATE_TEST_SUITE_P(Archs, TrainExport, ::testing::Values("gpt2", "llama"),
                         [](const auto& p) { return std::string(p.param); });

}  // namespace
