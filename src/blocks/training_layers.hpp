// Internal: the layers of a GPT-2 style transformer as training needs them, llm.c style — each a
// `*_forward` that keeps what its backward will read, and a `*_backward` that turns ∂L/∂out into
// ∂L/∂in and the parameter gradients. Plain contiguous row-major pointers, templates on the scalar:
// S = float trains (the embedding forward is blocks/layers.hpp's; LayerNorm, GELU and softmax are
// vectorised versions of the same functions, agreeing with them to f32 rounding); S = double is
// the f64 twin that the gradient checks take finite differences of. Every function is serial: the
// model (train/gpt.cpp) runs them on slices of the batch, one slice per thread. Sizes:
//
//   N  tokens in the batch (B·T)      T  positions per sequence      C  channels (embedding width)
//   V  vocabulary size                n  element count of an elementwise layer
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
template <class S>
void embedding_forward(S* out, const std::int32_t* tok, const S* wte, const S* wpe, std::int64_t N,
                       std::int64_t T, std::int64_t C);
// dwte[tok[n], :] += dout[n, :];  dwpe[n % T, :] += dout[n, :]
template <class S>
void embedding_backward(S* dwte, S* dwpe, const S* dout, const std::int32_t* tok, std::int64_t N,
                        std::int64_t T, std::int64_t C);

// LayerNorm over the last axis, eps = 1e-5 (torch.nn.LayerNorm's default).
//   x [N, C] → out [N, C];  mean [N], rstd [N] kept for the backward;  b may be null (no bias).
template <class S>
void layernorm_forward(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b,
                       std::int64_t N, std::int64_t C);
// dx += ∂L/∂x (the residual stream also reaches x by its skip path);  dw += …;  db += … (db may be null).
template <class S>
void layernorm_backward(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w,
                        const S* mean, const S* rstd, std::int64_t N, std::int64_t C);

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
