// GEMV with bf16 weights on AVX-512 BF16: vdpbf16ps (_mm512_dpbf16_ps) multiplies 32 bf16 pairs
// and accumulates 16 f32 lanes — one instruction per 32 weights instead of widen + FMA per 16.
// Both operands must be bf16, so x arrives split (dense.cpp) as x_hi + x_lo, each bf16: two
// vdpbf16ps per weight vector keep the activations' error at ≤ 2^-17·|x| instead of bf16's 2^-9.
// Compiled with -mavx512bf16 on top of the AVX-512 flags (src/blocks/CMakeLists.txt).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "blocks/dense_kernels.hpp"

namespace qkv::blocks::detail {
namespace {

using i64 = std::int64_t;

inline __m512bh load_bh(const std::uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(reinterpret_cast<const void*>(p)));
}
inline __m512bh load_bh_n(const std::uint16_t* p, int n) {  // n < 32 values, the rest zero
  return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(static_cast<__mmask32>((1u << n) - 1u), p));
}

// Output row o for the M input rows; as gemv_row in dense_impl.hpp (one row, front to back),
// U vectors of 32 columns a step. Each accumulator's chain is two dependent vdpbf16ps (x_hi, then
// x_lo) per step; U = 4 chains at M = 1 keep the unit busy (measured: the same speed as separate
// hi / lo accumulators), M·U ≤ 8 above.
template <int M>
void row(const GemvArgs& a, i64 o) {
  constexpr int U = M <= 2 ? 4 : 2;
  const i64 in = a.in;
  const std::uint16_t* w_row = static_cast<const std::uint16_t*>(a.W) + o * in;
  __m512 acc[M][U];
  for (int m = 0; m < M; ++m)
    for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
  // One vector of weights (32 columns from i) into accumulator u of every input row.
  auto step = [&](int u, auto load, i64 i) {
    const __m512bh w = load(w_row + i);
    for (int m = 0; m < M; ++m)
      acc[m][u] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[m][u], w, load(a.xs + 2 * m * in + i)), w,
                                   load(a.xs + (2 * m + 1) * in + i));
  };
  const auto full = [](const std::uint16_t* p) { return load_bh(p); };
  i64 i = 0;
  for (; i + 32 * U <= in; i += 32 * U)
    for (int u = 0; u < U; ++u) step(u, full, i + 32 * u);
  for (; i + 32 <= in; i += 32) step(0, full, i);
  if (i < in) {
    const int n = static_cast<int>(in - i);
    step(0, [n](const std::uint16_t* p) { return load_bh_n(p, n); }, i);
  }
  for (int m = 0; m < M; ++m) {
    for (int u = 1; u < U; ++u) acc[m][0] = _mm512_add_ps(acc[m][0], acc[m][u]);
    float* y = a.y + m * a.out + o;
    *y = (a.beta == 0.0f ? 0.0f : *y) + _mm512_reduce_add_ps(acc[m][0]) + (a.b ? a.b[o] : 0.0f);
  }
}

template <int M>
void rows(const GemvArgs& a, i64 o0, i64 o1) {
  for (i64 o = o0; o < o1; ++o) row<M>(a, o);
}

}  // namespace

void split_bf16_avx512bf16(const float* x, std::uint16_t* xs, i64 M, i64 in) {
  using S = kernels::cpu::SimdAvx512;
  for (i64 m = 0; m < M; ++m) {
    const float* xm = x + m * in;
    std::uint16_t* hi = xs + 2 * m * in;
    std::uint16_t* lo = hi + in;
    i64 i = 0;
    for (; i + S::L <= in; i += S::L) {
      const S::V v = S::loadu(xm + i);
      S::store_bf16(hi + i, v);
      S::store_bf16(lo + i, S::sub(v, S::load_bf16(hi + i)));
    }
    if (i < in) {
      const int n = static_cast<int>(in - i);
      const S::V v = S::load_n(xm + i, n);
      S::store_bf16_n(hi + i, v, n);
      S::store_bf16_n(lo + i, S::sub(v, S::load_bf16_n(hi + i, n)), n);
    }
  }
}

void gemv_bf16_avx512bf16(const GemvArgs& a, i64 o0, i64 o1) {
  switch (a.M) {
    case 1: rows<1>(a, o0, o1); break;
    case 2: rows<2>(a, o0, o1); break;
    case 3: rows<3>(a, o0, o1); break;
    default: rows<4>(a, o0, o1); break;
  }
}

}  // namespace qkv::blocks::detail
