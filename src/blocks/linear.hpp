// Internal: the dense projection of every layer, in torch.nn.Linear's layout.
//
//   x [N, in]   W [out, in]   b [out] (may be null)   y [N, out]      all row-major, contiguous f32
//
// linear_forward:   y = x · Wᵀ + b          (beta = 1 adds into y instead of overwriting it)
// linear_backward:  dx = dy · W            (added into dx when accumulate_dx)
//                   dW += dyᵀ · x,  db += Σ_n dy[n]     (gradients always accumulate)
// The fast path is oneDNN's sgemm (≈90% of the fp32 peak here); linear_forward_reference is the
// f64 twin the tests compare with.
#pragma once

#include <cstdint>

namespace qkv::blocks {

void linear_forward(const float* x, const float* W, const float* b, float* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, float beta = 0.0f);
void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, float* db,
                     std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx = false);
void linear_forward_reference(const float* x, const float* W, const float* b, float* y, std::int64_t N,
                              std::int64_t in, std::int64_t out);

}  // namespace qkv::blocks
