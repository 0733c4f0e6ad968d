#include "train/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "blocks/training_layers.hpp"
#include "core/parallel.hpp"
#include "qkv/attention.hpp"
#include "qkv/types.hpp"

namespace qkv::train {

void GptConfig::validate(const char* fn) const {
  auto in_range = [&](const char* what, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi)
      fail(fn, std::string(what) + ": must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                   std::to_string(v));
  };
  in_range("vocab", vocab, 1, 1 << 24);
  in_range("context", context, 1, 1 << 20);
  in_range("layers", layers, 1, 1024);
  in_range("heads", heads, 1, 1024);
  in_range("embd", embd, 1, 1 << 16);
  if (embd % heads != 0)
    fail(fn, "embd, heads: the width (--d-model) must be a multiple of heads, got " + std::to_string(embd) + " and heads " +
                 std::to_string(heads));
}

std::vector<ParamInfo> param_layout(const GptConfig& cfg) {
  const std::int64_t V = cfg.vocab, T = cfg.context, C = cfg.embd;
  std::vector<ParamInfo> out;
  std::int64_t offset = 0;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, bool decay) {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    out.push_back({std::move(name), std::move(shape), offset, n, decay});
    offset += n;
  };
  add("transformer.wte.weight", {V, C}, true);
  add("transformer.wpe.weight", {T, C}, true);
  for (std::int64_t l = 0; l < cfg.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {C}, false);
    if (cfg.bias) add(p + "ln_1.bias", {C}, false);
    add(p + "attn.c_attn.weight", {3 * C, C}, true);
    if (cfg.bias) add(p + "attn.c_attn.bias", {3 * C}, false);
    add(p + "attn.c_proj.weight", {C, C}, true);
    if (cfg.bias) add(p + "attn.c_proj.bias", {C}, false);
    add(p + "ln_2.weight", {C}, false);
    if (cfg.bias) add(p + "ln_2.bias", {C}, false);
    add(p + "mlp.c_fc.weight", {4 * C, C}, true);
    if (cfg.bias) add(p + "mlp.c_fc.bias", {4 * C}, false);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, true);
    if (cfg.bias) add(p + "mlp.c_proj.bias", {C}, false);
  }
  add("transformer.ln_f.weight", {C}, false);
  if (cfg.bias) add("transformer.ln_f.bias", {C}, false);
  return out;
}

std::int64_t param_count(const GptConfig& cfg) {
  const auto layout = param_layout(cfg);
  return layout.back().offset + layout.back().numel;
}

