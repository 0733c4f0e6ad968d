// Internal: the tile loop of the fast attention backward, written once over V16 (simd.hpp) and
// compiled per instruction set by attention_backward_{avx512,avx2,scalar}.cpp, each of which
// defines QKV_ISA_NS and includes this file. See attention_backward.hpp for the algorithm.
//
// Per-thread arena (floats, each piece a multiple of 16 so all stay 64-byte aligned):
//   KT  [D,   kBk]   keys of the block, transposed      (B operand of S = Q·Kᵀ)
//   Kr  [kBk, Dp ]   keys of the block, row-major        (B operand of dQ += dS·K)
//   VT  [Dv,  kBk]   values of the block, transposed    (B operand of dP = dO·Vᵀ)
//   dK  [kBk, Dp ]   accumulators of the block's dk over the group's heads and all queries
//   dV  [kBk, Dvp]   same for dv
//   S   [kBq, kBk]   scores, then probabilities P in place
//   dP  [kBq, kBk]   dO·Vᵀ, then dS in place
//   row [kBk]        one row of the dense mask
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_backward.hpp"
#include "kernels/cpu/simd.hpp"

namespace qkv::kernels::QKV_ISA_NS {
namespace {

using bwd::Context;
using bwd::kBk;
using bwd::kBq;

// Register tile of the micro-kernel: kM rows × kNG groups of 16 columns held in registers.
#if defined(__AVX512F__)
inline constexpr int kM = 6, kNG = 4;  // 24 of 32 zmm accumulate; 4 loads + 6 broadcasts per 24 FMAs
#elif defined(__AVX2__)
inline constexpr int kM = 6, kNG = 1;  // 12 of 16 ymm accumulate
#else
inline constexpr int kM = 4, kNG = 1;
#endif

inline std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// C[m, 16·g + l] (+)= Σ_k A[m·a_rs + k·a_cs] · B[k·ldb + 16·g + l]  for m < M, g < NG, l < 16.
// A is broadcast one element at a time, so it may be read transposed (a_rs = 1) as well.
template <int M, int NG>
void tile(const float* A, std::int64_t a_rs, std::int64_t a_cs, const float* B, std::int64_t ldb, float* C,
          std::int64_t ldc, std::int64_t K, bool accumulate) {
  V16 c[M][NG];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) c[m][g] = accumulate ? vload(C + m * ldc + kLanes * g) : vzero();
  for (std::int64_t k = 0; k < K; ++k) {
    V16 b[NG];
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) b[g] = vload(B + k * ldb + kLanes * g);
    const float* a = A + k * a_cs;
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const V16 am = vset1(a[m * a_rs]);
#pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) c[m][g] = vfma(am, b[g], c[m][g]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) vstore(C + m * ldc + kLanes * g, c[m][g]);
}

using TileFn = void (*)(const float*, std::int64_t, std::int64_t, const float*, std::int64_t, float*, std::int64_t,
                        std::int64_t, bool);
struct TileTable {
  TileFn f[kM][kNG];
};
template <int M, std::size_t... G>
constexpr void fill_row(TileFn* row, std::index_sequence<G...>) {
  ((row[G] = &tile<M, static_cast<int>(G) + 1>), ...);
}
template <std::size_t... Mi>
constexpr TileTable make_table(std::index_sequence<Mi...>) {
  TileTable t{};
  (fill_row<static_cast<int>(Mi) + 1>(t.f[Mi], std::make_index_sequence<kNG>{}), ...);
  return t;
}
constexpr TileTable kTiles = make_table(std::make_index_sequence<kM>{});

// C [m, 16·ng] (+)= A [m, K] · B [K, 16·ng], A read as A[i·a_rs + k·a_cs], B and C row-major.
void gemm(std::int64_t m, std::int64_t ng, std::int64_t K, const float* A, std::int64_t a_rs, std::int64_t a_cs,
          const float* B, std::int64_t ldb, float* C, std::int64_t ldc, bool accumulate) {
  for (std::int64_t g0 = 0; g0 < ng; g0 += kNG) {
    const std::int64_t gn = imin(kNG, ng - g0);
    for (std::int64_t m0 = 0; m0 < m; m0 += kM) {
      const std::int64_t mn = imin(kM, m - m0);
      kTiles.f[mn - 1][gn - 1](A + m0 * a_rs, a_rs, a_cs, B + kLanes * g0, ldb, C + m0 * ldc + kLanes * g0, ldc, K,
                                accumulate);
    }
  }
}

// Allowed keys [lo, hi) of query i (the KeyRange rule, restated without std:: templates).
inline void row_range(const KeyRange& r, std::int64_t i, std::int64_t key_len, std::int64_t* lo, std::int64_t* hi) {
  const std::int64_t diag = i + r.diag_offset;
  std::int64_t l = 0, h = key_len;
  if (r.window_left >= 0) l = imax(l, diag - r.window_left);
  if (r.causal) h = imin(h, diag + 1);
  if (r.window_right >= 0) h = imin(h, diag + r.window_right + 1);
  *lo = l;
  *hi = h;
}

inline void zero_floats(float* p, std::int64_t n) { std::memset(p, 0, static_cast<std::size_t>(n) * sizeof(float)); }

}  // namespace

