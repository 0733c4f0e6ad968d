// The fast attention backward for bf16 tensors on CPUs with AVX-512 BF16: the five products run
// on vdpbf16ps (_mm512_dpbf16_ps: pairs of bf16 multiplied and summed into f32, 32 products per
// instruction instead of 16), as the bf16 forward's (flash_avx512bf16.cpp). S = Q·Kᵀ and
// dP = dO·Vᵀ take the inputs exactly; P and dS are rounded to bf16 (round to nearest even) for
// dV += Pᵀ·dO, dK += dSᵀ·Q and dQ += dS·K, as a bf16 matmul (and FlashAttention's bf16 backward)
// would. Softmax, masks, variants and dropout are the f32 code of attention_backward_impl.hpp;
// every sum is f32. Compiled with -mavx512bf16 on top of the AVX-512 flags (CMakeLists.txt).
//
// Operands as 32-bit words, each a pair of bf16 (low half first) along the summed index:
//   Kt  [Dp/2][kBk]    K of the block: word (dp, j) = (k[j][2dp], k[j][2dp+1])   (Q·Kᵀ)
//   Kp  [kBk/2][Dp]    word (jp, d) = (k[2jp][d], k[2jp+1][d]), not finite → 0   (dS·K)
//   Vt  [Dvp/2][kBk]   V of the block as Kt                                       (dO·Vᵀ)
//   Pp  [kBq/2][kBk]   word (ip, j) = (P[2ip][j], P[2ip+1][j])                   (Pᵀ·dO)
//   dSp [kBq/2][kBk]   dS as Pp                                                   (dSᵀ·Q)
//   dSr [kBq][kBk/2]   dS rows: word (i, jp) = (dS[i][2jp], dS[i][2jp+1])         (dS·K)
//   Q and dO: Context::qb (rows: pairs along d) and qb2 (pairs of rows), ob and ob2 likewise.
// Keys past the block's nk and rows past its mq are zero words in every operand, so a pair that
// straddles the edge adds 0·0 (K and V past nk are never read from the caller's memory).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {
namespace {

using i64 = std::int64_t;
using Word = std::uint32_t;

// A vector of 16 words typed as bf16 from the start (see load_bh in flash_avx512bf16.cpp: a
// __m512i load reinterpreted makes GCC 12 copy values through the stack).
inline __m512bh load_words(const Word* p) {
  __m512bh x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

// C[m, 16·g + l] (+)= Σ_{p < K} A(m, p) · B[p·ldb + 16·g + l] for m < M, g < NG, l < 16, each term
// the f32 dot product of two bf16 pairs; A(m, p) = A[m·a_rs + p·a_cs] is broadcast, so it may be
// read transposed (a_rs = 1). Strides in words; C row-major f32.
template <int M, int NG>
void dtile(const Word* A, i64 a_rs, i64 a_cs, const Word* B, i64 ldb, float* C, i64 ldc, i64 K, bool accumulate) {
  __m512 c[M][NG];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) c[m][g] = accumulate ? _mm512_loadu_ps(C + m * ldc + 16 * g) : _mm512_setzero_ps();
  for (i64 p = 0; p < K; ++p) {
    __m512bh b[NG];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) b[g] = load_words(B + p * ldb + 16 * g);
    const Word* a = A + p * a_cs;
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const __m512bh am = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(a[m * a_rs])));
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) c[m][g] = _mm512_dpbf16_ps(c[m][g], am, b[g]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) _mm512_storeu_ps(C + m * ldc + 16 * g, c[m][g]);
}

// Register tile: 6 rows × 4 groups of 16 columns (24 accumulators + 4 B vectors + the broadcast,
// as the forward's Q·Kᵀ); smaller tiles for the edges.
constexpr int kTM = 6, kTG = 4;
using DTileFn = void (*)(const Word*, i64, i64, const Word*, i64, float*, i64, i64, bool);
struct DTileTable {
  DTileFn f[kTM][kTG];
  template <int M, std::size_t... G>
  constexpr void fill_row(std::index_sequence<G...>) {
    ((f[M - 1][G] = &dtile<M, static_cast<int>(G) + 1>), ...);
  }
  template <std::size_t... Mi>
  constexpr DTileTable(std::index_sequence<Mi...>) : f{} {
    (fill_row<static_cast<int>(Mi) + 1>(std::make_index_sequence<kTG>{}), ...);
  }
};

