// Internal: the model of qkv/model.hpp as training sees it — the forward of a whole batch of
// sequences that keeps every activation, and the backward through all of it (llm.c style). The
// configuration is qkv::Config and the parameters are exactly Weights::tensors() (names, shapes,
// order), so what this trains qkv::Model serves, and what qkv::Model loads this fine-tunes.
//
//   tokens [B, T] → wte[tok] (+ wpe[pos] when learned) → L × { x += W_O·attn(rope(W_Q·n1(x)),
//   rope(W_K·n1(x)), W_V·n1(x)) + b_O;  x += MLP(n2(x)) } → final norm → logits = x · W_clsᵀ
//   → cross-entropy against the next token at every position, all positions at once.
//
// n1, n2, final norm: LayerNorm (with bias when config.bias) or RMSNorm; rope only with rotary
// positions; attention: causal, H query heads over Hkv key/value heads (query head h reads kv head
// h / (H / Hkv)) through qkv::attention / qkv::attention_backward (the fastest kernel that takes
// the call; the reference kernel for S = double); MLP: W2·gelu(W1·h + b1) + b2 (tanh or exact GELU)
// or W2·(silu(W1·h) ⊙ W3·h); W_cls = wte when tied.
//
// Dimension letters: B sequences of T positions, N = B·T rows, C = dim, Hd = hidden_dim,
// H, Hkv heads of D = C / H, V = vocab_size, L = n_layers.
//
// Threads: the batch is cut into P shards of whole sequences (P = min(threads, B)); everything but
// attention runs shard by shard, one thread each (single-threaded sgemms over a shard's rows), from
// one attention call to the next; attention runs over the whole batch on all threads. Shard s > 0
// adds its parameter gradients into a buffer of its own, summed into `grads` in shard order at the
// end of backward(), so a run is reproducible bit for bit for a given thread count.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/attention.hpp"
#include "qkv/model.hpp"

namespace qkv {

// One named tensor of the flat parameter array (Weights::tensors() order, packed).
struct ParamInfo {
  std::string name;                 // Weights::tensors()' name, e.g. "layers.0.attention.wq.weight"
  std::vector<std::int64_t> shape;  // [out, in] for matrices
  std::int64_t offset = 0;          // into the flat array, in elements
  std::int64_t numel = 0;
  bool decay = false;               // weight decay applies: matrices and embeddings (2-D), not biases or gains
};

std::vector<ParamInfo> param_layout(const Config& c);
std::int64_t param_count(const Config& c);

// Throws std::invalid_argument naming `fn` and the config key unless training implements every
// feature of c (an encoder's bidirectional attention, post-norm and token types are not).
void check_trainable(const Config& c, std::string_view fn);

// S = float trains; S = double is the f64 twin the gradient checks take finite differences of.
template <class S>
class Trainable {
 public:
  // Activations for batches of B sequences of exactly T ≤ config.seq_len positions.
  Trainable(const Config& c, std::int64_t B, std::int64_t T);

  void zero_grad();
  // tokens, targets: [B, T] in [0, V). Returns the mean cross-entropy over all B·T positions and
  // keeps the activations for backward().
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  // Adds ∂(loss_scale · mean loss)/∂params to grads (loss_scale = 1/steps of accumulation).
  void backward(S loss_scale);

  // The parameters as f32 Weights (a copy, for qkv::Model and save_safetensors), and back from
  // Weights of the same config (fine-tuning, resuming); set_weights throws naming `what` otherwise.
  Weights to_weights() const;
  void set_weights(const Weights& w, std::string_view what);

