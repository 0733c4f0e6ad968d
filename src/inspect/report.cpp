// Builds the inspect Report from a traced forward pass and writes it as JSON.
#include "inspect/report.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

#include <zlib.h>

namespace qkv::inspect {
namespace {

constexpr const char* kFn = "qkv::inspect::make_report";

std::string shape_of(const std::vector<std::int64_t>& s) {
  std::ostringstream o;
  o << '[';
  for (std::size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << ']';
  return o.str();
}

void expect_shape(const View& v, const std::vector<std::int64_t>& want, const std::string& what) {
  bool ok = v.data != nullptr && is_float(v.dtype) && v.rank == static_cast<int>(want.size());
  for (int i = 0; ok && i < v.rank; ++i) ok = v.dim(i) == want[static_cast<std::size_t>(i)];
  if (!ok) {
    fail(kFn, what + ": expected a float tensor of shape " + shape_of(want) + " (got " +
                  (v.data ? std::string(dtype_name(v.dtype)) + " " + v.shape_str() : "null") + ")");
  }
}

// Euclidean norm of row (i0, i1, :) of a rank-3 view or row i0 of a rank-2 view, in f64.
double row_norm(const View& v, std::int64_t i0, std::int64_t i1) {
  const int last = v.rank - 1;
  const std::int64_t base = v.rank == 3 ? v.offset(i0, i1) : v.offset(i0);
  double s = 0;
  for (std::int64_t j = 0; j < v.dim(last); ++j) {
    const double x = v.load(base + j * v.stride(last));
    s += x * x;
  }
  return std::sqrt(s);
}

std::string where(std::int64_t l, std::int64_t h, std::int64_t q) {
  return "layer " + std::to_string(l) + " head " + std::to_string(h) + " query " + std::to_string(q);
}

}  // namespace

Report make_report(const ModelInfo& model, std::string prompt, std::vector<Token> tokens,
                   const std::vector<LayerInput>& layers, const View& last_logits,
                   const std::function<std::string(std::int32_t)>& token_text,
                   nlohmann::json params) {
  Report r;
  r.model = model;
  r.prompt = std::move(prompt);
  r.S = static_cast<std::int64_t>(tokens.size());
  r.L = static_cast<std::int64_t>(layers.size());
  r.tokens = std::move(tokens);
  r.params = std::move(params);
  if (r.S < 1) fail(kFn, "tokens: need at least one token (got 0)");
  if (r.L < 1) fail(kFn, "layers: need at least one layer (got 0)");
  if (layers[0].pattern.rank != 3) {
    fail(kFn, "layers[0].pattern: expected [H, S, S] (got " + layers[0].pattern.shape_str() + ")");
  }
  r.H = layers[0].pattern.dim(0);
  const std::int64_t S = r.S, H = r.H;
  const std::int64_t d = layers[0].block_delta.rank == 2 ? layers[0].block_delta.dim(1) : -1;
  if (H < 1 || d < 1) {
    fail(kFn, "layers[0]: need H ≥ 1 heads and d_model ≥ 1 (got pattern " +
                  layers[0].pattern.shape_str() + ", block_delta " + layers[0].block_delta.shape_str() + ")");
  }
  const Config& c = model.config;
  if (r.L != c.n_layers || H != c.n_heads || d != c.dim) {
    fail(kFn, "layers: " + std::to_string(r.L) + " layers of " + std::to_string(H) + " heads, d_model " +
                  std::to_string(d) + ", but model '" + model.name + "' has n_layers " + std::to_string(c.n_layers) +
                  ", n_heads " + std::to_string(c.n_heads) + ", dim " + std::to_string(c.dim));
  }
  if (last_logits.data) expect_shape(last_logits, {model.config.vocab_size}, "last_logits");

  const auto HS = static_cast<std::size_t>(H * S * S);
  for (std::int64_t l = 0; l < r.L; ++l) {
    const LayerInput& in = layers[static_cast<std::size_t>(l)];
    const std::string ln = "layers[" + std::to_string(l) + "].";
    expect_shape(in.scores, {H, S, S}, ln + "scores");
    expect_shape(in.pattern, {H, S, S}, ln + "pattern");
    expect_shape(in.head_delta, {H, S, d}, ln + "head_delta");
    expect_shape(in.block_delta, {S, d}, ln + "block_delta");

    std::vector<float> sc(HS), pa(HS);
    std::vector<HeadSummary> hs(static_cast<std::size_t>(H));
    for (std::int64_t h = 0; h < H; ++h) {
      HeadSummary& s = hs[static_cast<std::size_t>(h)];
      s.entropy_bits.assign(static_cast<std::size_t>(S), 0.0);
      s.argmax_key.assign(static_cast<std::size_t>(S), -1);
      s.delta_norm.resize(static_cast<std::size_t>(S));
      double prev = 0, first = 0, self = 0;
      for (std::int64_t q = 0; q < S; ++q) {
        double sum = 0, ent = 0, best = -1;
        for (std::int64_t k = 0; k < S; ++k) {
          const double x = in.scores.load(in.scores.offset(h, q, k));
          const double p = in.pattern.load(in.pattern.offset(h, q, k));
          const bool masked = x == -std::numeric_limits<double>::infinity();
          if (std::isnan(x) || x == std::numeric_limits<double>::infinity()) {
            fail(kFn, ln + "scores: " + where(l, h, q) + " key " + std::to_string(k) +
                          ": a score must be finite or −∞ (got " + std::to_string(x) + ")");
          }
          if (!(p >= 0 && p <= 1) || (masked && p != 0)) {
            fail(kFn, ln + "pattern: " + where(l, h, q) + " key " + std::to_string(k) +
                          ": a weight must lie in [0, 1] and be 0 where masked (got " + std::to_string(p) +
                          (masked ? ", masked)" : ")"));
          }
          const auto i = static_cast<std::size_t>((h * S + q) * S + k);
          sc[i] = static_cast<float>(x);
          pa[i] = static_cast<float>(p);
          sum += p;
          if (p > 0) ent -= p * std::log2(p);
          if (!masked && p > best) {
            best = p;
            s.argmax_key[static_cast<std::size_t>(q)] = k;
          }
        }
        if (s.argmax_key[static_cast<std::size_t>(q)] >= 0 && std::abs(sum - 1) > kRowSumTolerance) {
          fail(kFn, ln + "pattern: " + where(l, h, q) + ": weights sum to " + std::to_string(sum) +
                        ", not 1");
        }
        s.entropy_bits[static_cast<std::size_t>(q)] = ent;
        s.delta_norm[static_cast<std::size_t>(q)] = row_norm(in.head_delta, h, q);
        if (q >= 2) {
          prev += pa[static_cast<std::size_t>((h * S + q) * S + q - 1)];
          first += pa[static_cast<std::size_t>((h * S + q) * S)];
          self += pa[static_cast<std::size_t>((h * S + q) * S + q)];
        }
      }
      s.mean_entropy_bits = std::accumulate(s.entropy_bits.begin(), s.entropy_bits.end(), 0.0) /
                            static_cast<double>(S);
      const double nq = static_cast<double>(S - 2);
      const double nan = std::numeric_limits<double>::quiet_NaN();
      s.previous_token = S >= 3 ? prev / nq : nan;
      s.first_token = S >= 3 ? first / nq : nan;
      s.self_token = S >= 3 ? self / nq : nan;
      if (s.previous_token >= kHeadKindShare) s.kind = "previous-token";
      else if (s.first_token >= kHeadKindShare) s.kind = "first-token";
    }
    if (layers[0].q.data) {  // q [H, S, D], k [Hkv, S, D]: the last kAnatomyQueries queries, every key
      if (l == 0) {
        r.qk_D = in.q.rank == 3 ? in.q.dim(2) : -1;
        r.qk_Hkv = in.k.rank == 3 ? in.k.dim(0) : -1;
        r.qk_q0 = std::max<std::int64_t>(0, S - kAnatomyQueries);
        if (r.qk_D < 1 || r.qk_Hkv < 1 || H % r.qk_Hkv != 0) {
          fail(kFn, "layers[0].q, k: expected [H, S, D] and [Hkv, S, D] with H % Hkv = 0 (got " + in.q.shape_str() +
                        ", " + in.k.shape_str() + ")");
        }
      }
      expect_shape(in.q, {H, S, r.qk_D}, ln + "q");
      expect_shape(in.k, {r.qk_Hkv, S, r.qk_D}, ln + "k");
      std::vector<float> qs, ks;
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = r.qk_q0; i < S; ++i)
          for (std::int64_t x = 0; x < r.qk_D; ++x) qs.push_back(static_cast<float>(in.q.load(in.q.offset(h, i, x))));
      for (std::int64_t g = 0; g < r.qk_Hkv; ++g)
        for (std::int64_t j = 0; j < S; ++j)
          for (std::int64_t x = 0; x < r.qk_D; ++x) ks.push_back(static_cast<float>(in.k.load(in.k.offset(g, j, x))));
      r.q_last.push_back(std::move(qs));
      r.k_all.push_back(std::move(ks));
    }
    std::vector<double> bn(static_cast<std::size_t>(S));
    for (std::int64_t q = 0; q < S; ++q) bn[static_cast<std::size_t>(q)] = row_norm(in.block_delta, q, 0);
    r.scores.push_back(std::move(sc));
    r.pattern.push_back(std::move(pa));
    r.heads.push_back(std::move(hs));
    r.block_delta_norm.push_back(std::move(bn));
  }

