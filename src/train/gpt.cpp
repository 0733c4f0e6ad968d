#include "train/gpt.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "blocks/training_layers.hpp"
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
  tmp_.resize(N * C), dresid_.resize(N * C), dln_.resize(N * C), datty_.resize(N * C);
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
  const std::string p = "transformer.h." + std::to_string(l) + ".";
  return {tensor(base, p + "ln_1.weight"),     tensor(base, p + "ln_1.bias"),
          tensor(base, p + "attn.c_attn.weight"), tensor(base, p + "attn.c_attn.bias"),
          tensor(base, p + "attn.c_proj.weight"), tensor(base, p + "attn.c_proj.bias"),
          tensor(base, p + "ln_2.weight"),     tensor(base, p + "ln_2.bias"),
          tensor(base, p + "mlp.c_fc.weight"), tensor(base, p + "mlp.c_fc.bias"),
          tensor(base, p + "mlp.c_proj.weight"), tensor(base, p + "mlp.c_proj.bias")};
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
  S* wte = tensor(P, "transformer.wte.weight");
  blocks::typed::embedding_forward(resid_.data(), tokens, wte, tensor(P, "transformer.wpe.weight"), N, T_, C);

  AttentionOptions causal;
  causal.causal = true;  // every position predicts its next token at once, seeing only its past
  for (std::int64_t l = 0; l < L; ++l) {
    const LayerPtrs w = layer(P, l);
    S* x = resid_.data() + l * N * C;
    S* ln1 = ln1_.data() + l * N * C;
    S* qkv = qkv_.data() + l * N * 3 * C;
    S* atty = atty_.data() + l * N * C;
    S* mid = resid_mid_.data() + l * N * C;
    S* ln2 = ln2_.data() + l * N * C;
    S* fch = fch_.data() + l * N * 4 * C;
    S* fch_gelu = fch_gelu_.data() + l * N * 4 * C;
    S* x_next = resid_.data() + (l + 1) * N * C;

    blocks::typed::layernorm_forward(ln1, ln1_mean_.data() + l * N, ln1_rstd_.data() + l * N, x, w.ln1w, w.ln1b, N, C);
    blocks::typed::dense_forward(ln1, w.qkvw, w.qkvb, qkv, N, C, 3 * C);
    attention(heads_view(qkv, B_, H, T_, D, 3 * C, 0), heads_view(qkv, B_, H, T_, D, 3 * C, C),
              heads_view(qkv, B_, H, T_, D, 3 * C, 2 * C), heads_view(atty, B_, H, T_, D, C, 0), causal,
              View::contiguous(lse_.data() + l * B_ * H * T_, dtype_of<S>(), {B_, H, T_}));
    blocks::typed::dense_forward(atty, w.projw, w.projb, tmp_.data(), N, C, C);
#pragma omp simd
    for (std::int64_t i = 0; i < N * C; ++i) mid[i] = x[i] + tmp_[static_cast<std::size_t>(i)];

    blocks::typed::layernorm_forward(ln2, ln2_mean_.data() + l * N, ln2_rstd_.data() + l * N, mid, w.ln2w, w.ln2b, N, C);
    blocks::typed::dense_forward(ln2, w.fcw, w.fcb, fch, N, C, 4 * C);
    blocks::typed::gelu_forward(fch_gelu, fch, N * 4 * C);
    blocks::typed::dense_forward(fch_gelu, w.fcprojw, w.fcprojb, tmp_.data(), N, 4 * C, C);
#pragma omp simd
    for (std::int64_t i = 0; i < N * C; ++i) x_next[i] = mid[i] + tmp_[static_cast<std::size_t>(i)];
  }

  blocks::typed::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), resid_.data() + L * N * C,
                            tensor(P, "transformer.ln_f.weight"), tensor(P, "transformer.ln_f.bias"), N, C);
  blocks::typed::dense_forward(lnf_.data(), wte, static_cast<const S*>(nullptr), probs_.data(), N, C, V);  // logits
  const double total =
      blocks::typed::crossentropy_forward(probs_.data(), losses_.data(), probs_.data(), targets, N, V);
  return total / static_cast<double>(N);
}