template <class S>
Gpt<S>::Gpt(const GptConfig& cfg, std::int64_t B, std::int64_t T)
    : cfg_(cfg), layout_(param_layout(cfg)), B_(B), T_(T), N_(B * T) {
  cfg.validate("qkv::train::Gpt");
  if (B < 1 || T < 1 || T > cfg.context)
    fail("qkv::train::Gpt", "B, T: need B ≥ 1 and 1 ≤ T ≤ context " + std::to_string(cfg.context) + ", got B " +
                                std::to_string(B) + ", T " + std::to_string(T));
  const auto P = static_cast<std::size_t>(param_count(cfg));
  params.assign(P, S(0));
  grads.assign(P, S(0));
  auto offset = [&](const std::string& name) -> std::int64_t {
    for (const auto& p : layout_)
      if (p.name == name) return p.offset;
    return -1;
  };
  wte_ = offset("transformer.wte.weight"), wpe_ = offset("transformer.wpe.weight");
  lnfw_ = offset("transformer.ln_f.weight"), lnfb_ = offset("transformer.ln_f.bias");
  for (std::int64_t l = 0; l < cfg.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    for (const char* t : {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                          "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                          "mlp.c_proj.weight", "mlp.c_proj.bias"})
      layer_offsets_.push_back(offset(p + t));
  }
  shards_ = std::min<std::int64_t>(B, qkv::num_threads());
  shard_grads_.assign(static_cast<std::size_t>(shards_ - 1), std::vector<S>(P));
  const auto L = static_cast<std::size_t>(cfg.layers), N = static_cast<std::size_t>(N_),
             C = static_cast<std::size_t>(cfg.embd), V = static_cast<std::size_t>(cfg.vocab);
  tokens_.resize(N);
  targets_.resize(N);
  resid_.resize((L + 1) * N * C);
  ln1_.resize(L * N * C), ln1_mean_.resize(L * N), ln1_rstd_.resize(L * N);
  qkv_.resize(L * N * 3 * C);
  atty_.resize(L * N * C);
  lse_.resize(L * N * static_cast<std::size_t>(cfg.heads));
  resid_mid_.resize(L * N * C);
  ln2_.resize(L * N * C), ln2_mean_.resize(L * N), ln2_rstd_.resize(L * N);
  fch_.resize(L * N * 4 * C), fch_gelu_.resize(L * N * 4 * C);
  lnf_.resize(N * C), lnf_mean_.resize(N), lnf_rstd_.resize(N);
  probs_.resize(N * V), losses_.resize(N);
  dresid_.resize(N * C), dln_.resize(N * C), datty_.resize(N * C);
  dq_.resize(N * C), dk_.resize(N * C), dv_.resize(N * C);
  dfch_.resize(N * 4 * C), dfch_gelu_.resize(N * 4 * C);
  dlogits_.resize(N * V);
}

template <class S>
S* Gpt<S>::tensor(S* base, const std::string& name) const {
  for (const auto& p : layout_)
    if (p.name == name) return base + p.offset;
  return nullptr;
}

template <class S>
typename Gpt<S>::LayerPtrs Gpt<S>::layer(S* base, std::int64_t l) const {
  const std::int64_t* o = layer_offsets_.data() + l * 12;
  auto at = [&](int i) { return o[i] < 0 ? nullptr : base + o[i]; };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

template <class S>
template <class F>
void Gpt<S>::for_shards(F&& fn) {
  // Shard s holds sequences [s·B/P, (s+1)·B/P): equal work, the same cut at every call.
  parallel_for(shards_, static_cast<int>(shards_), [&](std::int64_t s) {
    const std::int64_t b0 = s * B_ / shards_, b1 = (s + 1) * B_ / shards_;
    fn(s, b0 * T_, (b1 - b0) * T_);
  });
}

template <class S>
void Gpt<S>::init(Rng& rng) {
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg_.layers));
  for (const auto& p : layout_) {
    S* w = params.data() + p.offset;
    const bool is_bias = p.name.ends_with(".bias");
    const bool is_gain = p.shape.size() == 1 && !is_bias;  // LayerNorm weight
    const double std = p.name.ends_with("c_proj.weight") ? resid_std : 0.02;
    for (std::int64_t i = 0; i < p.numel; ++i)
      w[i] = is_bias ? S(0) : is_gain ? S(1) : static_cast<S>(std * rng.normal());
  }
}

template <class S>
void Gpt<S>::zero_grad() {
  std::fill(grads.begin(), grads.end(), S(0));
}

namespace {

template <class S>
constexpr DType dtype_of() {
  return std::is_same_v<S, float> ? DType::f32 : DType::f64;
}

// A [B, H, T, D] view of the columns [col, col + H·D) of a row-major [B·T, row] matrix: head h of
// token (b, t) starts at element (b·T + t)·row + col + h·D. Nothing is copied.
template <class S>
View heads_view(S* base, std::int64_t B, std::int64_t H, std::int64_t T, std::int64_t D, std::int64_t row,
                std::int64_t col) {
  return View::strided(base + col, dtype_of<S>(), {B, H, T, D}, {T * row, D, row, 1});
}

}  // namespace

template <class S>
double Gpt<S>::forward(const std::int32_t* tokens, const std::int32_t* targets) {
  const std::int64_t L = cfg_.layers, N = N_, C = cfg_.embd, V = cfg_.vocab, H = cfg_.heads, D = C / H;
  for (std::int64_t n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V || targets[n] < 0 || targets[n] >= V)
      fail("qkv::train::Gpt::forward", "tokens, targets: ids must be in [0, " + std::to_string(V) + "), got " +
                                           std::to_string(tokens[n]) + " → " + std::to_string(targets[n]) +
                                           " at position " + std::to_string(n));
  std::copy(tokens, tokens + N, tokens_.begin());
  std::copy(targets, targets + N, targets_.begin());
  S* P = params.data();
  const S* wte = P + wte_;

  // Layer l up to its attention input: x → ln_1 → q | k | v, on rows [n0, n0 + n).
  auto to_attention = [&](std::int64_t l, std::int64_t n0, std::int64_t n) {
    const LayerPtrs w = layer(P, l);
    const std::int64_t i = l * N + n0;
    blocks::typed::layernorm_forward(ln1_.data() + i * C, ln1_mean_.data() + i, ln1_rstd_.data() + i,
                                     resid_.data() + i * C, w.ln1w, w.ln1b, n, C, S(1e-5));
    blocks::typed::dense_forward(ln1_.data() + i * C, w.qkvw, w.qkvb, qkv_.data() + i * 3 * C, n, C, 3 * C);
  };
  for_shards([&](std::int64_t, std::int64_t n0, std::int64_t n) {
    blocks::typed::embedding_forward(resid_.data() + n0 * C, tokens + n0, wte, P + wpe_, n, T_, C);
    to_attention(0, n0, n);
  });

  AttentionOptions causal;
  causal.causal = true;  // every position predicts its next token at once, seeing only its past
  for (std::int64_t l = 0; l < L; ++l) {
    S* qkv = qkv_.data() + l * N * 3 * C;
    S* atty = atty_.data() + l * N * C;
    attention(heads_view(qkv, B_, H, T_, D, 3 * C, 0), heads_view(qkv, B_, H, T_, D, 3 * C, C),
              heads_view(qkv, B_, H, T_, D, 3 * C, 2 * C), heads_view(atty, B_, H, T_, D, C, 0), causal,
              View::contiguous(lse_.data() + l * B_ * H * T_, dtype_of<S>(), {B_, H, T_}));
    for_shards([&](std::int64_t, std::int64_t n0, std::int64_t n) {
      const LayerPtrs w = layer(P, l);
      const std::int64_t i = l * N + n0;
      const S* x = resid_.data() + i * C;
      S* mid = resid_mid_.data() + i * C;
      S* ln2 = ln2_.data() + i * C;
      S* fch = fch_.data() + i * 4 * C;
      S* fch_gelu = fch_gelu_.data() + i * 4 * C;
      S* x_next = resid_.data() + (i + N) * C;
      // mid = x + c_proj(atty); x_next = mid + c_proj(gelu(c_fc(ln_2(mid)))): the projections add
      // into a copy of the skip path.
      std::copy(x, x + n * C, mid);
      blocks::typed::dense_forward(atty_.data() + i * C, w.projw, w.projb, mid, n, C, C, true);
      blocks::typed::layernorm_forward(ln2, ln2_mean_.data() + i, ln2_rstd_.data() + i, mid, w.ln2w, w.ln2b, n, C, S(1e-5));
      blocks::typed::dense_forward(ln2, w.fcw, w.fcb, fch, n, C, 4 * C);
      blocks::typed::gelu_forward(fch_gelu, fch, fch, n * 4 * C);  // fch now holds gelu'(c_fc output)
      std::copy(mid, mid + n * C, x_next);
      blocks::typed::dense_forward(fch_gelu, w.fcprojw, w.fcprojb, x_next, n, 4 * C, C, true);
      if (l + 1 < L) {
        to_attention(l + 1, n0, n);
        return;
      }
      // After the last layer: ln_f, logits = lnf · wteᵀ (tied unembedding), softmax cross-entropy.
      blocks::typed::layernorm_forward(lnf_.data() + n0 * C, lnf_mean_.data() + n0, lnf_rstd_.data() + n0, x_next,
                                       P + lnfw_, lnfb_ < 0 ? nullptr : P + lnfb_, n, C, S(1e-5));
      S* logits = probs_.data() + n0 * V;
      blocks::typed::dense_forward(lnf_.data() + n0 * C, wte, static_cast<const S*>(nullptr), logits, n, C, V);
      blocks::typed::crossentropy_forward(logits, losses_.data() + n0, logits, targets + n0, n, V);
    });
  }
  double total = 0;  // in row order, whatever the shards
  for (std::int64_t n = 0; n < N; ++n) total += losses_[static_cast<std::size_t>(n)];
  return total / static_cast<double>(N);
}

template <class S>
void Gpt<S>::block_backward_to_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n) {
  const std::int64_t N = N_, C = cfg_.embd;
  const LayerPtrs w = layer(params.data(), l), g = layer(G, l);
  const std::int64_t i = l * N + n0;
  S* dresid = dresid_.data() + n0 * C;
  S* dln = dln_.data() + n0 * C;
  S* dfch = dfch_.data() + n0 * 4 * C;
  S* dfch_gelu = dfch_gelu_.data() + n0 * 4 * C;
  // In the forward pass this was x_next = mid + c_proj(gelu(c_fc(ln_2(mid)))). dresid holds
  // ∂L/∂x_next; the skip path hands it to mid unchanged, the MLP branch adds its part below.
  blocks::typed::dense_backward(fch_gelu_.data() + i * 4 * C, w.fcprojw, dresid, dfch_gelu, g.fcprojw, g.fcprojb, n,
                                4 * C, C, false);
  blocks::typed::gelu_backward(dfch, fch_.data() + i * 4 * C, dfch_gelu, n * 4 * C);  // fch_: the slope
  blocks::typed::dense_backward(ln2_.data() + i * C, w.fcw, dfch, dln, g.fcw, g.fcb, n, C, 4 * C, false);
  blocks::typed::layernorm_backward(dresid, g.ln2w, g.ln2b, dln, resid_mid_.data() + i * C, w.ln2w,
                                    ln2_mean_.data() + i, ln2_rstd_.data() + i, n, C);
  // In the forward pass this was mid = x + c_proj(attention(q, k, v)). dresid now holds ∂L/∂mid,
  // which again flows to x by the skip path.
  blocks::typed::dense_backward(atty_.data() + i * C, w.projw, dresid, datty_.data() + n0 * C, g.projw, g.projb, n, C,
                                C, false);
}

