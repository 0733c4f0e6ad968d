// Internal: the tile loop of the fast attention backward, written once as a template over the
// vector helpers of simd_{avx512,avx2,scalar}.hpp (the same exp2 as the flash forward) and over
// the operand code of its five products (OpsF32 below: f32 tiles; attention_backward_avx512bf16.cpp:
// vdpbf16ps tiles on bf16 operands), instantiated by attention_backward_<isa>.cpp, each compiled
// with its ISA's flags. See attention_backward.hpp for the algorithm. Everything here has internal
// linkage (anonymous namespace), so no copy compiled with AVX-512 flags can leak into portable code.
//
// Per-thread arena (floats, each piece a multiple of 16 so all stay 64-byte aligned):
//   S   [kBq, kBk]   scores, then probabilities P in place
//   dP  [kBq, kBk]   dO·Vᵀ, then dS in place
//   row [kBk]        one row of the dense mask; later that row's dropout factors W
//   Fc  [kBq, kBk]   1 − tanh² of the softcapped scores (softcap only)
//   then, for each of the kPassBlocks key blocks of a pass (pass_block_floats each):
//   dK  [kBk, Dp ]   accumulators of the block's dk over the group's heads and all queries
//   dV  [kBk, Dvp]   same for dv (both unused when they accumulate in the caller's rows, Context::dk0)
//   the operands' own scratch (ops_f32_floats / ops_bf16_floats in attention_backward.hpp); OpsF32's:
//   KT  [D,   kBk]   keys of the block, transposed      (B operand of S = Q·Kᵀ)
//   Kr  [kBk, Dp ]   keys of the block, row-major        (B operand of dQ += dS·K)
//   VT  [Dv,  kBk]   values of the block, transposed    (B operand of dP = dO·Vᵀ)
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_backward.hpp"
#include "kernels/dropout.hpp"
#include "kernels/cpu/score_mod.hpp"
#include "kernels/cpu/simd_common.hpp"

namespace qkv::kernels::bwd {
namespace {

inline constexpr int kLanes = 16;  // columns per group: padded widths are multiples of 16
inline constexpr float kInfF = __builtin_inff();

// 16 floats as 16 / Simd::L native vectors (one zmm, two ymm, or two 8-float arrays).
template <class Simd>
struct V16 {
  static constexpr int P = kLanes / Simd::L;
  typename Simd::V r[P];

  static V16 zero() {
    V16 a;
    for (int i = 0; i < P; ++i) a.r[i] = Simd::zero();
    return a;
  }
  static V16 set1(float x) {
    V16 a;
    for (int i = 0; i < P; ++i) a.r[i] = Simd::set1(x);
    return a;
  }
  static V16 load(const float* p) {
    V16 a;
    for (int i = 0; i < P; ++i) a.r[i] = Simd::loadu(p + i * Simd::L);
    return a;
  }
  void store(float* p) const {
    for (int i = 0; i < P; ++i) Simd::storeu(p + i * Simd::L, r[i]);
  }
  // this·b + c
  V16 fma(V16 b, V16 c) const {
    for (int i = 0; i < P; ++i) c.r[i] = Simd::fmadd(r[i], b.r[i], c.r[i]);
    return c;
  }
  V16 operator+(V16 b) const {
    for (int i = 0; i < P; ++i) b.r[i] = Simd::add(r[i], b.r[i]);
    return b;
  }
  V16 operator-(V16 b) const {
    for (int i = 0; i < P; ++i) b.r[i] = Simd::sub(r[i], b.r[i]);
    return b;
  }
  V16 operator*(V16 b) const {
    for (int i = 0; i < P; ++i) b.r[i] = Simd::mul(r[i], b.r[i]);
    return b;
  }
  // 2^x, exactly 0 below −126 (so −∞ gives 0).
  V16 exp2() const {
    V16 a;
    for (int i = 0; i < P; ++i) a.r[i] = Simd::exp2(r[i]);
    return a;
  }
};

inline std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }

// What a register tile does to each accumulator vector before storing it: c is row m, columns
// [col, col + 16) of the product (m and col counted from the product's first row and column).
struct EpiStore {  // nothing: C = the product
  template <class V>
  V operator()(V c, std::int64_t, std::int64_t) const {
    return c;
  }
};

// C[m, 16·g + l] (+)= Σ_k A[m·a_rs + k·a_cs] · B[k·ldb + 16·g + l]  for m < M, g < NG, l < 16,
// each sum in increasing k from +0, added to C (accumulate) after the loop, then C = epi(C) (row
// row0 + m, column col0 + 16·g of the product). A is broadcast one element at a time, so it may be
// read transposed (a_rs = 1) as well. C is read after the loop rather than before it: the loop's
// first multiply-adds do not wait for C, which the gradient products find in L2 (their dK, dV and
// dQ accumulators are too large for L1), and the loads issue while the loop still runs.
template <class Simd, int M, int NG, class Epi>
void tile(const float* A, std::int64_t a_rs, std::int64_t a_cs, const float* B, std::int64_t ldb, float* C,
          std::int64_t ldc, std::int64_t K, bool accumulate, const Epi& epi, std::int64_t row0, std::int64_t col0) {
  using V = V16<Simd>;
  V c[M][NG];
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m)
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) c[m][g] = V::zero();
  for (std::int64_t k = 0; k < K; ++k) {
    V b[NG];
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) b[g] = V::load(B + k * ldb + kLanes * g);
    const float* a = A + k * a_cs;