  if (!last_logits.data) return r;
  // Top 10 of softmax(last_logits), computed in f64 with the max subtracted.
  const std::int64_t V = model.config.vocab_size;
  std::vector<double> z(static_cast<std::size_t>(V));
  double zmax = -std::numeric_limits<double>::infinity();
  for (std::int64_t v = 0; v < V; ++v) {
    z[static_cast<std::size_t>(v)] = last_logits.load(v * last_logits.stride(0));
    if (!std::isfinite(z[static_cast<std::size_t>(v)])) {
      fail(kFn, "last_logits: logit " + std::to_string(v) + " is not finite");
    }
    zmax = std::max(zmax, z[static_cast<std::size_t>(v)]);
  }
  double zsum = 0;
  for (double x : z) zsum += std::exp(x - zmax);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  const auto top = std::min<std::size_t>(10, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(top), ids.end(),
                    [&](std::int32_t a, std::int32_t b) {
                      return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)];
                    });
  for (std::size_t i = 0; i < top; ++i) {
    const double x = z[static_cast<std::size_t>(ids[i])];
    r.next_tokens.push_back({ids[i], token_text(ids[i]), std::exp(x - zmax) / zsum, x});
  }
  return r;
}

KeySpans key_spans(const Report& r) {
  const std::int64_t S = r.S;
  KeySpans ks;
  ks.key_lo.assign(static_cast<std::size_t>(S), S);
  ks.key_hi.assign(static_cast<std::size_t>(S), 0);
  for (std::int64_t l = 0; l < r.L; ++l) {
    for (std::int64_t h = 0; h < r.H; ++h) {
      for (std::int64_t q = 0; q < S; ++q) {
        auto& lo = ks.key_lo[static_cast<std::size_t>(q)];
        auto& hi = ks.key_hi[static_cast<std::size_t>(q)];
        for (std::int64_t k = 0; k < S; ++k) {
          if (r.score(l, h, q, k) != -std::numeric_limits<float>::infinity()) {
            lo = std::min(lo, k);
            hi = std::max(hi, k + 1);
          }
        }
      }
    }
  }
  ks.row_offset.assign(static_cast<std::size_t>(S) + 1, 0);
  for (std::int64_t q = 0; q < S; ++q) {
    auto& lo = ks.key_lo[static_cast<std::size_t>(q)];
    auto& hi = ks.key_hi[static_cast<std::size_t>(q)];
    if (hi <= lo) lo = hi = 0;  // every key masked for this query: store nothing
    ks.row_offset[static_cast<std::size_t>(q) + 1] = ks.row_offset[static_cast<std::size_t>(q)] + hi - lo;
  }
  return ks;
}