// C [m, 16·ng] (+)= A [m, K pairs] · B [K pairs, 16·ng], A read as in dtile.
void dgemm(i64 m, i64 ng, i64 K, const Word* A, i64 a_rs, i64 a_cs, const Word* B, i64 ldb, float* C, i64 ldc,
           bool accumulate) {
  static constexpr DTileTable kTiles{std::make_index_sequence<kTM>{}};
  for (i64 g0 = 0; g0 < ng; g0 += kTG) {
    const i64 gn = imin(kTG, ng - g0);
    for (i64 m0 = 0; m0 < m; m0 += kTM) {
      const i64 mn = imin(kTM, m - m0);
      kTiles.f[mn - 1][gn - 1](A + m0 * a_rs, a_rs, a_cs, B + 16 * g0, ldb, C + m0 * ldc + 16 * g0, ldc, K, accumulate);
    }
  }
}

// 16 floats → 16 words whose low halves are the bf16 of a and high halves the bf16 of b: both
// rounded by one vcvtne2ps2bf16 (a in halves 0–15, b in 16–31), then interleaved by one vpermw.
inline __m512i pair16(__m512 a, __m512 b) {
  const __m512i ab = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a));
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5,
                                       20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, ab);
}

// X [mq, kBk] f32, columns [0, 16·ng) → Xp [⌈mq/2⌉][kBk] words of row pairs (a zero row past mq).
inline void to_row_pairs(const float* X, i64 mq, i64 ng, Word* Xp) {
  for (i64 ip = 0; 2 * ip < mq; ++ip) {
    const float* a = X + 2 * ip * kBk;
    const bool has_b = 2 * ip + 1 < mq;
    for (i64 g = 0; g < ng; ++g) {
      const __m512 va = _mm512_loadu_ps(a + 16 * g);
      const __m512 vb = has_b ? _mm512_loadu_ps(a + kBk + 16 * g) : _mm512_setzero_ps();
      _mm512_storeu_si512(Xp + ip * kBk + 16 * g, pair16(va, vb));
    }
  }
}

// X [mq, kBk] f32, columns [0, 16·ng) → bf16 rows Xr [mq][kBk] (as words: [mq][kBk/2]).
inline void to_bf16_rows(const float* X, i64 mq, i64 ng, Word* Xr) {
  for (i64 i = 0; i < mq; ++i) {
    auto* dst = reinterpret_cast<std::uint16_t*>(Xr + i * (kBk / 2));
    for (i64 g = 0; g < ng; ++g)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * g),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(X + i * kBk + 16 * g))));
  }
}

inline std::uint16_t finite_or_zero_bf16(std::uint16_t x) { return (x & 0x7f80u) == 0x7f80u ? 0 : x; }

// The five products on bf16 operands (the interface of OpsF32 in attention_backward_impl.hpp).
struct OpsBf16 {
  const Context& cx;
  i64 qw, ow;  // words per Q row (Dp/2), per dO row (Dvp/2)
  Word *Kt, *Kp, *Vt, *Pp, *dSp, *dSr;

  OpsBf16(const Context& c, float* mem) : cx(c), qw(c.Dp / 2), ow(c.Dvp / 2) {
    Kt = reinterpret_cast<Word*>(mem);
    Kp = Kt + qw * kBk;
    Vt = Kp + kBk / 2 * c.Dp;
    Pp = Vt + ow * kBk;
    dSp = Pp + kBq / 2 * kBk;
    dSr = dSp + kBq / 2 * kBk;
  }
  // Word pointers to the rows of head (b, h): rows of Q (dO), and pair rows of Q (dO).
  const Word* q_rows(i64 b, i64 h) const { return reinterpret_cast<const Word*>(cx.qb) + (b * cx.H + h) * cx.Sq * qw; }
  const Word* o_rows(i64 b, i64 h) const { return reinterpret_cast<const Word*>(cx.ob) + (b * cx.H + h) * cx.Sq * ow; }
  const Word* q_pairs(i64 b, i64 h) const {
    return reinterpret_cast<const Word*>(cx.qb2) + (b * cx.H + h) * ((cx.Sq + 1) / 2) * cx.Dp;
  }
  const Word* o_pairs(i64 b, i64 h) const {
    return reinterpret_cast<const Word*>(cx.ob2) + (b * cx.H + h) * ((cx.Sq + 1) / 2) * cx.Dvp;
  }

