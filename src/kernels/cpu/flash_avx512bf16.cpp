// The flash forward (and the decode scores) for bf16 tensors on CPUs with AVX-512 BF16: Q·Kᵀ and P·V run on
// vdpbf16ps (_mm512_dpbf16_ps), which multiplies pairs of bf16 and accumulates in f32 —
// 32 products per instruction instead of 16. Softmax, masking and the online rescaling are the
// f32 code of flash_impl.hpp; P is rounded to bf16 for P·V (as a bf16 matmul would).
// Compiled with -mavx512bf16 on top of the AVX-512 flags (CMakeLists.txt).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/flash_impl.hpp"

namespace qkv::kernels::cpu {
namespace {

using S = SimdAvx512;

inline __m512bh pair_bcast(const std::uint16_t* p) {
  std::int32_t w;
  std::memcpy(&w, p, sizeof w);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(w));
}
inline __m512bh load_bh(const std::uint16_t* p) {
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(reinterpret_cast<const void*>(p)));
}

// Operands as bf16 pairs (d or j adjacent in one 32-bit lane), the layouts vdpbf16ps wants:
//   Qs [kMb][Dp2]              queries, bf16, unscaled (exact inputs), Dp2 = D rounded up to even
//   Kt [Dp2/2][kNt][2]         K tile: for pair dp and key c, (k[c][2dp], k[c][2dp+1])
//   Vt [kNt/2][Dvp][2]         V tile: for key pair jp and column e, (v[2jp][e], v[2jp+1][e])
//   Pb [kRows][kNt]            one strip's probabilities rounded to bf16
// The scale · log2 e is applied to the f32 scores, so rounding never touches the inputs.
struct OperandsBf16 {
  static constexpr int kQc = 64;  // 6 × 4 zmm accumulators, 16 keys each
  static constexpr int kVc = 32;  // 6 × 2 zmm accumulators, 16 columns each
  static i64 scratch_floats(const FlashArgs& a) {
    const i64 Dp2 = round_up(a.D, 2), Dvp = round_up(a.Dv, kVc);
    // bf16 element counts halved into floats
    return round_up(kMb * Dp2 / 2, 16) + round_up(Dp2 / 2 * kNt, 16) + round_up(kNt / 2 * Dvp, 16) + kRows * kNt / 2;
  }

  const FlashArgs& a;
  i64 Dp2, Dvp;
  std::uint16_t *Qs, *Kt, *Vt, *Pb;