#pragma GCC unroll 8
    for (int m = 0; m < M; ++m) {
      const V am = V::set1(a[m * a_rs]);
#pragma GCC unroll 8
      for (int g = 0; g < NG; ++g) c[m][g] = am.fma(b[g], c[m][g]);
    }
  }
  // A row's epilogues before its stores: with no store between them, the compiler reads the
  // epilogue's per-row operands (L or delta of row m) once per row instead of once per vector.
#pragma GCC unroll 8
  for (int m = 0; m < M; ++m) {
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) {
      if (accumulate) c[m][g] = V::load(C + m * ldc + kLanes * g) + c[m][g];
      c[m][g] = epi(c[m][g], row0 + m, col0 + kLanes * g);
    }
#pragma GCC unroll 8
    for (int g = 0; g < NG; ++g) c[m][g].store(C + m * ldc + kLanes * g);
  }
}

template <class Epi>
using TileFn = void (*)(const float*, std::int64_t, std::int64_t, const float*, std::int64_t, float*, std::int64_t,
                        std::int64_t, bool, const Epi&, std::int64_t, std::int64_t);
// Register tiles of every size up to kM × kNG, for the edges of a product.
template <class Simd, int kM, int kNG, class Epi>
struct TileTable {
  TileFn<Epi> f[kM][kNG];
  template <int M, std::size_t... G>
  constexpr void fill_row(std::index_sequence<G...>) {
    ((f[M - 1][G] = &tile<Simd, M, static_cast<int>(G) + 1, Epi>), ...);
  }
  template <std::size_t... Mi>
  constexpr TileTable(std::index_sequence<Mi...>) : f{} {
    (fill_row<static_cast<int>(Mi) + 1>(std::make_index_sequence<kNG>{}), ...);
  }
};

// The part of a product a row tile (kM rows of C) computes: column groups [g0, g1) of C, the sum
// over k ∈ [k0, k1). The parts of C left out are not written.
struct Span {
  std::int64_t g0, g1, k0, k1;
};

// C [m, 16·ng] (+)= A [m, K] · B [K, 16·ng], then C = epi(C); A read as A[i·a_rs + k·a_cs], B and
// C row-major; kM × kNG register tiles (kNG groups of 16 columns), row tile t = rows
// [t·kM, t·kM + kM) restricted to span(t) (default: all of C, all of K). Terms left out of a sum
// must be zero products (see Spans); with a sum left empty, accumulate leaves C as it was and
// !accumulate stores zeros (epi of zero).
template <class Simd, int kM, int kNG, class Epi = EpiStore, class SpanOf>
void gemm_spans(std::int64_t m, const SpanOf& span, const float* A, std::int64_t a_rs, std::int64_t a_cs,
                const float* B, std::int64_t ldb, float* C, std::int64_t ldc, bool accumulate, const Epi& epi = {}) {
  static constexpr TileTable<Simd, kM, kNG, Epi> kTiles{std::make_index_sequence<kM>{}};
  for (std::int64_t t = 0, m0 = 0; m0 < m; ++t, m0 += kM) {
    const std::int64_t mn = imin(kM, m - m0);
    Span s = span(t);
    if (s.k1 <= s.k0) {
      if (accumulate) continue;
      s.k0 = s.k1 = 0;
    }
    for (std::int64_t g = s.g0; g < s.g1; g += kNG)
      kTiles.f[mn - 1][imin(kNG, s.g1 - g) - 1](A + m0 * a_rs + s.k0 * a_cs, a_rs, a_cs, B + s.k0 * ldb + kLanes * g,
                                                 ldb, C + m0 * ldc + kLanes * g, ldc, s.k1 - s.k0, accumulate, epi, m0,
                                                 kLanes * g);
  }
}
template <class Simd, int kM, int kNG>
void gemm(std::int64_t m, std::int64_t ng, std::int64_t K, const float* A, std::int64_t a_rs, std::int64_t a_cs,
          const float* B, std::int64_t ldb, float* C, std::int64_t ldc, bool accumulate) {
  gemm_spans<Simd, kM, kNG>(
      m, [&](std::int64_t) { return Span{0, ng, 0, K}; }, A, a_rs, a_cs, B, ldb, C, ldc, accumulate);
}

// Allowed keys [lo, hi) of query i (KeyRange::range, through simd_common.hpp's rule_range).
inline void row_range(const KeyRange& r, std::int64_t i, std::int64_t key_len, std::int64_t* lo, std::int64_t* hi) {
  cpu::rule_range(cpu::rule_diag(i, r.diag_offset, r.diag_from_key_len, key_len), r.causal, r.window_left,
                  r.window_right, key_len, lo, hi);
}

