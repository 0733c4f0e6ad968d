// The multi-head attention block as the seeds draw it: each head proposes a change Δe_h to every
// embedding, and the block adds them up (Δe = Σ_h Δe_h + b_O) into the residual stream, e ← e + Δe.
// Prints the size of each head's proposal for each token.
//
//   build/examples/mha_head_delta
#include <cmath>
#include <cstdio>
#include <vector>

#include "qkv/mha.hpp"

int main() {
  constexpr int S = 5, C = 32, H = 4;
  qkv::MhaConfig cfg;
  cfg.d_model = C;
  cfg.n_heads = H;
  cfg.d_head = C / H;
  cfg.bias = true;
  qkv::MultiHeadAttention mha(cfg);
  mha.init_random(42);

  std::vector<float> e(S * C), delta(S * C), head_delta(H * S * C);
  for (int i = 0; i < S * C; ++i) e[i] = std::sin(0.37f * i);  // five token embeddings
  qkv::AttentionOptions opt;
  opt.causal = true;  // each token looks only at itself and the tokens before it
  using qkv::DType, qkv::View;
  mha.forward(View::contiguous(e.data(), DType::f32, {1, S, C}), std::nullopt, opt,
              View::contiguous(delta.data(), DType::f32, {1, S, C}),
              View::contiguous(head_delta.data(), DType::f32, {1, H, S, C}));

  std::printf("|Δe_h| of each head (rows) for each token (columns):\n");
  for (int h = 0; h < H; ++h) {
    std::printf("head %d:", h);
    for (int s = 0; s < S; ++s) {
      double n = 0;
      for (int c = 0; c < C; ++c) n += double(head_delta[(h * S + s) * C + c]) * head_delta[(h * S + s) * C + c];
      std::printf(" %7.4f", std::sqrt(n));
    }
    std::printf("\n");
  }
  // The heads' proposals plus the output bias are the block's change, to rounding.
  double worst = 0;
  for (int s = 0; s < S; ++s)
    for (int c = 0; c < C; ++c) {
      double sum = mha.b_o.ptr<float>()[c];
      for (int h = 0; h < H; ++h) sum += head_delta[(h * S + s) * C + c];
      worst = std::fmax(worst, std::fabs(sum - delta[s * C + c]));
    }
  qkv::add_residual(View::contiguous(e.data(), DType::f32, {S, C}), View::contiguous(delta.data(), DType::f32, {S, C}),
                    View::contiguous(e.data(), DType::f32, {S, C}));
  std::printf("max |Σ_h Δe_h + b_O − Δe| = %.1e\n", worst);
  return worst < 1e-5 ? 0 : 1;  // f32 sums of H + 1 terms of size ~1
}
