// qkv::Encoder on small random BERT weights against a naive f64 twin written here from the formulas
// of qkv/encoder.hpp (each text alone, plain loops), and the encoder's Config as data.
// Tolerance: 2e-5 absolute on pooled, unit-norm embeddings — f32 GEMMs and flash attention over
// C = 32, Hd = 64 sums of two layers measured ≈ 1.6e-7; a wrong mask, position or norm is off by ≫ 1e-2.
#include <cmath>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/encoder.hpp"

namespace {

qkv::Config tiny_bert() {
  qkv::Config c;
  c.dim = 32;
  c.hidden_dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 4;
  c.vocab_size = 12;
  c.seq_len = 16;
  c.type_vocab_size = 2;
  c.pos = qkv::PosEncoding::learned;
  c.norm = qkv::NormKind::layernorm;
  c.mlp = qkv::MlpKind::gelu_exact;
  c.bias = true;
  c.causal = false;
  c.post_norm = true;
  c.norm_eps = 1e-12f;
  return c;
}

// A WordPiece vocabulary of 12 tokens: the specials, then a few words and pieces.
qkv::Tokenizer tiny_tokenizer() {
  const std::string path = ::testing::TempDir() + "qkv_encoder_vocab.txt";
  std::ofstream(path) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\n##s\non\nmat\n.\n";
  return qkv::Tokenizer::load_wordpiece(path);
}

using Mat = std::vector<double>;

void layernorm(Mat& x, std::int64_t S, std::int64_t C, const float* w, const float* b, double eps) {
  for (std::int64_t s = 0; s < S; ++s) {
    double m = 0, v = 0;
    for (std::int64_t k = 0; k < C; ++k) m += x[s * C + k];
    m /= C;
    for (std::int64_t k = 0; k < C; ++k) v += (x[s * C + k] - m) * (x[s * C + k] - m);
    v /= C;
    for (std::int64_t k = 0; k < C; ++k) x[s * C + k] = (x[s * C + k] - m) / std::sqrt(v + eps) * w[k] + b[k];
  }
}

// y [S, out] = x [S, in] · Wᵀ + b
Mat linear(const Mat& x, std::int64_t S, std::int64_t in, std::int64_t out, const float* W, const float* b) {
  Mat y(static_cast<std::size_t>(S * out));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t o = 0; o < out; ++o) {
      double a = b[o];
      for (std::int64_t i = 0; i < in; ++i) a += x[s * in + i] * W[o * in + i];
      y[s * out + o] = a;
    }
  return y;
}

// The mean-pooled, normalised embedding of one text, in f64.
std::vector<double> reference(const qkv::Weights& w, const std::vector<int>& t) {
  const qkv::Config& c = w.config;
  const std::int64_t S = static_cast<std::int64_t>(t.size()), C = c.dim, H = c.n_heads, D = C / H, Hd = c.hidden_dim;
  Mat x(static_cast<std::size_t>(S * C));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t k = 0; k < C; ++k) x[s * C + k] = w.wte[t[s] * C + k] + w.wpe[s * C + k] + w.wtt[k];
  layernorm(x, S, C, w.norme_w, w.norme_b, c.norm_eps);
  for (const qkv::LayerWeights& L : w.layers) {
    const Mat q = linear(x, S, C, C, L.wq, L.bq), k = linear(x, S, C, C, L.wk, L.bk), v = linear(x, S, C, C, L.wv, L.bv);
    Mat att(static_cast<std::size_t>(S * C), 0.0);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> p(static_cast<std::size_t>(S));
        double mx = -1e300, sum = 0;
        for (std::int64_t j = 0; j < S; ++j) {  // every key: bidirectional
          double d = 0;
          for (std::int64_t e = 0; e < D; ++e) d += q[i * C + h * D + e] * k[j * C + h * D + e];
          p[j] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, p[j]);
        }
        for (auto& pj : p) sum += (pj = std::exp(pj - mx));
        for (std::int64_t j = 0; j < S; ++j)
          for (std::int64_t e = 0; e < D; ++e) att[i * C + h * D + e] += p[j] / sum * v[j * C + h * D + e];
      }
    Mat o = linear(att, S, C, C, L.wo, L.bo);
    for (std::size_t i = 0; i < o.size(); ++i) x[i] += o[i];
    layernorm(x, S, C, L.norm1_w, L.norm1_b, c.norm_eps);
    Mat f = linear(x, S, C, Hd, L.w1, L.b1);
    for (auto& z : f) z = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    Mat g = linear(f, S, Hd, C, L.w2, L.b2);
    for (std::size_t i = 0; i < g.size(); ++i) x[i] += g[i];
    layernorm(x, S, C, L.norm2_w, L.norm2_b, c.norm_eps);
  }
  std::vector<double> e(static_cast<std::size_t>(C), 0.0);
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t k = 0; k < C; ++k) e[k] += x[s * C + k] / S;
  double n = 0;
  for (double z : e) n += z * z;
  for (double& z : e) z /= std::sqrt(n);
  return e;
}

}  // namespace