// The keys of query i a tile [k0, k0 + nk) holds, relative to k0: [lo, hi) less [gap0, gap1).
// With keep_first the row's keys are [0, ke) ∪ [l, h), ke = min(keep_first, h) (params.hpp);
// when the window starts past the kept keys the gap between them is [ke, l), else it is empty
// (gap0 = gap1), and lo ≥ hi means the tile holds none of the row's keys.
struct TileKeys {
  std::int64_t lo, hi, gap0, gap1;
};
inline TileKeys tile_keys(const KeyRange& r, std::int64_t i, std::int64_t key_len, std::int64_t k0, std::int64_t nk) {
  std::int64_t lo, hi;
  row_range(r, i, key_len, &lo, &hi);
  const std::int64_t ke = imax(imin(imin(r.keep_first, hi) - k0, nk), 0);  // kept keys [0, ke) of the tile
  lo = imax(lo - k0, 0);
  hi = imin(hi - k0, nk);
  if (ke == 0) return {lo, hi, 0, 0};
  if (hi <= lo) return {0, ke, 0, 0};            // no key of the window in the tile: the kept ones only
  if (ke >= lo) return {0, imax(hi, ke), 0, 0};  // kept keys and window meet: one range
  return {0, hi, ke, lo};
}

inline void zero_floats(float* p, std::int64_t n) { std::memset(p, 0, static_cast<std::size_t>(n) * sizeof(float)); }

// The epilogues that turn a tile's products into P and dS while they are in registers (same
// operations, in the same order, as probabilities and score_gradients below).
// P = 2^(S·scale·log2e − L) of rows i0 + m of the tile: L points at L of row i0.
template <class Simd>
struct EpiP {
  const float* L;
  V16<Simd> vc;  // scale · log2(e)
  V16<Simd> operator()(V16<Simd> c, std::int64_t m, std::int64_t) const {
    return c.fma(vc, V16<Simd>::set1(-L[m])).exp2();
  }
};
// dS = P ∘ (dP − delta) · scale from the product dP: P [mq, kBk] of the tile, delta of row i0.
template <class Simd>
struct EpiDS {
  const float* P;
  const float* delta;
  V16<Simd> vscale;
  V16<Simd> operator()(V16<Simd> c, std::int64_t m, std::int64_t col) const {
    return V16<Simd>::load(P + m * kBk + col) * (c - V16<Simd>::set1(delta[m])) * vscale;
  }
};

// Where a tile's P and dS may be nonzero, by register tile of kM: query rows [t·kM, t·kM + kM)
// have their keys in [klo[t], khi[t]), and keys [t·kM, t·kM + kM) their rows in [rlo[t], rhi[t])
// (hulls of the rows' allowed keys, TileKeys; empty: lo ≥ hi). On a diagonal tile of causal
// attention this leaves out the register tiles above the diagonal, so causal does not pay for the
// masked half of those tiles. Everything outside a row's keys has P = dS = 0 (zeroed), so the
// products may leave it out: a zero product added to a sum changes no bit (the sums start at +0,
// and x + (±0) = x for x ≠ 0, +0 + (±0) = +0; so a tile's partial sum of zero products is +0,
// which added to the accumulator changes no bit either) while its other factor is finite (Q and K
// are, see Prepass and pack_kv_block; dO is unless the caller's is not). The spans depend on kM
// only, so avx2 and avx512 (both kM = 6) leave out the same products and cut the same partial
// sums even then: their bits agree.
template <int kM>
struct Spans {
  static constexpr int kT = (kBq + kM - 1) / kM;
  static_assert(kBq == kBk, "row and key tiles share the arrays' size");
  std::int64_t klo[kT], khi[kT], rlo[kT], rhi[kT];

  // Every row sees every key: mq rows, nk keys.
  void all(std::int64_t mq, std::int64_t nk) {
    for (int t = 0; t < kT; ++t) klo[t] = 0, khi[t] = nk, rlo[t] = 0, rhi[t] = mq;
  }
  // From each row's keys.
  void from(const TileKeys* keys, std::int64_t mq) {
    for (int t = 0; t < kT; ++t) klo[t] = rlo[t] = kBk, khi[t] = rhi[t] = 0;
    for (std::int64_t r = 0; r < mq; ++r) {
      const std::int64_t lo = keys[r].lo, hi = keys[r].hi;
      if (lo >= hi) continue;
      const std::int64_t t = r / kM;
      klo[t] = imin(klo[t], lo), khi[t] = imax(khi[t], hi);
      for (std::int64_t u = lo / kM; u <= (hi - 1) / kM; ++u) rlo[u] = imin(rlo[u], r), rhi[u] = imax(rhi[u], r + 1);
    }
  }
};