  void pack_kv(i64 b, i64 hk, i64 k0, i64 nk) {
    const View& k = cx.p->fwd.k;
    const View& v = cx.p->fwd.v;
    const i64 D = cx.D, Dv = cx.Dv, Dp = cx.Dp;
    std::memset(Kt, 0, static_cast<std::size_t>(qw * kBk) * sizeof(Word));
    std::memset(Kp, 0, static_cast<std::size_t>(kBk / 2 * Dp) * sizeof(Word));
    std::memset(Vt, 0, static_cast<std::size_t>(ow * kBk) * sizeof(Word));
    auto* kt = reinterpret_cast<std::uint16_t*>(Kt);
    auto* kp = reinterpret_cast<std::uint16_t*>(Kp);
    auto* vt = reinterpret_cast<std::uint16_t*>(Vt);
    const i64 ks = k.stride(3), vs = v.stride(3);
    for (i64 j = 0; j < nk; ++j) {
      const std::uint16_t* kr = k.ptr<std::uint16_t>() + k.offset(b, hk, k0 + j, 0);
      const std::uint16_t* vr = v.ptr<std::uint16_t>() + v.offset(b, hk, k0 + j, 0);
      std::uint16_t* kpj = kp + (j >> 1) * Dp * 2 + (j & 1);
      for (i64 d = 0; d < D; ++d) {
        const std::uint16_t x = kr[d * ks];
        kt[((d >> 1) * kBk + j) * 2 + (d & 1)] = x;
        kpj[2 * d] = finite_or_zero_bf16(x);  // the B operand of dS·K only: see finite_or_zero
      }
      for (i64 e = 0; e < Dv; ++e) vt[((e >> 1) * kBk + j) * 2 + (e & 1)] = vr[e * vs];
    }
  }
  void scores(i64 b, i64 h, i64 i0, i64 mq, i64 ngk, float* S) const {
    dgemm(mq, ngk, qw, q_rows(b, h) + i0 * qw, qw, 1, Kt, kBk, S, kBk, false);
  }
  void dov(i64 b, i64 h, i64 i0, i64 mq, i64 ngk, float* dP) const {
    dgemm(mq, ngk, ow, o_rows(b, h) + i0 * ow, ow, 1, Vt, kBk, dP, kBk, false);
  }
  // i0 is a multiple of kBq (even), so the block's row pairs start at pair i0 / 2.
  void grads(i64 b, i64 h, i64 i0, i64 mq, i64 nk, const float* P, const float* dS, float* dK, float* dV, float* dQ,
             i64 dq_ld) const {
    const i64 ngk = (nk + 15) / 16, mp = (mq + 1) / 2;
    to_row_pairs(P, mq, ngk, Pp);
    to_row_pairs(dS, mq, ngk, dSp);
    to_bf16_rows(dS, mq, ngk, dSr);
    dgemm(nk, cx.Dvp / 16, mp, Pp, 1, kBk, o_pairs(b, h) + i0 / 2 * cx.Dvp, cx.Dvp, dV, cx.Dvp, true);
    dgemm(nk, cx.Dp / 16, mp, dSp, 1, kBk, q_pairs(b, h) + i0 / 2 * cx.Dp, cx.Dp, dK, cx.Dp, true);
    dgemm(mq, cx.Dp / 16, (nk + 1) / 2, dSr, kBk / 2, 1, Kp, cx.Dp, dQ, dq_ld, true);
  }
};

}  // namespace

void backward_task_avx512_bf16(const Context& cx, float* arena, std::int64_t task) {
  backward_task<cpu::SimdAvx512, OpsBf16>(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