void backward_task(const Context& cx, float* arena, std::int64_t task) {
  const std::int64_t c = task % cx.chunks;
  const std::int64_t b = task / cx.chunks / cx.Hkv, hk = task / cx.chunks % cx.Hkv;
  const std::int64_t D = cx.D, Dv = cx.Dv, Dp = cx.Dp, Dvp = cx.Dvp, Sq = cx.Sq;
  const std::int64_t key_len = cx.key_len[b];

  float* KT = arena;
  float* Kr = KT + D * kBk;
  float* VT = Kr + kBk * Dp;
  float* dK = VT + Dv * kBk;
  float* dV = dK + kBk * Dp;
  float* S = dV + kBk * Dvp;
  float* dP = S + kBq * kBk;
  float* mrow = dP + kBq * kBk;

  for (std::int64_t h = hk * cx.G; h < (hk + 1) * cx.G; ++h) zero_floats(cx.dq_rows(c, b, h), Sq * Dp);

  const V16 vscale = vset1(cx.scale);
  const V16 vc = vset1(cx.scale_log2e);
  const std::int64_t kb_begin = cx.chunk_begin[b * (cx.chunks + 1) + c];
  const std::int64_t kb_end = cx.chunk_begin[b * (cx.chunks + 1) + c + 1];
  for (std::int64_t kb = kb_begin; kb < kb_end; ++kb) {
    const std::int64_t k0 = kb * kBk, nk = imin(kBk, cx.Skv - k0);
    const std::int64_t ngk = (nk + kLanes - 1) / kLanes;  // V16 groups spanning the block's keys
    bwd::pack_kv_block(cx, b, hk, k0, nk, KT, Kr, VT);
    zero_floats(dK, kBk * Dp);
    zero_floats(dV, kBk * Dvp);

    for (std::int64_t h = hk * cx.G; h < (hk + 1) * cx.G; ++h) {
      const float* Qh = cx.q_rows(b, h);
      const float* dOh = cx.dout_rows(b, h);
      const float* Lh = cx.L + (b * cx.H + h) * Sq;
      const float* delta_h = cx.delta + (b * cx.H + h) * Sq;
      float* dQh = cx.dq_rows(c, b, h);

      for (std::int64_t i0 = 0; i0 < Sq; i0 += kBq) {
        const std::int64_t mq = imin(kBq, Sq - i0), i1 = i0 + mq - 1;
        // The allowed ranges move monotonically with i, so the block's union is
        // [lo(i0), hi(i1)) and its intersection [lo(i1), hi(i0)).
        std::int64_t lo_first, hi_first, lo_last, hi_last;
        row_range(cx.rule, i0, key_len, &lo_first, &hi_first);
        row_range(cx.rule, i1, key_len, &lo_last, &hi_last);
        if (imax(lo_first, k0) >= imin(hi_last, k0 + nk)) continue;  // no allowed key in the tile
        const bool full = !cx.has_mask && nk % kLanes == 0 && lo_last <= k0 && hi_first >= k0 + nk;

        const float* Q = Qh + i0 * cx.q_ld;
        const float* dO = dOh + i0 * cx.o_ld;

        // S = Q·Kᵀ, then P = 2^(S·scale·log2e + mask − L) on allowed keys, 0 elsewhere.
        gemm(mq, ngk, D, Q, cx.q_ld, 1, KT, kBk, S, kBk, false);
        for (std::int64_t r = 0; r < mq; ++r) {
          float* Sr = S + r * kBk;
          const V16 negL = vset1(-Lh[i0 + r]);
          if (full) {
            for (std::int64_t g = 0; g < ngk; ++g)
              vstore(Sr + kLanes * g, vexp2(vfma(vload(Sr + kLanes * g), vc, negL)));
            continue;
          }
          std::int64_t lo, hi;
          row_range(cx.rule, i0 + r, key_len, &lo, &hi);
          lo = imax(lo - k0, 0);
          hi = imin(hi - k0, nk);
          if (lo >= hi) {
            zero_floats(Sr, ngk * kLanes);
            continue;
          }
          if (cx.has_mask) {
            bwd::load_mask_row(cx, b, h, i0 + r, k0, nk, mrow);
            for (std::int64_t g = 0; g < ngk; ++g)
              vstore(Sr + kLanes * g, vexp2(vfma(vload(Sr + kLanes * g), vc, vadd(vload(mrow + kLanes * g), negL))));
          } else {
            for (std::int64_t g = 0; g < ngk; ++g)
              vstore(Sr + kLanes * g, vexp2(vfma(vload(Sr + kLanes * g), vc, negL)));
          }
          zero_floats(Sr, lo);
          zero_floats(Sr + hi, ngk * kLanes - hi);
        }

        // dP = dO·Vᵀ, then dS = P ∘ (dP − delta) · scale.
        gemm(mq, ngk, Dv, dO, cx.o_ld, 1, VT, kBk, dP, kBk, false);
        for (std::int64_t r = 0; r < mq; ++r) {
          const V16 dl = vset1(delta_h[i0 + r]);
          float* dPr = dP + r * kBk;
          const float* Pr = S + r * kBk;
          for (std::int64_t g = 0; g < ngk; ++g)
            vstore(dPr + kLanes * g, vmul(vmul(vload(Pr + kLanes * g), vsub(vload(dPr + kLanes * g), dl)), vscale));
        }

        // dV += Pᵀ·dO, dK += dSᵀ·Q (Pᵀ and dSᵀ read transposed), dQ += dS·K.
        gemm(nk, Dvp / kLanes, mq, S, 1, kBk, dO, cx.o_ld, dV, Dvp, true);
        gemm(nk, Dp / kLanes, mq, dP, 1, kBk, Q, cx.q_ld, dK, Dp, true);
        gemm(mq, Dp / kLanes, nk, dP, kBk, 1, Kr, Dp, dQh + i0 * Dp, Dp, true);
      }
    }
    bwd::store_dkdv_block(cx, b, hk, k0, nk, dK, dV);
  }
}

}  // namespace qkv::kernels::QKV_ISA_NS
