#include "model/trainable.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "blocks/activation.hpp"
#include "blocks/crossentropy.hpp"
#include "blocks/embedding.hpp"
#include "blocks/linear.hpp"
#include "blocks/norm.hpp"
#include "blocks/rope.hpp"
#include "core/parallel.hpp"
#include "model/weights.hpp"
#include "qkv/attention.hpp"
#include "qkv/types.hpp"

namespace qkv {

std::vector<ParamInfo> param_layout(const Config& c) {
  c.validate("qkv::param_layout");
  Weights w;  // only for the names and shapes for_each_param lists; no memory behind its slots
  w.config = c;
  detail::prepare_layout(w);
  std::vector<ParamInfo> out;
  std::int64_t offset = 0;
  detail::for_each_param(w, [&](const std::string& name, const std::vector<std::int64_t>& shape, float*&) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({name, shape, offset, n, shape.size() == 2});
    offset += n;
  });
  return out;
}

std::int64_t param_count(const Config& c) {
  const auto layout = param_layout(c);
  return layout.back().offset + layout.back().numel;
}

void check_trainable(const Config& c, std::string_view fn) {
  c.validate(fn);
  if (c.causal) {
    if (c.post_norm)
      fail(fn, "post_norm: training implements pre-norm decoders and post-norm encoders, got post_norm: true with "
               "causal: true");
    if (c.type_vocab_size > 0)
      fail(fn, "type_vocab_size: token types belong to encoders (causal: false), got " +
                   std::to_string(c.type_vocab_size) + " in a causal decoder");
    return;
  }
  if (!c.mlm_head)
    fail(fn, "mlm_head: a bidirectional encoder (causal: false) trains with the masked-LM objective, which needs "
             "mlm_head: true, got false");
  if (!c.post_norm)
    fail(fn, "post_norm: training implements pre-norm decoders and post-norm encoders, got post_norm: false with "
             "causal: false");
}

namespace {

template <class S>
constexpr DType dtype_of() {
  return std::is_same_v<S, float> ? DType::f32 : DType::f64;
}

// A [B, H, T, D] view of the columns [0, H·D) of a row-major [B·T, H·D] matrix: head h of token
// (b, t) starts at element (b·T + t)·H·D + h·D. Nothing is copied.
template <class S>
View heads_view(S* base, std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D) {
  return View::strided(base, dtype_of<S>(), {B, H, T, D}, {T * H * D, D, H * D, 1});
}

}  // namespace