template <class S>
void Gpt<S>::backward(S loss_scale) {
  const std::int64_t L = cfg_.layers, N = N_, C = cfg_.embd, V = cfg_.vocab, H = cfg_.heads, D = C / H;
  S* P = params.data();
  const auto n_params = static_cast<std::int64_t>(params.size());
  auto shard_grads = [&](std::int64_t s) {
    return s == 0 ? grads.data() : shard_grads_[static_cast<std::size_t>(s - 1)].data();
  };

  for_shards([&](std::int64_t s, std::int64_t n0, std::int64_t n) {
    S* G = shard_grads(s);
    if (s > 0) std::fill(G, G + n_params, S(0));
    // In the forward pass the loss was the mean over N positions of −log softmax(logits)[target],
    // so now ∂/∂logits = (probs − onehot) · loss_scale / N.
    S* dlogits = dlogits_.data() + n0 * V;
    blocks::typed::crossentropy_backward(dlogits, probs_.data() + n0 * V, targets_.data() + n0, n, V,
                                         static_cast<S>(loss_scale / static_cast<S>(N)));
    // logits = lnf · wteᵀ: the tied unembedding adds its gradient into the token embedding's.
    S* dln = dln_.data() + n0 * C;
    S* dresid = dresid_.data() + n0 * C;
    blocks::typed::dense_backward(lnf_.data() + n0 * C, P + wte_, dlogits, dln, G + wte_, static_cast<S*>(nullptr), n,
                                  C, V, false);
    std::fill(dresid, dresid + n * C, S(0));
    blocks::typed::layernorm_backward(dresid, G + lnfw_, lnfb_ < 0 ? nullptr : G + lnfb_, dln,
                                      resid_.data() + (L * N + n0) * C, P + lnfw_, lnf_mean_.data() + n0,
                                      lnf_rstd_.data() + n0, n, C);
    block_backward_to_attention(L - 1, G, n0, n);
  });

  AttentionOptions causal;
  causal.causal = true;
  for (std::int64_t l = L - 1; l >= 0; --l) {
    S* qkv = qkv_.data() + l * N * 3 * C;
    S* atty = atty_.data() + l * N * C;
    attention_backward(heads_view(qkv, B_, H, T_, D, 3 * C, 0), heads_view(qkv, B_, H, T_, D, 3 * C, C),
                       heads_view(qkv, B_, H, T_, D, 3 * C, 2 * C), heads_view(atty, B_, H, T_, D, C, 0),
                       heads_view(datty_.data(), B_, H, T_, D, C, 0),
                       View::contiguous(lse_.data() + l * B_ * H * T_, dtype_of<S>(), {B_, H, T_}),
                       heads_view(dq_.data(), B_, H, T_, D, C, 0), heads_view(dk_.data(), B_, H, T_, D, C, 0),
                       heads_view(dv_.data(), B_, H, T_, D, C, 0), causal);
    for_shards([&](std::int64_t s, std::int64_t n0, std::int64_t n) {
      S* G = shard_grads(s);
      const LayerPtrs w = layer(P, l), g = layer(G, l);
      const std::int64_t i = l * N + n0;
      S* dln = dln_.data() + n0 * C;
      S* dresid = dresid_.data() + n0 * C;
      // In the forward pass this was q | k | v = c_attn(ln_1(x)), and x also went on by the skip path.
      // c_attn's weight [3C, C] is W_Q, W_K, W_V stacked by rows, so each is a contiguous [C, C] block.
      const S* dqkv[3] = {dq_.data() + n0 * C, dk_.data() + n0 * C, dv_.data() + n0 * C};
      for (std::int64_t part = 0; part < 3; ++part)
        blocks::typed::dense_backward(ln1_.data() + i * C, w.qkvw + part * C * C, dqkv[part], dln,
                                      g.qkvw + part * C * C, g.qkvb ? g.qkvb + part * C : nullptr, n, C, C, part > 0);
      blocks::typed::layernorm_backward(dresid, g.ln1w, g.ln1b, dln, resid_.data() + i * C, w.ln1w,
                                        ln1_mean_.data() + i, ln1_rstd_.data() + i, n, C);
      if (l > 0) {
        block_backward_to_attention(l - 1, G, n0, n);
        return;
      }
      // In the forward pass this was resid[0] = wte[token] + wpe[position].
      blocks::typed::embedding_backward(G + wte_, G + wpe_, dresid, tokens_.data() + n0, n, T_, C);
    });
  }

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

template class Gpt<float>;
template class Gpt<double>;

}  // namespace qkv::train
