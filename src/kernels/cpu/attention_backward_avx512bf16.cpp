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
// The fixed costs that do not shrink with D — these layouts (K and V per key block here, Q and dO
// in prepass_head_avx512_bf16) and rounding dk, dv, dq to bf16 — run on vectors when the caller's
// rows are contiguous (scalar loops otherwise), with the same bits: at D = 64 the scalar loops took
// a quarter of the backward's time.
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

// ---- Vector packing of the bf16 operands (unit-stride rows; the scalar loops take the others) ----

// The first n (≤ 32 used; n ≤ 0: none) bf16 at p, zero past them. Masked lanes are not read.
inline __m512i load_bf16(const std::uint16_t* p, i64 n) {
  if (n <= 0) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi16(n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1, p);
}
// Stores the first n (≤ 32 used) halves of x at p.
inline void store_bf16(std::uint16_t* p, __m512i x, i64 n) {
  if (n > 0) _mm512_mask_storeu_epi16(p, n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1, x);
}
// finite_or_zero_bf16 (attention_backward.hpp) on 32 halves.
inline __m512i finite_or_zero32(__m512i x) {
  const __m512i e = _mm512_set1_epi16(0x7f80);
  return _mm512_maskz_mov_epi16(_mm512_cmpneq_epi16_mask(_mm512_and_si512(x, e), e), x);
}
// Halves a[0..31], b[0..31] → words (a[d], b[d]): d < 16 in *lo, d ≥ 16 in *hi.
inline void interleave32(__m512i a, __m512i b, __m512i* lo, __m512i* hi) {
  const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6, 37, 5,
                                      36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
  *lo = _mm512_permutex2var_epi16(a, il, b);
  *hi = _mm512_permutex2var_epi16(a, ih, b);
}
// r[t] (16 rows of 16 words) → r[c] = column c: the 16 × 16 transpose of 32-bit words.
inline void transpose16(__m512i r[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4q + k], k < 4: in 128-bit lane L, word 4L + k of rows 4q … 4q + 3
  for (int q = 0; q < 4; ++q) {
    u[4 * q] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i a = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), bb = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i c = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88), d = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    r[k] = _mm512_shuffle_i32x4(a, c, 0x88);
    r[4 + k] = _mm512_shuffle_i32x4(bb, d, 0x88);
    r[8 + k] = _mm512_shuffle_i32x4(a, c, 0xDD);
    r[12 + k] = _mm512_shuffle_i32x4(bb, d, 0xDD);
  }
}
// rows[j] (n bf16 each, j < nr ≤ kBk; rows past nr zero) → T [w_n][kBk] words: word (w, j) =
// (rows[j][2w], rows[j][2w + 1]), zero past n; w_n = ⌈n/2⌉ rounded up to 8 (Dp/2 or Dvp/2).
inline void transpose_rows(const std::uint16_t* const* rows, i64 nr, i64 n, i64 w_n, Word* T) {
  for (i64 j0 = 0; j0 < kBk; j0 += 16)
    for (i64 w0 = 0; w0 < w_n; w0 += 16) {
      __m512i r[16];
      for (int t = 0; t < 16; ++t) r[t] = j0 + t < nr ? load_bf16(rows[j0 + t] + 2 * w0, n - 2 * w0) : _mm512_setzero_si512();
      transpose16(r);
      for (i64 c = 0; c < 16 && w0 + c < w_n; ++c) _mm512_storeu_si512(T + (w0 + c) * kBk + j0, r[c]);
    }
}
// Rows a and b (n bf16 each; null: a zero row) → np words (a[d], b[d]) at P, zero past n; n ≤ np,
// np a multiple of 16. Not-finite values → 0 when sanitize. Also the rows themselves, zero-padded
// to np, at ra and rb unless those are null.
inline void pair_rows(const std::uint16_t* a, const std::uint16_t* b, i64 n, i64 np, bool sanitize, Word* P,
                      std::uint16_t* ra = nullptr, std::uint16_t* rb = nullptr) {
  for (i64 d0 = 0; d0 < np; d0 += 32) {
    __m512i x = a ? load_bf16(a + d0, n - d0) : _mm512_setzero_si512();
    __m512i y = b ? load_bf16(b + d0, n - d0) : _mm512_setzero_si512();
    if (sanitize) x = finite_or_zero32(x), y = finite_or_zero32(y);
    if (ra) store_bf16(ra + d0, x, np - d0);
    if (rb) store_bf16(rb + d0, y, np - d0);
    __m512i lo, hi;
    interleave32(x, y, &lo, &hi);
    _mm512_storeu_si512(P + d0, lo);
    if (d0 + 16 < np) _mm512_storeu_si512(P + d0 + 16, hi);
  }
}
// f32_to_bf16 (qkv/types.hpp) on 16 floats, bit for bit: round to nearest even, NaN quietened
// (vcvtneps2bf16 would flush subnormals to zero).
inline __m256i round_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);
}
// Σ_e (f64) x[e]·y[e] over n bf16 pairs (the products are exact in f64).
inline double dot_bf16(const std::uint16_t* x, const std::uint16_t* y, i64 n) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  for (i64 e = 0; e < n; e += 16) {
    const __mmask16 m = n - e >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - e)) - 1);
    const __m512 xf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x + e)), 16));
    const __m512 yf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, y + e)), 16));
    acc0 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(xf)), _mm512_cvtps_pd(_mm512_castps512_ps256(yf)), acc0);
    acc1 = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(xf, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(yf, 1)),
                           acc1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
}