template <class S>
Trainable<S>::Trainable(const Config& c, std::int64_t B, std::int64_t T)
    : cfg_(c), post_(c.post_norm), B_(B), T_(T), N_(B * T) {
  constexpr const char* kFn = "qkv::Trainable";
  check_trainable(c, kFn);
  if (B < 1 || T < 1 || T > c.seq_len)
    fail(kFn, "B, T: need B ≥ 1 and 1 ≤ T ≤ seq_len " + std::to_string(c.seq_len) + ", got B " + std::to_string(B) +
                  ", T " + std::to_string(T));
  layout_ = param_layout(c);
  C_ = c.dim, D_ = c.head_dim(), QD_ = c.n_heads * D_, KD_ = c.n_kv_heads * D_, Hd_ = c.hidden_dim,
  V_ = c.vocab_size;
  const auto P = static_cast<std::size_t>(layout_.back().offset + layout_.back().numel);
  params.assign(P, S(0));
  grads.assign(P, S(0));
  auto offset = [&](const std::string& name) -> std::int64_t {
    for (const auto& p : layout_)
      if (p.name == name) return p.offset;
    return -1;
  };
  wte_ = offset("tok_embeddings.weight"), wpe_ = offset("pos_embeddings.weight");
  wtt_ = offset("type_embeddings.weight");
  new_ = offset("embedding_norm.weight"), neb_ = offset("embedding_norm.bias");
  nfw_ = offset("norm.weight"), nfb_ = offset("norm.bias");
  wcls_ = c.tied_embeddings ? wte_ : offset("output.weight");
  mw_ = offset("mlm_head.dense.weight"), mb_ = offset("mlm_head.dense.bias");
  mnw_ = offset("mlm_head.norm.weight"), mnb_ = offset("mlm_head.norm.bias"), ob_ = offset("output.bias");
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    for (const char* t : {"attention_norm.weight", "attention_norm.bias", "attention.wq.weight", "attention.wq.bias",
                          "attention.wk.weight", "attention.wk.bias", "attention.wv.weight", "attention.wv.bias",
                          "attention.wo.weight", "attention.wo.bias", "ffn_norm.weight", "ffn_norm.bias",
                          "feed_forward.w1.weight", "feed_forward.w1.bias", "feed_forward.w2.weight",
                          "feed_forward.w2.bias", "feed_forward.w3.weight"})
      layer_offsets_.push_back(offset(p + t));
  }
  shards_ = std::min<std::int64_t>(B, qkv::num_threads());
  shard_grads_.assign(static_cast<std::size_t>(shards_ - 1), std::vector<S>(P));
  if (c.pos == PosEncoding::rotary) {
    rope_cs_.resize(static_cast<std::size_t>(T * D_));
    for (std::int64_t t = 0; t < T; ++t)
      blocks::rope_angles(rope_cs_.data() + t * D_, D_, t, static_cast<S>(c.rope_theta));
  }
  const auto L = static_cast<std::size_t>(c.n_layers), N = static_cast<std::size_t>(N_),
             C = static_cast<std::size_t>(C_), QD = static_cast<std::size_t>(QD_),
             KD = static_cast<std::size_t>(KD_), Hd = static_cast<std::size_t>(Hd_), V = static_cast<std::size_t>(V_);
  const bool ln = c.norm == NormKind::layernorm, swiglu = c.mlp == MlpKind::swiglu;
  tokens_.resize(N), targets_.resize(N), types_.assign(N, 0);
  if (post_) emb_.resize(N * C), ne_rstd_.resize(N), ne_mean_.resize(ln ? N : 0);
  resid_.resize((L + 1) * N * C);
  n1_.resize(L * N * C), n1_rstd_.resize(L * N), n1_mean_.resize(ln ? L * N : 0);
  q_.resize(L * N * QD), k_.resize(L * N * KD), v_.resize(L * N * KD);
  att_.resize(L * N * QD);
  lse_.resize(L * N * static_cast<std::size_t>(c.n_heads));
  mid_.resize(L * N * C);
  n2_.resize(L * N * C), n2_rstd_.resize(L * N), n2_mean_.resize(ln ? L * N : 0);
  h1_.resize(L * N * Hd), hg_.resize(L * N * Hd), h3_.resize(swiglu ? L * N * Hd : 0);
  if (!post_) nf_.resize(N * C), nf_rstd_.resize(N), nf_mean_.resize(ln ? N : 0);
  if (c.mlm_head) {
    mlm_rows_.resize(N), mlm_count_.resize(static_cast<std::size_t>(shards_)), mlm_targets_.resize(N);
    mlm_x_.resize(N * C), mlm_t_.resize(N * C), mlm_g_.resize(N * C), mlm_n_.resize(N * C);
    mlm_mean_.resize(N), mlm_rstd_.resize(N), dmlm_.resize(N * C);
  }
  probs_.resize(N * V), losses_.resize(N);
  dresid_.resize(N * C), dn_.resize(N * C);
  datt_.resize(N * QD), dq_.resize(N * QD), dk_.resize(N * KD), dv_.resize(N * KD);
  dh1_.resize(N * Hd), dhg_.resize(N * Hd), dh3_.resize(swiglu ? N * Hd : 0);
  dlogits_.resize(N * V);
}

template <class S>
typename Trainable<S>::LayerPtrs Trainable<S>::layer(S* base, std::int64_t l) const {
  const std::int64_t* o = layer_offsets_.data() + l * kLayerTensors;
  auto at = [&](int i) { return o[i] < 0 ? nullptr : base + o[i]; };
  return {at(0), at(1), at(2),  at(3),  at(4),  at(5),  at(6),  at(7), at(8),
          at(9), at(10), at(11), at(12), at(13), at(14), at(15), at(16)};
}

template <class S>
template <class F>
void Trainable<S>::for_shards(F&& fn) {
  // Shard s holds sequences [s·B/P, (s+1)·B/P): equal work, the same cut at every call.
  parallel_for(shards_, static_cast<int>(shards_), [&](std::int64_t s) {
    const std::int64_t b0 = s * B_ / shards_, b1 = (s + 1) * B_ / shards_;
    fn(s, b0 * T_, (b1 - b0) * T_);
  });
}

template <class S>
void Trainable<S>::zero_grad() {
  std::fill(grads.begin(), grads.end(), S(0));
}

