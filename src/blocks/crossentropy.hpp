// Internal: softmax cross-entropy of every position at once (the training loss), forward and
// backward. f32 (vectorised per instruction set with exp_f32) trains; f64 is the twin the gradient
// checks use.
//
//   logits [N, V]   targets [N] in [0, V)   probs [N, V] (may be the logits' own memory)   losses [N]
#pragma once

#include <cstdint>

namespace qkv::blocks {

// probs = softmax(logits) per row, losses[n] = −log probs[n, targets[n]] (computed from the logits,
// not from probs, which may underflow to 0); returns Σ_n losses[n], summed in row order in f64.
double crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets, std::int64_t N,
                            std::int64_t V);
double crossentropy_forward(double* probs, double* losses, const double* logits, const int* targets,
                            std::int64_t N, std::int64_t V);
// dlogits = scale · (probs − onehot(targets))  (overwrites; scale = 1/N for a mean loss).
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, std::int64_t N, std::int64_t V,
                           float scale);
void crossentropy_backward(double* dlogits, const double* probs, const int* targets, std::int64_t N, std::int64_t V,
                           double scale);

}  // namespace qkv::blocks
