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

// Output rows o … o + R − 1 for the M input rows; as gemv_block in dense_impl.hpp, 32 columns a step.
template <int M, int R>
void block(const GemvArgs& a, i64 o) {
  const i64 in = a.in;
  const auto* W = static_cast<const std::uint16_t*>(a.W);
  __m512 acc[M][R];
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  auto step = [&](auto load_x, auto load_w) {
    __m512bh xh[M], xl[M];
    for (int m = 0; m < M; ++m) {
      xh[m] = load_x(a.xs + 2 * m * in);
      xl[m] = load_x(a.xs + (2 * m + 1) * in);
    }
    for (int r = 0; r < R; ++r) {
      const __m512bh w = load_w(W + (o + r) * in);
      for (int m = 0; m < M; ++m) acc[m][r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[m][r], w, xh[m]), w, xl[m]);
    }
  };
  i64 i = 0;
  for (; i + 32 <= in; i += 32) {
    auto ld = [i](const std::uint16_t* row) { return load_bh(row + i); };
    step(ld, ld);
  }
  if (i < in) {
    const int n = static_cast<int>(in - i);
    auto ld = [i, n](const std::uint16_t* row) { return load_bh_n(row + i, n); };
    step(ld, ld);
  }
  for (int m = 0; m < M; ++m)
    for (int r = 0; r < R; ++r) {
      float* y = a.y + m * a.out + o + r;
      *y = (a.beta == 0.0f ? 0.0f : *y) + _mm512_reduce_add_ps(acc[m][r]) + (a.b ? a.b[o + r] : 0.0f);
    }
}

template <int M>
void rows(const GemvArgs& a, i64 o0, i64 o1) {
  i64 o = o0;
  for (; o + 4 <= o1; o += 4) block<M, 4>(a, o);
  for (; o < o1; ++o) block<M, 1>(a, o);
}

}  // namespace

void gemv_bf16_avx512bf16(const GemvArgs& a, i64 o0, i64 o1) {
  switch (a.M) {
    case 1: rows<1>(a, o0, o1); break;
    case 2: rows<2>(a, o0, o1); break;
    case 3: rows<3>(a, o0, o1); break;
    default: rows<4>(a, o0, o1); break;
  }
}

}  // namespace qkv::blocks::detail