template <class S>
void Trainable<S>::norm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b, std::int64_t n) const {
  const auto eps = static_cast<S>(cfg_.norm_eps);
  if (cfg_.norm == NormKind::layernorm)
    blocks::layernorm_forward(out, mean, rstd, x, w, b, n, C_, eps);
  else
    blocks::rmsnorm_forward(out, rstd, x, w, n, C_, eps);
}

template <class S>
void Trainable<S>::norm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w, const S* mean,
                                 const S* rstd, std::int64_t n) const {
  if (cfg_.norm == NormKind::layernorm)
    blocks::layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, n, C_);
  else
    blocks::rmsnorm_backward(dx, dw, dout, x, w, rstd, n, C_);
}

template <class S>
void Trainable<S>::embed_forward(std::int64_t n0, std::int64_t n) {
  const S* P = params.data();
  S* e = (post_ ? emb_.data() : resid_.data()) + n0 * C_;  // post-norm: the sum, normed into resid_[0] below
  for (std::int64_t s0 = 0; s0 < n; s0 += T_)  // whole sequences: positions 0 … T − 1
    blocks::embedding_forward(e + s0 * C_, tokens_.data() + n0 + s0, P + wte_, wpe_ < 0 ? nullptr : P + wpe_, T_, C_,
                              0);
  if (wtt_ >= 0)
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t k = 0; k < C_; ++k) e[r * C_ + k] += P[wtt_ + types_[static_cast<std::size_t>(n0 + r)] * C_ + k];
  if (post_)
    norm_forward(resid_.data() + n0 * C_, ne_mean_.empty() ? nullptr : ne_mean_.data() + n0, ne_rstd_.data() + n0, e,
                 P + new_, neb_ < 0 ? nullptr : P + neb_, n);
}

template <class S>
void Trainable<S>::embed_backward(S* G, std::int64_t n0, std::int64_t n) {
  // dresid holds ∂L/∂resid_[0]; post-norm: through n_e first, into dn.
  const S* de = dresid_.data() + n0 * C_;
  if (post_) {
    S* dn = dn_.data() + n0 * C_;
    std::fill(dn, dn + n * C_, S(0));
    norm_backward(dn, G + new_, neb_ < 0 ? nullptr : G + neb_, de, emb_.data() + n0 * C_, params.data() + new_,
                  ne_mean_.empty() ? nullptr : ne_mean_.data() + n0, ne_rstd_.data() + n0, n);
    de = dn;
  }
  for (std::int64_t s0 = 0; s0 < n; s0 += T_)
    blocks::embedding_backward(G + wte_, wpe_ < 0 ? nullptr : G + wpe_, de + s0 * C_, tokens_.data() + n0 + s0, T_,
                               C_, 0);
  if (wtt_ >= 0)  // serial, in row order, as embedding_backward
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t k = 0; k < C_; ++k) G[wtt_ + types_[static_cast<std::size_t>(n0 + r)] * C_ + k] += de[r * C_ + k];
}

template <class S>
void Trainable<S>::to_attention(std::int64_t l, std::int64_t n0, std::int64_t n) {
  const LayerPtrs w = layer(params.data(), l);
  const std::int64_t i = l * N_ + n0;  // row of the [L, N, ·] stacks
  S* q = q_.data() + i * QD_;
  S* k = k_.data() + i * KD_;
  const S* in = resid_.data() + i * C_;  // post-norm: the attention reads x itself
  if (!post_) {
    S* n1 = n1_.data() + i * C_;
    norm_forward(n1, n1_mean_.empty() ? nullptr : n1_mean_.data() + i, n1_rstd_.data() + i, in, w.n1w, w.n1b, n);
    in = n1;
  }
  blocks::linear_forward(in, w.wq, w.bq, q, n, C_, QD_);
  blocks::linear_forward(in, w.wk, w.bk, k, n, C_, KD_);
  blocks::linear_forward(in, w.wv, w.bv, v_.data() + i * KD_, n, C_, KD_);
  if (cfg_.pos == PosEncoding::rotary) {  // rows n0 … start whole sequences: row r is at position r % T
    for (std::int64_t r = 0; r < n; ++r) {
      const S* cs = rope_cs_.data() + (r % T_) * D_;
      blocks::rope_apply(q + r * QD_, cfg_.n_heads, D_, cs);
      blocks::rope_apply(k + r * KD_, cfg_.n_kv_heads, D_, cs);
    }
  }
}