template <class S>
void Gpt<S>::backward(S loss_scale) {
  const std::int64_t L = cfg_.layers, N = N_, C = cfg_.embd, V = cfg_.vocab, H = cfg_.heads, D = C / H;
  S* P = params.data();
  S* G = grads.data();
  S* wte = tensor(P, "transformer.wte.weight");
  S* dwte = tensor(G, "transformer.wte.weight");

  // In the forward pass the loss was the mean over N positions of −log softmax(logits)[target],
  // so now ∂/∂logits = (probs − onehot) · loss_scale / N.
  blocks::typed::crossentropy_backward(dlogits_.data(), probs_.data(), targets_.data(), N, V,
                                static_cast<S>(loss_scale / static_cast<S>(N)));
  // logits = lnf · wteᵀ: the tied unembedding adds its gradient into the token embedding's.
  blocks::typed::dense_backward(lnf_.data(), wte, dlogits_.data(), dln_.data(), dwte, static_cast<S*>(nullptr), N, C, V,
                         false);
  std::fill(dresid_.begin(), dresid_.end(), S(0));
  blocks::typed::layernorm_backward(dresid_.data(), tensor(G, "transformer.ln_f.weight"), tensor(G, "transformer.ln_f.bias"),
                             dln_.data(), resid_.data() + L * N * C, tensor(P, "transformer.ln_f.weight"),
                             lnf_mean_.data(), lnf_rstd_.data(), N, C);

  AttentionOptions causal;
  causal.causal = true;
  for (std::int64_t l = L - 1; l >= 0; --l) {
    const LayerPtrs w = layer(P, l), g = layer(G, l);
    S* x = resid_.data() + l * N * C;
    S* ln1 = ln1_.data() + l * N * C;
    S* qkv = qkv_.data() + l * N * 3 * C;
    S* atty = atty_.data() + l * N * C;
    S* mid = resid_mid_.data() + l * N * C;
    S* ln2 = ln2_.data() + l * N * C;
    S* fch = fch_.data() + l * N * 4 * C;
    S* fch_gelu = fch_gelu_.data() + l * N * 4 * C;

    // In the forward pass this was x_next = mid + c_proj(gelu(c_fc(ln_2(mid)))). dresid holds
    // ∂L/∂x_next; the skip path hands it to mid unchanged, the MLP branch adds its part below.
    blocks::typed::dense_backward(fch_gelu, w.fcprojw, dresid_.data(), dfch_gelu_.data(), g.fcprojw, g.fcprojb, N, 4 * C,
                           C, false);
    blocks::typed::gelu_backward(dfch_.data(), fch, dfch_gelu_.data(), N * 4 * C);
    blocks::typed::dense_backward(ln2, w.fcw, dfch_.data(), dln_.data(), g.fcw, g.fcb, N, C, 4 * C, false);
    blocks::typed::layernorm_backward(dresid_.data(), g.ln2w, g.ln2b, dln_.data(), mid, w.ln2w,
                               ln2_mean_.data() + l * N, ln2_rstd_.data() + l * N, N, C);

    // In the forward pass this was mid = x + c_proj(attention(q, k, v)) with q | k | v =
    // c_attn(ln_1(x)). dresid now holds ∂L/∂mid, which again flows to x by the skip path.
    blocks::typed::dense_backward(atty, w.projw, dresid_.data(), datty_.data(), g.projw, g.projb, N, C, C, false);
    attention_backward(heads_view(qkv, B_, H, T_, D, 3 * C, 0), heads_view(qkv, B_, H, T_, D, 3 * C, C),
                       heads_view(qkv, B_, H, T_, D, 3 * C, 2 * C), heads_view(atty, B_, H, T_, D, C, 0),
                       heads_view(datty_.data(), B_, H, T_, D, C, 0),
                       View::contiguous(lse_.data() + l * B_ * H * T_, dtype_of<S>(), {B_, H, T_}),
                       heads_view(dq_.data(), B_, H, T_, D, C, 0), heads_view(dk_.data(), B_, H, T_, D, C, 0),
                       heads_view(dv_.data(), B_, H, T_, D, C, 0), causal);
    // c_attn's weight [3C, C] is W_Q, W_K, W_V stacked by rows, so each is a contiguous [C, C] block.
    const S* dqkv[3] = {dq_.data(), dk_.data(), dv_.data()};
    for (std::int64_t part = 0; part < 3; ++part)
      blocks::typed::dense_backward(ln1, w.qkvw + part * C * C, dqkv[part], dln_.data(), g.qkvw + part * C * C,
                             g.qkvb ? g.qkvb + part * C : nullptr, N, C, C, part > 0);
    blocks::typed::layernorm_backward(dresid_.data(), g.ln1w, g.ln1b, dln_.data(), x, w.ln1w, ln1_mean_.data() + l * N,
                               ln1_rstd_.data() + l * N, N, C);
  }
  // In the forward pass this was resid[0] = wte[token] + wpe[position].
  blocks::typed::embedding_backward(dwte, tensor(G, "transformer.wpe.weight"), dresid_.data(), tokens_.data(), N, T_, C);
}

template class Gpt<float>;
template class Gpt<double>;

}  // namespace qkv::train
