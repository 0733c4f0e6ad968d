// Internal: e^x in f32, written so that `omp simd` loops calling it vectorise (a std::exp call per
// element keeps a loop scalar). Used by the SwiGLU gate, the exact GELU and the cross-entropy.
//
// x = k·ln2 + r with |r| ≤ ln2/2 (ln2 split in two for an exact k·ln2; k rounded by the 1.5·2^23
// trick), e^r by its degree-7 Taylor polynomial (truncation r⁸/8! < 6e-9 relative), 2^k put in the
// exponent bits. Inputs are clamped to [−87, 88], where 2^k stays a normal float. Relative error
// against std::exp ≈ 1e-7 (tests/blocks/test_layers.cpp).
#pragma once

#include <cstdint>
#include <cstring>

namespace qkv::blocks {

[[gnu::always_inline]] inline float exp_f32(float x) {
  x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
  const float kf = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
  const float r = (x - kf * 0.693145752f) - kf * 1.42860677e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const std::int32_t bits = (static_cast<std::int32_t>(kf) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace qkv::blocks