// Where a tile's three gradient products go: dK [nk, Dp] (row stride ldk), dV [nk, Dvp] (ldv) of
// the key block, dQ [mq, Dp] (ldq) of the query block; each product adds to its rows (acc) or, as
// the first to reach them, stores over them (!acc: the bits of adding to zeros, as every sum starts
// at +0 and so is never −0, and +0 + x = x).
struct GradOut {
  float* dK;
  std::int64_t ldk;
  float* dV;
  std::int64_t ldv;
  bool acc_kv;
  float* dQ;
  std::int64_t ldq;
  bool acc_q;
};

// The five products on f32 operands: Q and dO rows as the driver left them (Context::q, dout),
// K and V of the block packed by pack_kv_block; kM × kNG register tiles.
template <class Simd, int kM, int kNG>
struct OpsF32 {
  const Context& cx;
  float *KT, *Kr, *VT;
  OpsF32(const Context& c, float* mem) : cx(c), KT(mem), Kr(KT + c.D * kBk), VT(Kr + kBk * c.Dp) {}

  void pack_kv(std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk) {
    if constexpr (Simd::kHasTranspose16)
      if (pack_kv_transposed(b, hk, k0, nk)) return;
    pack_kv_block(cx, b, hk, k0, nk, KT, Kr, VT);
  }
  // pack_kv_block's KT, Kr and VT (the same values) by 16 × 16 register transposes, for a whole
  // block of f32 keys with unit inner stride and D, Dv multiples of 16 (nothing to pad); false,
  // with nothing written, otherwise.
  bool pack_kv_transposed(std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk) {
    const View& k = cx.p->fwd.k;
    const View& v = cx.p->fwd.v;
    if (k.dtype != DType::f32 || v.dtype != DType::f32 || k.stride(3) != 1 || v.stride(3) != 1 || nk != kBk ||
        cx.D % kLanes != 0 || cx.Dv % kLanes != 0)
      return false;
    const float* ks = k.ptr<float>() + k.offset(b, hk, k0, 0);
    const float* vs = v.ptr<float>() + v.offset(b, hk, k0, 0);
    const std::int64_t lk = k.stride(2), lv = v.stride(2);
    for (std::int64_t j0 = 0; j0 < kBk; j0 += kLanes) {
      for (std::int64_t d0 = 0; d0 < cx.D; d0 += kLanes) Simd::transpose16(ks + j0 * lk + d0, lk, KT + d0 * kBk + j0, kBk);
      for (std::int64_t e0 = 0; e0 < cx.Dv; e0 += kLanes)
        Simd::transpose16(vs + j0 * lv + e0, lv, VT + e0 * kBk + j0, kBk);
    }
    for (std::int64_t j = 0; j < kBk; ++j)
      for (std::int64_t d = 0; d < cx.D; ++d) Kr[j * cx.Dp + d] = finite_or_zero(ks[j * lk + d]);
    return true;
  }
  void store_dkdv(std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk, const float* dK,
                  const float* dV) const {
    store_dkdv_block(cx, b, hk, k0, nk, dK, dV);
  }
  // S [mq, 16·ngk] = Q·Kᵀ of query rows [i0, i0 + mq) of head h (unscaled).
  void scores(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t ngk, float* S) const {
    gemm<Simd, kM, kNG>(mq, ngk, cx.D, cx.q_rows(b, h) + i0 * cx.q_ld, cx.q_ld, 1, KT, kBk, S, kBk, false);
  }
  // dP [mq, 16·ngk] = dO·Vᵀ.
  void dov(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t ngk, float* dP) const {
    gemm<Simd, kM, kNG>(mq, ngk, cx.Dv, cx.dout_rows(b, h) + i0 * cx.o_ld, cx.o_ld, 1, VT, kBk, dP, kBk, false);
  }
  // The products restricted to the register tiles of sp (Spans), the scores and dO·Vᵀ with their
  // epilogues: S = EpiP(Q·Kᵀ) = P, dP = EpiDS(dO·Vᵀ) = dS, then dV += Pᵀ·dO, dK += dSᵀ·Q, dQ += dS·K
  // as grads below.
  static constexpr bool kSpans = true;
  using TileSpans = Spans<kM>;
  void p_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, const TileSpans& sp, float* S,
              const EpiP<Simd>& epi) const {
    gemm_spans<Simd, kM, kNG>(
        mq, [&](std::int64_t t) { return Span{sp.klo[t] / kLanes, (sp.khi[t] + kLanes - 1) / kLanes, 0, cx.D}; },
        cx.q_rows(b, h) + i0 * cx.q_ld, cx.q_ld, 1, KT, kBk, S, kBk, false, epi);
  }
  void ds_tile(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, const TileSpans& sp, float* dP,
               const EpiDS<Simd>& epi) const {
    gemm_spans<Simd, kM, kNG>(
        mq, [&](std::int64_t t) { return Span{sp.klo[t] / kLanes, (sp.khi[t] + kLanes - 1) / kLanes, 0, cx.Dv}; },
        cx.dout_rows(b, h) + i0 * cx.o_ld, cx.o_ld, 1, VT, kBk, dP, kBk, false, epi);
  }
  void grads_spans(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t nk,
                   const TileSpans& sp, const float* P, const float* dS, const GradOut& g) const {
    const float* Q = cx.q_rows(b, h) + i0 * cx.q_ld;
    const float* dO = cx.dout_rows(b, h) + i0 * cx.o_ld;
    const std::int64_t ngv = cx.Dvp / kLanes, ngq = cx.Dp / kLanes;
    gemm_spans<Simd, kM, kNG>(
        nk, [&](std::int64_t t) { return Span{0, ngv, sp.rlo[t], sp.rhi[t]}; }, P, 1, kBk, dO, cx.o_ld, g.dV, g.ldv,
        g.acc_kv);
    gemm_spans<Simd, kM, kNG>(
        nk, [&](std::int64_t t) { return Span{0, ngq, sp.rlo[t], sp.rhi[t]}; }, dS, 1, kBk, Q, cx.q_ld, g.dK, g.ldk,
        g.acc_kv);
    gemm_spans<Simd, kM, kNG>(
        mq, [&](std::int64_t t) { return Span{0, ngq, sp.klo[t], sp.khi[t]}; }, dS, kBk, 1, Kr, cx.Dp, g.dQ, g.ldq,
        g.acc_q);
  }
  // dV (+)= Pᵀ·dO, dK (+)= dSᵀ·Q (Pᵀ and dSᵀ read transposed), dQ (+)= dS·K (GradOut), over the
  // block's nk keys; P and dS [mq, kBk], zero past the allowed keys of each row.
  void grads(std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t nk, const float* P,
             const float* dS, const GradOut& g) const {
    const float* Q = cx.q_rows(b, h) + i0 * cx.q_ld;
    const float* dO = cx.dout_rows(b, h) + i0 * cx.o_ld;
    gemm<Simd, kM, kNG>(nk, cx.Dvp / kLanes, mq, P, 1, kBk, dO, cx.o_ld, g.dV, g.ldv, g.acc_kv);
    gemm<Simd, kM, kNG>(nk, cx.Dp / kLanes, mq, dS, 1, kBk, Q, cx.q_ld, g.dK, g.ldk, g.acc_kv);
    gemm<Simd, kM, kNG>(mq, cx.Dp / kLanes, nk, dS, kBk, 1, Kr, cx.Dp, g.dQ, g.ldq, g.acc_q);
  }
};

