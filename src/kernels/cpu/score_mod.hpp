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

// softcap_v: c2 · tanh(s / c2) for f32 lanes x, the scores being s = x · mul (mul = 1 for scores
// in log2 units; the bf16 forward passes its raw dot products and folds the scale in here). With
// z = x · kz, kz = softcap_kz(c2, mul) = 2 log2 e · mul / c2, and E = 2^z = e^(2s/c2):
//   tanh(s / c2) = 1 − 2 / (1 + E),   so   y = c2 − 2 c2 · r,   r = 1 / (1 + E),
// with the kernels' own S::exp2 (relative error ≤ 2.4e-7) and S::rcp (approximate reciprocal and
// one Newton step). 17 vector instructions on AVX-512 (one of them the scale the bf16 forward
// folds in), 9 of them on the FMA ports, against 20 and 15 for the rational minimax tanh it
// replaced: the bf16 forward's dot products need those ports.
// Ends: z is clamped to ≤ 64 (E ≤ 2^64, so 1 + E and its reciprocal stay finite; tanh is 1 in f32
// from z ≈ 26 on), and S::exp2 is 0 below −126 (y = −c2). x = +∞ → c2 (as ONNX); x = −∞ → −∞
// (masked stays masked; tested on x, as z is also −∞ for finite x below −FLT_MAX / kz);
// NaN → NaN (the clamp puts z second: min returns its second operand on NaN).
// Error: absolute, |y − c2 · tanh(s / c2)| ≤ 2 c2 · (|δr| + ½ |δE|) + roundings, measured
// ≤ 3.6e-7 · c2 on every ISA over the whole range (Flash.SoftcapAccuracy, against std::tanh in
// f64): 3 ulps of c2, the bound of the capped scores. Not relative: near s = 0,
// 1 − 2r cancels (tanh(±0) gives ≈ 6e-8 · c2, not ±0), below what the softmax can resolve in
// scores that are themselves rounded to f32.
inline float softcap_kz(float c2, float mul = 1.0f) {
  return static_cast<float>(2.0 * 1.4426950408889634 * static_cast<double>(mul) / static_cast<double>(c2));
}
template <class S>
struct SoftcapK {
  typename S::V kz, zmax, one, neg_two_c2, c2;
  SoftcapK(float c2f, float kzf)
      : kz(S::set1(kzf)), zmax(S::set1(64.0f)), one(S::set1(1.0f)), neg_two_c2(S::set1(-2.0f * c2f)), c2(S::set1(c2f)) {}
};
template <class S>
inline typename S::V softcap_v(typename S::V x, const SoftcapK<S>& k) {
  const auto e = S::exp2(S::min(k.zmax, S::mul(x, k.kz)));
  const auto r = S::rcp(S::add(k.one, e));
  return S::where_neg_inf(x, S::fmadd(r, k.neg_two_c2, k.c2));
}

// s[cb, ce) → c2 · tanh(s / c2), −∞ kept (cb, ce multiples of S::L). dcap, when not null, gets
// 1 − tanh² at the same columns: the derivative of the capped score by the uncapped one (backward).
template <class S>
inline void softcap_row(float* s, int cb, int ce, float c2, float* dcap = nullptr) {
  const SoftcapK<S> k(c2, softcap_kz(c2));
  const auto inv = S::set1(1.0f / c2);
  for (int c = cb; c < ce; c += S::L) {
    const auto y = softcap_v<S>(S::loadu(s + c), k);
    S::storeu(s + c, y);
    if (dcap) {
      const auto t = S::mul(y, inv);
      S::storeu(dcap + c, S::sub(k.one, S::mul(t, t)));
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
