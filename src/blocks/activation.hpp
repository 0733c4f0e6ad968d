// Internal: the MLP's activations, GELU (tanh and exact forms) and the SwiGLU gate, each a forward
// and a backward over n elements. One implementation for serving and training: f32 runs the model
// and trains it, f64 is the twin the gradient checks use. The inference-only GELU kernel that
// shares its loop over threads (blocks::gelu_fast, dense.hpp) has gelu_tanh_forward as its twin.
//
//   x, gate, up, out, slope, dout, dx [n]; out may equal x (or gate, up).
//
// A GELU forward can keep its slope gelu'(x) for the backward (slope non-null; it may be x's own
// memory, which is then overwritten): the forward has the parts at hand, and the backward is then a
// product, dx = dout · slope (gelu_backward).
#pragma once

#include <cstdint>

namespace qkv::blocks {

// GELU, the tanh approximation (GPT-2's "gelu_new"): out = ½x(1 + tanh(u)), u = √(2/π)(x + 0.044715x³);
// slope = ½(1 + tanh u) + ½x(1 − tanh²u)·√(2/π)(1 + 3·0.044715x²).
void gelu_tanh_forward(float* out, const float* x, std::int64_t n, float* slope = nullptr);
void gelu_tanh_forward(double* out, const double* x, std::int64_t n, double* slope = nullptr);

// GELU, exact (erf) form — torch.nn.GELU(), nanoGPT, BERT:
//   out = x·Φ(x) = ½x(1 + erf(x/√2)),  slope = Φ(x) + x·φ(x),  φ(x) = e^(−x²/2)/√(2π).
// f32: vectorised per instruction set with erfc from Abramowitz & Stegun 7.1.26 (absolute error
// ≤ 1.5e-7 in erf, so |error| ≤ 0.75e-7·|x|, below the f32 rounding of x); f64: std::erf.
void gelu_exact_forward(float* out, const float* x, std::int64_t n, float* slope = nullptr);
void gelu_exact_forward(double* out, const double* x, std::int64_t n, double* slope = nullptr);

// dx = dout · slope  (overwrites dx; slope from either GELU forward).
void gelu_backward(float* dx, const float* slope, const float* dout, std::int64_t n);
void gelu_backward(double* dx, const double* slope, const double* dout, std::int64_t n);

// SwiGLU gate (Llama MLP): out = silu(gate) ⊙ up, silu(g) = g·σ(g) = g / (1 + e^(−g)).
// f32: vectorised per instruction set with exp_f32 (relative error ~1e-7 against std::exp).
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n);
void swiglu_forward(double* out, const double* gate, const double* up, std::int64_t n);
// dgate = dout · up · σ(g)(1 + g(1 − σ(g))),  dup = dout · silu(g)  (both overwritten).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, std::int64_t n);
void swiglu_backward(double* dgate, double* dup, const double* dout, const double* gate, const double* up,
                     std::int64_t n);

}  // namespace qkv::blocks