// The five products on bf16 operands (the interface of OpsF32 in attention_backward_impl.hpp).
struct OpsBf16 {
  static constexpr bool kSpans = false;  // P and dS by backward_task's separate passes
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
    if ((k.stride(3) == 1 || D == 1) && (v.stride(3) == 1 || Dv == 1)) {  // rows in place: transposes
      const std::uint16_t *kr[kBk], *vr[kBk];
      for (i64 j = 0; j < nk; ++j) {
        kr[j] = k.ptr<std::uint16_t>() + k.offset(b, hk, k0 + j, 0);
        vr[j] = v.ptr<std::uint16_t>() + v.offset(b, hk, k0 + j, 0);
      }
      transpose_rows(kr, nk, D, qw, Kt);
      transpose_rows(vr, nk, Dv, ow, Vt);
      for (i64 jp = 0; jp < kBk / 2; ++jp)
        pair_rows(2 * jp < nk ? kr[2 * jp] : nullptr, 2 * jp + 1 < nk ? kr[2 * jp + 1] : nullptr, D, Dp, true,
                  Kp + jp * Dp);
      return;
    }
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
  // store_dkdv_block's work, rounding 16 values at a time when the rows are contiguous.
  void store_dkdv(i64 b, i64 hk, i64 k0, i64 nk, const float* dK, const float* dV) const {
    const View& dk = cx.p->dk;
    const View& dv = cx.p->dv;
    if (!((dk.stride(3) == 1 || cx.D == 1) && (dv.stride(3) == 1 || cx.Dv == 1))) {
      store_dkdv_block(cx, b, hk, k0, nk, dK, dV);
      return;
    }
    for (i64 j = 0; j < nk; ++j) {
      sum_rows_bf16_avx512_bf16(dK + j * cx.Dp, 0, 1, cx.D, dk.ptr<std::uint16_t>() + dk.offset(b, hk, k0 + j, 0));
      sum_rows_bf16_avx512_bf16(dV + j * cx.Dvp, 0, 1, cx.Dv, dv.ptr<std::uint16_t>() + dv.offset(b, hk, k0 + j, 0));
    }
  }
  // i0 is a multiple of kBq (even), so the block's row pairs start at pair i0 / 2.
  void grads(i64 b, i64 h, i64 i0, i64 mq, i64 nk, const float* P, const float* dS, const GradOut& g) const {
    const i64 ngk = (nk + 15) / 16, mp = (mq + 1) / 2;
    to_row_pairs(P, mq, ngk, Pp);
    to_row_pairs(dS, mq, ngk, dSp);
    to_bf16_rows(dS, mq, ngk, dSr);
    dgemm(nk, cx.Dvp / 16, mp, Pp, 1, kBk, o_pairs(b, h) + i0 / 2 * cx.Dvp, cx.Dvp, g.dV, g.ldv, g.acc_kv);
    dgemm(nk, cx.Dp / 16, mp, dSp, 1, kBk, q_pairs(b, h) + i0 / 2 * cx.Dp, cx.Dp, g.dK, g.ldk, g.acc_kv);
    dgemm(mq, cx.Dp / 16, (nk + 1) / 2, dSr, kBk / 2, 1, Kp, cx.Dp, g.dQ, g.ldq, g.acc_q);
  }
};

}  // namespace

bool prepass_head_avx512_bf16(const AttnBwdParams& bp, std::int64_t b, std::int64_t h, bool q_sanitize,
                              std::uint16_t* qr, std::uint16_t* q2, std::uint16_t* or_, std::uint16_t* o2, double* dots) {
  const AttnParams& p = bp.fwd;
  const View& q = p.q;
  const View& o = bp.dout;
  const View& out = p.out;
  const i64 D = p.D, Dv = p.Dv, Dp = pad16(D), Dvp = pad16(Dv), Sq = p.Sq;
  if (!((q.stride(3) == 1 || D == 1) && (o.stride(3) == 1 || Dv == 1) && (out.stride(3) == 1 || Dv == 1)))
    return false;
  auto row = [&](const View& t, i64 i) { return i < Sq ? t.ptr<std::uint16_t>() + t.offset(b, h, i, 0) : nullptr; };
  for (i64 i = 0; i < Sq; i += 2) {
    const bool two = i + 1 < Sq;
    pair_rows(row(q, i), row(q, i + 1), D, Dp, q_sanitize, reinterpret_cast<Word*>(q2 + i * Dp), qr + i * Dp,
              two ? qr + (i + 1) * Dp : nullptr);
    pair_rows(row(o, i), row(o, i + 1), Dv, Dvp, false, reinterpret_cast<Word*>(o2 + i * Dvp), or_ + i * Dvp,
              two ? or_ + (i + 1) * Dvp : nullptr);
  }
  for (i64 i = 0; i < Sq; ++i) dots[i] = dot_bf16(row(out, i), row(o, i), Dv);
  return true;
}

void sum_rows_bf16_avx512_bf16(const float* src, std::int64_t cs, std::int64_t C, std::int64_t n, std::uint16_t* dst) {
  for (i64 e = 0; e < n; e += 16) {
    const __mmask16 m = n - e >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - e)) - 1);
    __m512 acc = _mm512_maskz_loadu_ps(m, src + e);
    for (i64 c = 1; c < C; ++c) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, src + c * cs + e));
    _mm256_mask_storeu_epi16(dst + e, m, round_bf16(acc));
  }
}

void backward_task_avx512_bf16(const Context& cx, float* arena, std::int64_t task) {
  backward_task<cpu::SimdAvx512, OpsBf16>(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
