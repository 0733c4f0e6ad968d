// The reference attention: the oracle every fast kernel is tested against, and the fallback
// for whatever the fast kernels do not take. Straight loops over (b, h, i, j), every product
// and sum in f64, every tensor read through its strides. Clarity over speed.
//
//   q [B,H,Sq,D]  k [B,Hkv,Skv,D]  v [B,Hkv,Skv,Dv]  out [B,H,Sq,Dv]
//   query head h reads kv head h / (H / Hkv)
#include <cmath>
#include <cstdlib>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/dropout.hpp"
#include "kernels/params.hpp"

namespace qkv::kernels {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// One allowed key's score from s = scale · q·k, in qkv/attention.hpp's order: softcap, + the
// additive mask entry `extra`, − the ALiBi bias. −∞ stays −∞ (tanh would make it −c). dcap, when
// not null, gets ∂score/∂s = 1 − tanh²(s / c) (1 without softcap).
double score_mod(const AttnParams& p, std::int64_t b, std::int64_t h, std::int64_t diag, std::int64_t j, double s,
                 double extra, double* dcap) {
  double d = 1.0;
  if (p.softcap > 0.0 && s != kNegInf) {
    const double t = std::tanh(s / p.softcap);
    s = p.softcap * t;
    d = 1.0 - t * t;
  }
  s += extra;
  if (!p.alibi.empty()) s -= p.alibi[static_cast<std::size_t>(b * p.alibi_sb + h)] * static_cast<double>(std::abs(diag - j));
  if (dcap) *dcap = d;
  return s;
}

// Scores of one query row against every key. allowed[j]: whether query i may attend key j (the
// causal/window/padding rule, the bool mask, and an additive mask other than −∞); masked entries
// of s are −∞ whatever q·k is, so a NaN in a masked key's K never reaches the row.
//   s, allowed: [Skv] outputs; dcap: [Skv] ∂score/∂(scale·q·k) (score_mod), or null
void row_scores(const AttnParams& p, std::int64_t b, std::int64_t h, std::int64_t i, double* s, char* allowed,
                double* dcap = nullptr) {
  const std::int64_t hk = h / p.group();
  const std::int64_t key_len = p.key_len[static_cast<std::size_t>(b)];
  const std::int64_t diag = p.rule.diag(i, key_len);
  std::int64_t lo, hi;
  p.rule.range(i, key_len, &lo, &hi);
  for (std::int64_t j = 0; j < p.Skv; ++j) {
    bool ok = j < hi && (j >= lo || j < p.rule.keep_first);
    double extra = 0.0;
    if (ok && p.mask.data) {
      const double m = p.mask.load(p.mask.offset(b, h, i, j));
      if (p.mask_is_bool)
        ok = m != 0.0;
      else if (m == kNegInf)
        ok = false;
      else
        extra = m;
    }
    allowed[j] = ok ? 1 : 0;
    if (!ok) {
      s[j] = kNegInf;
      continue;
    }
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.D; ++d)
      dot += p.q.load(p.q.offset(b, h, i, d)) * p.k.load(p.k.offset(b, hk, j, d));
    s[j] = score_mod(p, b, h, diag, j, dot * p.scale, extra, dcap ? dcap + j : nullptr);
  }
}

// Row (b, h, i) of the score output at its stage (qkv/attention.hpp's ScoreStage). masked: the row's
// pre-softmax scores s [Skv] as row_scores gave them; scaled and softcapped: recomputed for every
// key, masked or not (ONNX's qk_matmul_output is a whole matmul).
void write_scores(const AttnParams& p, std::int64_t b, std::int64_t h, std::int64_t i, const double* s) {
  const std::int64_t hk = h / p.group();
  for (std::int64_t j = 0; j < p.Skv; ++j) {
    double x = s[j];
    if (!p.scores_masked) {
      double dot = 0.0;
      for (std::int64_t d = 0; d < p.D; ++d)
        dot += p.q.load(p.q.offset(b, h, i, d)) * p.k.load(p.k.offset(b, hk, j, d));
      x = dot * p.scale;
      if (p.scores_softcap && p.softcap > 0.0) x = p.softcap * std::tanh(x / p.softcap);
    }
    p.scores.store(p.scores.offset(b, h, i, j), x);
  }
}

