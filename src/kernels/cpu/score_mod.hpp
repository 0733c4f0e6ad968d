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

// c2 · tanh(x / c2) for f32 lanes x: tanh by an odd rational minimax approximation, numerator
// of degree 13 over a denominator of degree 6 in u = x / c2 (the coefficients Eigen publishes in
// MathFunctionsImpl.h, also used by XLA and ONNX Runtime's MLAS), with u clamped to ±7.90531
// where tanh rounds to ±1 in f32. Odd in u, so small arguments keep their relative accuracy
// (1 − 2 / (e^2u + 1) would lose it to cancellation, a cost of c · 1e-7 in every capped score).
// The cap's two multiplications fold into the clamp: c2 · u · P(u²) / Q(u²) = xc · P / Q with
// xc = x clamped to ±lim = ±7.90531 · c2. NaN stays NaN (the clamp puts x second: min / max
// return their second operand when either is NaN). The denominator (≥ 4.9e-3) is inverted by
// S::rcp, not divided: the division alone was most of softcap's cost.
//   lim = S::set1(kTanhClamp · c2), nlim = −lim, inv = S::set1(1 / c2)
constexpr float kTanhClamp = 7.90531110763549805f;
template <class S>
inline typename S::V softcap_v(typename S::V x, typename S::V lim, typename S::V nlim, typename S::V inv) {
  const auto xc = S::min(lim, S::max(nlim, x));
  const auto u = S::mul(xc, inv);
  const auto u2 = S::mul(u, u);
  auto p = S::set1(-2.76076847742355e-16f);
  p = S::fmadd(p, u2, S::set1(2.00018790482477e-13f));
  p = S::fmadd(p, u2, S::set1(-8.60467152213735e-11f));
  p = S::fmadd(p, u2, S::set1(5.12229709037114e-08f));
  p = S::fmadd(p, u2, S::set1(1.48572235717979e-05f));
  p = S::fmadd(p, u2, S::set1(6.37261928875436e-04f));
  p = S::fmadd(p, u2, S::set1(4.89352455891786e-03f));
  auto q = S::set1(1.19825839466702e-06f);
  q = S::fmadd(q, u2, S::set1(1.18534705686654e-04f));
  q = S::fmadd(q, u2, S::set1(2.26843463243900e-03f));
  q = S::fmadd(q, u2, S::set1(4.89352518554385e-03f));
  return S::mul(S::mul(xc, p), S::rcp(q));
}

// s[cb, ce) → c2 · tanh(s / c2), −∞ kept (cb, ce multiples of S::L). dcap, when not null, gets
// 1 − tanh² at the same columns: the derivative of the capped score by the uncapped one (backward).
template <class S>
inline void softcap_row(float* s, int cb, int ce, float c2, float* dcap = nullptr) {
  const auto lim = S::set1(kTanhClamp * c2), nlim = S::set1(-kTanhClamp * c2), inv = S::set1(1.0f / c2);
  const auto one = S::set1(1.0f);
  for (int c = cb; c < ce; c += S::L) {
    const auto x = S::loadu(s + c);
    const auto y = softcap_v<S>(x, lim, nlim, inv);
    S::storeu(s + c, S::where_neg_inf(x, y));
    if (dcap) {
      const auto t = S::mul(y, inv);
      S::storeu(dcap + c, S::sub(one, S::mul(t, t)));
    }
  }
}

// s[c] −= slope2 · |t0 + c − diag| for c ∈ [cb, ce) (multiples of S::L): key j = t0 + c of a
// row whose diagonal is diag. Distances d = j − diag are exact in f32 below 2^24 keys and
// advance by L per vector. Most tiles lie wholly on one side of the diagonal, where the bias is
// ∓slope2 · d: one fmadd per vector (the same product, so the same bits, as with |d|); the
// tile the diagonal crosses takes |d| = max(d, −d). Two vector instructions instead of six (the
// scalar distance, its broadcast, the absolute value) on the vector FMA ports the bf16 forward's
// dot products keep busy.
template <class S>
inline void alibi_row(float* s, int cb, int ce, float slope2, std::int64_t t0, std::int64_t diag) {
  alignas(64) static constexpr float kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static_assert(S::L <= 16);
  const auto step = S::set1(static_cast<float>(S::L));
  auto d = S::add(S::set1(static_cast<float>(t0 + cb - diag)), S::loadu(kIota));
  if (t0 + ce - 1 <= diag || t0 + cb >= diag) {  // d ≤ 0 everywhere, or d ≥ 0 everywhere
    const auto k = S::set1(t0 + cb >= diag ? -slope2 : slope2);
    for (int c = cb; c < ce; c += S::L, d = S::add(d, step)) S::storeu(s + c, S::fmadd(k, d, S::loadu(s + c)));
    return;
  }
  const auto vneg = S::set1(-slope2), zero = S::zero();
  for (int c = cb; c < ce; c += S::L, d = S::add(d, step))
    S::storeu(s + c, S::fmadd(vneg, S::max(d, S::sub(zero, d)), S::loadu(s + c)));
}

}  // namespace
}  // namespace qkv::kernels::cpu