template <class S>
void Trainable<S>::mlp_forward(const LayerPtrs& w, std::int64_t i, const S* in, S* y, std::int64_t n) {
  S* h1 = h1_.data() + i * Hd_;
  S* hg = hg_.data() + i * Hd_;
  blocks::linear_forward(in, w.w1, w.b1, h1, n, C_, Hd_);
  switch (cfg_.mlp) {
    case MlpKind::gelu_exact: blocks::gelu_exact_forward(hg, h1, n * Hd_, h1); break;  // h1 now holds the slope
    case MlpKind::gelu: blocks::gelu_tanh_forward(hg, h1, n * Hd_, h1); break;  // likewise
    case MlpKind::swiglu: {
      S* h3 = h3_.data() + i * Hd_;
      blocks::linear_forward(in, w.w3, static_cast<const S*>(nullptr), h3, n, C_, Hd_);
      blocks::swiglu_forward(hg, h1, h3, n * Hd_);
      break;
    }
  }
  blocks::linear_forward(hg, w.w2, w.b2, y, n, Hd_, C_, S(1));
}

template <class S>
void Trainable<S>::from_attention(std::int64_t l, std::int64_t n0, std::int64_t n) {
  const LayerPtrs w = layer(params.data(), l);
  const std::int64_t i = l * N_ + n0;
  const S* x = resid_.data() + i * C_;
  S* mid = mid_.data() + i * C_;
  S* n1 = n1_.data() + i * C_;
  S* n2 = n2_.data() + i * C_;
  S* x_next = resid_.data() + (i + N_) * C_;
  // mid = x + W_O·att + b_O: the projection adds into a copy of the skip path.
  std::copy(x, x + n * C_, mid);
  blocks::linear_forward(att_.data() + i * QD_, w.wo, w.bo, mid, n, QD_, C_, S(1));
  if (post_) {
    // n1 = norm1(mid); n2 = n1 + MLP(n1); x_next = norm2(n2).
    norm_forward(n1, n1_mean_.empty() ? nullptr : n1_mean_.data() + i, n1_rstd_.data() + i, mid, w.n1w, w.n1b, n);
    std::copy(n1, n1 + n * C_, n2);
    mlp_forward(w, i, n1, n2, n);
    norm_forward(x_next, n2_mean_.empty() ? nullptr : n2_mean_.data() + i, n2_rstd_.data() + i, n2, w.n2w, w.n2b, n);
  } else {
    // x_next = mid + MLP(norm2(mid)).
    norm_forward(n2, n2_mean_.empty() ? nullptr : n2_mean_.data() + i, n2_rstd_.data() + i, mid, w.n2w, w.n2b, n);
    std::copy(mid, mid + n * C_, x_next);
    mlp_forward(w, i, n2, x_next, n);
  }
  if (l + 1 < cfg_.n_layers) to_attention(l + 1, n0, n);
}

template <class S>
void Trainable<S>::head_forward(std::int64_t s, std::int64_t n0, std::int64_t n) {
  const S* P = params.data();
  const S* x = resid_.data() + (cfg_.n_layers * N_ + n0) * C_;  // the last layer's output
  if (!post_) {
    S* nf = nf_.data() + n0 * C_;
    norm_forward(nf, nf_mean_.empty() ? nullptr : nf_mean_.data() + n0, nf_rstd_.data() + n0, x, P + nfw_,
                 nfb_ < 0 ? nullptr : P + nfb_, n);
    x = nf;
  }
  S* logits = probs_.data() + n0 * V_;
  if (!cfg_.mlm_head) {  // every row predicts its next token: logits = x · W_clsᵀ
    blocks::linear_forward(x, P + wcls_, static_cast<const S*>(nullptr), logits, n, C_, V_);
    blocks::crossentropy_forward(logits, losses_.data() + n0, logits, targets_.data() + n0, n, V_);
    return;
  }
  // The predicted rows, packed from row n0 on: logits = LN(gelu(x · W_mᵀ + b_m)) · W_clsᵀ + b_out.
  std::int64_t m = 0;
  for (std::int64_t r = n0; r < n0 + n; ++r) {
    if (targets_[static_cast<std::size_t>(r)] == kIgnoreTarget) continue;
    mlm_rows_[static_cast<std::size_t>(n0 + m)] = r;
    mlm_targets_[static_cast<std::size_t>(n0 + m)] = targets_[static_cast<std::size_t>(r)];
    std::copy_n(x + (r - n0) * C_, C_, mlm_x_.data() + (n0 + m) * C_);
    ++m;
  }
  mlm_count_[static_cast<std::size_t>(s)] = m;
  if (m == 0) return;
  S* t = mlm_t_.data() + n0 * C_;
  S* g = mlm_g_.data() + n0 * C_;
  S* h = mlm_n_.data() + n0 * C_;
  blocks::linear_forward(mlm_x_.data() + n0 * C_, P + mw_, P + mb_, t, m, C_, C_);
  if (cfg_.mlp == MlpKind::gelu_exact)
    blocks::gelu_exact_forward(g, t, m * C_, t);  // t now holds the slope
  else
    blocks::gelu_tanh_forward(g, t, m * C_, t);
  blocks::layernorm_forward(h, mlm_mean_.data() + n0, mlm_rstd_.data() + n0, g, P + mnw_, P + mnb_, m, C_,
                            static_cast<S>(cfg_.norm_eps));
  blocks::linear_forward(h, P + wcls_, P + ob_, logits, m, C_, V_);
  blocks::crossentropy_forward(logits, losses_.data() + n0, logits, mlm_targets_.data() + n0, m, V_);
}

