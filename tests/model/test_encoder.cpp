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
#include "support/temp_path.hpp"

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
  const std::string path = qkv::testing::temp_path("encoder_vocab.txt");
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

// One layer's attention as the twin computed it (what qkv::LayerTrace records): q, k [S, C] (head h:
// columns h·D … h·D + D − 1), scores and pattern [H, S, S], head_delta [H, S, C] = W_O[:, head h] · att_h.
struct LayerRef {
  Mat q, k, scores, pattern, head_delta;
};

// The mean-pooled, normalised embedding of one text, in f64; with `layers`, each layer's attention
// recorded, with `hidden`, the last layer's output [S, C].
std::vector<double> reference(const qkv::Weights& w, const std::vector<int>& t, std::vector<LayerRef>* layers = nullptr,
                              Mat* hidden = nullptr) {
  const qkv::Config& c = w.config;
  const std::int64_t S = static_cast<std::int64_t>(t.size()), C = c.dim, H = c.n_heads, D = C / H, Hd = c.hidden_dim;
  Mat x(static_cast<std::size_t>(S * C));
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t k = 0; k < C; ++k) x[s * C + k] = w.wte[t[s] * C + k] + w.wpe[s * C + k] + w.wtt[k];
  layernorm(x, S, C, w.norme_w, w.norme_b, c.norm_eps);
  for (const qkv::LayerWeights& L : w.layers) {
    const Mat q = linear(x, S, C, C, L.wq, L.bq), k = linear(x, S, C, C, L.wk, L.bk), v = linear(x, S, C, C, L.wv, L.bv);
    Mat att(static_cast<std::size_t>(S * C), 0.0);
    LayerRef r{q, k, Mat(static_cast<std::size_t>(H * S * S)), Mat(static_cast<std::size_t>(H * S * S)),
               Mat(static_cast<std::size_t>(H * S * C), 0.0)};
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        std::vector<double> p(static_cast<std::size_t>(S));
        double mx = -1e300, sum = 0;
        for (std::int64_t j = 0; j < S; ++j) {  // every key: bidirectional
          double d = 0;
          for (std::int64_t e = 0; e < D; ++e) d += q[i * C + h * D + e] * k[j * C + h * D + e];
          p[j] = d / std::sqrt(static_cast<double>(D));
          r.scores[(h * S + i) * S + j] = p[j];
          mx = std::max(mx, p[j]);
        }
        for (auto& pj : p) sum += (pj = std::exp(pj - mx));
        for (std::int64_t j = 0; j < S; ++j) {
          r.pattern[(h * S + i) * S + j] = p[j] / sum;
          for (std::int64_t e = 0; e < D; ++e) att[i * C + h * D + e] += p[j] / sum * v[j * C + h * D + e];
        }
        for (std::int64_t o = 0; o < C; ++o)
          for (std::int64_t e = 0; e < D; ++e)
            r.head_delta[(h * S + i) * C + o] += double{L.wo[o * C + h * D + e]} * att[i * C + h * D + e];
      }
    if (layers) layers->push_back(std::move(r));
    Mat o = linear(att, S, C, C, L.wo, L.bo);
    for (std::size_t i = 0; i < o.size(); ++i) x[i] += o[i];
    layernorm(x, S, C, L.norm1_w, L.norm1_b, c.norm_eps);
    Mat f = linear(x, S, C, Hd, L.w1, L.b1);
    for (auto& z : f) z = 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
    Mat g = linear(f, S, Hd, C, L.w2, L.b2);
    for (std::size_t i = 0; i < g.size(); ++i) x[i] += g[i];
    layernorm(x, S, C, L.norm2_w, L.norm2_b, c.norm_eps);
  }
  if (hidden) *hidden = x;
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

