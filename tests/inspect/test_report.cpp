// The inspect data (summaries, top-10, validation), its two JSON encodings, the page's
// escaping and the PNG encoder, each against hand-computed values or an independent decoder.
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "inspect/page.hpp"
#include "inspect/png.hpp"

namespace {

using qkv::DType;
using qkv::View;
namespace qi = qkv::inspect;
constexpr float kNinf = -std::numeric_limits<float>::infinity();

// One causal layer, H = 2, S = 3, d = 2. Head 0 always attends to the previous token
// (query 0 to itself); head 1 splits query 2 between keys 0 and 2.
struct Tiny {
  std::vector<float> scores, pattern;
  std::vector<float> head_delta, block_delta;
  std::vector<float> logits;
  std::vector<qi::Token> tokens{{1, "<s>"}, {7, " fluffy"}, {9, " blue"}};
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
             View::contiguous(block_delta.data(), DType::f32, {3, 2})}};
  }
  qi::Report report() {
    qi::ModelInfo m{"tiny", 1, 2, 1, 1, 2, 12, 8};
    return qi::make_report(m, "fluffy blue", tokens, layers(),
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
  {
    Tiny t;
    auto layers = t.layers();
    layers[0].head_delta = View::contiguous(t.head_delta.data(), DType::f32, {2, 2, 3});
    qi::ModelInfo m{"tiny", 1, 2, 1, 1, 2, 12, 8};
    EXPECT_THROW(qi::make_report(m, "", t.tokens, layers, View::contiguous(t.logits.data(), DType::f32, {12}),
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
  const std::string png = qi::encode_png(img);
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
  EXPECT_THROW(qi::encode_png({2, 2, {0, 0, 0}}), std::invalid_argument);
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

}  // namespace
