// Internal: the model of qkv/model.hpp as training sees it — the forward of a whole batch of
// sequences that keeps every activation, and the backward through all of it (llm.c style). The
// configuration is qkv::Config and the parameters are exactly Weights::tensors() (names, shapes,
// order), so what this trains qkv::Model (decoders) or qkv::Encoder (encoders) serves, and what they
// load this fine-tunes. Two configurations of the one Config:
//
// Decoder (causal, pre-norm): next-token prediction at every position, all positions at once.
//   tokens [B, T] → wte[tok] (+ wpe[pos] when learned) → L × { x += W_O·attn(rope(W_Q·n1(x)),
//   rope(W_K·n1(x)), W_V·n1(x)) + b_O;  x += MLP(n2(x)) } → final norm → logits = x · W_clsᵀ
//   → cross-entropy against the next token at every position.
//
// Encoder (BERT: bidirectional, post-norm, mlm_head): BertForMaskedLM's masked-LM objective.
//   tokens [B, T] → x = n_e(wte[tok] + wpe[pos] + wtt[type]) → L × { x = n1(x + W_O·attn(W_Q·x,
//   W_K·x, W_V·x) + b_O);  x = n2(x + MLP(x)) } → (no final norm) → at the targeted positions only:
//   logits = LN(gelu(x · W_mᵀ + b_m)) · W_clsᵀ + b_out → cross-entropy, the mean over those positions
//   (the other positions' targets are kIgnoreTarget, transformers' −100).
//
// n_e, n1, n2, final norm: LayerNorm (with bias when config.bias) or RMSNorm; rope only with rotary
// positions; attention: causal or bidirectional, H query heads over Hkv key/value heads (query head
// h reads kv head h / (H / Hkv)) through qkv::attention / qkv::attention_backward (the fastest
// kernel that takes the call; the reference kernel for S = double); MLP: W2·gelu(W1·h + b1) + b2
// (tanh or exact GELU) or W2·(silu(W1·h) ⊙ W3·h); W_cls = wte when tied.
//
// Dimension letters: B sequences of T positions, N = B·T rows, C = dim, Hd = hidden_dim,
// H, Hkv heads of D = C / H, V = vocab_size, L = n_layers, M ≤ N targeted rows (encoder).
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
// feature of c: a causal pre-norm decoder (no token types, no MLM head), or a bidirectional post-norm
// encoder with the masked-LM head (mlm_head: its objective).
void check_trainable(const Config& c, std::string_view fn);

// An encoder's target at a position that is not predicted (transformers' ignore_index).
inline constexpr std::int32_t kIgnoreTarget = -100;

// S = float trains; S = double is the f64 twin the gradient checks take finite differences of.
template <class S>
class Trainable {
 public:
  // Activations for batches of B sequences of exactly T ≤ config.seq_len positions.
  Trainable(const Config& c, std::int64_t B, std::int64_t T);

