// Internal: the optimiser of training — AdamW with decoupled weight decay (as torch.optim.AdamW),
// global gradient-norm clipping (as torch.nn.utils.clip_grad_norm_), and nanoGPT's learning-rate
// schedule (linear warmup, cosine decay to min_lr, then constant).
#pragma once

#include <cstdint>
#include <vector>

namespace qkv::train {

struct AdamWConfig {
  double lr = 1e-3;            // peak learning rate
  double min_lr = 1e-4;        // reached at decay_steps
  std::int64_t warmup = 100;   // steps of linear warmup
  std::int64_t decay_steps = 2000;
  double beta1 = 0.9, beta2 = 0.99, eps = 1e-8;
  double weight_decay = 0.1;   // on tensors marked `decay` only
  double clip = 1.0;           // max global L2 norm of the gradient; ≤ 0 turns clipping off
};

// nanoGPT's get_lr(step), step counted from 0:
//   step < warmup:       lr · (step + 1) / (warmup + 1)
//   step > decay_steps:  min_lr
//   otherwise:           min_lr + ½(1 + cos(π · (step − warmup) / (decay_steps − warmup))) · (lr − min_lr)
double lr_at(const AdamWConfig& c, std::int64_t step);

// Global L2 norm of g[0, n) (accumulated in f64); if it exceeds max_norm > 0, scales g by
// max_norm / (norm + 1e-6) as torch does. Returns the norm before clipping.
double clip_grad_norm(float* g, std::int64_t n, double max_norm);

// One AdamW step t ≥ 1 over a flat array with moment buffers m, v [n] and a per-element decay
// mask given as ranges [begin, end) that weight decay applies to. In torch's order:
//   p ← p · (1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
//   p ← p − (lr / (1 − β1ᵗ)) · m / (√v / √(1 − β2ᵗ) + eps)
struct DecayRange { std::int64_t begin, end; };
void adamw_step(float* p, const float* g, float* m, float* v, std::int64_t n, const std::vector<DecayRange>& decay,
                const AdamWConfig& c, double lr, std::int64_t t);

}  // namespace qkv::train