  OperandsBf16(const FlashArgs& args, float* mem) : a(args), Dp2(round_up(args.D, 2)), Dvp(round_up(args.Dv, kVc)) {
    Qs = reinterpret_cast<std::uint16_t*>(mem);
    Kt = Qs + 2 * round_up(kMb * Dp2 / 2, 16);
    Vt = Kt + 2 * round_up(Dp2 / 2 * kNt, 16);
    Pb = Vt + 2 * round_up(kNt / 2 * Dvp, 16);
  }
  void load_q(i64 b, i64 h, i64 i0, int nrows, int npad) {
    const auto* q = static_cast<const std::uint16_t*>(a.q);
    for (int r = 0; r < npad; ++r) {
      std::uint16_t* row = Qs + r * Dp2;
      if (r < nrows) {
        const i64 off = b * a.sq[0] + h * a.sq[1] + (i0 + r) * a.sq[2];
        for (i64 d = 0; d < a.D; ++d) row[d] = q[off + d * a.sq[3]];
        if (a.D < Dp2) row[a.D] = 0;
      } else {
        std::memset(row, 0, sizeof(std::uint16_t) * static_cast<std::size_t>(Dp2));
      }
    }
  }
  void load_kv(i64 kbase, i64 vbase, i64 t0, i64 j_lo, i64 j_hi) {
    const auto* k = static_cast<const std::uint16_t*>(a.k);
    const auto* v = static_cast<const std::uint16_t*>(a.v);
    // Kt seen as 32-bit words [Dp2/2][kNt] is the transpose of the K rows seen as words
    // [key][D/2], so whole 16 keys × 16 pairs blocks go through the f32 register transpose
    // (it only moves bits) when the pairs lie in place: unit stride and an even row stride.
    i64 j_done = j_lo;
    const i64 W = a.D / 2;  // whole pairs per row
    if (a.sk[3] == 1 && a.sk[2] % 2 == 0 && W >= 16) {
      for (; j_done + 16 <= j_hi; j_done += 16) {
        const std::uint16_t* kp = k + kbase + j_done * a.sk[2];
        const i64 c = j_done - t0;
        i64 w0 = 0;
        for (; w0 + 16 <= W; w0 += 16)
          S::transpose16(reinterpret_cast<const float*>(kp + 2 * w0), a.sk[2] / 2,
                         reinterpret_cast<float*>(Kt) + w0 * kNt + c, kNt);
        for (i64 j = 0; j < 16; ++j) {
          for (i64 d = 2 * w0; d < a.D; ++d) Kt[((d >> 1) * kNt + c + j) * 2 + (d & 1)] = kp[j * a.sk[2] + d];
          if (a.D < Dp2) Kt[((a.D >> 1) * kNt + c + j) * 2 + 1] = 0;
        }
      }
    }
    for (i64 j = j_done; j < j_hi; ++j) {
      const std::uint16_t* kp = k + kbase + j * a.sk[2];
      const i64 c = j - t0;
      for (i64 d = 0; d < a.D; ++d) Kt[((d >> 1) * kNt + c) * 2 + (d & 1)] = kp[d * a.sk[3]];
      if (a.D < Dp2) Kt[((a.D >> 1) * kNt + c) * 2 + 1] = 0;
    }
    // V: every key of the tile is written (zeros outside [j_lo, j_hi) and past Dv), because a
    // pair straddling the range edge is multiplied by a zero probability and must be finite.
    if (a.sv[3] == 1) {
      // 16 columns of two keys at a time: word e = v[2jp][e] | v[2jp + 1][e] << 16.
      for (i64 jp = 0; jp < kNt / 2; ++jp) {
        const i64 ja = t0 + 2 * jp, jb = ja + 1;
        const bool in_a = ja >= j_lo && ja < j_hi, in_b = jb >= j_lo && jb < j_hi;
        const std::uint16_t* pa = in_a ? v + vbase + ja * a.sv[2] : nullptr;
        const std::uint16_t* pb = in_b ? v + vbase + jb * a.sv[2] : nullptr;
        std::uint16_t* dst = Vt + jp * Dvp * 2;
        for (i64 e = 0; e < Dvp; e += 16) {
          const __mmask16 m = S::first(static_cast<int>(imax(imin(a.Dv - e, 16), 0)));
          const __m512i wa = in_a ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, pa + e)) : _mm512_setzero_si512();
          const __m512i wb = in_b ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, pb + e)) : _mm512_setzero_si512();
          _mm512_storeu_si512(reinterpret_cast<void*>(dst + 2 * e), _mm512_or_si512(wa, _mm512_slli_epi32(wb, 16)));
        }
      }
      return;
    }
    for (i64 c = 0; c < kNt; ++c) {
      const i64 j = t0 + c;
      std::uint16_t* dst = Vt + (c >> 1) * Dvp * 2 + (c & 1);
      if (j >= j_lo && j < j_hi) {
        const std::uint16_t* vp = v + vbase + j * a.sv[2];
        for (i64 e = 0; e < a.Dv; ++e) dst[2 * e] = vp[e * a.sv[3]];
        for (i64 e = a.Dv; e < Dvp; ++e) dst[2 * e] = 0;
      } else {
        for (i64 e = 0; e < Dvp; ++e) dst[2 * e] = 0;
      }
    }
  }
  void qk(int r0, float* Ps, i64 c_lo, i64 c_hi) const {
    if (c_hi <= c_lo) return;
    const std::uint16_t* q = Qs + r0 * Dp2;
    const __m512 scale = _mm512_set1_ps(a.scale_log2);
    __m512 acc[kRows][4];
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    for (i64 dp = 0; dp < Dp2 / 2; ++dp) {
      __m512bh kv[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) kv[c] = load_bh(Kt + (dp * kNt + c * 16) * 2);
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
        const __m512bh qb = pair_bcast(q + r * Dp2 + 2 * dp);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], qb, kv[c]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(Ps + r * kNt + c * 16, _mm512_mul_ps(acc[r][c], scale));
  }
  void pv(const float* Ps, i64 c_lo, i64 c_hi, float* o) const {
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kNt; c += 32) {
        const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(Ps + r * kNt + c + 16), _mm512_loadu_ps(Ps + r * kNt + c));
        _mm512_storeu_si512(reinterpret_cast<void*>(Pb + r * kNt + c), reinterpret_cast<__m512i>(p));
      }
    const i64 jp0 = c_lo / 2, jp1 = (c_hi + 1) / 2;
    for (i64 e0 = 0; e0 < Dvp; e0 += kVc) {
      __m512 acc[kRows][2];
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) acc[r][c] = _mm512_loadu_ps(o + r * Dvp + e0 + c * 16);
      for (i64 jp = jp0; jp < jp1; ++jp) {
        __m512bh vv[2];
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) vv[c] = load_bh(Vt + (jp * Dvp + e0 + c * 16) * 2);
#pragma GCC unroll 8
        for (int r = 0; r < kRows; ++r) {
          const __m512bh pb = pair_bcast(Pb + r * kNt + 2 * jp);
#pragma GCC unroll 2
          for (int c = 0; c < 2; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vv[c]);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) _mm512_storeu_ps(o + r * Dvp + e0 + c * 16, acc[r][c]);
    }
  }
};