namespace {

using nlohmann::json;

// Strings may hold invalid UTF-8 (byte-fallback tokens): replace such bytes with U+FFFD.
std::string str(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}

void put_float(std::string& out, float x) {
  if (x == -std::numeric_limits<float>::infinity()) {
    out += "null";
    return;
  }
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, x);  // shortest round-trip form
  out.append(buf, res.ptr);
}

// JSON has no NaN: a share that is undefined (S < 3) is written as null.
json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

void base64(std::string& out, const unsigned char* p, std::size_t n) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const unsigned v = (unsigned{p[i]} << 16) | (unsigned{p[i + 1]} << 8) | p[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (i < n) {
    const unsigned v = (unsigned{p[i]} << 16) | (i + 1 < n ? unsigned{p[i + 1]} << 8 : 0u);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < n ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
}

// A whole f32 array as base64 of its little-endian bytes.
std::string f32_b64(const std::vector<float>& v) {
  std::vector<unsigned char> bytes(v.size() * 4);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t u;
    std::memcpy(&u, &v[i], 4);
    for (int b = 0; b < 4; ++b) bytes[4 * i + static_cast<std::size_t>(b)] = static_cast<unsigned char>(u >> (8 * b));
  }
  std::string out;
  base64(out, bytes.data(), bytes.size());
  return out;
}

