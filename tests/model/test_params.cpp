// Parameter counts against published figures and hand arithmetic (exact integers: no tolerance).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "qkv/mha.hpp"
#include "qkv/model.hpp"
#include "qkv/params.hpp"
#include "support/expect_rejects.hpp"

namespace {

using qkv::count_params;
using qkv::model_preset;
using qkv::testing::expect_rejects;

TEST(Params, Gpt3MatchesSeed004) {
  // Seed 004 (3Blue1Brown): each of W_Q, W_K, value-down, value-up is 128 × 12,288 = 1,572,864;
  // a head 6,291,456; 96 heads 603,979,776; 96 blocks 57,982,058,496.
  const auto c = count_params(model_preset("gpt3"));
  EXPECT_EQ(c.attention.query, 1572864);
  EXPECT_EQ(c.attention.key, 1572864);
  EXPECT_EQ(c.attention.value_down, 1572864);
  EXPECT_EQ(c.attention.value_up, 1572864);
  EXPECT_EQ(c.attention.per_head, 6291456);
  EXPECT_EQ(c.attention.block_weights, 603979776);
  EXPECT_EQ(c.attention.all_weights, 57982058496);
  // The whole model by hand: per layer 12·d² + 13·d (4d² + 4d attention, 8d² + 5d MLP, 4d norms)
  // = 1,812,099,072; × 96 = 173,961,510,912; + token embedding 50,257·12,288 = 617,558,016
  // + positions 2,048·12,288 = 25,165,824 + final LayerNorm 24,576 = 174,604,259,328 ("175B").
  ASSERT_TRUE(c.model.has_value());
  EXPECT_EQ(c.model->per_layer, 1812099072);
  EXPECT_EQ(c.model->total, 174604259328);
  std::printf("gpt3: head %lld, block %lld, all %lld, model %lld\n", static_cast<long long>(c.attention.per_head),
              static_cast<long long>(c.attention.block_weights), static_cast<long long>(c.attention.all_weights),
              static_cast<long long>(c.model->total));
}

TEST(Params, Gpt2FamilyMatchesPublishedCheckpoints) {
  // Parameter counts of the released GPT-2 checkpoints (tied unembedding): small 124,439,808,
  // medium 354,823,168.
  EXPECT_EQ(count_params(model_preset("gpt2")).model->total, 124439808);
  EXPECT_EQ(count_params(model_preset("gpt2-medium")).model->total, 354823168);
}

TEST(Params, ConfigShapeCountsTheWeightsTheModelAllocates) {
  // A Config's shape() is what count_params scores; the independent count is the tensors that
  // Weights::allocate makes for the same Config (summed by num_params), and the bytes that
  // MultiHeadAttention allocates for its attention() config: one layer's attention block.
  qkv::Config llama;
  llama.dim = 48, llama.hidden_dim = 128, llama.n_layers = 3, llama.n_heads = 6, llama.n_kv_heads = 2;
  llama.vocab_size = 97, llama.seq_len = 16, llama.tied_embeddings = false;
  qkv::Config gpt2 = qkv::Config::gpt2_small();
  gpt2.dim = 32, gpt2.hidden_dim = 128, gpt2.n_layers = 2, gpt2.n_heads = gpt2.n_kv_heads = 4;
  gpt2.vocab_size = 50, gpt2.seq_len = 8;
  for (const qkv::Config& c : {llama, gpt2}) {
    const auto n = count_params(c.shape("test"));
    ASSERT_TRUE(n.model.has_value());
    EXPECT_EQ(n.model->total, qkv::Weights::allocate(c).num_params());
    EXPECT_EQ(static_cast<std::uint64_t>(4 * n.attention.block), qkv::MultiHeadAttention(c.attention()).weight_bytes());
  }
}

TEST(Params, Stories260KMatchesItsCheckpointFile) {
  // shared/data/README.md: stories260K.bin is 1,056,540 bytes: a 7·int32 header, then float32
  // weights, then two rotary tables [seq_len 512, head_size/2 4]. So the weights number
  // (1,056,540 − 28)/4 − 2·512·4 = 264,128 − 4,096 = 260,032.
  const std::int64_t from_file_size = (1056540 - 7 * 4) / 4 - 2 * 512 * 4;
  const auto c = count_params(model_preset("stories260K"));
  ASSERT_TRUE(c.model.has_value());
  EXPECT_EQ(c.model->total, from_file_size);
  // GQA: 8 query heads (W_Q, value-up 8·64 each) on 4 kv heads (W_K, value-down 8·64 each) = 12,288 per block.
  EXPECT_EQ(c.attention.block_weights, 8 * (512 + 512) + 4 * (512 + 512));
  // The copy committed in the repository: its header and its size say the same.
  const std::string path = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin";
  ASSERT_TRUE(std::filesystem::is_regular_file(path)) << path;
  const auto bytes = static_cast<std::int64_t>(std::filesystem::file_size(path));
  std::ifstream f(path, std::ios::binary);
  std::int32_t h[7];  // dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
  f.read(reinterpret_cast<char*>(h), sizeof h);
  ASSERT_TRUE(f.good());
  const std::int64_t head_size = h[0] / h[3];
  const std::int64_t floats = (bytes - static_cast<std::int64_t>(sizeof h)) / 4;
  const std::int64_t weights = floats - 2 * static_cast<std::int64_t>(h[6]) * (head_size / 2);
  std::printf("%s: %lld bytes, dim %d hidden %d layers %d heads %d kv_heads %d vocab %d seq %d: %lld weights\n",
              path.c_str(), static_cast<long long>(bytes), h[0], h[1], h[2], h[3], h[4], h[5], h[6],
              static_cast<long long>(weights));
  EXPECT_EQ(bytes, 1056540);
  EXPECT_EQ(weights, c.model->total);
}

TEST(Params, GroupedQueryCrossAttentionAndBiases) {
  // d_model 10, d_source 6, H 4, Hkv 2, d_head 3, d_value 5, with biases:
  //   per query head: W_Q 3·10 + value-up 10·5 = 80;  per kv head: W_K 3·6 + value-down 5·6 = 48
  //   weights 4·80 + 2·48 = 416;  biases b_Q 12 + b_K 6 + b_V 10 + b_O 10 = 38.
  qkv::ModelShape s;
  s.d_model = 10;
  s.d_source = 6;
  s.n_heads = 4;
  s.n_kv_heads = 2;
  s.d_head = 3;
  s.d_value = 5;
  s.n_layers = 3;
  s.attn_bias = true;
  const auto c = count_params(s);
  EXPECT_EQ(c.attention.query, 30);
  EXPECT_EQ(c.attention.key, 18);
  EXPECT_EQ(c.attention.value_down, 30);
  EXPECT_EQ(c.attention.value_up, 50);
  EXPECT_EQ(c.attention.block_weights, 416);
  EXPECT_EQ(c.attention.block_biases, 38);
  EXPECT_EQ(c.attention.all, 3 * 454);
  EXPECT_FALSE(c.model.has_value());  // no d_ff / vocab: attention only
}

TEST(Params, BiasFreeLayerNormModel) {
  // nanoGPT's CPU Shakespeare model (bias=False: no biases anywhere, LayerNorm weight only), by hand:
  //   per layer: attention 4·128·128 = 65,536; MLP 2·512·128 = 131,072; two LayerNorms 2·128 = 256
  //   4 layers 787,456 + token embedding 65·128 = 8,320 + positions 64·128 = 8,192 + final norm 128
  //   = 804,096 (nanoGPT prints 0.80M: the same less the 8,192 position weights).
  qkv::ModelShape s;
  s.d_model = 128;
  s.n_heads = 4;
  s.d_head = 32;
  s.n_layers = 4;
  s.d_ff = 512;
  s.vocab = 65;
  s.context = 64;
  s.norm_bias = false;
  const auto c = count_params(s);
  ASSERT_TRUE(c.model.has_value());
  EXPECT_EQ(c.model->norms_per_layer, 256);
  EXPECT_EQ(c.model->total, 804096);
  s.norm_bias = true;  // GPT-2 style LayerNorm: + 2·128 per layer and 128 at the end
  EXPECT_EQ(count_params(s).model->total, 804096 + 4 * 256 + 128);
}

TEST(Params, WithCommas) {
  EXPECT_EQ(qkv::with_commas(0), "0");
  EXPECT_EQ(qkv::with_commas(999), "999");
  EXPECT_EQ(qkv::with_commas(1000), "1,000");
  EXPECT_EQ(qkv::with_commas(57982058496), "57,982,058,496");
  EXPECT_EQ(qkv::with_commas(-1234567), "-1,234,567");
  EXPECT_EQ(qkv::with_commas(INT64_MIN), "-9,223,372,036,854,775,808");
}

TEST(Params, Rejections) {
  qkv::ModelShape s;
  s.d_model = 64;
  s.n_heads = 8;
  s.d_head = 8;
  s.n_kv_heads = 3;
  expect_rejects([&] { count_params(s); }, {"[qkv::count_params]", "n_kv_heads: must divide n_heads", "n_heads 8, n_kv_heads 3"});
  s.n_kv_heads = 0;
  s.d_model = 0;
  expect_rejects([&] { count_params(s); }, {"[qkv::count_params]", "d_model: must be > 0 (got 0)"});
  s.d_model = std::int64_t{1} << 40;
  s.d_head = std::int64_t{1} << 30;
  expect_rejects([&] { count_params(s); }, {"[qkv::count_params]", "overflows 64 bits"});
  expect_rejects([] { model_preset("gpt5"); }, {"[qkv::model_preset]", "unknown preset 'gpt5'", "gpt3", "stories260K"});
}

}  // namespace