  void zero_grad();
  // tokens: [B, T] in [0, V). targets [B, T]: a decoder's in [0, V) (the next tokens); an encoder's
  // in [0, V) where a position is predicted and kIgnoreTarget elsewhere, at least one predicted.
  // types: [B, T] token types in [0, type_vocab_size), or null (every token type 0); only for a
  // model with token types. Returns the mean cross-entropy over the predicted positions (a decoder:
  // all B·T) and keeps the activations for backward().
  double forward(const std::int32_t* tokens, const std::int32_t* targets, const std::int32_t* types = nullptr);
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
  // Rows [n0, n0 + n) of layer l after its attention: W_O, the norms and the MLP half, up to the
  // layer's output resid_[l + 1] (then the next layer's to_attention).
  void from_attention(std::int64_t l, std::int64_t n0, std::int64_t n);
  // Shard s (rows [n0, n0 + n)) after the last layer: the final norm (pre-norm), the objective's
  // logits and cross-entropy.
  void head_forward(std::int64_t s, std::int64_t n0, std::int64_t n);
  // Its backward, gradients into G: leaves ∂L/∂(the last layer's output) in dresid.
  void head_backward(std::int64_t s, S* G, S scale, std::int64_t n0, std::int64_t n);
  // Backward of the MLP half and of W_O of layer l on rows [n0, n0 + n), gradients into G:
  // dresid holds ∂L/∂(layer l's output) on entry, ∂L/∂(layer l's input) from the skip paths on
  // exit (post-norm: through the two norms), datt ∂L/∂(attention output).
  void backward_to_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n);
  // Backward of W_Q, W_K, W_V (through rope) and (pre-norm) n1 of layer l on rows [n0, n0 + n).
  void backward_from_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n);
  // The MLP on rows i … i + n of the [L, N, ·] stacks from its input `in` into y (which holds the
  // skip path), and its backward from dy into dx (added when accumulate, else overwritten).
  void mlp_forward(const LayerPtrs& w, std::int64_t i, const S* in, S* y, std::int64_t n);
  void mlp_backward(const LayerPtrs& w, const LayerPtrs& g, std::int64_t i, std::int64_t n0, const S* in, const S* dy,
                    S* dx, bool accumulate, std::int64_t n);
  // Sequences starting at rows n0 … n0 + n: the embedding (wte, wpe, wtt; post-norm: then n_e) into
  // resid_[0], and its backward from dresid.
  void embed_forward(std::int64_t n0, std::int64_t n);
  void embed_backward(S* G, std::int64_t n0, std::int64_t n);
  // Layer l's attention and its backward for the whole sequences in rows [n0, n0 + n)
  // (att, lse from q, k, v; dq, dk, dv from datt), on one thread when the pass is sharded.
  void attention_forward(std::int64_t l, std::int64_t n0, std::int64_t n);
  void attention_backward_rows(std::int64_t l, std::int64_t n0, std::int64_t n);
  AttentionOptions shard_attention_options() const;
  void norm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b, std::int64_t n) const;
  void norm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w, const S* mean, const S* rstd,
                     std::int64_t n) const;

  Config cfg_;
  bool post_;  // cfg_.post_norm
  std::vector<ParamInfo> layout_;
  std::int64_t B_, T_, N_;  // N = B·T rows
  std::int64_t C_, D_, QD_, KD_, Hd_, V_;  // C, D, H·D, Hkv·D, Hd, V
  std::vector<std::int64_t> layer_offsets_;  // [L, kLayerTensors] offset of each LayerPtrs tensor, −1 if absent
  std::int64_t wte_, wpe_, wtt_, new_, neb_, nfw_, nfb_, wcls_;  // offsets (−1 if absent; wcls_ = wte_ when tied)
  std::int64_t mw_, mb_, mnw_, mnb_, ob_;      // the MLM head's offsets (−1 without one)
  std::int64_t shards_;                        // P
  std::vector<std::vector<S>> shard_grads_;    // [P − 1][param_count] gradients of shards 1 … P−1
  std::vector<S> rope_cs_;                     // [T, D] blocks::rope_angles of positions 0 … T − 1 (rotary only)

  // Activations kept by forward(); [L, …] stacks one per layer. Pre-norm: n1 = norm1(x) is the
  // attention's input, mid = x + attention, n2 = norm2(mid) the MLP's input. Post-norm: the attention
  // reads x (resid), mid = x + attention, n1 = norm1(mid) is the MLP's input, n2 = n1 + MLP(n1) is
  // norm2's input, and norm2(n2) the layer's output.
  std::vector<std::int32_t> tokens_, targets_, types_;  // [N]
  std::int64_t count_ = 0;                // predicted positions (a decoder: N)
  std::vector<S> emb_, ne_mean_, ne_rstd_;  // post-norm: [N, C] the embedding sum, n_e's [N] statistics
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
  std::vector<S> nf_, nf_mean_, nf_rstd_;  // [N, C], [N], [N] (pre-norm)
  // The MLM head on the predicted rows: shard s's m_s rows are packed from its first row n0 on
  // (mlm_rows_[n0 + j] = the row of the j-th, mlm_targets_ their targets; mlm_count_[s] = m_s).
  std::vector<std::int64_t> mlm_rows_, mlm_count_;
  std::vector<std::int32_t> mlm_targets_;
  std::vector<S> mlm_x_, mlm_t_, mlm_g_;  // [N, C]: gathered hidden rows, W_m output (then GELU's slope), gelu
  std::vector<S> mlm_n_, mlm_mean_, mlm_rstd_;  // [N, C] LayerNorm output, [N] ×2
  std::vector<S> probs_;                  // [N, V] softmax of the logits (MLM: rows packed as mlm_rows_)
  std::vector<S> losses_;                 // [N] (MLM: packed)

  // Scratch of the backward, reused layer after layer.
  std::vector<S> dresid_, dn_;            // [N, C]
  std::vector<S> datt_, dq_;              // [N, H·D]
  std::vector<S> dk_, dv_;                // [N, Hkv·D]
  std::vector<S> dh1_, dhg_, dh3_;        // [N, Hd]
  std::vector<S> dlogits_;                // [N, V]
  std::vector<S> dmlm_;                   // [N, C] (MLM head)
};

}  // namespace qkv