template <class S>
void Trainable<S>::head_backward(std::int64_t s, S* G, S scale, std::int64_t n0, std::int64_t n) {
  const S* P = params.data();
  S* dlogits = dlogits_.data() + n0 * V_;
  S* dn = dn_.data() + n0 * C_;
  S* dresid = dresid_.data() + n0 * C_;
  // In the forward pass the loss was the mean over count_ rows of −log softmax(logits)[target], so
  // now ∂/∂logits = (probs − onehot) · scale / count_.
  std::fill(dresid, dresid + n * C_, S(0));
  if (!cfg_.mlm_head) {
    blocks::crossentropy_backward(dlogits, probs_.data() + n0 * V_, targets_.data() + n0, n, V_, scale);
    // logits = nf · W_clsᵀ (W_cls = wte when tied: its gradient adds into the embedding's).
    blocks::linear_backward(nf_.data() + n0 * C_, P + wcls_, dlogits, dn, G + wcls_, static_cast<S*>(nullptr), n, C_,
                            V_, false);
  } else {
    const std::int64_t m = mlm_count_[static_cast<std::size_t>(s)];
    S* dh = dmlm_.data() + n0 * C_;
    if (m > 0) {
      blocks::crossentropy_backward(dlogits, probs_.data() + n0 * V_, mlm_targets_.data() + n0, m, V_, scale);
      // logits = h · W_clsᵀ + b_out; h = LN(g); g = gelu(t); t = x · W_mᵀ + b_m.
      blocks::linear_backward(mlm_n_.data() + n0 * C_, P + wcls_, dlogits, dn, G + wcls_, G + ob_, m, C_, V_, false);
      std::fill(dh, dh + m * C_, S(0));
      blocks::layernorm_backward(dh, G + mnw_, G + mnb_, dn, mlm_g_.data() + n0 * C_, P + mnw_, mlm_mean_.data() + n0,
                                 mlm_rstd_.data() + n0, m, C_);
      blocks::gelu_backward(dn, mlm_t_.data() + n0 * C_, dh, m * C_);
      blocks::linear_backward(mlm_x_.data() + n0 * C_, P + mw_, dn, dh, G + mw_, G + mb_, m, C_, C_, false);
    }
    // ∂L/∂(hidden rows): the packed rows' gradients back in their places, zero elsewhere.
    S* dx = post_ ? dresid : dn;
    if (!post_) std::fill(dn, dn + n * C_, S(0));
    for (std::int64_t j = 0; j < m; ++j)
      std::copy_n(dh + j * C_, C_, dx + (mlm_rows_[static_cast<std::size_t>(n0 + j)] - n0) * C_);
    if (post_) return;
  }
  // Pre-norm: through the final norm into dresid.
  norm_backward(dresid, G + nfw_, nfb_ < 0 ? nullptr : G + nfb_, dn, resid_.data() + (cfg_.n_layers * N_ + n0) * C_,
                P + nfw_, nf_mean_.empty() ? nullptr : nf_mean_.data() + n0, nf_rstd_.data() + n0, n);
}