// forward_trace against the twin: every recorded tensor of every layer, and the hidden rows (also
// forward's, whose attention kernel differs only in summation order from the traced one, which
// writes the pattern). Tolerance 2e-5 absolute, as above: f32 values of magnitude ≲ 5, two layers.
TEST(Encoder, TraceEqualsTheNaiveTwin) {
  const qkv::Config c = tiny_bert();
  const qkv::Weights w = qkv::Weights::random(c, 11, 0.3f);
  qkv::Encoder enc(w, tiny_tokenizer(), qkv::Pooling::mean, true, 16);
  const std::vector<int> t = enc.tokenize("the cats sat on the mat .");
  const std::int64_t S = static_cast<std::int64_t>(t.size()), C = c.dim, H = c.n_heads, D = C / H;
  std::vector<float> hidden(static_cast<std::size_t>(S * C)), plain(hidden.size());
  const std::vector<qkv::LayerTrace> trace = enc.forward_trace(t, hidden.data());
  const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(S)};
  enc.forward(t, cu, plain.data());
  std::vector<LayerRef> want;
  Mat want_hidden;
  reference(w, t, &want, &want_hidden);
  ASSERT_EQ(trace.size(), static_cast<std::size_t>(c.n_layers));
  double worst = 0;
  const auto check = [&](const char* what, const qkv::Buffer& got, const std::vector<std::int64_t>& shape,
                         auto&& at) {
    ASSERT_EQ(got.shape(), shape) << what;
    const float* g = got.ptr<float>();
    for (std::int64_t i = 0; i < got.numel(); ++i) {
      const double err = std::abs(g[i] - at(i));
      worst = std::max(worst, err);
      ASSERT_LT(err, 2e-5) << what << " [" << i << "]";
    }
  };
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const qkv::LayerTrace& lt = trace[static_cast<std::size_t>(l)];
    const LayerRef& r = want[static_cast<std::size_t>(l)];
    check("scores", lt.scores, {H, S, S}, [&](std::int64_t i) { return r.scores[i]; });
    check("pattern", lt.pattern, {H, S, S}, [&](std::int64_t i) { return r.pattern[i]; });
    check("head_delta", lt.head_delta, {H, S, C}, [&](std::int64_t i) { return r.head_delta[i]; });
    check("block_delta", lt.block_delta, {S, C}, [&](std::int64_t i) {
      double sum = 0;
      for (std::int64_t h = 0; h < H; ++h) sum += r.head_delta[h * S * C + i];
      return sum;
    });
    // q, k [H, S, D] from the twin's rows [S, C].
    const auto head_major = [&](const Mat& rows) {
      return [&rows, S, C, D](std::int64_t i) { return rows[(i / D % S) * C + i / (S * D) * D + i % D]; };
    };
    check("q", lt.q, {H, S, D}, head_major(r.q));
    check("k", lt.k, {H, S, D}, head_major(r.k));
  }
  for (std::int64_t i = 0; i < S * C; ++i) {
    worst = std::max({worst, std::abs(hidden[i] - want_hidden[i]), std::abs(plain[i] - want_hidden[i])});
  }
  std::printf("encoder trace: max |qkv − twin| %.2e\n", worst);
  EXPECT_LT(worst, 2e-5);
}

// The trace reads f32 q, k, v: a bf16 encoder (bf16 q, k, v and attention) refuses it by name.
TEST(Encoder, Bf16EncoderRefusesTheTrace) {
  const qkv::Config c = tiny_bert();
  qkv::EncoderOptions opt;
  opt.dtype = qkv::DType::bf16;
  qkv::Encoder enc(qkv::Weights::random(c, 3, 0.3f), tiny_tokenizer(), qkv::Pooling::mean, true, 10, opt);
  const std::vector<int> t = enc.tokenize("the cat");
  const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(t.size())};
  std::vector<float> hidden(t.size() * static_cast<std::size_t>(c.dim));
  try {
    enc.forward_trace(t, hidden.data());
    FAIL() << "a bf16 encoder ran the f32 trace";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("forward_trace"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  enc.forward(t, cu, hidden.data());  // without a trace it runs
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
