// Dropout's keep/drop decision for element (b, h, i, j) of the attention probabilities: a
// counter-based hash of (seed, offset, b, h, i, j), so the mask never depends on tiling, thread
// count, kernel or ISA, and nothing of size Sq × Skv is stored: every kernel (the f64 reference,
// the flash forward and decode, the flash backward) regenerates the bits it needs, tile by tile.
//
//   row key  k(b, h, i) = F(F(F(F(F(seed ⊕ C) + offset) + b) + h) + i)    F: splitmix64's finaliser
//   bits(j)  = G(G(lo32(j) ⊕ lo32(k)) ⊕ (hi32(k) + hi32(j) · φ32))         G: a 32-bit avalanche
//   keep     ⟺ bits(j) ≥ t,  t = round(p · 2³²)   (so P(keep) = 1 − t / 2³², within 2⁻³³ of 1 − p)
//
// F and G are bijections; for one row, j ↦ bits(j) is one too (no two keys of a row share bits).
// Integer arithmetic only: the same bits on every compiler flag set. Every function is `static`
// (internal linkage), as simd_common.hpp asks of code the ISA translation units compile.
#pragma once

#include <cmath>
#include <cstdint>

namespace qkv::kernels {

// splitmix64's output function (Steele, Lea, Flood 2014).
static inline std::uint64_t dropout_mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// A 32-bit avalanche (Wellons' "lowbias32", bias ≈ 0.17 of the ideal): two multiplies, vectorisable.
static inline std::uint32_t dropout_mix32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The key of query row (b, h, i): b is the batch index (the sequence index in attention_varlen),
// h the query head.
static inline std::uint64_t dropout_row_key(std::uint64_t seed, std::uint64_t offset, std::int64_t b, std::int64_t h,
                                            std::int64_t i) {
  std::uint64_t k = dropout_mix64(seed ^ 0x9e3779b97f4a7c15ull);
  k = dropout_mix64(k + offset);
  k = dropout_mix64(k + static_cast<std::uint64_t>(b));
  k = dropout_mix64(k + static_cast<std::uint64_t>(h));
  return dropout_mix64(k + static_cast<std::uint64_t>(i));
}

// hi32(k) + hi32(j) · φ32: the part of bits(j) shared by the keys j of one 2³²-aligned run.
static inline std::uint32_t dropout_hi(std::uint64_t row_key, std::int64_t j) {
  return static_cast<std::uint32_t>(row_key >> 32) +
         static_cast<std::uint32_t>(static_cast<std::uint64_t>(j) >> 32) * 0x9e3779b9u;
}

static inline std::uint32_t dropout_bits(std::uint64_t row_key, std::int64_t j) {
  return dropout_mix32(dropout_mix32(static_cast<std::uint32_t>(j) ^ static_cast<std::uint32_t>(row_key)) ^
                       dropout_hi(row_key, j));
}

// t of the rule above for p ∈ [0, 1) (t = 0 for p = 0: every key is kept).
static inline std::uint32_t dropout_threshold(double p) {
  const double t = std::nearbyint(p * 4294967296.0);
  return t >= 4294967295.0 ? 0xffffffffu : static_cast<std::uint32_t>(t);
}

// w[c] ← keep(j0 + c) ? rs : 0 for c ∈ [0, n): the factor each probability of a row's keys
// [j0, j0 + n) is multiplied by (rs = 1 / (1 − p)). The same bits as dropout_bits, written for
// the vectoriser: 32-bit lanes, hi32(j) taken once per 2³²-aligned run of keys (a kernel's tile
// never crosses one, so the outer loop runs once).
static inline void dropout_row(std::uint64_t row_key, std::int64_t j0, std::int64_t n, std::uint32_t t, float rs,
                               float* w) {
  const auto klo = static_cast<std::uint32_t>(row_key);
  for (std::int64_t c = 0; c < n;) {
    const std::int64_t j = j0 + c;
    const std::int64_t left = (std::int64_t{1} << 32) - static_cast<std::int64_t>(static_cast<std::uint32_t>(j));
    const std::int64_t run = n - c < left ? n - c : left;
    const std::uint32_t hi = dropout_hi(row_key, j), jl = static_cast<std::uint32_t>(j);
    for (std::int64_t x = 0; x < run; ++x)
      w[c + x] = dropout_mix32(dropout_mix32((jl + static_cast<std::uint32_t>(x)) ^ klo) ^ hi) >= t ? rs : 0.0f;
    c += run;
  }
}

}  // namespace qkv::kernels