  const Config& config() const { return cfg_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  std::vector<S> params;  // [param_count]
  std::vector<S> grads;   // [param_count]

 private:
  struct LayerPtrs {  // one layer's tensors inside a flat array (params or grads); null where absent
    S *n1w, *n1b, *wq, *bq, *wk, *bk, *wv, *bv, *wo, *bo, *n2w, *n2b, *w1, *b1, *w2, *b2, *w3;
  };
  static constexpr int kLayerTensors = 17;
  LayerPtrs layer(S* base, std::int64_t l) const;

  template <class F>
  void for_shards(F&& fn);
  // Rows [n0, n0 + n) of layer l from its input (resid_[l]) to the attention's input (q, k, v).
  void to_attention(std::int64_t l, std::int64_t n0, std::int64_t n);
  // Rows [n0, n0 + n) of layer l after its attention: W_O, the MLP half, and, after the last layer,
  // the final norm, logits and loss.
  void from_attention(std::int64_t l, std::int64_t n0, std::int64_t n);
  // Backward of the MLP half and of W_O of layer l on rows [n0, n0 + n), gradients into G:
  // dresid holds ∂L/∂(layer l's output) on entry, ∂L/∂(layer l's input) from the skip paths on
  // exit, datt ∂L/∂(attention output).
  void backward_to_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n);
  // Backward of W_Q, W_K, W_V (through rope) and n1 of layer l on rows [n0, n0 + n).
  void backward_from_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n);
  // Layer l's causal attention and its backward for the whole sequences in rows [n0, n0 + n)
  // (att, lse from q, k, v; dq, dk, dv from datt), on one thread when the pass is sharded.
  void attention_forward(std::int64_t l, std::int64_t n0, std::int64_t n);
  void attention_backward_rows(std::int64_t l, std::int64_t n0, std::int64_t n);
  AttentionOptions shard_attention_options() const;
  void norm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b, std::int64_t n) const;
  void norm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w, const S* mean, const S* rstd,
                     std::int64_t n) const;

  Config cfg_;
  std::vector<ParamInfo> layout_;
  std::int64_t B_, T_, N_;  // N = B·T rows
  std::int64_t C_, D_, QD_, KD_, Hd_, V_;  // C, D, H·D, Hkv·D, Hd, V
  std::vector<std::int64_t> layer_offsets_;  // [L, kLayerTensors] offset of each LayerPtrs tensor, −1 if absent
  std::int64_t wte_, wpe_, nfw_, nfb_, wcls_;  // offsets (−1 if absent; wcls_ = wte_ when tied)
  std::int64_t shards_;                        // P
  std::vector<std::vector<S>> shard_grads_;    // [P − 1][param_count] gradients of shards 1 … P−1
  std::vector<S> rope_cs_;                     // [T, D] blocks::rope_angles of positions 0 … T − 1 (rotary only)

  // Activations kept by forward(); [L, …] stacks one per layer.
  std::vector<std::int32_t> tokens_, targets_;  // [N]
  std::vector<S> resid_;                  // [L+1, N, C] residual stream entering layer l (l = L: leaving the last)
  std::vector<S> n1_, n1_mean_, n1_rstd_;  // [L, N, C], [L, N] (LayerNorm only), [L, N]
  std::vector<S> q_, k_, v_;              // [L, N, H·D], [L, N, Hkv·D] ×2: after rope (the attention's inputs)
  std::vector<S> att_;                    // [L, N, H·D] attention output, heads side by side
  std::vector<S> lse_;                    // [L, B, H, T] logsumexp of each attention row (for the backward)
  std::vector<S> mid_;                    // [L, N, C] residual stream after the attention half
  std::vector<S> n2_, n2_mean_, n2_rstd_;
  std::vector<S> h1_;                     // [L, N, Hd] W1 output (gelu: then the GELU's slope there)
  std::vector<S> hg_;                     // [L, N, Hd] W2's input: gelu(h1) or silu(h1) ⊙ h3
  std::vector<S> h3_;                     // [L, N, Hd] W3 output (SwiGLU only)
  std::vector<S> nf_, nf_mean_, nf_rstd_;  // [N, C], [N], [N]
  std::vector<S> probs_;                  // [N, V] softmax of the logits
  std::vector<S> losses_;                 // [N]

  // Scratch of the backward, reused layer after layer.
  std::vector<S> dresid_, dn_;            // [N, C]
  std::vector<S> datt_, dq_;              // [N, H·D]
  std::vector<S> dk_, dv_;                // [N, Hkv·D]
  std::vector<S> dh1_, dhg_, dh3_;        // [N, Hd]
  std::vector<S> dlogits_;                // [N, V]
};

}  // namespace qkv