// P of one tile: S [mq, kBk] holds Q·Kᵀ of query rows [i0, i0 + mq) of head h against keys
// [k0, k0 + nk) (ngk groups of 16) on entry and P = 2^(S·scale·log2e + mask − L) on exit, 0 on
// the keys a row may not attend and past nk. With softcap, Fc [mq, kBk] gets 1 − tanh² of the
// capped scores (for dS). full: every key of the tile is allowed for every row, no mask and no
// score variant. mrow [kBk]: scratch for a dense-mask row.
template <class Simd>
void probabilities(const Context& cx, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t k0,
                   std::int64_t nk, bool full, float* S, float* Fc, float* mrow) {
  using V = V16<Simd>;
  const std::int64_t ngk = (nk + kLanes - 1) / kLanes;
  const std::int64_t key_len = cx.key_len[b];
  const float* Lh = cx.L + (b * cx.H + h) * cx.Sq;
  const V vc = V::set1(cx.scale_log2e);
  const bool mods = cx.softcap_log2 > 0.0f || cx.alibi;
  for (std::int64_t r = 0; r < mq; ++r) {
    float* Sr = S + r * kBk;
    const V negL = V::set1(-Lh[i0 + r]);
    if (full) {
      for (std::int64_t g = 0; g < ngk; ++g)
        V::load(Sr + kLanes * g).fma(vc, negL).exp2().store(Sr + kLanes * g);
      continue;
    }
    const TileKeys keys = tile_keys(cx.rule, i0 + r, key_len, k0, nk);
    const std::int64_t lo = keys.lo, hi = keys.hi;
    if (lo >= hi) {
      zero_floats(Sr, ngk * kLanes);
      if (cx.softcap_log2 > 0.0f) zero_floats(Fc + r * kBk, ngk * kLanes);  // read by dS beside P = 0
      continue;
    }
    if (mods) {
      // The forward's order: scaled score, softcap (keeping 1 − tanh² for dS), + mask − L, ALiBi.
      // Without softcap, mask − L joins the scaling FMA as in the paths below.
      if (cx.has_mask) load_mask_row(cx, b, h, i0 + r, k0, nk, mrow);
      const int ncol = static_cast<int>(ngk * kLanes);
      if (cx.softcap_log2 > 0.0f) {
        for (std::int64_t g = 0; g < ngk; ++g) (V::load(Sr + kLanes * g) * vc).store(Sr + kLanes * g);
        cpu::softcap_row<Simd>(Sr, 0, ncol, cx.softcap_log2, Fc + r * kBk);
        for (std::int64_t g = 0; g < ngk; ++g) {
          const V x = V::load(Sr + kLanes * g) + negL;
          (cx.has_mask ? x + V::load(mrow + kLanes * g) : x).store(Sr + kLanes * g);
        }
      } else {
        for (std::int64_t g = 0; g < ngk; ++g)
          V::load(Sr + kLanes * g).fma(vc, cx.has_mask ? V::load(mrow + kLanes * g) + negL : negL).store(Sr + kLanes * g);
      }
      if (cx.alibi)
        cpu::alibi_row<Simd>(Sr, 0, ncol, static_cast<float>(cx.alibi[b * cx.alibi_sb + h] * 1.4426950408889634), k0,
                             i0 + r + cx.rule.diag_offset + (cx.rule.diag_from_key_len ? key_len : 0));
      for (std::int64_t g = 0; g < ngk; ++g) V::load(Sr + kLanes * g).exp2().store(Sr + kLanes * g);
      if (cx.has_mask)
        for (std::int64_t j = lo; j < hi; ++j)
          if (mrow[j] == -kInfF) Sr[j] = 0.0f;
    } else if (cx.has_mask) {
      load_mask_row(cx, b, h, i0 + r, k0, nk, mrow);
      for (std::int64_t g = 0; g < ngk; ++g)
        V::load(Sr + kLanes * g).fma(vc, V::load(mrow + kLanes * g) + negL).exp2().store(Sr + kLanes * g);
      // Keys the mask denies get P = 0 even where the sum above is NaN (a NaN in their K,
      // or L = NaN on a NaN row): masked keys stay out of the gradients.
      for (std::int64_t j = lo; j < hi; ++j)
        if (mrow[j] == -kInfF) Sr[j] = 0.0f;
    } else {
      for (std::int64_t g = 0; g < ngk; ++g)
        V::load(Sr + kLanes * g).fma(vc, negL).exp2().store(Sr + kLanes * g);
    }
    zero_floats(Sr, lo);
    if (keys.gap1 > keys.gap0) zero_floats(Sr + keys.gap0, keys.gap1 - keys.gap0);
    zero_floats(Sr + hi, ngk * kLanes - hi);
  }
}

