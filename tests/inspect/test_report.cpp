// The inspect data (summaries, top-10, validation), its two JSON encodings, the page's
// escaping and the PNG encoder, each against hand-computed values or an independent decoder.
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "inspect/page.hpp"
#include "inspect/png.hpp"
#include "qkv/model.hpp"

namespace {

using qkv::DType;
using qkv::View;
namespace qi = qkv::inspect;
constexpr float kNinf = -std::numeric_limits<float>::infinity();

// The model the Tiny report is for: one layer, H = 2 over Hkv = 1, d = 2 (so D = 1), V = 12, P = 8.
qi::ModelInfo tiny_model() {
  qkv::Config c;
  c.dim = 2; c.hidden_dim = 4; c.n_layers = 1; c.n_heads = 2; c.n_kv_heads = 1; c.vocab_size = 12; c.seq_len = 8;
  return qi::ModelInfo::of("tiny", c);
}

// One causal layer, H = 2, S = 3, d = 2. Head 0 always attends to the previous token
// (query 0 to itself); head 1 splits query 2 between keys 0 and 2.
struct Tiny {
  std::vector<float> scores, pattern;
  std::vector<float> head_delta, block_delta;
  std::vector<float> logits;
  std::vector<qi::Token> tokens{{1, "<s>"}, {7, " fluffy"}, {9, " blue"}};
  qi::ModelInfo model = tiny_model();
  Tiny() {
    // Row-per-query [H=2, S=3, S=3].
    pattern = {1, 0, 0,    1, 0, 0,    0, 1, 0,      // head 0: query 2 → key 1 (previous)
               1, 0, 0,    .5f, .5f, 0, .25f, 0, .75f};
    // Scores (any finite values below the diagonal; −∞ above it).
    scores.assign(18, 0.0f);
    for (int h = 0; h < 2; ++h)
      for (int q = 0; q < 3; ++q)
        for (int k = 0; k < 3; ++k) scores[(h * 3 + q) * 3 + k] = k > q ? kNinf : 0.5f * float(q - k);
    // |Δe| of head 0 at each token: 5, 0, 1; head 1: 0, 13, 1; block: the sums' norms.
    head_delta = {3, 4, 0, 0, 1, 0,    0, 0, 5, 12, 0, 1};
    block_delta = {3, 4, 5, 12, 1, 1};
    // logits = log p for p = (0.4, 0.3, 0.2, 0.1, 0, ...): softmax gives p back.
    logits.assign(12, -1e4f);
    const float p[4] = {0.4f, 0.3f, 0.2f, 0.1f};
    for (int i = 0; i < 4; ++i) logits[static_cast<std::size_t>(3 * i + 1)] = std::log(p[i]);
  }
  std::vector<qi::LayerInput> layers() {
    return {{View::contiguous(scores.data(), DType::f32, {2, 3, 3}),
             View::contiguous(pattern.data(), DType::f32, {2, 3, 3}),
             View::contiguous(head_delta.data(), DType::f32, {2, 3, 2}),
             View::contiguous(block_delta.data(), DType::f32, {3, 2}), {}, {}}};
  }
  qi::Report report() {
    return qi::make_report(model, "fluffy blue", tokens, layers(),
                           View::contiguous(logits.data(), DType::f32, {12}),
                           [](std::int32_t id) { return "tok" + std::to_string(id); },
                           {{"total", 42}});
  }
};

TEST(InspectReport, SummariesMatchHandComputedValues) {
  Tiny t;
  const qi::Report r = t.report();
  ASSERT_EQ(r.S, 3);
  ASSERT_EQ(r.H, 2);
  const qi::HeadSummary& h0 = r.heads[0][0];
  const qi::HeadSummary& h1 = r.heads[0][1];
  // Shares are over queries q ≥ 2 only (one query here).
  EXPECT_DOUBLE_EQ(h0.previous_token, 1.0);
  EXPECT_DOUBLE_EQ(h0.first_token, 0.0);
  EXPECT_EQ(h0.kind, "previous-token");
  EXPECT_DOUBLE_EQ(h1.previous_token, 0.0);
  EXPECT_DOUBLE_EQ(h1.first_token, 0.25);
  EXPECT_DOUBLE_EQ(h1.self_token, 0.75);
  EXPECT_EQ(h1.kind, "");
  EXPECT_EQ(h0.argmax_key, (std::vector<std::int64_t>{0, 0, 1}));
  EXPECT_EQ(h1.argmax_key, (std::vector<std::int64_t>{0, 0, 2}));  // ties go to the first key
  // Entropy in bits: (1/2,1/2) → 1; (1/4,3/4) → 0.811278124459133 (−¼log₂¼ − ¾log₂¾).
  const double e = 0.25 * 2 + 0.75 * std::log2(4.0 / 3.0);
  double err = std::abs(h1.entropy_bits[1] - 1) + std::abs(h1.entropy_bits[2] - e);
  err += std::abs(h1.mean_entropy_bits - (1 + e) / 3) + std::abs(h0.mean_entropy_bits);
  std::printf("entropy error %.3g\n", err);
  EXPECT_LT(err, 1e-12);  // f64 sums of three terms
  EXPECT_EQ(h0.delta_norm, (std::vector<double>{5, 0, 1}));
  EXPECT_EQ(h1.delta_norm, (std::vector<double>{0, 13, 1}));
  EXPECT_EQ(r.block_delta_norm[0], (std::vector<double>{5, 13, std::sqrt(2.0)}));
  // Top 10 of softmax(log p): p itself, up to e^-1e4 leftovers and f32 rounding of log p.
  ASSERT_EQ(r.next_tokens.size(), 10u);
  const double p[4] = {0.4, 0.3, 0.2, 0.1};
  double perr = 0;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.next_tokens[static_cast<std::size_t>(i)].id, 3 * i + 1);
    perr = std::max(perr, std::abs(r.next_tokens[static_cast<std::size_t>(i)].prob - p[i]));
  }
  std::printf("top-4 prob error %.3g\n", perr);
  EXPECT_LT(perr, 1e-7);  // log p rounded to f32 moves p by ≤ 2^-24 relative
  EXPECT_EQ(r.next_tokens[0].text, "tok1");
}

