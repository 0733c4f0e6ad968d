// Direct logit attribution and the logit lens for the inspect report (see report.hpp).
//
// Dimension letters: S tokens, L layers, H heads, C = d_model, V vocabulary. Everything here is
// computed in f64 from the model's f32 arrays, so the parts' contributions sum to the f64 logit of
// the f32 residual, which the model's own f32 logit matches to f32 rounding.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "inspect/report.hpp"

namespace qkv::inspect {
namespace {

constexpr const char* kFn = "qkv::inspect::add_attribution";

using Vec = std::vector<double>;

// The final norm's σ for x [C]: √(mean(x²) + eps) (RMSNorm) or √(var(x) + eps) (LayerNorm).
double sigma_of(const ModelTail& m, const float* x, std::int64_t C) {
  double mean = 0;
  if (m.norm == NormKind::layernorm) {
    for (std::int64_t c = 0; c < C; ++c) mean += x[c];
    mean /= static_cast<double>(C);
  }
  double ss = 0;
  for (std::int64_t c = 0; c < C; ++c) ss += (x[c] - mean) * (x[c] - mean);
  return std::sqrt(ss / static_cast<double>(C) + m.eps);
}

// The norm linearised at σ: g ⊙ (v − mean v) / σ for LayerNorm, g ⊙ v / σ for RMSNorm. v, out [C].
Vec linear_norm(const ModelTail& m, const Vec& v, double sigma) {
  const auto C = static_cast<std::int64_t>(v.size());
  double mean = 0;
  if (m.norm == NormKind::layernorm) mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(C);
  Vec u(v.size());
  for (std::int64_t c = 0; c < C; ++c) u[c] = m.norm_w[c] * (v[c] - mean) / sigma;
  return u;
}

// W_U[t] · u, u [C].
double dot_row(const ModelTail& m, std::int64_t t, const Vec& u) {
  const float* w = m.unembed + t * static_cast<std::int64_t>(u.size());
  double s = 0;
  for (std::size_t c = 0; c < u.size(); ++c) s += w[c] * u[c];
  return s;
}

// z [V] = W_U · u.
Vec all_logits(const ModelTail& m, const Vec& u, std::int64_t V) {
  Vec z(static_cast<std::size_t>(V));
  for (std::int64_t t = 0; t < V; ++t) z[static_cast<std::size_t>(t)] = dot_row(m, t, u);
  return z;
}

// The n largest entries of z (most first), or the n smallest with `lowest`.
std::vector<std::int32_t> top_ids(const Vec& z, std::size_t n, bool lowest) {
  std::vector<std::int32_t> ids(z.size());
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min(n, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), [&](std::int32_t a, std::int32_t b) {
    return lowest ? z[static_cast<std::size_t>(a)] < z[static_cast<std::size_t>(b)]
                  : z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)];
  });
  ids.resize(n);
  return ids;
}

// The lens at position s of residual x [S, C]: the full final norm (σ of this vector) and W_U;
// the n most likely tokens with their softmax probabilities (f64, max subtracted).
std::vector<NextToken> lens_at(const ModelTail& m, const float* x, std::int64_t C, std::int64_t V, std::size_t n,
                               const std::function<std::string(std::int32_t)>& token_text) {
  const Vec v(x, x + C);
  Vec u = linear_norm(m, v, sigma_of(m, x, C));
  if (m.norm_b) {
    for (std::int64_t c = 0; c < C; ++c) u[static_cast<std::size_t>(c)] += m.norm_b[c];
  }
  const Vec z = all_logits(m, u, V);
  const double zmax = *std::max_element(z.begin(), z.end());
  double zsum = 0;
  for (double a : z) zsum += std::exp(a - zmax);
  std::vector<NextToken> out;
  for (std::int32_t id : top_ids(z, n, false)) {
    const double a = z[static_cast<std::size_t>(id)];
    out.push_back({id, token_text(id), std::exp(a - zmax) / zsum, a});
  }
  return out;
}

}  // namespace

