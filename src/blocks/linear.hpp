// Internal: the dense projection of every layer, in torch.nn.Linear's layout.
//
//   x [N, in]   W [out, in]   b [out] (may be null)   y [N, out]      all row-major, contiguous
//
// linear_forward:   y = x · Wᵀ + b          (beta = 1 adds into y instead of overwriting it)
// linear_backward:  dx = dy · W            (added into dx when accumulate_dx)
//                   dW += dyᵀ · x,  db += Σ_n dy[n]     (gradients always accumulate)
// f32 runs oneDNN's sgemm (≈90% of the fp32 peak here; on one thread when called inside a parallel
// region); f64 runs plain loops: the twin that the tests and the gradient checks compare with.
#pragma once

#include <cstdint>

namespace qkv::blocks {

void linear_forward(const float* x, const float* W, const float* b, float* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, float beta = 0.0f);
void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, float* db,
                     std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx = false);
// Each head's own share of the value-up (the seeds' per-head proposed change Δe_h, without b_O, which
// belongs to no head): W_O's column block h times that head's attention output.
//   att [S, H·Dv] (each row: the heads side by side)   W_O [C, H·Dv]   out [H, S, C]
//   out[h, s, :] = W_O[:, h·Dv:(h+1)·Dv] · att[s, h·Dv:(h+1)·Dv], each sum in f64, so Σ_h out[h] is
//   W_O·att to the rounding of the f32 results. Used by MultiHeadAttention's head_delta and the
//   model's trace (qkv inspect).
// sum (optional) [S, C]: Σ_h of the unrounded f64 values, rounded once: the whole block's Δe W_O·att
// without b_O, the same number whichever model computes it and whatever dtype its W_O is kept in.
void head_delta_forward(float* out, const float* att, const float* wo, std::int64_t S, std::int64_t H,
                        std::int64_t Dv, std::int64_t C, float* sum = nullptr);

void linear_forward(const double* x, const double* W, const double* b, double* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, double beta = 0.0);
void linear_backward(const double* x, const double* W, const double* dy, double* dx, double* dW, double* db,
                     std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx = false);

}  // namespace qkv::blocks