template <class S>
AttentionOptions Trainable<S>::shard_attention_options() const {
  AttentionOptions o;
  o.causal = cfg_.causal;  // a decoder predicts every next token at once, each position seeing only its past
  o.num_threads = shards_ > 1 ? 1 : 0;  // several shards: each is one thread's work already
  return o;
}

template <class S>
void Trainable<S>::attention_forward(std::int64_t l, std::int64_t n0, std::int64_t n) {
  const std::int64_t H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, nb = n / T_, i = l * N_ + n0;
  attention(heads_view(q_.data() + i * QD_, nb, H, T_, D_), heads_view(k_.data() + i * KD_, nb, Hkv, T_, D_),
            heads_view(v_.data() + i * KD_, nb, Hkv, T_, D_), heads_view(att_.data() + i * QD_, nb, H, T_, D_),
            shard_attention_options(), View::contiguous(lse_.data() + i * H, dtype_of<S>(), {nb, H, T_}));
}

template <class S>
void Trainable<S>::attention_backward_rows(std::int64_t l, std::int64_t n0, std::int64_t n) {
  const std::int64_t H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, nb = n / T_, i = l * N_ + n0;
  attention_backward(heads_view(q_.data() + i * QD_, nb, H, T_, D_), heads_view(k_.data() + i * KD_, nb, Hkv, T_, D_),
                     heads_view(v_.data() + i * KD_, nb, Hkv, T_, D_), heads_view(att_.data() + i * QD_, nb, H, T_, D_),
                     heads_view(datt_.data() + n0 * QD_, nb, H, T_, D_),
                     View::contiguous(lse_.data() + i * H, dtype_of<S>(), {nb, H, T_}),
                     heads_view(dq_.data() + n0 * QD_, nb, H, T_, D_), heads_view(dk_.data() + n0 * KD_, nb, Hkv, T_, D_),
                     heads_view(dv_.data() + n0 * KD_, nb, Hkv, T_, D_), shard_attention_options());
}

template <class S>
double Trainable<S>::forward(const std::int32_t* tokens, const std::int32_t* targets, const std::int32_t* types) {
  constexpr const char* kFn = "qkv::Trainable::forward";
  const bool mlm = cfg_.mlm_head;
  if (types && wtt_ < 0) fail(kFn, "types: given, but the model has no token types (type_vocab_size 0)");
  std::int64_t count = 0;
  for (std::int64_t n = 0; n < N_; ++n) {
    const bool ignored = mlm && targets[n] == kIgnoreTarget;
    if (tokens[n] < 0 || tokens[n] >= V_ || (!ignored && (targets[n] < 0 || targets[n] >= V_)))
      fail(kFn, "tokens, targets: ids must be in [0, " + std::to_string(V_) + ")" +
                    (mlm ? " (targets: or " + std::to_string(kIgnoreTarget) + ", not predicted)" : "") + ", got " +
                    std::to_string(tokens[n]) + " → " + std::to_string(targets[n]) + " at position " + std::to_string(n));
    if (types && (types[n] < 0 || types[n] >= cfg_.type_vocab_size))
      fail(kFn, "types: must be in [0, " + std::to_string(cfg_.type_vocab_size) + "), got " + std::to_string(types[n]) +
                    " at position " + std::to_string(n));
    count += ignored ? 0 : 1;
  }
  if (count == 0)
    fail(kFn, "targets: every one is " + std::to_string(kIgnoreTarget) + ": no position to predict in the batch");
  count_ = count;
  std::copy(tokens, tokens + N_, tokens_.begin());
  std::copy(targets, targets + N_, targets_.begin());
  if (types) std::copy(types, types + N_, types_.begin());
  else std::fill(types_.begin(), types_.end(), 0);
  // Each shard runs its sequences through every layer on its own, attention included (one thread
  // for its sequences' heads when there are several shards): the threads meet once a pass, not
  // at every layer's attention, so a descheduled thread on a busy machine stalls the step once.
  for_shards([&](std::int64_t s, std::int64_t n0, std::int64_t n) {
    embed_forward(n0, n);
    to_attention(0, n0, n);
    for (std::int64_t l = 0; l < cfg_.n_layers; ++l) {
      attention_forward(l, n0, n);
      from_attention(l, n0, n);
    }
    head_forward(s, n0, n);
  });
  double total = 0;  // in row order, whatever the shards
  if (!mlm) {
    for (std::int64_t n = 0; n < N_; ++n) total += losses_[static_cast<std::size_t>(n)];
  } else {
    for (std::int64_t s = 0; s < shards_; ++s) {
      const std::int64_t n0 = s * B_ / shards_ * T_;
      for (std::int64_t j = 0; j < mlm_count_[static_cast<std::size_t>(s)]; ++j)
        total += losses_[static_cast<std::size_t>(n0 + j)];
    }
  }
  return total / static_cast<double>(count_);
}