TEST(InspectReport, RefusesBadInput) {
  const auto expect_fail = [](Tiny& t, const char* what) {
    try {
      t.report();
      ADD_FAILURE() << "accepted " << what;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("[qkv::inspect::make_report]"), std::string::npos) << e.what();
    }
  };
  { Tiny t; t.pattern[1] = 0.1f; expect_fail(t, "a weight on a masked key"); }
  { Tiny t; t.pattern[4] = 0.5f; expect_fail(t, "a row summing to 1.5"); }
  { Tiny t; t.scores[3] = std::nanf(""); expect_fail(t, "a NaN score"); }
  { Tiny t; t.pattern[0] = -0.0001f; expect_fail(t, "a negative weight"); }
  // Layers that are not the model's: its config says 2 layers, 3 heads or d_model 4.
  { Tiny t; t.model.config.n_layers = 2; expect_fail(t, "1 layer for a 2-layer model"); }
  { Tiny t; t.model.config.n_heads = 3; expect_fail(t, "2 heads for a 3-head model"); }
  { Tiny t; t.model.config.dim = 4; expect_fail(t, "d_model 2 for a model of dim 4"); }
  {
    Tiny t;
    auto layers = t.layers();
    layers[0].head_delta = View::contiguous(t.head_delta.data(), DType::f32, {2, 2, 3});
    EXPECT_THROW(qi::make_report(t.model, "", t.tokens, layers, View::contiguous(t.logits.data(), DType::f32, {12}),
                                 [](std::int32_t) { return std::string(); }, {}),
                 std::invalid_argument);
  }
}

// Independent base64 decoder (RFC 4648 alphabet), for the page encoding.
std::vector<unsigned char> unbase64(const std::string& s) {
  std::vector<unsigned char> out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : s) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else break;
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<unsigned char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