// Decode scores from bf16 keys read in place (unit stride): q·k by vdpbf16ps, 32 products per
// instruction and no widening of the key row, then × scale · log2 e as in the forward.
//   Qb [kDecRows][Dp32]  the item's query rows, bf16, unscaled, zero past D (Dp32 = D rounded up to 32)
struct DecodeDotsBf16 {
  static constexpr bool kEnabled = true;
  static i64 Dp32(const FlashArgs& a) { return round_up(a.D, 32); }
  static i64 scratch_floats(const FlashArgs& a) { return kDecRows * Dp32(a) / 2; }
  static bool takes(const FlashArgs& a) { return a.bf16 && a.sk[3] == 1; }

  const FlashArgs& a;
  i64 dp32;
  std::uint16_t* Qb;
  DecodeDotsBf16(const FlashArgs& args, float* mem) : a(args), dp32(Dp32(args)), Qb(reinterpret_cast<std::uint16_t*>(mem)) {}

  void load_q(int r, i64 off) {
    const auto* q = static_cast<const std::uint16_t*>(a.q) + off;
    std::uint16_t* row = Qb + r * dp32;
    for (i64 d = 0; d < a.D; ++d) row[d] = q[d * a.sq[3]];
    for (i64 d = a.D; d < dp32; ++d) row[d] = 0;
  }
  // s[r·lds] ← score of query row r against key row k[0, D), for rows [0, nr); the row count is
  // a template constant so that the accumulators live in registers.
  template <int R>
  void scores_r(const std::uint16_t* k, float* s, i64 lds) const {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (i64 d = 0; d < dp32; d += 32) {
      const __mmask32 m = a.D - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (a.D - d)) - 1u);
      const __m512bh kv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, k + d));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], load_bh(Qb + r * dp32 + d), kv);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) s[r * lds] = _mm512_reduce_add_ps(acc[r]) * a.scale_log2;
  }
  void scores(int nr, const std::uint16_t* k, float* s, i64 lds) const {
    static_assert(kDecRows == 8, "one case per row count below");
    switch (nr) {
      case 1: scores_r<1>(k, s, lds); break;
      case 2: scores_r<2>(k, s, lds); break;
      case 3: scores_r<3>(k, s, lds); break;
      case 4: scores_r<4>(k, s, lds); break;
      case 5: scores_r<5>(k, s, lds); break;
      case 6: scores_r<6>(k, s, lds); break;
      case 7: scores_r<7>(k, s, lds); break;
      default: scores_r<8>(k, s, lds); break;
    }
  }
};

}  // namespace

void flash_forward_avx512_bf16(const FlashArgs* list, std::int64_t n) { forward<S, OperandsBf16>(list, n); }
void flash_decode_avx512_bf16(const FlashArgs& a) { decode<S, DecodeDotsBf16>(a); }

}  // namespace qkv::kernels::cpu
