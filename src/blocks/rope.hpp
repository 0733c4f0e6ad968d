// Internal: rotary position embedding (Llama, interleaved pairs), forward and backward. One
// implementation for serving and training (f32), with the f64 twin of the gradient checks.
//
//   x [nh, hs] at one position (rows of nh·hs values), hs even. Each pair (x[2i], x[2i+1]) of every
//   head turns by the angle pos · theta^(−2i/hs):
//     x'[2i] = x[2i]·cos − x[2i+1]·sin      x'[2i+1] = x[2i]·sin + x[2i+1]·cos
//   The angle is computed in the scalar type exactly as llama2.c does (f32: freq = 1 / theta^(i/hs),
//   angle = pos · freq), so greedy decoding matches llama2.c bit for bit.
//
// The angles of a position are computed once (rope_angles) and applied to every head of q and k
// (rope_apply); training computes them for positions 0 … T − 1 once, decoding once a step.
#pragma once

#include <cstdint>

namespace qkv::blocks {

// cs [hs] = (cos, sin) of each pair's angle at position pos, interleaved: cs[2i], cs[2i+1].
void rope_angles(float* cs, std::int64_t hs, std::int64_t pos, float theta);
void rope_angles(double* cs, std::int64_t hs, std::int64_t pos, double theta);

// x [nh, hs] turned by cs (in place).
void rope_apply(float* x, std::int64_t nh, std::int64_t hs, const float* cs);
void rope_apply(double* x, std::int64_t nh, std::int64_t hs, const double* cs);

// The rotation is orthogonal, so the backward turns dx [nh, hs] (in place) by the opposite angle.
void rope_apply_backward(float* dx, std::int64_t nh, std::int64_t hs, const float* cs);
void rope_apply_backward(double* dx, std::int64_t nh, std::int64_t hs, const double* cs);

// x [N, nh, hs], row n at position pos0 + n: rope_angles then rope_apply for each row (prefill).
void rope_forward(float* x, std::int64_t N, std::int64_t nh, std::int64_t hs, std::int64_t pos0, float theta);

}  // namespace qkv::blocks
