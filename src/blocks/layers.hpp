// Internal: the forward pass of every layer of a transformer besides attention and the dense
// projections (blocks/linear.hpp), as free functions over plain contiguous f32 pointers, llm.c
// style. Each function states the shapes of its buffers; outputs never alias inputs unless
// the comment says "in place". The backward twins live in their own files beside these.
//
// Dimension letters here: N rows (positions), C channels (d_model), V vocabulary,
// Hd hidden width of the MLP, nh heads, hs head size.
#pragma once

#include <cstdint>

namespace qkv::blocks {

// Token (and learned position) embedding, GPT-2 style when wpe is non-null.
//   tokens [N] in [0, V)   wte [V, C]   wpe [P, C] or null (P > pos0 + N − 1)   out [N, C]
//   out[n] = wte[tokens[n]] + wpe[pos0 + n]
void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0);

// RMSNorm (Llama):  out[n] = x[n] · rstd[n] ⊙ w,  rstd[n] = 1 / √(mean_c x[n,c]² + eps)
//   x [N, C]   w [C]   out [N, C] (may equal x)   rstd [N] or null (saved for the backward)
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, std::int64_t N, std::int64_t C,
                     float eps);

// LayerNorm (GPT-2):  out[n] = (x[n] − mean[n]) · rstd[n] ⊙ w + b,  rstd = 1 / √(var + eps)
//   x [N, C]   w [C]   b [C] or null   out [N, C] (may equal x)   mean, rstd [N] or null
//   var is the biased (population) variance, as torch.nn.LayerNorm computes it.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       std::int64_t N, std::int64_t C, float eps);

// Rotary position embedding (Llama, interleaved pairs), in place.
//   x [N, nh, hs] (rows of nh·hs floats), hs even; row n is at position pos0 + n.
//   Each pair (x[2i], x[2i+1]) of every head turns by the angle pos · theta^(−2i/hs):
//     x'[2i] = x[2i]·cos − x[2i+1]·sin      x'[2i+1] = x[2i]·sin + x[2i+1]·cos
//   The angle is computed in f32 exactly as llama2.c does, so greedy decoding matches it bit for bit.
void rope_forward(float* x, std::int64_t N, std::int64_t nh, std::int64_t hs, std::int64_t pos0, float theta);
// The same at one position in two parts, for decoding (the angles once a step, not once a head):
//   rope_angles: cs [hs] = (cos, sin) of each pair's angle at position pos, as rope_forward computes them
//   rope_apply:  x [nh, hs] turned by cs: the same bits as rope_forward(x, 1, nh, hs, pos, theta)
void rope_angles(float* cs, std::int64_t hs, std::int64_t pos, float theta);
void rope_apply(float* x, std::int64_t nh, std::int64_t hs, const float* cs);

// GELU, the tanh approximation GPT-2 uses: out = ½x(1 + tanh(√(2/π)(x + 0.044715x³))).
//   x [n]   out [n] (may equal x)
void gelu_forward(float* out, const float* x, std::int64_t n);

// GELU, exact (torch.nn.GELU(), nanoGPT): out = ½x(1 + erf(x/√2)).   x [n]   out [n] (may equal x)
void gelu_exact_forward(float* out, const float* x, std::int64_t n);

// SwiGLU gate (Llama MLP): out = silu(gate) ⊙ up,  silu(g) = g / (1 + e^(−g)).
//   gate, up [n]   out [n] (may equal gate or up)
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n);

// Row softmax:  probs[n, v] = exp(logits[n, v] − max) / Σ_v' exp(logits[n, v'] − max)
//   logits [N, V]   probs [N, V] (may equal logits)
void softmax_forward(float* probs, const float* logits, std::int64_t N, std::int64_t V);

// Residual add:  out = a + b.   a, b, out [n] (out may equal a or b)
void residual_forward(float* out, const float* a, const float* b, std::int64_t n);

}  // namespace qkv::blocks
