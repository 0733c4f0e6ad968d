// Internal: the GEMV and GELU kernels of dense.hpp, written once over an ISA's vector interface
// (kernels/cpu/simd_*.hpp plus `div`) and instantiated by dense_avx2.cpp / dense_avx512.cpp.
// Everything here has internal linkage: each ISA's translation unit keeps its own copy.
#pragma once

#include <cmath>
#include <cstdint>

#include "blocks/dense_kernels.hpp"

namespace qkv::blocks::detail {
namespace {

using i64 = std::int64_t;

// Where one weight row's vector of L values comes from: f32 as is, bf16 widened (exact).
template <class S>
struct RowsF32 {
  static typename S::V load(const void* W, i64 at) { return S::loadu(static_cast<const float*>(W) + at); }
  static typename S::V load_n(const void* W, i64 at, int n) { return S::load_n(static_cast<const float*>(W) + at, n); }
};
template <class S>
struct RowsBf16 {
  static typename S::V load(const void* W, i64 at) { return S::load_bf16(static_cast<const std::uint16_t*>(W) + at); }
  static typename S::V load_n(const void* W, i64 at, int n) {
    return S::load_bf16_n(static_cast<const std::uint16_t*>(W) + at, n);
  }
};

// Output row o for all M input rows. The row is read once, front to back, U vectors of L columns
// a step, so the weights stream through memory in address order (the hardware prefetcher follows
// one linear stream; interleaving several rows 1–6 KiB apart measured 2–3× slower at M = 1) and
// the M·U accumulators are independent FMA chains. U = 4 at M ≤ 2, 2 above: M·U ≤ 8
// accumulators leave registers for x and w on AVX2's 16.
template <class S, class Rows, int M>
void gemv_row(const GemvArgs& a, i64 o) {
  using V = typename S::V;
  constexpr int U = M <= 2 ? 4 : 2;
  const i64 in = a.in, row = o * in;
  V acc[M][U];
  for (int m = 0; m < M; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = S::zero();
  i64 i = 0;
  for (; i + U * S::L <= in; i += U * S::L)
    for (int u = 0; u < U; ++u) {
      const V w = Rows::load(a.W, row + i + u * S::L);
      for (int m = 0; m < M; ++m) acc[m][u] = S::fmadd(w, S::loadu(a.x + m * in + i + u * S::L), acc[m][u]);
    }
  for (; i + S::L <= in; i += S::L) {
    const V w = Rows::load(a.W, row + i);
    for (int m = 0; m < M; ++m) acc[m][0] = S::fmadd(w, S::loadu(a.x + m * in + i), acc[m][0]);
  }
  if (i < in) {  // the last in % L columns (lanes past them load as zero)
    const int n = static_cast<int>(in - i);
    const V w = Rows::load_n(a.W, row + i, n);
    for (int m = 0; m < M; ++m) acc[m][0] = S::fmadd(w, S::load_n(a.x + m * in + i, n), acc[m][0]);
  }
  for (int m = 0; m < M; ++m) {
    for (int u = 1; u < U; ++u) acc[m][0] = S::add(acc[m][0], acc[m][u]);
    float* y = a.y + m * a.out + o;
    *y = (a.beta == 0.0f ? 0.0f : *y) + S::hsum(acc[m][0]) + (a.b ? a.b[o] : 0.0f);
  }
}

template <class S, class Rows, int M>
void gemv_rows_m(const GemvArgs& a, i64 o0, i64 o1) {
  for (i64 o = o0; o < o1; ++o) gemv_row<S, Rows, M>(a, o);
}

// M ∈ [1, 4] becomes a template constant so the accumulators live in registers.
template <class S, class Rows>
void gemv_rows(const GemvArgs& a, i64 o0, i64 o1) {
  switch (a.M) {
    case 1: gemv_rows_m<S, Rows, 1>(a, o0, o1); break;
    case 2: gemv_rows_m<S, Rows, 2>(a, o0, o1); break;
    case 3: gemv_rows_m<S, Rows, 3>(a, o0, o1); break;
    default: gemv_rows_m<S, Rows, 4>(a, o0, o1); break;
  }
}

// gelu(x) = x / (1 + 2^(−2u·log2 e)), u = x(k + k·0.044715·x²), k = √(2/π). The exponent is
// clamped to ≤ 126 so 2^ stays finite (x < −9: gelu(x) < 1e-18·|x|, returned as ≈ −x·2^-126).
template <class S>
void gelu_impl(float* out, const float* x, i64 n) {
  using V = typename S::V;
  const float k = static_cast<float>(std::sqrt(2.0 / M_PI));
  const V k1 = S::set1(-2.0f * 1.4426950408889634f * k), k3 = S::set1(-2.0f * 1.4426950408889634f * k * 0.044715f);
  const V one = S::set1(1.0f), cap = S::set1(126.0f);
  auto one_vec = [&](V v) {
    const V e = S::exp2(S::min(S::mul(v, S::fmadd(S::mul(v, v), k3, k1)), cap));
    return S::div(v, S::add(one, e));
  };
  i64 i = 0;
  for (; i + S::L <= n; i += S::L) S::storeu(out + i, one_vec(S::loadu(x + i)));
  if (i < n) S::store_n(out + i, one_vec(S::load_n(x + i, static_cast<int>(n - i))), static_cast<int>(n - i));
}

}  // namespace
}  // namespace qkv::blocks::detail
