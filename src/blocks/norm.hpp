// Internal: the two norms of the model, LayerNorm (GPT-2, BERT) and RMSNorm (Llama), each a forward
// that can keep what its backward reads and a backward that turns ∂L/∂out into ∂L/∂x and the gain
// (and bias) gradients. One implementation for serving and training: f32 (LayerNorm vectorised per
// instruction set) runs the model and trains it, f64 is the twin the gradient checks use.
//
//   x [N, C]   w, b [C] (b may be null: no bias)   out [N, C] (may equal x)   mean, rstd [N]
//
// Outputs of the forward that are only kept for the backward (mean, rstd) may be null. Parameter
// gradients (dw, db) accumulate (+=), so micro-batches and shards add up; dx accumulates too: the
// residual stream also reaches x by its skip path.
#pragma once

#include <cstdint>

namespace qkv::blocks {

// LayerNorm:  out[n] = (x[n] − mean[n]) · rstd[n] ⊙ w + b,  rstd = 1 / √(var + eps), var the biased
// (population) variance, as torch.nn.LayerNorm computes it.
void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       std::int64_t N, std::int64_t C, float eps);
void layernorm_forward(double* out, double* mean, double* rstd, const double* x, const double* w, const double* b,
                       std::int64_t N, std::int64_t C, double eps);
// dx += ∂L/∂x;  dw += Σ_n dout ⊙ x̂;  db += Σ_n dout (db may be null).  mean, rstd from the forward.
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C);
void layernorm_backward(double* dx, double* dw, double* db, const double* dout, const double* x, const double* w,
                        const double* mean, const double* rstd, std::int64_t N, std::int64_t C);

// RMSNorm:  out[n] = w ⊙ (rstd[n] · x[n]),  rstd[n] = 1 / √(mean_c x[n,c]² + eps). The f32 sum is the
// serial one llama2.c computes, so greedy decoding matches it bit for bit.
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, std::int64_t N, std::int64_t C,
                     float eps);
void rmsnorm_forward(double* out, double* rstd, const double* x, const double* w, std::int64_t N, std::int64_t C,
                     double eps);
// dx += ∂L/∂x;  dw += Σ_n dout ⊙ x̂.  rstd from the forward.
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      std::int64_t N, std::int64_t C);
void rmsnorm_backward(double* dx, double* dw, const double* dout, const double* x, const double* w,
                      const double* rstd, std::int64_t N, std::int64_t C);

}  // namespace qkv::blocks