// dS of one tile: dP [mq, kBk] holds dO·Vᵀ on entry and dS = P ∘ (dP − delta) · scale on exit
// (∘ Fc with softcap: the chain through tanh). With dropout (W = keep / (1 − p), regenerated
// from the seed into mrow) dP ∘= W first, and P [mq, kBk] (in S) becomes Z = P ∘ W, which takes
// P's place in dV += Zᵀ·dO.
template <class Simd>
void score_gradients(const Context& cx, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq, std::int64_t k0,
                     std::int64_t nk, float* S, float* dP, const float* Fc, float* mrow) {
  using V = V16<Simd>;
  const std::int64_t ngk = (nk + kLanes - 1) / kLanes;
  const float* delta_h = cx.delta + (b * cx.H + h) * cx.Sq;
  const V vscale = V::set1(cx.scale);
  for (std::int64_t r = 0; r < mq; ++r) {
    const V dl = V::set1(delta_h[i0 + r]);
    float* dPr = dP + r * kBk;
    float* Pr = S + r * kBk;
    // With softcap, dS takes the chain through tanh: ∘ Fc (the factor defaults to 1 below).
    const float* Fr = cx.softcap_log2 > 0.0f ? Fc + r * kBk : nullptr;
    if (cx.dropout) {  // dP ∘= W (the gradient through Z = P ∘ W), then P ← Z for dV below
      const auto& d = cx.p->fwd.dropout;
      dropout_row(dropout_row_key(d.seed, d.offset, d.b0 + b, h, i0 + r), k0, ngk * kLanes, cx.dropout_t,
                  cx.dropout_rs, mrow);
      for (std::int64_t g = 0; g < ngk; ++g) {
        const V w = V::load(mrow + kLanes * g), pg = V::load(Pr + kLanes * g);
        const V ds = pg * (V::load(dPr + kLanes * g) * w - dl) * vscale;
        (Fr ? ds * V::load(Fr + kLanes * g) : ds).store(dPr + kLanes * g);
        (pg * w).store(Pr + kLanes * g);
      }
      continue;
    }
    if (Fr) {
      for (std::int64_t g = 0; g < ngk; ++g)
        (V::load(Pr + kLanes * g) * (V::load(dPr + kLanes * g) - dl) * vscale * V::load(Fr + kLanes * g))
            .store(dPr + kLanes * g);
      continue;
    }
    for (std::int64_t g = 0; g < ngk; ++g)
      (V::load(Pr + kLanes * g) * (V::load(dPr + kLanes * g) - dl) * vscale).store(dPr + kLanes * g);
  }
}