// The sink logit of head h, −∞ without opt.sinks (exp(−∞) = 0 leaves the softmax as it was).
double sink_of(const AttnParams& p, std::int64_t h) {
  return p.sinks.empty() ? kNegInf : p.sinks[static_cast<std::size_t>(h)];
}

// In place: scores → probabilities; returns the logsumexp. The non-finite policy of
// qkv/attention.hpp: a NaN or +∞ score on an allowed key makes the row NaN (p = NaN on every
// allowed key, lse NaN); −∞ scores (masked keys, or q·k = −∞) get p = 0; a row whose every
// score is −∞ gets p = 0 everywhere and lse = −∞. sink (finite, or −∞ for none) joins the
// denominator as one more score without a value: lse = log(exp(sink) + Σ exp(s_j)).
double softmax_inplace(double* s, const char* allowed, std::int64_t n, double sink) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  bool nan_row = false;
  for (std::int64_t j = 0; j < n; ++j) nan_row = nan_row || (allowed[j] && (std::isnan(s[j]) || s[j] == -kNegInf));
  if (nan_row) {
    for (std::int64_t j = 0; j < n; ++j) s[j] = allowed[j] ? kNaN : 0.0;
    return kNaN;
  }
  double m = sink;
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  if (m == kNegInf) {
    for (std::int64_t j = 0; j < n; ++j) s[j] = 0.0;
    return kNegInf;
  }
  double sum = sink == kNegInf ? 0.0 : std::exp(sink - m);
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] = s[j] == kNegInf ? 0.0 : std::exp(s[j] - m);
    sum += s[j];
  }
  for (std::int64_t j = 0; j < n; ++j) s[j] /= sum;
  return m + std::log(sum);
}

// Dropout of one row, in place: w[j] ← keep_ij / (1 − p) (qkv/attention.hpp), decided by the same
// dropout_bits as every fast kernel, but key by key and in f64.  w: [Skv]
void dropout_weights(const AttnParams& p, std::int64_t b, std::int64_t h, std::int64_t i, double* w) {
  const std::uint64_t key = dropout_row_key(p.dropout.seed, p.dropout.offset, p.dropout.b0 + b, h, i);
  const std::uint32_t t = dropout_threshold(p.dropout.p);
  const double rs = 1.0 / (1.0 - p.dropout.p);
  for (std::int64_t j = 0; j < p.Skv; ++j) w[j] = dropout_bits(key, j) >= t ? rs : 0.0;
}

}  // namespace

