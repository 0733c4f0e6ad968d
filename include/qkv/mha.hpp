// qkv/mha.hpp — the multi-head attention block, as the seeds describe it.
//
// Each head h owns a query map W_Q^h and a key map W_K^h (width → d_head), and a value map that
// is factored in two: value-down W_V^h (d_source → d_value) and value-up W_O^h (d_value → d_model).
// The value-ups of all heads are stapled side by side into one output matrix
// W_O = [W_O^0 | W_O^1 | … | W_O^{H−1}], so that
//
//   Δe_i = Σ_h W_O^h · (Σ_j p^h_ij · W_V^h s_j)  (+ b_O)  =  W_O · concat_h(attention of head h)_i  (+ b_O)
//
// where p^h is head h's attention pattern of query i over the source positions j. Each head's own
// proposed change Δe^h (the term of the sum, without b_O, which belongs to no head) can be returned.
// Self-attention reads keys and values from x itself; cross-attention from another sequence
// `source` whose width d_source may differ from d_model and whose length Skv may differ from S.
//
// Weights, in torch.nn.Linear's layout (y = x·Wᵀ + b), row-major f32:
//
//   name  shape                    rows of head h
//   w_q   [H·Dh,    d_model]       h·Dh  … (h+1)·Dh          query
//   w_k   [Hkv·Dh,  d_source]      g·Dh  … (g+1)·Dh          key of kv head g = h / (H / Hkv)
//   w_v   [Hkv·Dv,  d_source]      g·Dv  … (g+1)·Dv          value-down of kv head g
//   w_o   [d_model, H·Dv]          columns h·Dv … (h+1)·Dv   value-up of head h (stapled)
//   b_q [H·Dh], b_k [Hkv·Dh], b_v [Hkv·Dv], b_o [d_model]    only when config.bias
//
// With grouped-query attention (Hkv < H) a key/value head serves H / Hkv query heads; nothing is
// copied to share it (qkv::attention reads kv head h / (H / Hkv) for query head h).
//
// forward() arguments, all f32 (x and source may have any strides; outputs must be contiguous):
//
//   x           [B, S,   d_model]      the embeddings that ask (queries) and receive the change
//   source      [B, Skv, d_source]     keys/values for cross-attention; absent: x (self-attention)
//   delta       [B, S,   d_model]      written: Δe, the block's proposed change to every embedding
//   head_delta  [B, H, S, d_model]     optional, written: Δe^h of each head; Σ_h Δe^h + b_o = Δe
//   pattern     [B, H, S, Skv]         optional, f32 or f64, written: each head's attention pattern
//   opt                                as for qkv::attention (scale, causal, masks, window …)
//
// backward() arguments (x, source, opt as in the forward it differentiates; all f32, outputs contiguous):
//
//   d_delta     [B, S,   d_model]      ∂L/∂Δe
//   dx          [B, S,   d_model]      written: ∂L/∂x (for self-attention through queries, keys and values)
//   d_source    [B, Skv, d_source]     written: ∂L/∂source; needed exactly when source is given
//   grads       MhaGrads               weight and bias gradients, ADDED to what they hold
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/attention.hpp"
#include "qkv/types.hpp"

namespace qkv {

struct MhaConfig {
  std::int64_t d_model = 0;
  std::int64_t d_source = 0;    // width of the key/value input; 0 = d_model
  std::int64_t n_heads = 0;     // H
  std::int64_t n_kv_heads = 0;  // Hkv; 0 = n_heads. Must divide n_heads.
  std::int64_t d_head = 0;      // Dh: query/key size of one head
  std::int64_t d_value = 0;     // Dv: value size of one head; 0 = d_head
  bool bias = false;            // biases b_q, b_k, b_v, b_o
};

// Gradients of every weight of a block, shaped like the weights (make them with make_grads()).
struct MhaGrads {
  Buffer w_q, w_k, w_v, w_o;
  Buffer b_q, b_k, b_v, b_o;  // numel 0 when the block has no biases
};

class MultiHeadAttention {
 public:
  // Validates the configuration (throws std::invalid_argument naming the field) and allocates
  // zero weights. config() returns it with the defaults (0 = …) resolved. Weights that would not
  // fit in the available memory throw qkv::OutOfMemory (qkv/memory.hpp, a std::bad_alloc) first;
  // so do make_grads() and forward()/backward() for their work buffers.
  explicit MultiHeadAttention(const MhaConfig& config);

  const MhaConfig& config() const { return cfg_; }

  // Fills every weight with N(0, 1/fan_in) and every bias with N(0, 0.01²), from a fixed seed.
  void init_random(std::uint64_t seed);

  // Δe = W_O · attention(W_Q x, W_K s, W_V s) + b_o, see the table above.
  void forward(const View& x, const std::optional<View>& source, const AttentionOptions& opt, const View& delta,
               const std::optional<View>& head_delta = std::nullopt,
               const std::optional<View>& pattern = std::nullopt) const;

  // Backward of forward(x, source, opt): recomputes the forward's projections and attention,
  // then writes dx (and d_source) and adds the weight gradients into grads.
  void backward(const View& x, const std::optional<View>& source, const AttentionOptions& opt,
                const View& d_delta, const View& dx, const std::optional<View>& d_source, MhaGrads& grads) const;

  // Zero gradients shaped like this block's weights.
  MhaGrads make_grads() const;

  // Bytes of the weights and biases (what the constructor and make_grads() allocate).
  std::uint64_t weight_bytes() const;

  // The weights (shapes in the table above). Their shapes are fixed; their values are the caller's.
  Buffer w_q, w_k, w_v, w_o;
  Buffer b_q, b_k, b_v, b_o;  // empty (numel 0) unless config().bias

 private:
  MhaConfig cfg_;
};

// The residual update e ← e + Δe: out = e + delta, elementwise, all f32 of the same shape
// (rank 1..4, contiguous). out may be e itself (in place).
void add_residual(const View& e, const View& delta, const View& out);

}  // namespace qkv
