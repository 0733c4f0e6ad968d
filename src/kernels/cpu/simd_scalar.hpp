// Portable vector helpers (no intrinsics): the interface of simd_avx512.hpp over an array of
// 8 floats, for CPUs without AVX2. Correct everywhere; speed is whatever the compiler makes of it.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/cpu/simd_common.hpp"

namespace qkv::kernels::cpu {

struct SimdScalar {
  static constexpr int L = 8;
  struct V {
    float x[L];
  };

  static V zero() { return set1(0.0f); }
  static V set1(float a) {
    V r;
    for (float& e : r.x) e = a;
    return r;
  }
  static V loadu(const float* p) {
    V r;
    std::memcpy(r.x, p, sizeof r.x);
    return r;
  }
  static void storeu(float* p, V a) { std::memcpy(p, a.x, sizeof a.x); }
  static V load_n(const float* p, int n) {
    V r = zero();
    for (int i = 0; i < n; ++i) r.x[i] = p[i];
    return r;
  }
  static void store_n(float* p, V a, int n) {
    for (int i = 0; i < n; ++i) p[i] = a.x[i];
  }
  static V fmadd(V a, V b, V c) {
    for (int i = 0; i < L; ++i) c.x[i] += a.x[i] * b.x[i];
    return c;
  }
  static V mul(V a, V b) {
    for (int i = 0; i < L; ++i) a.x[i] *= b.x[i];
    return a;
  }
  static V add(V a, V b) {
    for (int i = 0; i < L; ++i) a.x[i] += b.x[i];
    return a;
  }
  static V sub(V a, V b) {
    for (int i = 0; i < L; ++i) a.x[i] -= b.x[i];
    return a;
  }
  static V max(V a, V b) {
    for (int i = 0; i < L; ++i) a.x[i] = a.x[i] > b.x[i] ? a.x[i] : b.x[i];
    return a;
  }
  static V min(V a, V b) {
    for (int i = 0; i < L; ++i) a.x[i] = a.x[i] < b.x[i] ? a.x[i] : b.x[i];
    return a;
  }
  static V rcp(V a) {
    for (int i = 0; i < L; ++i) a.x[i] = 1.0f / a.x[i];
    return a;
  }
  static V where_neg_inf(V x, V y) {
    for (int i = 0; i < L; ++i) y.x[i] = x.x[i] == -__builtin_inff() ? x.x[i] : y.x[i];
    return y;
  }
  static float hmax(V a) {
    float m = a.x[0];
    for (int i = 1; i < L; ++i) m = a.x[i] > m ? a.x[i] : m;
    return m;
  }
  static float hsum(V a) {
    float s = 0.0f;
    for (int i = 0; i < L; ++i) s += a.x[i];
    return s;
  }
  static bool any_gt(V a, float t) {
    bool r = false;
    for (int i = 0; i < L; ++i) r = r || a.x[i] > t;
    return r;
  }

  // As SimdAvx512::exp2, one lane at a time; 2^n built in the exponent field.
  static V exp2(V a) {
    V r;
    for (int i = 0; i < L; ++i) {
      const float x = a.x[i];
      if (x < -126.0f) {  // also −∞
        r.x[i] = 0.0f;
        continue;
      }
      if (x != x) {  // NaN stays NaN (the non-finite policy of qkv/attention.hpp)
        r.x[i] = x;
        continue;
      }
      const float xc = x < 127.0f ? x : 127.0f;
      const float n = static_cast<float>(static_cast<int>(xc + (xc >= 0 ? 0.5f : -0.5f)));
      const float f = xc - n;
      float p = kExp2Poly[5];
      for (int k = 4; k >= 0; --k) p = p * f + kExp2Poly[k];
      const std::uint32_t bits = static_cast<std::uint32_t>(static_cast<int>(n) + 127) << 23;
      float s;
      std::memcpy(&s, &bits, sizeof s);
      r.x[i] = p * s;
    }
    return r;
  }

  static constexpr bool kHasTranspose16 = false;
  static constexpr bool kHasF16 = false;  // no load_f16: see SimdAvx512
  static void transpose16(const float*, std::int64_t, float*, std::int64_t) {}
  static V load_bf16(const std::uint16_t* p) { return load_bf16_n(p, L); }
  static V load_bf16_n(const std::uint16_t* p, int n) {
    V r = zero();
    for (int i = 0; i < n; ++i) r.x[i] = bf16_bits_to_f32(p[i]);
    return r;
  }
  static void store_bf16(std::uint16_t* p, V a) { store_bf16_n(p, a, L); }
  static void store_bf16_n(std::uint16_t* p, V a, int n) {
    for (int i = 0; i < n; ++i) p[i] = f32_to_bf16_bits(a.x[i]);
  }
};

}  // namespace qkv::kernels::cpu