void attention_reference(const AttnParams& p) {
  if (p.cache.paged() || p.cache.i8()) {
    // A paged / int8 KV cache: the keys some row may attend, [first_key, key_len[b]), gathered
    // and dequantised into f64 [B, Hkv, Skv, D] and [.., Dv] (the rest zeros, never used: those
    // keys are masked; a paged table's entries for them need not be valid).
    Buffer k(DType::f64, {p.B, p.Hkv, p.Skv, p.D}), v(DType::f64, {p.B, p.Hkv, p.Skv, p.Dv});
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t hk = 0; hk < p.Hkv; ++hk)
        for (std::int64_t j = p.rule.first_key(p.Sq, p.key_len[static_cast<std::size_t>(b)]);
             j < p.key_len[static_cast<std::size_t>(b)]; ++j) {
          const double ks = p.cache.i8() ? p.cache.k_scale.load(p.cache.offset(p.cache.k_scale, b, hk, j)) : 1.0;
          const double vs = p.cache.i8() ? p.cache.v_scale.load(p.cache.offset(p.cache.v_scale, b, hk, j)) : 1.0;
          const std::int64_t ko = p.cache.offset(p.k, b, hk, j), vo = p.cache.offset(p.v, b, hk, j);
          for (std::int64_t d = 0; d < p.D; ++d) k.view().store(k.view().offset(b, hk, j, d), ks * p.k.load(ko + d * p.k.stride(3)));
          for (std::int64_t e = 0; e < p.Dv; ++e) v.view().store(v.view().offset(b, hk, j, e), vs * p.v.load(vo + e * p.v.stride(3)));
        }
    AttnParams dense = p;
    dense.k = k.view(), dense.v = v.view();
    dense.cache = {};
    attention_reference(dense);
    return;
  }
  // One task per (b, h): each writes disjoint rows of out / lse / pattern.
  parallel_for(p.B * p.H, p.threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / p.H, h = bh % p.H, hk = h / p.group();
    std::vector<double> s(static_cast<std::size_t>(p.Skv));
    std::vector<char> allowed(static_cast<std::size_t>(p.Skv));
    std::vector<double> acc(static_cast<std::size_t>(p.Dv));
    std::vector<double> w(p.dropout.on() ? static_cast<std::size_t>(p.Skv) : 0);  // dropout factors
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      row_scores(p, b, h, i, s.data(), allowed.data());
      if (p.scores.data) write_scores(p, b, h, i, s.data());
      const double lse = softmax_inplace(s.data(), allowed.data(), p.Skv, sink_of(p, h));
      // Dropout after the softmax (lse stays the softmax's); a NaN row stays NaN.
      if (p.dropout.on() && !std::isnan(lse)) {
        dropout_weights(p, b, h, i, w.data());
        for (std::int64_t j = 0; j < p.Skv; ++j) s[static_cast<std::size_t>(j)] *= w[static_cast<std::size_t>(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (std::int64_t j = 0; j < p.Skv; ++j) {
        if (s[static_cast<std::size_t>(j)] == 0.0) continue;
        for (std::int64_t e = 0; e < p.Dv; ++e)
          acc[static_cast<std::size_t>(e)] += s[static_cast<std::size_t>(j)] * p.v.load(p.v.offset(b, hk, j, e));
      }
      for (std::int64_t e = 0; e < p.Dv; ++e) p.out.store(p.out.offset(b, h, i, e), acc[static_cast<std::size_t>(e)]);
      if (p.lse.data) p.lse.store(p.lse.offset(b, h, i), lse);
      if (p.pattern.data)
        for (std::int64_t j = 0; j < p.Skv; ++j)
          p.pattern.store(p.pattern.offset(b, h, i, j), s[static_cast<std::size_t>(j)]);
    }
  });
}

