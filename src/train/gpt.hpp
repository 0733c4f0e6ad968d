// Internal: a GPT-2 style transformer as training sees it — the forward of a whole batch that keeps
// every activation, and the backward through all of it (llm.c style).
//
//   tokens [B, T] → wte[tok] + wpe[pos] → L × { x += attn(ln_1(x)); x += mlp(ln_2(x)) } → ln_f
//   → logits = x · wteᵀ (tied unembedding) → cross-entropy against the next token at every position.
//
// attn: causal multi-head self-attention through qkv::attention / qkv::attention_backward (the
// fastest kernel that takes the call, picked automatically); mlp: c_fc (C → 4C), GELU,
// c_proj (4C → C).
//
// Threads: the batch is cut into P shards of whole sequences (P = min(threads, B)), and everything
// but attention runs shard by shard, one thread each, from one parallel region to the next attention
// call: the projections are single-threaded sgemms over a shard's rows, with no fork/join inside.
// Attention runs over the whole batch on all threads. Shard s > 0 adds its parameter gradients into
// a buffer of its own, summed into `grads` in shard order at the end of backward(), so a run is
// reproducible bit for bit for a given thread count. Parameters live in one flat array, in the order and under the names of
// nanoGPT's state_dict (so a checkpoint loads into the PyTorch twin as it is).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/rng.hpp"

namespace qkv::train {

struct GptConfig {
  std::int64_t vocab = 0;    // V
  std::int64_t context = 64; // T, the longest sequence (rows of wpe)
  std::int64_t layers = 4;   // L
  std::int64_t heads = 4;    // H (head dim D = C / H)
  std::int64_t embd = 128;   // C
  bool bias = false;         // biases in the linear layers and LayerNorms (nanoGPT's `bias`)

  // Throws std::invalid_argument naming `fn` if a size is out of range or heads ∤ embd.
  void validate(const char* fn) const;
  bool operator==(const GptConfig&) const = default;
};

// One named tensor of the flat parameter array.
struct ParamInfo {
  std::string name;                 // nanoGPT name, e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<std::int64_t> shape;  // torch layout ([out, in] for linear weights)
  std::int64_t offset = 0;          // into the flat array, in elements
  std::int64_t numel = 0;
  bool decay = false;               // weight decay applies (matrices and embeddings; not biases or gains)
};

std::vector<ParamInfo> param_layout(const GptConfig& cfg);
std::int64_t param_count(const GptConfig& cfg);

// S = float trains; S = double is the f64 twin the gradient checks take finite differences of.
template <class S>
class Gpt {
 public:
  // Activations sized for batches of B sequences of exactly T ≤ cfg.context positions.
  Gpt(const GptConfig& cfg, std::int64_t B, std::int64_t T);

  // nanoGPT's initialisation: N(0, 0.02) for matrices and embeddings, N(0, 0.02/√(2L)) for the two
  // residual projections (c_proj) of each layer, zero biases, unit LayerNorm gains.
  void init(Rng& rng);
  void zero_grad();

  // tokens, targets: [B, T] in [0, V). Returns the mean cross-entropy over all B·T positions and
  // keeps the activations for backward().
  double forward(const std::int32_t* tokens, const std::int32_t* targets);
  // Adds ∂(loss_scale · mean loss)/∂params to grads (loss_scale = 1/steps of accumulation).
  void backward(S loss_scale);

  const GptConfig& config() const { return cfg_; }
  const std::vector<ParamInfo>& layout() const { return layout_; }
  std::vector<S> params;  // [param_count]
  std::vector<S> grads;   // [param_count]

 private:
  struct LayerPtrs {  // one layer's tensors inside a flat array (params or grads); biases may be null
    S *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  LayerPtrs layer(S* base, std::int64_t l) const;
  S* tensor(S* base, const std::string& name) const;  // null if the tensor does not exist (no bias)

  // Runs fn(s, n0, n) for every shard s on its own thread: rows [n0, n0 + n) of the [N, …] buffers.
  template <class F>
  void for_shards(F&& fn);
  // The MLP half of layer l and the attention output projection, backward, on rows [n0, n0 + n),
  // gradients into G: dresid holds ∂L/∂(layer l's output) on entry, datty ∂L/∂(attention output).
  void block_backward_to_attention(std::int64_t l, S* G, std::int64_t n0, std::int64_t n);

  GptConfig cfg_;
  std::vector<ParamInfo> layout_;
  std::int64_t B_, T_, N_;  // N = B·T tokens
  std::vector<std::int64_t> layer_offsets_;  // [L, 12] offset of each LayerPtrs tensor, −1 if absent
  std::int64_t wte_, wpe_, lnfw_, lnfb_;     // offsets (lnfb_ −1 without biases)
  std::int64_t shards_;                      // P
  std::vector<std::vector<S>> shard_grads_;  // [P − 1][param_count] gradients of shards 1 … P−1

  // Activations kept by forward(); shapes per layer, stacked over L where it says [L, …].
  std::vector<std::int32_t> tokens_, targets_;  // [N]
  std::vector<S> resid_;      // [L+1, N, C] residual stream entering layer l (l = L: leaving the last)
  std::vector<S> ln1_, ln1_mean_, ln1_rstd_;  // [L, N, C], [L, N], [L, N]
  std::vector<S> qkv_;        // [L, N, 3C]  q | k | v of each token, head h at columns h·D … h·D+D−1
  std::vector<S> atty_;       // [L, N, C]   attention output, heads side by side
  std::vector<S> lse_;        // [L, B, H, T] logsumexp of each attention row (for the backward)
  std::vector<S> resid_mid_;  // [L, N, C]   residual stream after the attention half
  std::vector<S> ln2_, ln2_mean_, ln2_rstd_;
  std::vector<S> fch_;        // [L, N, 4C]  c_fc output (GELU input), then GELU's slope there (backward)
  std::vector<S> fch_gelu_;   // [L, N, 4C]
  std::vector<S> lnf_, lnf_mean_, lnf_rstd_;  // [N, C], [N], [N]
  std::vector<S> probs_;      // [N, V] softmax of the logits
  std::vector<S> losses_;     // [N]

  // Scratch of forward/backward, reused layer after layer.
  std::vector<S> dresid_;     // [N, C]  ∂L/∂(residual stream) at the current depth
  std::vector<S> dln_;        // [N, C]
  std::vector<S> datty_;      // [N, C]
  std::vector<S> dq_, dk_, dv_;  // [N, C] each
  std::vector<S> dfch_, dfch_gelu_;  // [N, 4C]
  std::vector<S> dlogits_;    // [N, V]
};

}  // namespace qkv::train
