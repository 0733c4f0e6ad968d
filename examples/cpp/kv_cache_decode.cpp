// Decoding with qkv::AttentionKvCache: two sequences with prompts of different lengths (5 and 2
// tokens) in one paged cache (blocks of 16 rows), then three steps that append one token to each
// and attend with its query. Each sequence sees only its own tokens, causally: the last query of
// sequence b sits at its own length. The last step is checked against the formula written out here.
//
//   build/examples/kv_cache_decode
#include <cmath>
#include <cstdio>
#include <vector>

#include "qkv/kv_cache.hpp"

int main() {
  using qkv::DType, qkv::View;
  constexpr int B = 2, H = 4, Hkv = 2, D = 8, kMaxLen = 64;
  qkv::AttentionKvCache cache(B, kMaxLen, Hkv, D, DType::f32, /*value_dim=*/0, /*block_size=*/16);

  // Every token's key and value rows [Hkv][D], kept here only to check the result.
  std::vector<std::vector<float>> keys[B], values[B];
  auto token = [](int b, int t, int hk, int d, float phase) {
    return std::sin(0.37f * (b * 97 + t * 13 + hk * 5 + d) + phase);
  };

  const int prompt[B] = {5, 2};
  for (int b = 0; b < B; ++b) {
    std::vector<float> k(prompt[b] * Hkv * D), v(k.size());
    for (int t = 0; t < prompt[b]; ++t) {
      for (int e = 0; e < Hkv * D; ++e)
        k[t * Hkv * D + e] = token(b, t, e / D, e % D, 0.0f), v[t * Hkv * D + e] = token(b, t, e / D, e % D, 1.0f);
      keys[b].emplace_back(k.begin() + t * Hkv * D, k.begin() + (t + 1) * Hkv * D);
      values[b].emplace_back(v.begin() + t * Hkv * D, v.begin() + (t + 1) * Hkv * D);
    }
    cache.append_to(b, View::contiguous(k.data(), DType::f32, {prompt[b], Hkv, D}),
                    View::contiguous(v.data(), DType::f32, {prompt[b], Hkv, D}));
  }

  std::vector<float> q(B * H * D), out(B * H * D);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> k(B * Hkv * D), v(k.size());  // one new token per sequence: [B, 1, Hkv, D]
    for (int b = 0; b < B; ++b) {
      const int t = static_cast<int>(cache.length(b));
      for (int e = 0; e < Hkv * D; ++e)
        k[b * Hkv * D + e] = token(b, t, e / D, e % D, 0.0f), v[b * Hkv * D + e] = token(b, t, e / D, e % D, 1.0f);
      keys[b].emplace_back(k.begin() + b * Hkv * D, k.begin() + (b + 1) * Hkv * D);
      values[b].emplace_back(v.begin() + b * Hkv * D, v.begin() + (b + 1) * Hkv * D);
    }
    cache.append(View::contiguous(k.data(), DType::f32, {B, 1, Hkv, D}),
                 View::contiguous(v.data(), DType::f32, {B, 1, Hkv, D}));
    for (std::size_t i = 0; i < q.size(); ++i)
      q[i] = std::cos(0.11f * static_cast<float>(i) + static_cast<float>(step));
    const auto ran = cache.attend(View::contiguous(q.data(), DType::f32, {B, H, 1, D}),
                                  View::contiguous(out.data(), DType::f32, {B, H, 1, D}));
    std::printf("step %d: lengths %lld, %lld (kernel %s)\n", step, static_cast<long long>(cache.length(0)),
                static_cast<long long>(cache.length(1)), ran.name);
  }

  // out[b, h] = Σ_j softmax_j(q·k_j / √D) v_j over sequence b's tokens, kv head h / (H / Hkv).
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int hk = h / (H / Hkv), n = static_cast<int>(keys[b].size());
      std::vector<double> p(n);
      double z = 0;
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int d = 0; d < D; ++d) s += q[(b * H + h) * D + d] * keys[b][j][hk * D + d];
        z += p[j] = std::exp(s / std::sqrt(double(D)));
      }
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < n; ++j) o += p[j] / z * values[b][j][hk * D + d];
        worst = std::fmax(worst, std::fabs(out[(b * H + h) * D + d] - o));
      }
    }
  std::printf("largest difference from the formula: %.1e\n", worst);
  return worst < 1e-5 ? 0 : 1;  // f32 sums over ≤ 8 tokens of values ≤ 1
}