template <class S>
void Trainable<S>::mlp_backward(const LayerPtrs& w, const LayerPtrs& g, std::int64_t i, std::int64_t n0, const S* in,
                                const S* dy, S* dx, bool accumulate, std::int64_t n) {
  S* dh1 = dh1_.data() + n0 * Hd_;
  S* dhg = dhg_.data() + n0 * Hd_;
  // In the forward pass this was y += W2·hg + b2 with hg = act(W1·in + b1) (⊙ W3·in).
  blocks::linear_backward(hg_.data() + i * Hd_, w.w2, dy, dhg, g.w2, g.b2, n, Hd_, C_, false);
  if (cfg_.mlp == MlpKind::swiglu) {
    S* dh3 = dh3_.data() + n0 * Hd_;
    blocks::swiglu_backward(dh1, dh3, dhg, h1_.data() + i * Hd_, h3_.data() + i * Hd_, n * Hd_);
    blocks::linear_backward(in, w.w1, dh1, dx, g.w1, g.b1, n, C_, Hd_, accumulate);
    blocks::linear_backward(in, w.w3, dh3, dx, g.w3, static_cast<S*>(nullptr), n, C_, Hd_, true);
  } else {
    blocks::gelu_backward(dh1, h1_.data() + i * Hd_, dhg, n * Hd_);  // h1_: the slope
    blocks::linear_backward(in, w.w1, dh1, dx, g.w1, g.b1, n, C_, Hd_, accumulate);
  }
}

template <class S>
void Trainable<S>::backward_to_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n) {
  const LayerPtrs w = layer(params.data(), l), g = layer(G, l);
  const std::int64_t i = l * N_ + n0;
  S* dresid = dresid_.data() + n0 * C_;
  S* dn = dn_.data() + n0 * C_;
  if (post_) {
    // In the forward pass: n2 = n1 + MLP(n1), x_next = norm2(n2). dresid holds ∂L/∂x_next.
    std::fill(dn, dn + n * C_, S(0));
    norm_backward(dn, g.n2w, g.n2b, dresid, n2_.data() + i * C_, w.n2w, n2_mean_.empty() ? nullptr : n2_mean_.data() + i,
                  n2_rstd_.data() + i, n);
    std::copy(dn, dn + n * C_, dresid);  // ∂L/∂n2 reaches n1 by the skip path, the MLP adds its part
    mlp_backward(w, g, i, n0, n1_.data() + i * C_, dn, dresid, true, n);
    // n1 = norm1(mid): dresid holds ∂L/∂n1.
    std::fill(dn, dn + n * C_, S(0));
    norm_backward(dn, g.n1w, g.n1b, dresid, mid_.data() + i * C_, w.n1w, n1_mean_.empty() ? nullptr : n1_mean_.data() + i,
                  n1_rstd_.data() + i, n);
    std::copy(dn, dn + n * C_, dresid);  // ∂L/∂mid
  } else {
    // In the forward pass this was x_next = mid + MLP(norm2(mid)). dresid holds ∂L/∂x_next; the skip
    // path hands it to mid unchanged, the MLP branch adds its part through norm2.
    mlp_backward(w, g, i, n0, n2_.data() + i * C_, dresid, dn, false, n);
    norm_backward(dresid, g.n2w, g.n2b, dn, mid_.data() + i * C_, w.n2w,
                  n2_mean_.empty() ? nullptr : n2_mean_.data() + i, n2_rstd_.data() + i, n);
  }
  // In the forward pass this was mid = x + W_O·att + b_O. dresid now holds ∂L/∂mid, which again
  // flows to x by the skip path.
  blocks::linear_backward(att_.data() + i * QD_, w.wo, dresid, datt_.data() + n0 * QD_, g.wo, g.bo, n, QD_, C_, false);
}

