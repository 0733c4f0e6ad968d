// Internal: the layers of the transformer (qkv::Config's space) as training needs them, llm.c style — each a
// `*_forward` that keeps what its backward will read, and a `*_backward` that turns ∂L/∂out into
// ∂L/∂in and the parameter gradients. Plain contiguous row-major pointers, templates on the scalar:
// S = float trains (the embedding forward is blocks/layers.hpp's; LayerNorm, GELU and softmax are
// vectorised versions of the same functions, agreeing with them to f32 rounding); S = double is
// the f64 twin that the gradient checks take finite differences of. Every function is serial: the
// model (model/trainable.cpp) runs them on slices of the batch, one slice per thread. Sizes:
//
//   N  tokens in the batch (B·T)      T  positions per sequence      C  channels (embedding width)
//   V  vocabulary size                n  element count of an elementwise layer
//   nh heads in a row                 hs head size (even for rotary)
//
// Parameter gradients (dwte, dwpe, dw, db) always accumulate (+=), so micro-batches add up;
// input gradients accumulate where the residual stream branches (said at each function).
// Projections are blocks::linear_forward / linear_backward; attention is qkv::attention.
#pragma once

#include <cstdint>

// In their own namespace so that these templates never compete in overload resolution with the
// f32 functions of the same names in blocks/layers.hpp.
namespace qkv::blocks::typed {

// Each function below is a template on the scalar S ∈ {float, double}.

// out[n, :] = wte[tok[n], :] + wpe[n % T, :]          tok [N] in [0, V)   out [N, C]
// wpe may be null (rotary or no positions): out[n, :] = wte[tok[n], :].
template <class S>
void embedding_forward(S* out, const std::int32_t* tok, const S* wte, const S* wpe, std::int64_t N,
                       std::int64_t T, std::int64_t C);
// dwte[tok[n], :] += dout[n, :];  dwpe[n % T, :] += dout[n, :] (dwpe null: no positions)
template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tok, std::int64_t N,
                        std::int64_t T, std::int64_t C);

// LayerNorm over the last axis (torch.nn.LayerNorm; its default eps is 1e-5).
//   x [N, C] → out [N, C];  mean [N], rstd [N] kept for the backward;  b may be null (no bias).
template <class S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b,
                       std::int64_t N, std::int64_t C, S eps);
// dx += ∂L/∂x (the residual stream also reaches x by its skip path);  dw += …;  db += … (db may be null).
template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w,
                        const S* mean, const S* rstd, std::int64_t N, std::int64_t C);

// RMSNorm (Llama): out = x · rstd ⊙ w, rstd = 1/√(mean_c x² + eps).  x [N, C], w [C], rstd [N] kept.
template <class S>
void rmsnorm_forward(S* out, S* rstd, const S* x, const S* w, std::int64_t N, std::int64_t C, S eps);
// dx += ∂L/∂x (the skip path also reaches x);  dw += Σ_n dout · x · rstd.
template <class S>
void rmsnorm_backward(S* dx, S* dw, const S* dout, const S* x, const S* w, const S* rstd, std::int64_t N,
                      std::int64_t C);

// Rotary position embedding, in place, in blocks::rope_forward's convention (interleaved pairs):
// row n of x [N, nh, hs] is at position n % T, and pair i of each head turns by the angle whose
// cosine and sine are cos[n % T, i], sin[n % T, i] (tables [T, hs/2] the caller computes once, in
// f32 exactly as blocks::rope_forward for S = float, so training and inference rotate alike).
template <class S>
void rope_forward(S* x, const S* cos, const S* sin, std::int64_t N, std::int64_t T, std::int64_t nh, std::int64_t hs);
// The rotation is orthogonal, so the backward turns dx (in place) by the opposite angle.
template <class S>
void rope_backward(S* dx, const S* cos, const S* sin, std::int64_t N, std::int64_t T, std::int64_t nh,
                   std::int64_t hs);
// rope_tables: cos, sin [T, hs/2] for positions 0 … T − 1: angle = t · theta^(−2i/hs).
template <class S>
void rope_tables(S* cos, S* sin, std::int64_t T, std::int64_t hs, S theta);

// SwiGLU gate (Llama MLP): out = silu(gate) ⊙ up, silu(g) = g·σ(g).   gate, up, out [n]
template <class S>
void swiglu_forward(S* out, const S* gate, const S* up, std::int64_t n);
// dgate = dout · up · σ(g)(1 + g(1 − σ(g))),  dup = dout · silu(g)  (both overwritten).
template <class S>
void swiglu_backward(S* dgate, S* dup, const S* dout, const S* gate, const S* up, std::int64_t n);

// GELU, the tanh approximation (GPT-2's "gelu_new"): out = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³);
// slope = ½(1 + tanh u) + ½x(1 − tanh²u)·√(2/π)(1 + 3·0.044715x²). slope may be x's own memory.
// The backward is gelu_backward (dout · slope).
template <class S>
void gelu_tanh_forward(S* out, S* slope, const S* x, std::int64_t n);

// GELU, exact (erf) form — torch.nn.GELU(), as nanoGPT uses:     x, out, slope [n]
//   out = x·Φ(x) = ½x(1 + erf(x/√2)),  slope = gelu'(x) = Φ(x) + x·φ(x),  φ(x) = e^(−x²/2)/√(2π).
// The slope is what the backward needs, and the forward has Φ and φ at hand: keeping it saves the
// backward a second erf and exp. slope may be x's own memory (x is then overwritten).
template <class S>
void gelu_forward(S* out, S* slope, const S* x, std::int64_t n);
// dx = dout · slope  (overwrites dx; slope from gelu_forward).
template <class S>
void gelu_backward(S* dx, const S* slope, const S* dout, std::int64_t n);

// Softmax cross-entropy of every position at once.
//   logits [N, V] → probs [N, V] (softmax; may be the logits' own memory), losses [N] =
//   −log probs[n, targets[n]]; returns Σ losses.
template <class S>
double crossentropy_forward(S* probs, S* losses, const S* logits, const std::int32_t* targets,
                            std::int64_t N, std::int64_t V);
// dlogits = scale · (probs − onehot(targets))  (overwrites; scale = 1/N for a mean loss).
template <class S>
void crossentropy_backward(S* dlogits, const S* probs, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, S scale);

// y = x · Wᵀ + b (y += … when accumulate) and its backward, as blocks::linear_* (same argument order
// and accumulation rules): S = float runs the oneDNN sgemm of linear.hpp (on one thread when called
// inside a parallel region); S = double runs plain f64 loops (the twin).
template <class S>
void dense_forward(const S* x, const S* W, const S* b, S* y, std::int64_t N, std::int64_t in, std::int64_t out,
                   bool accumulate = false);
template <class S>
void dense_backward(const S* x, const S* W, const S* dy, S* dx, S* dW, S* db, std::int64_t N, std::int64_t in,
                    std::int64_t out, bool accumulate_dx);

}  // namespace qkv::blocks::typed