void add_attribution(Report& r, const ModelTail& m, const std::function<std::string(std::int32_t)>& token_text) {
  const std::int64_t S = r.S, L = r.L, H = r.H, C = r.model.config.dim, V = r.model.config.vocab_size;
  const auto Ls = static_cast<std::size_t>(L);
  if (!m.norm_w || !m.unembed || !m.embed || m.resid.size() != Ls || m.head_delta.size() != Ls ||
      m.out_bias.size() != Ls || !(m.eps >= 0)) {
    fail(kFn, "model tail: need norm_w, unembed, embed, eps ≥ 0 and " +
                  std::to_string(L) + " resid, head_delta and out_bias entries (got " + std::to_string(m.resid.size()) +
                  ", " + std::to_string(m.head_delta.size()) + ", " + std::to_string(m.out_bias.size()) + ")");
  }
  for (std::size_t l = 0; l < Ls; ++l) {
    if (!m.resid[l] || !m.head_delta[l]) fail(kFn, "layer " + std::to_string(l) + ": resid or head_delta is null");
  }
  if (C < 1 || V < 1 || r.next_tokens.empty()) fail(kFn, "report: need d_model ≥ 1, vocab ≥ 1 and next tokens");

  // ---- Attribution at the last position: the parts of x_L [C], each through the linear norm.
  const std::int64_t last = (S - 1) * C;
  const float* xL = m.resid[Ls - 1] + last;
  Attribution a;
  a.sigma = sigma_of(m, xL, C);
  const auto part = [&](const float* p) { return Vec(p, p + C); };
  const Vec u_embed = linear_norm(m, part(m.embed + last), a.sigma);
  std::vector<Vec> u_head, u_bias, u_mlp;  // [L·H], [L], [L] vectors of C
  for (std::int64_t l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const float* before = (l == 0 ? m.embed : m.resid[li - 1]) + last;
    Vec mlp(static_cast<std::size_t>(C));  // resid_l − resid_{l−1} − Σ_h Δe_h − b_O: the MLP's output
    for (std::int64_t c = 0; c < C; ++c) mlp[static_cast<std::size_t>(c)] = double{m.resid[li][last + c]} - before[c];
    for (std::int64_t h = 0; h < H; ++h) {
      const Vec dh = part(m.head_delta[li] + (h * S + S - 1) * C);
      for (std::int64_t c = 0; c < C; ++c) mlp[static_cast<std::size_t>(c)] -= dh[static_cast<std::size_t>(c)];
      u_head.push_back(linear_norm(m, dh, a.sigma));
    }
    Vec bias(static_cast<std::size_t>(C), 0.0);
    if (m.out_bias[li]) bias = part(m.out_bias[li]);
    for (std::int64_t c = 0; c < C; ++c) mlp[static_cast<std::size_t>(c)] -= bias[static_cast<std::size_t>(c)];
    u_bias.push_back(linear_norm(m, bias, a.sigma));
    u_mlp.push_back(linear_norm(m, mlp, a.sigma));
  }
  for (const NextToken& t : r.next_tokens) {
    TokenAttribution ta;
    ta.id = t.id;
    ta.text = t.text;
    ta.logit = t.logit;
    ta.embed = dot_row(m, t.id, u_embed);
    for (const Vec& u : u_head) ta.heads.push_back(dot_row(m, t.id, u));
    for (const Vec& u : u_bias) ta.attn_bias.push_back(dot_row(m, t.id, u));
    for (const Vec& u : u_mlp) ta.mlp.push_back(dot_row(m, t.id, u));
    if (m.norm_b) ta.norm_bias = dot_row(m, t.id, Vec(m.norm_b, m.norm_b + C));
    ta.sum = ta.embed + ta.norm_bias;
    for (double x : ta.heads) ta.sum += x;
    for (std::int64_t l = 0; l < L; ++l) ta.sum += ta.attn_bias[static_cast<std::size_t>(l)] + ta.mlp[static_cast<std::size_t>(l)];
    a.tokens.push_back(std::move(ta));
  }
  // Each head's strongest pushes over the whole vocabulary: L·H·V·C multiply-adds.
  for (const Vec& u : u_head) {
    const Vec z = all_logits(m, u, V);
    for (const bool lowest : {false, true}) {
      std::vector<ScoredToken> st;
      for (std::int32_t id : top_ids(z, kTopPushed, lowest)) st.push_back({id, token_text(id), z[static_cast<std::size_t>(id)]});
      (lowest ? a.down : a.up).push_back(std::move(st));
    }
    for (double x : u) a.head_vectors.push_back(static_cast<float>(x));
  }
  r.attribution = std::move(a);

  // ---- The logit lens: row 0 the embedding, row l + 1 the residual after layer l.
  const double per_position = static_cast<double>(L + 1) * static_cast<double>(V) * static_cast<double>(C);
  const auto n_pos = std::max<std::int64_t>(
      1, std::min<std::int64_t>({S, kLensPositions, static_cast<std::int64_t>(kLensBudget / per_position)}));
  r.lens_pos0 = S - n_pos;
  r.lens.clear();
  for (std::int64_t row = 0; row <= L; ++row) {
    const float* x = row == 0 ? m.embed : m.resid[static_cast<std::size_t>(row - 1)];
    LensRow lr;
    for (std::int64_t s = r.lens_pos0; s < S; ++s) {
      std::vector<NextToken> top = lens_at(m, x + s * C, C, V, s == S - 1 ? kLensTop : 1, token_text);
      lr.positions.push_back(top.front());
      if (s == S - 1) lr.top = std::move(top);
    }
    r.lens.push_back(std::move(lr));
  }
}

}  // namespace qkv::inspect