template <class S>
void Trainable<S>::backward_from_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n) {
  const LayerPtrs w = layer(params.data(), l), g = layer(G, l);
  const std::int64_t i = l * N_ + n0;
  S* dq = dq_.data() + n0 * QD_;
  S* dk = dk_.data() + n0 * KD_;
  S* dresid = dresid_.data() + n0 * C_;
  // In the forward pass this was q = rope(W_Q·in + b_Q), k = rope(W_K·in + b_K), v = W_V·in + b_V,
  // in = n1(x) (pre-norm) or x (post-norm), and x also went on by the skip path (dresid holds that part).
  if (cfg_.pos == PosEncoding::rotary) {
    for (std::int64_t r = 0; r < n; ++r) {  // rows n0 … start whole sequences: row r is at position r % T
      const S* cs = rope_cs_.data() + (r % T_) * D_;
      blocks::rope_apply_backward(dq + r * QD_, cfg_.n_heads, D_, cs);
      blocks::rope_apply_backward(dk + r * KD_, cfg_.n_kv_heads, D_, cs);
    }
  }
  const S* in = (post_ ? resid_.data() : n1_.data()) + i * C_;
  S* din = post_ ? dresid : dn_.data() + n0 * C_;
  blocks::linear_backward(in, w.wq, dq, din, g.wq, g.bq, n, C_, QD_, post_);
  blocks::linear_backward(in, w.wk, dk, din, g.wk, g.bk, n, C_, KD_, true);
  blocks::linear_backward(in, w.wv, dv_.data() + n0 * KD_, din, g.wv, g.bv, n, C_, KD_, true);
  if (!post_)
    norm_backward(dresid, g.n1w, g.n1b, din, resid_.data() + i * C_, w.n1w,
                  n1_mean_.empty() ? nullptr : n1_mean_.data() + i, n1_rstd_.data() + i, n);
}

template <class S>
void Trainable<S>::backward(S loss_scale) {
  const std::int64_t L = cfg_.n_layers;
  const auto n_params = static_cast<std::int64_t>(params.size());
  auto shard_grads = [&](std::int64_t s) {
    return s == 0 ? grads.data() : shard_grads_[static_cast<std::size_t>(s - 1)].data();
  };

  for_shards([&](std::int64_t s, std::int64_t n0, std::int64_t n) {
    S* G = shard_grads(s);
    if (s > 0) std::fill(G, G + n_params, S(0));
    head_backward(s, G, static_cast<S>(loss_scale / static_cast<S>(count_)), n0, n);
    backward_to_attention(L - 1, G, n0, n);
    for (std::int64_t l = L - 1; l >= 0; --l) {
      attention_backward_rows(l, n0, n);
      backward_from_attention(l, G, n0, n);
      if (l > 0) backward_to_attention(l - 1, G, n0, n);
    }
    embed_backward(G, n0, n);
  });

  // grads += Σ_{s ≥ 1} shard s's gradients, in shard order, in chunks spread over the threads.
  if (shards_ > 1) {
    constexpr std::int64_t kChunk = 1 << 14;
    parallel_for((n_params + kChunk - 1) / kChunk, static_cast<int>(shards_), [&](std::int64_t c) {
      const std::int64_t lo = c * kChunk, hi = std::min(n_params, lo + kChunk);
      for (const auto& sg : shard_grads_) {
        const S* src = sg.data();
#pragma omp simd
        for (std::int64_t k = lo; k < hi; ++k) grads[static_cast<std::size_t>(k)] += src[k];
      }
    });
  }
}

template <class S>
Weights Trainable<S>::to_weights() const {
  Weights w = Weights::allocate(cfg_);
  const auto t = w.tensors();
  for (std::size_t j = 0; j < t.size(); ++j) {
    const S* src = params.data() + layout_[j].offset;
    for (std::int64_t e = 0; e < layout_[j].numel; ++e) t[j].data[e] = static_cast<float>(src[e]);
  }
  return w;
}

template <class S>
void Trainable<S>::set_weights(const Weights& w, std::string_view what) {
  if (config_to_json(w.config, false) != config_to_json(cfg_, false))
    fail("qkv::Trainable::set_weights", std::string(what) + ": the weights' config " + config_to_json(w.config, false) +
                                            " differs from the model's " + config_to_json(cfg_, false));
  const auto t = w.tensors();
  for (std::size_t j = 0; j < t.size(); ++j) {
    S* dst = params.data() + layout_[j].offset;
    for (std::int64_t e = 0; e < layout_[j].numel; ++e) dst[e] = static_cast<S>(t[j].data[e]);
  }
}

template class Trainable<float>;
template class Trainable<double>;

}  // namespace qkv