// The packed cells of one layer: for each head, for each query q, keys key_lo[q]..key_hi[q)-1,
// as little-endian f32 bytes.
std::string packed_b64(const std::vector<float>& m, const Report& r, const KeySpans& ks) {
  std::vector<unsigned char> bytes;
  bytes.reserve(static_cast<std::size_t>(r.H * ks.row_offset.back()) * 4);
  for (std::int64_t h = 0; h < r.H; ++h) {
    for (std::int64_t q = 0; q < r.S; ++q) {
      for (std::int64_t k = ks.key_lo[static_cast<std::size_t>(q)]; k < ks.key_hi[static_cast<std::size_t>(q)]; ++k) {
        std::uint32_t u;
        std::memcpy(&u, &m[static_cast<std::size_t>((h * r.S + q) * r.S + k)], 4);
        for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<unsigned char>(u >> (8 * b)));
      }
    }
  }
  std::string out;
  base64(out, bytes.data(), bytes.size());
  return out;
}

// The compact layout of one layer's matrix m, packed by KeySpans: u16 codes (pattern: round(p ·
// 65535); scores: the f32's high half rounded to nearest even = bf16), as two byte planes (all
// high bytes, then all low bytes: the high bytes of small weights are mostly 0 and deflate well),
// deflated in zlib format and base64-encoded.
std::string packed_compact_b64(const std::vector<float>& m, const Report& r, const KeySpans& ks, bool is_pattern) {
  const std::size_t n = static_cast<std::size_t>(r.H * ks.row_offset.back());
  std::vector<unsigned char> planes(2 * n);
  std::size_t i = 0;
  for (std::int64_t h = 0; h < r.H; ++h) {
    for (std::int64_t q = 0; q < r.S; ++q) {
      for (std::int64_t k = ks.key_lo[static_cast<std::size_t>(q)]; k < ks.key_hi[static_cast<std::size_t>(q)]; ++k, ++i) {
        const float x = m[static_cast<std::size_t>((h * r.S + q) * r.S + k)];
        std::uint16_t code;
        if (is_pattern) {
          code = static_cast<std::uint16_t>(std::lround(std::clamp(x, 0.0f, 1.0f) * 65535.0f));
        } else {
          std::uint32_t u;
          std::memcpy(&u, &x, 4);
          if (std::isnan(x)) code = 0x7FC0;
          else code = static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // nearest even; ±∞ stays
        }
        planes[i] = static_cast<unsigned char>(code >> 8);
        planes[n + i] = static_cast<unsigned char>(code & 0xFF);
      }
    }
  }
  uLongf zlen = compressBound(static_cast<uLong>(planes.size()));
  std::vector<unsigned char> z(zlen);
  // Level 6, not 9: on the 1,000-token stories260K weights, 9 took 3.4 s of CPU for 3.56 MB and 6
  // took 0.37 s for 3.65 MB.
  if (compress2(z.data(), &zlen, planes.data(), static_cast<uLong>(planes.size()), 6) != Z_OK) {
    fail("qkv::inspect::to_json", "zlib compress2 failed on " + std::to_string(planes.size()) + " bytes");
  }
  std::string out;
  base64(out, z.data(), zlen);
  return out;
}