// One tile without dense mask, score variants or dropout (backward_task's arguments): P and dS
// computed in the epilogues of Q·Kᵀ and dO·Vᵀ, every product restricted to the register tiles
// that hold allowed keys (Spans), P and dS zeroed on the rest.
template <class Simd, class Ops>
void fused_tile(const Context& cx, const Ops& ops, std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t mq,
                std::int64_t k0, std::int64_t nk, bool full, float* S, float* dP, const GradOut& g) {
  using V = V16<Simd>;
  const std::int64_t ngk = (nk + kLanes - 1) / kLanes;
  const std::int64_t bh = (b * cx.H + h) * cx.Sq + i0;
  typename Ops::TileSpans sp;
  TileKeys keys[kBq];
  if (full) {
    sp.all(mq, nk);
  } else {
    const std::int64_t key_len = cx.key_len[b];
    for (std::int64_t r = 0; r < mq; ++r) keys[r] = tile_keys(cx.rule, i0 + r, key_len, k0, nk);
    sp.from(keys, mq);
  }
  // Zero P or dS [mq, kBk] outside each row's keys: the products wrote only their spans.
  auto zero_masked = [&](float* T) {
    for (std::int64_t r = 0; r < mq; ++r) {
      float* Tr = T + r * kBk;
      const TileKeys& k = keys[r];
      if (k.lo >= k.hi) {
        zero_floats(Tr, ngk * kLanes);
        continue;
      }
      zero_floats(Tr, k.lo);
      if (k.gap1 > k.gap0) zero_floats(Tr + k.gap0, k.gap1 - k.gap0);
      zero_floats(Tr + k.hi, ngk * kLanes - k.hi);
    }
  };
  ops.p_tile(b, h, i0, mq, sp, S, EpiP<Simd>{cx.L + bh, V::set1(cx.scale_log2e)});
  if (!full) zero_masked(S);
  ops.ds_tile(b, h, i0, mq, sp, dP, EpiDS<Simd>{S, cx.delta + bh, V::set1(cx.scale)});
  if (!full) zero_masked(dP);
  ops.grads_spans(b, h, i0, mq, nk, sp, S, dP, g);
}

