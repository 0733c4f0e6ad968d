// Internal: the token embedding (+ learned positions), forward and backward, llm.c style over plain
// contiguous row-major pointers. One implementation for serving and training: f32 runs the model
// and trains it, f64 is the twin that the gradient checks take finite differences of.
//
//   tokens [N] in [0, V)   wte [V, C]   wpe [P, C] or null (rotary or no positions)   out [N, C]
//   row n is at position pos0 + n (P > pos0 + N − 1); a batch of training sequences is one call per
//   sequence, each with pos0 = 0.
#pragma once

#include <cstdint>

namespace qkv::blocks {

// out[n] = wte[tokens[n]] + wpe[pos0 + n]   (wpe null: out[n] = wte[tokens[n]])
void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0);
void embedding_forward(double* out, const int* tokens, const double* wte, const double* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0);

// dwte[tokens[n]] += dout[n];  dwpe[pos0 + n] += dout[n] (dwpe null: no positions). Serial on purpose:
// several positions may share a token row, and a fixed order of the sums keeps a training run
// reproducible bit for bit.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, std::int64_t N,
                        std::int64_t C, std::int64_t pos0);
void embedding_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, std::int64_t N,
                        std::int64_t C, std::int64_t pos0);

// The residual add out = a + b (n elements; out may be a or b): token-type rows (encoders) and
// qkv::add_residual.
inline void residual_forward(float* out, const float* a, const float* b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace qkv::blocks
