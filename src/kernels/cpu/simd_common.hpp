// Constants and scalar helpers shared by every ISA's attention kernels (no intrinsics here).
#pragma once

#include <cstdint>
#include <cstring>

namespace qkv::kernels::cpu {

// 2^f ≈ Σ_k kExp2Poly[k]·f^k on f ∈ [−½, ½]: a degree-5 fit minimising the relative error
// (iteratively reweighted least squares on Chebyshev nodes). Evaluated in f32 with FMA its
// relative error is ≤ 2.4e-7 (≈ 2 ulp); tests/kernels/test_flash.cpp measures and prints it.
inline constexpr float kExp2Poly[6] = {1.0000001192092896f, 0.6931469440460205f, 0.24022120237350464f,
                                       0.05550713464617729f, 0.009675540961325169f, 0.0013276457320898771f};

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Lazy rescaling: a row's running max (in log2 units) is raised only when a new score exceeds
// it by more than this, so probabilities stay ≤ 2^8 (no overflow risk in f32) and the
// accumulators are rescaled rarely (FlashAttention-4's trick; exact after the final division).
inline constexpr float kLazyRescale = 8.0f;

// bf16 <-> f32, `static` on purpose: every function an ISA translation unit compiles must have
// internal linkage (or an ISA-specific name). A shared inline function would be emitted by the
// AVX-512 unit too, and the linker could keep that copy for the portable callers.
static inline float bf16_bits_to_f32(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
static inline std::uint16_t f32_to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// binary16 → f32 (qkv/types.hpp's f16_to_f32, `static` for the reason above): f16 KV caches.
static inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, em = h & 0x7fffu;
  std::uint32_t u;
  if (em >= 0x7c00u) {
    u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);
  } else if (em >= 0x0400u) {
    u = sign | ((em << 13) + 0x38000000u);
  } else {
    const float f = static_cast<float>(em) * 0x1p-24f;
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// The allowed-key rule of KeyRange (kernels/params.hpp) for the ISA translation units, `static` and
// without std:: templates for the reason above: query row i of a batch row with key_len valid keys
// has its diagonal at diag = i + diag_offset (+ key_len with diag_from_key_len) and may attend the
// keys [lo, hi); hi ≤ lo when it may attend none.
static inline std::int64_t rule_diag(std::int64_t i, std::int64_t diag_offset, bool diag_from_key_len,
                                     std::int64_t key_len) {
  return i + diag_offset + (diag_from_key_len ? key_len : 0);
}
static inline void rule_range(std::int64_t diag, bool causal, std::int64_t window_left, std::int64_t window_right,
                              std::int64_t key_len, std::int64_t* lo, std::int64_t* hi) {
  std::int64_t l = 0, h = key_len;
  if (window_left >= 0 && diag - window_left > l) l = diag - window_left;
  if (causal && diag + 1 < h) h = diag + 1;
  if (window_right >= 0 && diag + window_right + 1 < h) h = diag + window_right + 1;
  *lo = l;
  *hi = h;
}

}  // namespace qkv::kernels::cpu