// One task (b, hk, chunk): see attention_backward.hpp. Ops: the five products (OpsF32 or the
// bf16 operands of attention_backward_avx512bf16.cpp); the elementwise steps are f32 either way.
template <class Simd, class Ops>
void backward_task(const Context& cx, float* arena, std::int64_t task) {
  const std::int64_t c = task % cx.chunks;
  const std::int64_t b = task / cx.chunks / cx.Hkv, hk = task / cx.chunks % cx.Hkv;
  const std::int64_t Dp = cx.Dp, Dvp = cx.Dvp, Sq = cx.Sq;
  const std::int64_t key_len = cx.key_len[b];

  // The arena (layout at the top of this file): kPassBlocks of dK, dV and the operands' scratch.
  float* S = arena;
  float* dP = S + kBq * kBk;
  float* mrow = dP + kBq * kBk;
  float* Fc = mrow + kBk;
  float* per_block = Fc + kBq * kBk;
  const std::int64_t block_floats = pass_block_floats(cx.D, cx.Dv);
  static_assert(kPassBlocks == 4, "one Ops per block of a pass below");
  Ops ops[kPassBlocks] = {Ops(cx, per_block + kBk * (Dp + Dvp)), Ops(cx, per_block + block_floats + kBk * (Dp + Dvp)),
                          Ops(cx, per_block + 2 * block_floats + kBk * (Dp + Dvp)),
                          Ops(cx, per_block + 3 * block_floats + kBk * (Dp + Dvp))};
  const bool mods = cx.softcap_log2 > 0.0f || cx.alibi;
  // P and dS in the products' epilogues, the products restricted to where they are not zero
  // (fused_tile): everything but a dense mask, score variants and dropout.
  const bool fused = !cx.has_mask && !mods && !cx.dropout;

  const std::int64_t dq_ld = cx.dq_ld(c);
  // dK, dV rows of key block u: the caller's (Context::dk0) or the arena's.
  const bool kv_in_place = cx.dk0 != nullptr;
  const std::int64_t ldk = kv_in_place ? cx.dk0_ld : Dp, ldv = kv_in_place ? cx.dv0_ld : Dvp;
  auto dk_rows = [&](std::int64_t u, std::int64_t k0) {
    return kv_in_place ? cx.dk0 + b * cx.dk0_sb + hk * cx.dk0_sh + k0 * ldk : per_block + u * block_floats;
  };
  auto dv_rows = [&](std::int64_t u, std::int64_t k0) {
    return kv_in_place ? cx.dv0 + b * cx.dv0_sb + hk * cx.dv0_sh + k0 * ldv : per_block + u * block_floats + kBk * Dp;
  };
  auto zero_rows = [](float* p, std::int64_t ld, std::int64_t n, std::int64_t w) {
    for (std::int64_t r = 0; r < n; ++r) zero_floats(p + r * ld, w);
  };

  // Passes over up to kPassBlocks key blocks at a time: each query block's Q, dO and dQ rows serve
  // all of them while they are in cache. Every sum keeps its order (dQ's rows get the key blocks
  // in increasing order, dK and dV theirs by head and query block), so the bits do not depend on
  // how the blocks are grouped. No accumulator is zeroed first (attention_backward.hpp): the
  // first tile to reach a row of dQ (in the chunk's first pass) or of a block's dK, dV (in its
  // pass) stores there, and the rows no tile reached are zeroed after their pass.
  const std::int64_t kb_begin = cx.chunk_begin[b * (cx.chunks + 1) + c];
  const std::int64_t kb_end = cx.chunk_begin[b * (cx.chunks + 1) + c + 1];
  if (kb_begin == kb_end)  // an empty chunk (no work in the batch row): its dQ partial is zero
    for (std::int64_t h = hk * cx.G; h < (hk + 1) * cx.G; ++h) zero_rows(cx.dq_rows(c, b, h), dq_ld, Sq, Dp);
  for (std::int64_t kb0 = kb_begin; kb0 < kb_end; kb0 += kPassBlocks) {
    const std::int64_t nb = imin(kPassBlocks, kb_end - kb0);
    bool kv_first[kPassBlocks];  // no tile has reached block u's dK, dV yet
    for (std::int64_t u = 0; u < nb; ++u) {
      const std::int64_t k0 = (kb0 + u) * kBk;
      ops[u].pack_kv(b, hk, k0, imin(kBk, cx.Skv - k0));
      kv_first[u] = true;
    }

    for (std::int64_t h = hk * cx.G; h < (hk + 1) * cx.G; ++h) {
      float* dQh = cx.dq_rows(c, b, h);

      for (std::int64_t i0 = 0; i0 < Sq; i0 += kBq) {
        const std::int64_t mq = imin(kBq, Sq - i0), i1 = i0 + mq - 1;
        // The allowed ranges move monotonically with i, so the block's union is
        // [lo(i0), hi(i1)) ∪ [0, ke(i1)) and its intersection holds [lo(i1), hi(i0)) ∪ [0, ke(i0))
        // (ke = min(keep_first, hi): keep_first's kept keys, none without it).
        std::int64_t lo_first, hi_first, lo_last, hi_last;
        row_range(cx.rule, i0, key_len, &lo_first, &hi_first);
        row_range(cx.rule, i1, key_len, &lo_last, &hi_last);
        const std::int64_t ke_first = imin(cx.rule.keep_first, hi_first), ke_last = imin(cx.rule.keep_first, hi_last);
        bool q_first = kb0 == kb_begin;  // no tile has reached these dQ rows yet

        for (std::int64_t u = 0; u < nb; ++u) {
          const std::int64_t k0 = (kb0 + u) * kBk, nk = imin(kBk, cx.Skv - k0);
          const std::int64_t ngk = (nk + kLanes - 1) / kLanes;  // V16 groups spanning the block's keys
          if (imax(lo_first, k0) >= imin(hi_last, k0 + nk) && k0 >= ke_last) continue;  // no allowed key in the tile
          const bool full = !cx.has_mask && !mods && nk % kLanes == 0 &&
                            ((lo_last <= k0 && hi_first >= k0 + nk) || ke_first >= k0 + nk);
          const GradOut g{dk_rows(u, k0), ldk, dv_rows(u, k0), ldv, !kv_first[u], dQh + i0 * dq_ld, dq_ld, !q_first};
          kv_first[u] = q_first = false;

          if constexpr (Ops::kSpans) {
            if (fused) {
              fused_tile<Simd>(cx, ops[u], b, h, i0, mq, k0, nk, full, S, dP, g);
              continue;
            }
          }
          // S = Q·Kᵀ → P; dP = dO·Vᵀ → dS; then the three gradient products.
          ops[u].scores(b, h, i0, mq, ngk, S);
          probabilities<Simd>(cx, b, h, i0, mq, k0, nk, full, S, Fc, mrow);
          ops[u].dov(b, h, i0, mq, ngk, dP);
          score_gradients<Simd>(cx, b, h, i0, mq, k0, nk, S, dP, Fc, mrow);

          // dV += Pᵀ·dO (Zᵀ·dO with dropout), dK += dSᵀ·Q, dQ += dS·K.
          ops[u].grads(b, h, i0, mq, nk, S, dP, g);
        }
        if (q_first) zero_rows(dQh + i0 * dq_ld, dq_ld, mq, Dp);
      }
    }
    for (std::int64_t u = 0; u < nb; ++u) {
      const std::int64_t k0 = (kb0 + u) * kBk, nk = imin(kBk, cx.Skv - k0);
      if (kv_first[u]) zero_rows(dk_rows(u, k0), ldk, nk, Dp), zero_rows(dv_rows(u, k0), ldv, nk, Dvp);
      if (!kv_in_place) ops[u].store_dkdv(b, hk, k0, nk, dk_rows(u, k0), dv_rows(u, k0));
    }
  }
}

}  // namespace
}  // namespace qkv::kernels::bwd
