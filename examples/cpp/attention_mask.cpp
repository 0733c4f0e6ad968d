// One attention call with a mask: two sequences of a batch padded to 4 tokens, the second only 3 long,
// so its keys past position 2 must get no weight. The boolean mask is [B, 1, Sq, Skv] (broadcast over
// heads); `pattern` returns every head's softmax rows. Checked against the formula written out here.
//
//   build/examples/attention_mask
#include <cmath>
#include <cstdio>
#include <vector>

#include "qkv/attention.hpp"

int main() {
  constexpr int B = 2, H = 2, S = 4, D = 8;
  std::vector<float> q(B * H * S * D), k(q.size()), v(q.size()), out(q.size()), pattern(B * H * S * S);
  for (std::size_t i = 0; i < q.size(); ++i) {  // any values will do; these are easy to retype
    q[i] = std::sin(0.7f * i);
    k[i] = std::cos(0.3f * i);
    v[i] = 0.01f * static_cast<float>(i % 50);
  }
  std::vector<unsigned char> mask(B * S * S, 1);  // 1 = may attend
  for (int i = 0; i < S; ++i) mask[1 * S * S + i * S + 3] = 0;  // sequence 1 has 3 real tokens

  qkv::AttentionOptions opt;
  opt.mask = qkv::View::contiguous(mask.data(), qkv::DType::u8, {B, 1, S, S});
  using qkv::DType, qkv::View;
  const auto ran = qkv::attention(View::contiguous(q.data(), DType::f32, {B, H, S, D}),
                                  View::contiguous(k.data(), DType::f32, {B, H, S, D}),
                                  View::contiguous(v.data(), DType::f32, {B, H, S, D}),
                                  View::contiguous(out.data(), DType::f32, {B, H, S, D}), opt, std::nullopt,
                                  View::contiguous(pattern.data(), DType::f32, {B, H, S, S}));
  std::printf("kernel: %s\n", ran.name);

  // The same numbers by the formula: p_ij = exp(s_ij) / Σ_allowed exp(s_ij'), s_ij = q_i·k_j / √D.
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < S; ++i) {
        const float* qi = &q[((b * H + h) * S + i) * D];
        double s[S], z = 0;
        for (int j = 0; j < S; ++j) {
          s[j] = 0;
          for (int d = 0; d < D; ++d) s[j] += qi[d] * k[((b * H + h) * S + j) * D + d];
          s[j] = mask[(b * S + i) * S + j] ? std::exp(s[j] / std::sqrt(double(D))) : 0.0;
          z += s[j];
        }
        for (int j = 0; j < S; ++j)
          worst = std::fmax(worst, std::fabs(pattern[((b * H + h) * S + i) * S + j] - s[j] / z));
      }
  std::printf("sequence 1, head 0, query 0 over the 4 keys: %.4f %.4f %.4f %.4f (the padded key gets 0)\n",
              pattern[(1 * H + 0) * S * S + 0], pattern[(1 * H + 0) * S * S + 1], pattern[(1 * H + 0) * S * S + 2],
              pattern[(1 * H + 0) * S * S + 3]);
  std::printf("largest difference from the formula: %.1e\n", worst);
  return worst < 1e-6 ? 0 : 1;  // f32 probabilities ≤ 1: a few ulp
}