void put_matrix(std::string& out, const std::vector<float>& m, std::int64_t h, std::int64_t S) {
  out += '[';
  for (std::int64_t q = 0; q < S; ++q) {
    out += q ? ",[" : "[";
    for (std::int64_t k = 0; k < S; ++k) {
      if (k) out += ',';
      put_float(out, m[static_cast<std::size_t>((h * S + q) * S + k)]);
    }
    out += ']';
  }
  out += ']';
}

json tokens_json(const std::vector<NextToken>& ts) {
  json a = json::array();
  for (const NextToken& t : ts) a.push_back({{"id", t.id}, {"text", t.text}, {"prob", t.prob}, {"logit", t.logit}});
  return a;
}

// [L·H] layer-major → [L][H] nested arrays.
template <class T, class F>
json by_head(const Report& r, const std::vector<T>& v, F&& f) {
  json out = json::array();
  for (std::int64_t l = 0; l < r.L; ++l) {
    json row = json::array();
    for (std::int64_t h = 0; h < r.H; ++h) row.push_back(f(v[static_cast<std::size_t>(l * r.H + h)]));
    out.push_back(std::move(row));
  }
  return out;
}

json attribution_json(const Report& r, Encoding enc) {
  const Attribution& a = *r.attribution;
  json toks = json::array();
  for (const TokenAttribution& t : a.tokens) {
    toks.push_back({{"id", t.id},        {"text", t.text},
                    {"logit", t.logit},  {"sum", t.sum},
                    {"embed", t.embed},  {"norm_bias", t.norm_bias},
                    {"attn_bias", t.attn_bias}, {"mlp", t.mlp},
                    {"heads", by_head(r, t.heads, [](double x) { return x; })}});
  }
  const auto pushed = [](const std::vector<ScoredToken>& v) {
    json o = json::array();
    for (const ScoredToken& t : v) o.push_back({{"id", t.id}, {"text", t.text}, {"value", t.value}});
    return o;
  };
  json out = {{"sigma", a.sigma}, {"tokens", toks}, {"up", by_head(r, a.up, pushed)}, {"down", by_head(r, a.down, pushed)}};
  if (enc == Encoding::kJson) {  // [L][H][C]; the page has no W_U to dot them with, so it goes without
    const auto C = static_cast<std::size_t>(r.model.config.dim);
    std::vector<std::vector<float>> rows;
    for (std::size_t i = 0; i + C <= a.head_vectors.size(); i += C) {
      rows.emplace_back(a.head_vectors.begin() + static_cast<std::ptrdiff_t>(i),
                        a.head_vectors.begin() + static_cast<std::ptrdiff_t>(i + C));
    }
    out["head_vectors"] = by_head(r, rows, [](const std::vector<float>& v) { return json(v); });
  }
  return out;
}

const char* kind_name(HeadAblation::Kind k) { return k == HeadAblation::Kind::zero ? "zero" : "mean"; }

