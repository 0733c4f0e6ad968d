// The score variants of qkv/attention.hpp (softcap, ALiBi) on rows of f32 scores in log2 units,
// written once over a SIMD interface S (simd_*.hpp) for the flash forward, decode and backward.
// Internal linkage only (anonymous namespace): see simd_common.hpp.
//
// Scores here are s2 = score · log2 e, so with c2 = c · log2 e and slope2 = slope · log2 e:
//   softcap: c · tanh(score / c) · log2 e = c2 · tanh(s2 / c2)      (−∞ kept: masked stays masked)
//   ALiBi:   (score − slope · |diag − j|) · log2 e = s2 − slope2 · |diag − j|   (−∞ + finite = −∞)
#pragma once

#include <cstdint>

#include "kernels/cpu/simd_common.hpp"

namespace qkv::kernels::cpu {
namespace {

// tanh(x) for f32 lanes: an odd rational minimax approximation, numerator of degree 13 over a
// denominator of degree 6 in x (the coefficients Eigen publishes in MathFunctionsImpl.h, also
// used by XLA and ONNX Runtime's MLAS), with x clamped to ±7.90531 where tanh rounds to ±1 in
// f32. Odd in x, so small arguments keep their relative accuracy (1 − 2 / (e^2x + 1) would
// lose it to cancellation, a cost of c · 1e-7 in every capped score). NaN stays NaN (the clamp
// puts x second: min / max return their second operand when either is NaN). The denominator
// (≥ 4.9e-3) is inverted by S::rcp, not divided: the division alone was most of softcap's cost.
template <class S>
inline typename S::V tanh_v(typename S::V x) {
  constexpr float kClamp = 7.90531110763549805f;
  x = S::min(S::set1(kClamp), S::max(S::set1(-kClamp), x));
  const auto x2 = S::mul(x, x);
  auto p = S::set1(-2.76076847742355e-16f);
  p = S::fmadd(p, x2, S::set1(2.00018790482477e-13f));
  p = S::fmadd(p, x2, S::set1(-8.60467152213735e-11f));
  p = S::fmadd(p, x2, S::set1(5.12229709037114e-08f));
  p = S::fmadd(p, x2, S::set1(1.48572235717979e-05f));
  p = S::fmadd(p, x2, S::set1(6.37261928875436e-04f));
  p = S::fmadd(p, x2, S::set1(4.89352455891786e-03f));
  auto q = S::set1(1.19825839466702e-06f);
  q = S::fmadd(q, x2, S::set1(1.18534705686654e-04f));
  q = S::fmadd(q, x2, S::set1(2.26843463243900e-03f));
  q = S::fmadd(q, x2, S::set1(4.89352518554385e-03f));
  return S::mul(S::mul(x, p), S::rcp(q));
}

// s[cb, ce) → c2 · tanh(s / c2), −∞ kept (cb, ce multiples of S::L). dcap, when not null, gets
// 1 − tanh² at the same columns: the derivative of the capped score by the uncapped one (backward).
template <class S>
inline void softcap_row(float* s, int cb, int ce, float c2, float* dcap = nullptr) {
  const auto vc = S::set1(c2), vinv = S::set1(1.0f / c2), one = S::set1(1.0f);
  for (int c = cb; c < ce; c += S::L) {
    const auto x = S::loadu(s + c);
    const auto t = tanh_v<S>(S::mul(x, vinv));
    S::storeu(s + c, S::where_neg_inf(x, S::mul(vc, t)));
    if (dcap) S::storeu(dcap + c, S::sub(one, S::mul(t, t)));
  }
}

// s[c] −= slope2 · |t0 + c − diag| for c ∈ [cb, ce) (multiples of S::L): key j = t0 + c of a
// row whose diagonal is diag. Distances are exact in f32 below 2^24 keys.
template <class S>
inline void alibi_row(float* s, int cb, int ce, float slope2, std::int64_t t0, std::int64_t diag) {
  alignas(64) static constexpr float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(S::L <= 16);
  const auto iota = S::loadu(kIota), vneg = S::set1(-slope2), zero = S::zero();
  for (int c = cb; c < ce; c += S::L) {
    const auto d = S::add(S::set1(static_cast<float>(t0 + c - diag)), iota);
    S::storeu(s + c, S::fmadd(vneg, S::max(d, S::sub(zero, d)), S::loadu(s + c)));
  }
}

}  // namespace
}  // namespace qkv::kernels::cpu