// Backward, recomputing the probabilities in f64 (it does not trust the saved lse):
//   dv_j  += Σ_i p_ij · dout_i
//   dp_ij  = dout_i · v_j
//   ds_ij  = p_ij · (dp_ij − Σ_j' p_ij' dp_ij') · dcap_ij     dcap = 1 − tanh² with softcap, else 1
// With dropout (w_ij = keep_ij / (1 − p)) the forward used z_ij = p_ij w_ij in place of p_ij, so
// dv_j takes z_ij, and dp_ij is the gradient through z: dp_ij = w_ij · dout_i · v_j; the row sum
// Σ_j' p_ij' dp_ij' is then Σ_j' z_ij' dout_i · v_j' = dout_i · out_i (FlashAttention's D_i).
//   dq_i   = scale · Σ_j ds_ij · k_j
//   dk_j  += scale · Σ_i ds_ij · q_i
// A sink takes probability mass but has no value: Σ_j' p_ij' dp_ij' = dout_i · out_i still holds
// (p here already excludes the sink's share), so these formulas stand; its own gradient is
// sink_gradient() below.
// dk, dv of a kv head collect the contributions of all query heads of its group, so one task
// per (b, hk) owns them and the result does not depend on the thread count.
void attention_backward_reference(const AttnBwdParams& bp) {
  const AttnParams& p = bp.fwd;
  parallel_for(p.B * p.Hkv, p.threads, [&](std::int64_t bhk) {
    const std::int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv;
    const auto Skv = static_cast<std::size_t>(p.Skv);
    std::vector<double> dk(Skv * static_cast<std::size_t>(p.D), 0.0);
    std::vector<double> dv(Skv * static_cast<std::size_t>(p.Dv), 0.0);
    std::vector<double> s(Skv), dp(Skv), dcap(Skv), dq(static_cast<std::size_t>(p.D));
    std::vector<char> allowed(Skv);
    std::vector<double> w(Skv, 1.0);  // dropout factors w_ij (1 without dropout)
    for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        row_scores(p, b, h, i, s.data(), allowed.data(), dcap.data());
        const double lse = softmax_inplace(s.data(), allowed.data(), p.Skv, sink_of(p, h));
        const bool drop = p.dropout.on() && !std::isnan(lse);  // a NaN row stays NaN
        if (drop) dropout_weights(p, b, h, i, w.data());
        double dot_pdp = 0.0;
        for (std::int64_t j = 0; j < p.Skv; ++j) {
          double d = 0.0;
          for (std::int64_t e = 0; e < p.Dv; ++e)
            d += p.v.load(p.v.offset(b, hk, j, e)) * bp.dout.load(bp.dout.offset(b, h, i, e));
          if (drop) d *= w[static_cast<std::size_t>(j)];
          dp[static_cast<std::size_t>(j)] = d;
          if (s[static_cast<std::size_t>(j)] != 0.0) dot_pdp += s[static_cast<std::size_t>(j)] * d;  // masked keys: p = 0, V unread
        }
        std::fill(dq.begin(), dq.end(), 0.0);
        for (std::int64_t j = 0; j < p.Skv; ++j) {
          const double pj = s[static_cast<std::size_t>(j)];
          if (pj == 0.0) continue;
          const double ds = pj * (dp[static_cast<std::size_t>(j)] - dot_pdp) * dcap[static_cast<std::size_t>(j)] * p.scale;
          const double zj = drop ? pj * w[static_cast<std::size_t>(j)] : pj;
          for (std::int64_t e = 0; e < p.Dv; ++e)
            dv[static_cast<std::size_t>(j * p.Dv + e)] += zj * bp.dout.load(bp.dout.offset(b, h, i, e));
          for (std::int64_t d = 0; d < p.D; ++d) {
            dq[static_cast<std::size_t>(d)] += ds * p.k.load(p.k.offset(b, hk, j, d));
            dk[static_cast<std::size_t>(j * p.D + d)] += ds * p.q.load(p.q.offset(b, h, i, d));
          }
        }
        for (std::int64_t d = 0; d < p.D; ++d) bp.dq.store(bp.dq.offset(b, h, i, d), dq[static_cast<std::size_t>(d)]);
      }
    }
    for (std::int64_t j = 0; j < p.Skv; ++j) {
      for (std::int64_t d = 0; d < p.D; ++d) bp.dk.store(bp.dk.offset(b, hk, j, d), dk[static_cast<std::size_t>(j * p.D + d)]);
      for (std::int64_t e = 0; e < p.Dv; ++e) bp.dv.store(bp.dv.offset(b, hk, j, e), dv[static_cast<std::size_t>(j * p.Dv + e)]);
    }
  });
}

// out_i = Σ_j p_ij v_j with p_ij = exp(s_ij) / Z_i, Z_i = exp(sink_h) + Σ_j exp(s_ij), so
// ∂out_i/∂sink_h = −p_sink,i · out_i with p_sink,i = exp(sink_h − lse_i), and
// ∂L/∂sink_h = −Σ_{b,i} p_sink,i · (dout_i · out_i). One pass over out and dout, in f64.
void sink_gradient(const AttnBwdParams& bp, double* dsink) {
  const AttnParams& p = bp.fwd;
  for (std::int64_t h = 0; h < p.H; ++h) {
    double acc = 0.0;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t i = 0; i < p.Sq; ++i) {
        double delta = 0.0;
        for (std::int64_t e = 0; e < p.Dv; ++e)
          delta += p.out.load(p.out.offset(b, h, i, e)) * bp.dout.load(bp.dout.offset(b, h, i, e));
        acc -= std::exp(p.sinks[static_cast<std::size_t>(h)] - p.lse.load(p.lse.offset(b, h, i))) * delta;
      }
    dsink[h] += acc;
  }
}

}  // namespace qkv::kernels