TEST(InspectJson, BothEncodingsCarryEveryCell) {
  Tiny t;
  const qi::Report r = t.report();
  const auto nested = nlohmann::json::parse(qi::to_json(r, qi::Encoding::kJson));
  const auto packed = nlohmann::json::parse(qi::to_json(r, qi::Encoding::kPage));
  EXPECT_EQ(nested["format"], "qkv-inspect");
  EXPECT_EQ(nested["tokens"][1]["text"], " fluffy");
  EXPECT_EQ(nested["params"]["total"], 42);
  // The "model" object, read from the Config at writing time: tiny_model()'s values by hand
  // (head_dim = dim / n_heads = 1, max_seq = seq_len), and max_seq when the caller shortens it.
  const nlohmann::json want = {{"name", "tiny"}, {"n_layers", 1}, {"n_heads", 2}, {"n_kv_heads", 1},
                               {"head_dim", 1},  {"d_model", 2},  {"vocab", 12},  {"max_seq", 8}};
  EXPECT_EQ(nested["model"], want);
  EXPECT_EQ(packed["model"], want);
  Tiny shorter;
  shorter.model.max_seq = 5;
  EXPECT_EQ(nlohmann::json::parse(qi::to_json(shorter.report(), qi::Encoding::kJson))["model"]["max_seq"], 5);
  // Causal: query q stores keys [0, q]; 1 + 2 + 3 = 6 cells per head.
  EXPECT_EQ(packed["key_lo"], (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(packed["key_hi"], (std::vector<int>{1, 2, 3}));
  const auto bytes = unbase64(packed["layers"][0]["pattern_f32"].get<std::string>());
  const auto sbytes = unbase64(packed["layers"][0]["scores_f32"].get<std::string>());
  ASSERT_EQ(bytes.size(), 2u * 6u * 4u);
  ASSERT_EQ(sbytes.size(), bytes.size());
  std::size_t i = 0;
  for (int h = 0; h < 2; ++h) {
    for (int q = 0; q < 3; ++q) {
      for (int k = 0; k < 3; ++k) {
        const auto& js = nested["layers"][0]["heads"][h]["scores"][q][k];
        const float w = nested["layers"][0]["heads"][h]["pattern"][q][k].get<float>();
        EXPECT_EQ(w, t.pattern[static_cast<std::size_t>((h * 3 + q) * 3 + k)]);  // shortest form round-trips
        if (k > q) {
          EXPECT_TRUE(js.is_null());  // masked: −∞ has no JSON number
          continue;
        }
        EXPECT_EQ(js.get<float>(), t.scores[static_cast<std::size_t>((h * 3 + q) * 3 + k)]);
        float pw, ps;
        std::memcpy(&pw, &bytes[i], 4);  // little-endian host, as the page assumes
        std::memcpy(&ps, &sbytes[i], 4);
        EXPECT_EQ(pw, w);
        EXPECT_EQ(ps, js.get<float>());
        i += 4;
      }
    }
  }
}

TEST(InspectPage, EmbeddedDataCannotCloseTheScript) {
  Tiny t;
  t.tokens[2].text = "</script><script>alert(1)</script>";
  const std::string page = qi::render_page(t.report());
  std::size_t n = 0;
  for (auto at = page.find("</script>"); at != std::string::npos; at = page.find("</script>", at + 1)) ++n;
  EXPECT_EQ(n, 2u);  // the template's own two scripts, nothing from the data
  EXPECT_EQ(page.find("@QKV_DATA@"), std::string::npos);
  EXPECT_NE(page.find("\\u003c/script>\\u003cscript>alert(1)"), std::string::npos);
}

// Bitwise CRC-32 (IEEE, reflected, poly 0xEDB88320): independent of zlib's table version.
std::uint32_t crc32_bitwise(const std::string& s) {
  std::uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

std::uint32_t be32(const std::string& s, std::size_t at) {
  return (std::uint32_t(std::uint8_t(s[at])) << 24) | (std::uint32_t(std::uint8_t(s[at + 1])) << 16) |
         (std::uint32_t(std::uint8_t(s[at + 2])) << 8) | std::uint32_t(std::uint8_t(s[at + 3]));
}

TEST(InspectPng, ChunksAndPixelsDecode) {
  qi::Image img{3, 2, {255, 0, 0, 0, 255, 0, 0, 0, 255, 1, 2, 3, 4, 5, 6, 7, 8, 9}};
  const std::string png = qkv::detail::encode_png(img);
  ASSERT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::size_t at = 8;
  std::vector<std::string> types;
  std::string idat;
  while (at < png.size()) {
    const std::uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4), data = png.substr(at + 8, len);
    EXPECT_EQ(be32(png, at + 8 + len), crc32_bitwise(type + data)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(be32(data, 0), 3u);
      EXPECT_EQ(be32(data, 4), 2u);
      EXPECT_EQ(data.substr(8), std::string("\x08\x02\0\0\0", 5));
    }
    if (type == "IDAT") idat += data;
    types.push_back(type);
    at += 12 + len;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  std::vector<unsigned char> raw(2 * (1 + 9));
  uLongf n = raw.size();
  ASSERT_EQ(uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()), idat.size()), Z_OK);
  ASSERT_EQ(n, raw.size());
  for (int y = 0; y < 2; ++y) {
    EXPECT_EQ(raw[static_cast<std::size_t>(y) * 10], 0);  // filter type None
    for (int i = 0; i < 9; ++i) EXPECT_EQ(raw[static_cast<std::size_t>(y) * 10 + 1 + i], img.rgb[static_cast<std::size_t>(y) * 9 + i]);
  }
  EXPECT_THROW(qkv::detail::encode_png({2, 2, {0, 0, 0}}), std::invalid_argument);
}

TEST(InspectPng, LayerPictureShowsDotsAndMasks) {
  Tiny t;
  const qi::Report r = t.report();
  const qi::Image img = qi::render_layer(r, 0);
  // S = 3 → 24 px cells (capped), 72 px panels, 2 heads side by side with 8 px gaps, 1 px frames.
  EXPECT_EQ(img.width, 8 + 2 * (72 + 2 + 8));
  EXPECT_EQ(img.height, 8 + 72 + 2 + 8);
  const auto px = [&](int x, int y) {
    const auto* p = &img.rgb[(static_cast<std::size_t>(y) * static_cast<std::size_t>(img.width) + static_cast<std::size_t>(x)) * 3];
    return std::vector<int>{p[0], p[1], p[2]};
  };
  const int x0 = 8 + 1, y0 = 8 + 1;
  // Head 0: column q = 2 (query), row k = 1 (key) has weight 1: the centre is full ink.
  EXPECT_EQ(px(x0 + 2 * 24 + 12, y0 + 1 * 24 + 12), (std::vector<int>{31, 78, 154}));
  // Row k = 2, column q = 0: key after query, masked grey.
  EXPECT_EQ(px(x0 + 0 * 24 + 12, y0 + 2 * 24 + 12), (std::vector<int>{228, 228, 234}));
  // Row k = 0, column q = 2 has weight 0 but is allowed: paper.
  EXPECT_EQ(px(x0 + 2 * 24 + 12, y0 + 0 * 24 + 12), (std::vector<int>{255, 255, 255}));
  EXPECT_THROW(qi::render_layer(r, 1), std::invalid_argument);
}

// ---- Direct logit attribution and the lens on a real forward pass ---------------------------------
// A small random model of each family (GPT-2: LayerNorm with biases, learned positions, GELU;
// Llama: RMSNorm, rotary, SwiGLU, GQA), traced over 9 tokens. The parts' contributions must sum
// to the model's own f32 logit, and the lens's last row must give the model's own top tokens.
// Tolerance: the model's logit is an f32 dot of C terms after an f32 norm, so it may be off from
// the exact value by about C·2^-24·Σ_c |W_U[t, c]·y_c| (y the normed vector); we allow twice that.
void check_sum_rule(const qkv::Config& cfg, std::uint64_t seed) {
  qkv::Weights w = qkv::Weights::random(cfg, seed, 0.3f);
  // Non-zero biases so that b_O and the final norm's bias take part (random() leaves them 0).
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  for (auto& l : w.layers)
    for (float* b : {l.bo, l.b2})
      if (b) for (std::int64_t c = 0; c < cfg.dim; ++c) b[c] = nd(g);
  if (w.normf_b) for (std::int64_t c = 0; c < cfg.dim; ++c) w.normf_b[c] = nd(g);
  qkv::Model model(w);
  const std::vector<int> ids{1, 5, 9, 2, 7, 7, 3, 11, 4};
  qkv::Trace tr;
  model.forward_trace(ids, tr);
  const std::int64_t S = 9, C = cfg.dim, V = cfg.vocab_size;
  std::vector<qi::LayerInput> layers;
  for (const auto& t : tr.layers) {
    layers.push_back({t.scores.view(), t.pattern.view(), t.head_delta.view(), t.block_delta.view(), t.q.view(), t.k.view()});
  }
  std::vector<qi::Token> tokens;
  for (int id : ids) tokens.push_back({id, "t" + std::to_string(id)});
  const auto text = [](std::int32_t id) { return "t" + std::to_string(id); };
  qi::Report r = qi::make_report(qi::ModelInfo::of("random", cfg),
                                 "p", tokens, layers,
                                 View::contiguous(tr.logits.ptr<float>() + (S - 1) * V, DType::f32, {V}), text, {});
  qi::ModelTail tail{cfg.norm, cfg.norm_eps, w.normf_w, w.normf_b, w.wcls, tr.embed.ptr<float>(), {}, {}, {}};
  for (std::size_t l = 0; l < tr.layers.size(); ++l) {
    tail.resid.push_back(tr.layers[l].resid.ptr<float>());
    tail.head_delta.push_back(tr.layers[l].head_delta.ptr<float>());
    tail.out_bias.push_back(w.layers[l].bo);
  }
  qi::add_attribution(r, tail, text);
  ASSERT_TRUE(r.attribution.has_value());
  const qi::Attribution& a = *r.attribution;
  ASSERT_EQ(a.tokens.size(), 10u);

  // y = the final norm's output at the last position, in f64, for the tolerance's scale.
  const float* x = tr.layers.back().resid.ptr<float>() + (S - 1) * C;
  double mean = 0, ss = 0;
  if (cfg.norm == qkv::NormKind::layernorm) {
    for (std::int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= static_cast<double>(C);
  }
  for (std::int64_t c = 0; c < C; ++c) ss += (x[c] - mean) * (x[c] - mean);
  const double sigma = std::sqrt(ss / static_cast<double>(C) + cfg.norm_eps);
  EXPECT_NEAR(a.sigma, sigma, 1e-12 * sigma);
  double worst = 0;
  for (const qi::TokenAttribution& t : a.tokens) {
    double scale = 0;
    for (std::int64_t c = 0; c < C; ++c) {
      const double y = w.normf_w[c] * (x[c] - mean) / sigma + (w.normf_b ? w.normf_b[c] : 0.0);
      scale += std::abs(w.wcls[t.id * C + c] * y);
    }
    const double tol = 2 * static_cast<double>(C) * std::ldexp(1.0, -24) * scale;
    ASSERT_EQ(t.heads.size(), static_cast<std::size_t>(cfg.n_layers * cfg.n_heads));
    EXPECT_NEAR(t.sum, t.logit, tol) << "token " << t.id;
    worst = std::max(worst, std::abs(t.sum - t.logit) / scale);
    if (cfg.bias) {
      EXPECT_NE(t.norm_bias, 0.0);
      EXPECT_NE(t.attn_bias[0], 0.0);
    }
  }
  std::printf("%s: max |Σ parts − logit| / Σ|W_U·y| = %.3g (allowed 2·C·2^-24 = %.3g)\n",
              cfg.norm == qkv::NormKind::layernorm ? "LayerNorm" : "RMSNorm", worst,
              2 * static_cast<double>(C) * std::ldexp(1.0, -24));
  // The lens: embedding + one row per layer; its last row at the last position is the model's top 10.
  ASSERT_EQ(r.lens.size(), static_cast<std::size_t>(cfg.n_layers + 1));
  EXPECT_EQ(r.lens_pos0, 0);
  const qi::LensRow& out = r.lens.back();
  ASSERT_EQ(out.top.size(), 10u);
  ASSERT_EQ(out.positions.size(), static_cast<std::size_t>(S));
  for (std::size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(out.top[i].logit, r.next_tokens[i].logit, 1e-4 * (1 + std::abs(r.next_tokens[i].logit)));
    EXPECT_NEAR(out.top[i].prob, r.next_tokens[i].prob, 1e-5);
  }
  EXPECT_EQ(out.positions.back().id, r.next_tokens[0].id);
  // Heads' top pushes are sorted and consistent with the per-token numbers: the push of the head
  // with the largest push on the predicted token is ≥ that push for its own top token.
  for (std::size_t i = 0; i < a.up.size(); ++i) {
    ASSERT_EQ(a.up[i].size(), static_cast<std::size_t>(qi::kTopPushed));
    EXPECT_GE(a.up[i][0].value, a.up[i][1].value);
    EXPECT_LE(a.down[i][0].value, a.down[i][1].value);
    EXPECT_GE(a.up[i][0].value + 1e-12, a.tokens[0].heads[i]);
    EXPECT_LE(a.down[i][0].value - 1e-12, a.tokens[0].heads[i]);
  }
  // Query·key anatomy: the last kAnatomyQueries queries' q · k / √D is the traced score (both f32
  // vectors, dot in f64 here and in the trace: equal to f32 rounding of the score, 1e-6 relative).
  ASSERT_EQ(r.q_last.size(), static_cast<std::size_t>(cfg.n_layers));
  const std::int64_t D = cfg.head_dim(), nq = S - r.qk_q0, group = cfg.n_heads / cfg.n_kv_heads;
  EXPECT_EQ(nq, qi::kAnatomyQueries);
  for (std::int64_t l = 0; l < cfg.n_layers; ++l)
    for (std::int64_t h = 0; h < cfg.n_heads; ++h)
      for (std::int64_t i = r.qk_q0; i < S; ++i)
        for (std::int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (std::int64_t e = 0; e < D; ++e) {
            dot += double{r.q_last[l][(h * nq + i - r.qk_q0) * D + e]} * r.k_all[l][((h / group) * S + j) * D + e];
          }
          const double score = dot / std::sqrt(static_cast<double>(D));
          EXPECT_NEAR(score, r.score(l, h, i, j), 1e-6 * (1 + std::abs(score)));
        }
  // The JSON carries both, with the head vectors [L][H][C] in the nested encoding only.
  const auto j = nlohmann::json::parse(qi::to_json(r, qi::Encoding::kJson));
  EXPECT_EQ(j["attribution"]["tokens"][0]["heads"].size(), static_cast<std::size_t>(cfg.n_layers));
  EXPECT_EQ(j["attribution"]["head_vectors"][0][0].size(), static_cast<std::size_t>(C));
  EXPECT_EQ(j["lens"]["rows"].size(), static_cast<std::size_t>(cfg.n_layers + 1));
  EXPECT_EQ(j["qk_q0"], r.qk_q0);
  EXPECT_EQ(j["layers"][0]["q"][0].size(), static_cast<std::size_t>(nq));
  EXPECT_EQ(j["layers"][0]["k"].size(), static_cast<std::size_t>(cfg.n_kv_heads));
  EXPECT_EQ(j["layers"][0]["k"][0][0].size(), static_cast<std::size_t>(D));
  EXPECT_FALSE(nlohmann::json::parse(qi::to_json(r, qi::Encoding::kPage))["attribution"].contains("head_vectors"));
}

TEST(InspectAttribution, PartsSumToTheLogitGpt2Style) {
  qkv::Config c;
  c.dim = 24; c.hidden_dim = 96; c.n_layers = 2; c.n_heads = 3; c.n_kv_heads = 3; c.vocab_size = 40; c.seq_len = 16;
  c.pos = qkv::PosEncoding::learned; c.norm = qkv::NormKind::layernorm; c.mlp = qkv::MlpKind::gelu;
  c.tied_embeddings = false; c.bias = true;
  check_sum_rule(c, 7);
}

TEST(InspectAttribution, PartsSumToTheLogitLlamaStyle) {
  qkv::Config c;
  c.dim = 32; c.hidden_dim = 64; c.n_layers = 3; c.n_heads = 4; c.n_kv_heads = 2; c.vocab_size = 50; c.seq_len = 16;
  check_sum_rule(c, 11);
}

}  // namespace