TEST(Encoder, PackedBatchesEqualTheNaiveTwinTextByText) {
  const qkv::Config c = tiny_bert();
  qkv::Weights w = qkv::Weights::random(c, 7, 0.3f);
  qkv::Encoder enc(w, tiny_tokenizer(), qkv::Pooling::mean, true, 10);
  // Lengths 2 (empty text) to 10 (cut at max_seq_length), an unknown word, punctuation.
  const std::vector<std::string> texts = {"the cat sat on the mat.", "", "cats", "the dog sat", "mat",
                                          "the cat sat on the mat on the mat on the mat."};
  EXPECT_EQ(enc.tokenize("cats"), (std::vector<int>{2, 6, 8, 3}));
  EXPECT_EQ(enc.tokenize("the dog"), (std::vector<int>{2, 5, 1, 3}));
  EXPECT_EQ(enc.tokenize(texts[5]).size(), 10u);
  for (std::int64_t batch : {1, 4, 6}) {
    std::vector<float> out(texts.size() * static_cast<std::size_t>(c.dim));
    enc.embed(texts, out.data(), batch);
    double worst = 0;
    for (std::size_t i = 0; i < texts.size(); ++i) {
      const std::vector<double> want = reference(w, enc.tokenize(texts[i]));
      for (std::int64_t k = 0; k < c.dim; ++k)
        worst = std::max(worst, std::abs(out[i * static_cast<std::size_t>(c.dim) + static_cast<std::size_t>(k)] - want[static_cast<std::size_t>(k)]));
    }
    std::printf("batch %lld: max |error| %.2e\n", static_cast<long long>(batch), worst);
    EXPECT_LT(worst, 2e-5) << "batch " << batch;
  }
}

// Batches of several row blocks (the encoder runs its projections on blocks of 128 rows, one block
// per task, two threads here), in f32 and bf16: every text against the f64 twin. 60 texts of 3–10
// tokens make T up to 367 rows, so blocks run at once and the last block is padded.
// bf16 bound: 2e-2 absolute on the unit-norm embedding — each GEMM input, q, k, v, the attention's
// probabilities and output rounded to bf16 (relative 2^-9 per element) through 2 layers of C = 32
// measured 7.2e-3 (4e-3 with the attention in f32); a wrong row, block or mask is off by ≫ 0.1.
TEST(Encoder, RowBlocksOnTwoThreadsEqualTheNaiveTwin) {
  const qkv::Config c = tiny_bert();
  qkv::Weights w = qkv::Weights::random(c, 11, 0.3f);
  const char* words[] = {"the", "cat", "sat", "on", "mat", ".", "cats", "dog"};
  std::vector<std::string> texts;
  for (int i = 0; i < 60; ++i) {
    std::string t;
    for (int j = 0; j < 1 + (i * 7) % 9; ++j) t += std::string(j ? " " : "") + words[(i + 3 * j) % 8];
    texts.push_back(t);
  }
  for (qkv::DType dt : {qkv::DType::f32, qkv::DType::bf16}) {
    qkv::EncoderOptions opt;
    opt.dtype = dt;
    opt.num_threads = 2;
    qkv::Encoder enc(w, tiny_tokenizer(), qkv::Pooling::mean, true, 10, opt);
    for (std::int64_t batch : {60, 17}) {
      std::vector<float> out(texts.size() * static_cast<std::size_t>(c.dim));
      enc.embed(texts, out.data(), batch);
      double worst = 0;
      for (std::size_t i = 0; i < texts.size(); ++i) {
        const std::vector<double> want = reference(w, enc.tokenize(texts[i]));
        for (std::int64_t k = 0; k < c.dim; ++k)
          worst = std::max(worst, std::abs(out[i * static_cast<std::size_t>(c.dim) + static_cast<std::size_t>(k)] -
                                           want[static_cast<std::size_t>(k)]));
      }
      std::printf("%s batch %lld: max |error| %.2e\n", qkv::dtype_name(dt), static_cast<long long>(batch), worst);
      EXPECT_LT(worst, dt == qkv::DType::f32 ? 2e-5 : 2e-2) << qkv::dtype_name(dt) << " batch " << batch;
    }
  }
}

// The layer hook reads f32 q, k, v: a bf16 encoder (bf16 q, k, v and attention) refuses it by name.
TEST(Encoder, Bf16EncoderRefusesTheF32LayerHook) {
  const qkv::Config c = tiny_bert();
  qkv::EncoderOptions opt;
  opt.dtype = qkv::DType::bf16;
  qkv::Encoder enc(qkv::Weights::random(c, 3, 0.3f), tiny_tokenizer(), qkv::Pooling::mean, true, 10, opt);
  const std::vector<int> t = enc.tokenize("the cat");
  const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(t.size())};
  std::vector<float> hidden(t.size() * static_cast<std::size_t>(c.dim));
  try {
    enc.forward(t, cu, hidden.data(), [](std::int64_t, const float*, const float*) {});
    FAIL() << "a bf16 encoder ran an f32 hook";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("on_layer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  enc.forward(t, cu, hidden.data());  // without a hook it runs
  for (float v : hidden) EXPECT_TRUE(std::isfinite(v));
}

TEST(Encoder, ConfigAsDataAndRefusedByTheDecoder) {
  const qkv::Config c = tiny_bert();
  const std::string j = qkv::config_to_json(c);
  const qkv::Config r = qkv::config_from_json(j, "bert.json");
  EXPECT_EQ(qkv::config_to_json(r), j);
  EXPECT_FALSE(r.causal);
  EXPECT_TRUE(r.post_norm);
  EXPECT_EQ(r.type_vocab_size, 2);
  // A decoder's JSON carries none of the encoder keys.
  EXPECT_EQ(qkv::config_to_json(qkv::Config::gpt2_small()).find("causal"), std::string::npos);
  try {
    qkv::Model m(qkv::Weights::random(c, 1));
    FAIL() << "qkv::Model ran an encoder";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("qkv::Encoder"), std::string::npos) << e.what();
  }
  try {
    qkv::config_from_json(R"({"model_type": "roberta"})", "config.json");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"roberta\" is not supported"), std::string::npos) << e.what();
  }
}