json ablation_json(const Report& r) {
  const AblationTable& t = *r.ablation;
  const auto effect = [](const AblationEffect& e) {
    return json{{"p_predicted", e.p_predicted},
                {"loss", num(e.loss)},
                {"top", {{"id", e.top.id}, {"text", e.top.text}, {"prob", e.top.prob}, {"logit", e.top.logit}}}};
  };
  return {{"p_predicted", t.p_predicted}, {"loss", num(t.loss)}, {"zero", by_head(r, t.zero, effect)},
          {"mean", by_head(r, t.mean, effect)}};
}

json lens_json(const Report& r) {
  json rows = json::array();
  for (const LensRow& lr : r.lens) rows.push_back({{"top", tokens_json(lr.top)}, {"positions", tokens_json(lr.positions)}});
  return {{"pos0", r.lens_pos0}, {"rows", rows}};
}

}  // namespace

std::string to_json(const Report& r, Encoding enc, double exact_bytes) {
  const Config& c = r.model.config;
  json model = {{"name", r.model.name},        {"n_layers", c.n_layers},  {"n_heads", c.n_heads},
                {"n_kv_heads", c.n_kv_heads},  {"head_dim", c.head_dim()}, {"d_model", c.dim},
                {"vocab", c.vocab_size},       {"max_seq", r.model.max_seq}};
  json tokens = json::array();
  for (const Token& t : r.tokens) {
    tokens.push_back({{"id", t.id}, {"text", t.text}});
    if (t.special) tokens.back()["special"] = true;
  }
  json next = json::array();
  for (const NextToken& t : r.next_tokens) {
    next.push_back({{"id", t.id}, {"text", t.text}, {"prob", t.prob}, {"logit", t.logit}});
  }
  const auto dump = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };

  KeySpans ks;
  bool compact = false, scores_stored = true;
  if (enc == Encoding::kPage) {
    ks = key_spans(r);
    const double bytes_per_cell = r.baseline_pattern.empty() ? 8.0 : 12.0;  // f32 weight, score (, baseline)
    const double cells = static_cast<double>(r.L * r.H * ks.row_offset.back());
    compact = bytes_per_cell * cells > exact_bytes;
    if (compact && cells > kCompactScoresCells) {
      bool masked_inside = false;  // a masked cell the spans do not tell
      for (std::int64_t l = 0; l < r.L && !masked_inside; ++l)
        for (std::int64_t h = 0; h < r.H && !masked_inside; ++h)
          for (std::int64_t q = 0; q < r.S && !masked_inside; ++q)
            for (std::int64_t k = ks.key_lo[static_cast<std::size_t>(q)]; k < ks.key_hi[static_cast<std::size_t>(q)]; ++k)
              if (r.score(l, h, q, k) == -std::numeric_limits<float>::infinity()) masked_inside = true;
      scores_stored = masked_inside;
    }
  }
  std::string out;
  out += "{\"format\":\"qkv-inspect\",\"version\":1,\"layout\":";
  out += enc == Encoding::kJson ? "\"nested\"" : compact ? "\"packed-u16-deflate-base64\"" : "\"packed-f32-base64\"";
  out += ",\"model\":" + dump(model);
  out += ",\"prompt\":" + str(r.prompt);
  out += ",\"tokens\":" + dump(tokens);
  out += ",\"params\":" + dump(r.params);
  out += ",\"next_tokens\":" + dump(next);
  if (!scores_stored) out += ",\"scores_stored\":false";
  if (!r.q_last.empty()) out += ",\"qk_q0\":" + std::to_string(r.qk_q0);
  if (r.attribution) out += ",\"attribution\":" + dump(attribution_json(r, enc));
  if (!r.lens.empty()) out += ",\"lens\":" + dump(lens_json(r));
  if (r.bidirectional) out += ",\"bidirectional\":true";
  if (!r.neighbours.empty()) {
    json nb = json::array();
    for (const Neighbour& n : r.neighbours) nb.push_back({{"line", n.line}, {"text", n.text}, {"cosine", n.cosine}});
    out += ",\"neighbours\":" + dump(nb);
  }
  json ablated = json::array();
  for (const HeadAblation& a : r.ablated) ablated.push_back({{"layer", a.layer}, {"head", a.head}, {"kind", kind_name(a.kind)}});
  out += ",\"ablated\":" + dump(ablated);
  if (r.ablation) out += ",\"ablation\":" + dump(ablation_json(r));
  if (enc == Encoding::kPage) {
    out += ",\"key_lo\":" + dump(ks.key_lo) + ",\"key_hi\":" + dump(ks.key_hi);
  }
  out += ",\"layers\":[";
  for (std::int64_t l = 0; l < r.L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    out += l ? ",{" : "{";
    out += "\"block_delta_norm\":" + dump(r.block_delta_norm[li]);
    if (!r.q_last.empty()) {  // q [H][S − qk_q0][D], k [Hkv][S][D]
      const auto nest = [&](const std::vector<float>& v, std::int64_t n0, std::int64_t n1) {
        json a = json::array();
        for (std::int64_t i = 0; i < n0; ++i) {
          json b = json::array();
          for (std::int64_t j = 0; j < n1; ++j) {
            const auto at = static_cast<std::ptrdiff_t>((i * n1 + j) * r.qk_D);
            b.push_back(std::vector<float>(v.begin() + at, v.begin() + at + r.qk_D));
          }
          a.push_back(std::move(b));
        }
        return a;
      };
      if (enc == Encoding::kPage) {
        out += ",\"q_f32\":\"" + f32_b64(r.q_last[li]) + '"';
        out += ",\"k_f32\":\"" + f32_b64(r.k_all[li]) + '"';
      } else {
        out += ",\"q\":" + dump(nest(r.q_last[li], r.H, r.S - r.qk_q0));
        out += ",\"k\":" + dump(nest(r.k_all[li], r.qk_Hkv, r.S));
      }
    }
    if (enc == Encoding::kPage && compact) {
      out += ",\"pattern_u16\":\"" + packed_compact_b64(r.pattern[li], r, ks, true) + '"';
      if (scores_stored) out += ",\"scores_bf16\":\"" + packed_compact_b64(r.scores[li], r, ks, false) + '"';
      if (!r.baseline_pattern.empty())
        out += ",\"baseline_u16\":\"" + packed_compact_b64(r.baseline_pattern[li], r, ks, true) + '"';
    } else if (enc == Encoding::kPage) {
      out += ",\"pattern_f32\":\"" + packed_b64(r.pattern[li], r, ks) + '"';
      out += ",\"scores_f32\":\"" + packed_b64(r.scores[li], r, ks) + '"';
      if (!r.baseline_pattern.empty()) out += ",\"baseline_f32\":\"" + packed_b64(r.baseline_pattern[li], r, ks) + '"';
    }
    out += ",\"heads\":[";
    for (std::int64_t h = 0; h < r.H; ++h) {
      const HeadSummary& s = r.heads[li][static_cast<std::size_t>(h)];
      json j = {{"mean_entropy_bits", s.mean_entropy_bits}, {"previous_token", num(s.previous_token)},
                {"first_token", num(s.first_token)},        {"self_token", num(s.self_token)},
                {"kind", s.kind},                           {"entropy_bits", s.entropy_bits},
                {"argmax_key", s.argmax_key},               {"delta_norm", s.delta_norm}};
      std::string o = dump(j);
      if (enc == Encoding::kJson) {
        o.pop_back();  // reopen the object to append the two matrices
        o += ",\"pattern\":";
        put_matrix(o, r.pattern[li], h, r.S);
        o += ",\"scores\":";
        put_matrix(o, r.scores[li], h, r.S);
        if (!r.baseline_pattern.empty()) {
          o += ",\"baseline_pattern\":";
          put_matrix(o, r.baseline_pattern[li], h, r.S);
        }
        o += '}';
      }
      out += h ? "," + o : o;
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace qkv::inspect
