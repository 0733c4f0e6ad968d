// Decode from an int8 KV cache: the arithmetic contract every ISA follows (qkv/attention.hpp states
// it with its error bound) and the simple policy that implements it row by row. The policy is the
// decode path of the scalar and AVX2 units and the oracle of the AVX-512 one (decode_i8_avx512.hpp),
// which computes the same integers with VNNI.
//
//   q       each query row (f32, or bf16 widened) is quantised once per item: d = max|q| / 127,
//           q8 = round(q · (127 / max|q|)) ∈ [−127, 127] (quantise_q8); a row with a NaN or ±∞
//           gets the factor NaN (its scores are NaN, as q · k would be), an all-zero row 0.
//   scores  s_j = float(Σ_d q8_d · k8_jd) · (d · scale · log2 e · k_scale_j), the sum exact in int32
//           (|Σ| ≤ 512 · 127 · 128 < 2^31).
//   P·V     per tile of ≤ kNt keys and query row, the weights w_j = p_j · v_scale_j (p from the
//           online softmax) are rounded to 15-bit fixed point on the tile's largest weight:
//           w16_j = round(w_j · 32767 / w_max) (round_weights), Σ_j w16_j · v8_je summed exact in
//           int32 (|Σ| ≤ 64 · 32767 · 128 < 2^31), and the accumulator gains float(Σ) · w_max / 32767.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/flash_tile.hpp"

namespace qkv::kernels::cpu {
namespace {

constexpr float kQ8Max = 127.0f;     // q8's range: symmetric, as llama.cpp's q8_0 activations
constexpr float kW16Max = 32767.0f;  // the weights' fixed point: w16 ∈ [0, 32767]

// q [D] → q8 [D] (see above); returns the row's score factor d · scale_log2 (NaN, 0: see above).
inline float quantise_q8(const float* q, i64 D, float scale_log2, std::int8_t* q8) {
  float amax = 0.0f;
  bool finite = true;
  for (i64 d = 0; d < D; ++d) {
    const float x = std::fabs(q[d]);
    finite = finite && x <= __builtin_huge_valf();  // false for NaN
    amax = x > amax ? x : amax;
  }
  finite = finite && amax < __builtin_huge_valf();
  if (!finite || amax == 0.0f) {
    for (i64 d = 0; d < D; ++d) q8[d] = 0;
    return finite ? 0.0f : __builtin_nanf("");
  }
  // |q · inv| ≤ 127 (1 + 2^-23)^2 < 127.5: the rounded value stays in [−127, 127].
  const float inv = kQ8Max / amax;
  for (i64 d = 0; d < D; ++d) q8[d] = static_cast<std::int8_t>(std::nearbyint(q[d] * inv));
  return amax / kQ8Max * scale_log2;
}

// w16[c] ← round(p[c] · vs[c] · (32767 / w_max)) for c ∈ [0, n), w_max = max_c p[c] · vs[c]
// (p, vs ≥ 0); returns the fixed point's step w_max / 32767 (0 when every weight is 0). A NaN
// weight (a NaN row, whose l is NaN too) rounds to 0.
inline float round_weights(const float* p, const float* vs, i64 n, std::int16_t* w16) {
  float wmax = 0.0f;
  for (i64 c = 0; c < n; ++c) {
    const float w = p[c] * vs[c];
    wmax = w > wmax ? w : wmax;
  }
  const float inv = wmax > 0.0f ? kW16Max / wmax : 0.0f;
  for (i64 c = 0; c < n; ++c) {
    const float x = p[c] * vs[c] * inv;
    w16[c] = x >= 0.0f ? static_cast<std::int16_t>(std::nearbyint(x)) : std::int16_t{0};
  }
  return wmax / kW16Max;
}

// The policy (flash_decode_impl.hpp's interface) for every int8 cache, any element strides.
// Scratch (as floats): Qt [D] one query row in f32; Q8 [kDecRows][D] int8 rows; qf [kDecRows]
// their score factors; vs [kNt] the tile's v_scale; W16 [kNt] one row's weights; Acc [Dv] int32.
struct DecodeOpsI8Ref {
  static constexpr bool kEnabled = true;
  static i64 scratch_floats(const FlashArgs& a) {
    return a.D + (kDecRows * a.D + 3) / 4 + kDecRows + kNt + kNt / 2 + a.Dv;
  }
  static bool takes_k(const FlashArgs& a) { return a.kv_i8; }
  static bool takes_v(const FlashArgs& a) { return a.kv_i8; }

  const FlashArgs& a;
  float *Qt, *qf, *vs;
  std::int8_t* Q8;
  std::int16_t* W16;
  std::int32_t* Acc;
  DecodeOpsI8Ref(const FlashArgs& args, float* mem) : a(args) {
    Qt = mem;
    Q8 = reinterpret_cast<std::int8_t*>(Qt + a.D);
    qf = Qt + a.D + (kDecRows * a.D + 3) / 4;
    vs = qf + kDecRows;
    W16 = reinterpret_cast<std::int16_t*>(vs + kNt);
    Acc = reinterpret_cast<std::int32_t*>(vs + kNt + kNt / 2);
  }

  void load_q(int r, i64 off) {
    load_row(a, a.q, off, a.sq[3], a.D, 1.0f, Qt);
    qf[r] = quantise_q8(Qt, a.D, a.scale_log2, Q8 + r * a.D);
  }
  void scores(int nr, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, i64, float* Ps) const {
    for (i64 j = j_lo; j < j_hi; ++j) {
      const std::int8_t* k = static_cast<const std::int8_t*>(a.k) + kv_row(a, a.sk, b, hk, j);
      const float ks = a.k_scale[kv_row(a, a.sks, b, hk, j)];
      for (int r = 0; r < nr; ++r) {
        std::int32_t s = 0;
        for (i64 d = 0; d < a.D; ++d) s += std::int32_t{Q8[r * a.D + d]} * k[d * a.sk[3]];
        Ps[r * kNt + (j - t0)] = static_cast<float>(s) * (qf[r] * ks);
      }
    }
  }
  void pv(int nr, const float* Ps, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp) {
    for (i64 j = j_lo; j < j_hi; ++j) vs[j - t0] = a.v_scale[kv_row(a, a.svs, b, hk, j)];
    for (int r = 0; r < nr; ++r) {
      const float step = round_weights(Ps + r * kNt + (j_lo - t0), vs + (j_lo - t0), j_hi - j_lo, W16);
      std::memset(Acc, 0, sizeof(std::int32_t) * static_cast<std::size_t>(a.Dv));
      for (i64 j = j_lo; j < j_hi; ++j) {
        const std::int8_t* v = static_cast<const std::int8_t*>(a.v) + kv_row(a, a.sv, b, hk, j);
        const std::int32_t w = W16[j - j_lo];
        for (i64 e = 0; e < a.Dv; ++e) Acc[e] += w * v[e * a.sv[3]];
      }
      for (i64 e = 0; e < a.Dv; ++e) Od[r * Dvp + e] += static_cast<float>(Acc[e]) * step;
    }
  }
};

}  // namespace
}  // namespace qkv::kernels::cpu
