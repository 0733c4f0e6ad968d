// The flash forward (and the decode scores) for bf16 tensors on CPUs with AVX-512 BF16: Q·Kᵀ and P·V run on
// vdpbf16ps (_mm512_dpbf16_ps), which multiplies pairs of bf16 and accumulates in f32 —
// 32 products per instruction instead of 16. Softmax, masking and the online rescaling are the
// f32 code of flash_tile.hpp; P is rounded to bf16 for P·V (as a bf16 matmul would).
// Compiled with -mavx512bf16 on top of the AVX-512 flags (CMakeLists.txt).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/flash_decode_impl.hpp"
#include "kernels/cpu/flash_forward_impl.hpp"

namespace qkv::kernels::cpu {
namespace {

using S = SimdAvx512;

inline __m512bh pair_bcast(const std::uint16_t* p) {
  std::int32_t w;
  std::memcpy(&w, p, sizeof w);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(w));
}
// A load typed as bf16 from the start: loading __m512i and reinterpreting it makes GCC 12 copy
// some of the values through the stack in the decode score loop.
inline __m512bh load_bh(const std::uint16_t* p) {
  __m512bh x;
  std::memcpy(&x, p, sizeof x);
  return x;
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
  void load_q(i64 b, i64 h, i64 i0, int r0, int r1, int nrows) {
    const auto* q = static_cast<const std::uint16_t*>(a.q);
    for (int r = r0; r < r1; ++r) {
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
    if (a.softcap_log2 > 0.0f) {
      // Capped here, once per score, from the registers (score_mod.hpp): the scale folds into
      // softcap_v's factor kz, so the cap costs no pass over Ps and the tile needs no masked path.
      const SoftcapK<S> cap(a.softcap_log2, softcap_kz(a.softcap_log2, a.scale_log2));
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) _mm512_storeu_ps(Ps + r * kNt + c * 16, softcap_v<S>(acc[r][c], cap));
      return;
    }
#pragma GCC unroll 8
    for (int r = 0; r < kRows; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) _mm512_storeu_ps(Ps + r * kNt + c * 16, _mm512_mul_ps(acc[r][c], scale));
  }
  // One pass over all Dvp columns (P rounded to bf16 once per strip and tile).
  i64 pv_pass_cols() const { return Dvp; }
  // o[kRows][e0, e1) += P[:, c_lo:c_hi] · V[c_lo:c_hi, e0:e1) (e0, e1 multiples of kVc or e1 ≥ Dvp).
  void pv(const float* Ps, i64 c_lo, i64 c_hi, float* o, i64 e_begin, i64 e_end) const {
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kNt; c += 32) {
        const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(Ps + r * kNt + c + 16), _mm512_loadu_ps(Ps + r * kNt + c));
        _mm512_storeu_si512(reinterpret_cast<void*>(Pb + r * kNt + c), reinterpret_cast<__m512i>(p));
      }
    const i64 jp0 = c_lo / 2, jp1 = (c_hi + 1) / 2;
    for (i64 e0 = e_begin; e0 < imin(e_end, Dvp); e0 += kVc) {
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

// Decode from bf16 K and V read in place (unit element stride), everything on vdpbf16ps
// (32 products per instruction, no widening of K or V rows):
//   scores  several query rows (GQA): 16 keys at a time per row, 16 accumulators of q·k partial
//           sums summed by reduce16; one row: key by key (scores1, see there). × scale · log2 e.
//   P·V     key pairs: the two V rows interleaved by unpack{lo,hi}_epi16 into (v[2jp][e],
//           v[2jp+1][e]) words and multiplied by the pair of probabilities rounded to bf16 (as the
//           forward does), so one instruction does 2 keys × 16 columns. unpack works per 128-bit
//           lane, so the accumulators hold columns in the order lo_idx / hi_idx below; they are
//           permuted from and back to Od's natural order once per tile.
// About twice as fast, with K and V in cache, as a horizontal sum per key and row with V widened
// to f32.
// Scratch (as floats): Qb [kDecRows][Dp32] bf16 query rows, unscaled, zero past D (Dp32 = D
// rounded up to 32); Pb [kDecRows][kNt] bf16 probabilities.
struct DecodeOpsBf16 {
  static constexpr bool kEnabled = true;
  // Query rows per P·V pass: 2 rows × 4 blocks of 32 columns × (lo, hi) = 16 accumulators, so
  // each pass reads whole V rows (D = 128) front to back; 4 rows × 64 columns streamed no faster.
  static constexpr int kRowsPv = 2;
  static i64 Dp32(const FlashArgs& a) { return round_up(a.D, 32); }
  static i64 scratch_floats(const FlashArgs& a) { return kDecRows * Dp32(a) / 2 + kDecRows * kNt / 2; }
  // bf16 K and V rows (not an int8 or f16 cache). Paged with blocks of ≥ 16 rows: a group of 16
  // keys (scores16, 16-aligned) and a pair of keys (pv_cols) then lie in one block, evenly strided;
  // smaller blocks go to decode's generic rows.
  static bool pages_ok(const FlashArgs& a) { return !a.block_table || a.page_shift >= 4; }
  static bool takes_k(const FlashArgs& a) { return a.bf16 && a.sk[3] == 1 && pages_ok(a) && !a.kv_i8 && !a.kv_f16; }
  static bool takes_v(const FlashArgs& a) { return a.bf16 && a.sv[3] == 1 && pages_ok(a) && !a.kv_i8 && !a.kv_f16; }

  const FlashArgs& a;
  i64 dp32;
  std::uint16_t *Qb, *Pb;
  i64 b_ = 0, hk_ = 0;         // the item's batch row and kv head (set by scores() and pv())
  i64 j_end_ = 0;              // of the tile scores() saw last: how far pv() prefetches K
  // Row pointers of one tile's keys c = j − t0, found through kv_row once per block run (rows_of):
  //   vp_[c]  the V rows of the tile scores() / pv() work on (keys outside its range: a valid row)
  //   kn_[c]  the K rows of the next tile, keys [t0 + kNt, t0 + kNt + pf_n), prefetched by pv()
  // A table lookup per block instead of one per key and use (each V row was found 3 times, each
  // next K row once): paged decode spent ≈ 10 % of its instructions there.
  const std::uint16_t* vp_[kNt];
  const std::uint16_t* kn_[kNt];
  const std::uint16_t* vn_[kNt];  // the next tile's V rows, prefetched with kn_
  i64 vpf_b_ = -1, vpf_hk_ = -1, vpf_t0_ = -1;  // the tile whose V rows pv() prefetched last
  DecodeOpsBf16(const FlashArgs& args, float* mem)
      : a(args), dp32(Dp32(args)), Qb(reinterpret_cast<std::uint16_t*>(mem)), Pb(Qb + kDecRows * dp32) {}

  const std::uint16_t* krow(i64 j) const { return static_cast<const std::uint16_t*>(a.k) + kv_row(a, a.sk, b_, hk_, j); }
  const std::uint16_t* vrow(i64 j) const { return static_cast<const std::uint16_t*>(a.v) + kv_row(a, a.sv, b_, hk_, j); }
  // out[j − t0] ← the row of key j of tensor t (strides s) for j ∈ [j_lo, j_hi), by runs of
  // evenly strided rows (one block when paged): the same addresses kv_row gives.
  void rows_of(const void* t, const i64* s, i64 t0, i64 j_lo, i64 j_hi, const std::uint16_t** out) const {
    for (i64 j = j_lo; j < j_hi;) {
      const i64 e = imin(j_hi, kv_run_end(a, j));
      const std::uint16_t* p = static_cast<const std::uint16_t*>(t) + kv_row(a, s, b_, hk_, j);
      for (; j < e; ++j, p += s[2]) out[j - t0] = p;
    }
  }
  // vp_ for the tile at t0 with keys [j_lo, j_hi) (j_lo < j_hi); the others point at j_lo's row.
  void v_rows(i64 t0, i64 j_lo, i64 j_hi) {
    rows_of(a.v, a.sv, t0, j_lo, j_hi, vp_);
    for (i64 c = 0; c < j_lo - t0; ++c) vp_[c] = vp_[j_lo - t0];
    for (i64 c = j_hi - t0; c < kNt; ++c) vp_[c] = vp_[j_lo - t0];
  }

  void load_q(int r, i64 off) {
    const auto* q = static_cast<const std::uint16_t*>(a.q) + off;
    std::uint16_t* row = Qb + r * dp32;
    for (i64 d = 0; d < a.D; ++d) row[d] = q[d * a.sq[3]];
    for (i64 d = a.D; d < dp32; ++d) row[d] = 0;
  }

  // Ps[r][c0, c0 + 16) ← scores of the 16 keys at k + c·ldk (c < 16). kMasked: key c is read from
  // kp[c] under km[c] (all 0 for a key outside the tile's range, which then scores 0 and is
  // masked by decode; kp[c] then points at a key inside it), and the last D % 32 dims under the
  // tail mask.
  template <bool kMasked>
  void scores16(int nr, const std::uint16_t* k, i64 ldk, const std::uint16_t* const* kp, const __mmask32* km,
                float* Ps, i64 c0) const {
    const __m512 scale = _mm512_set1_ps(a.scale_log2);
    const __mmask32 tail = static_cast<__mmask32>(a.D % 32 ? (1u << (a.D % 32)) - 1u : ~0u);
    for (int r = 0; r < nr; ++r) {
      __m512 acc[16];
#pragma GCC unroll 16
      for (int c = 0; c < 16; ++c) acc[c] = _mm512_setzero_ps();
      for (i64 d = 0; d < dp32; d += 32) {
        const __m512bh qv = load_bh(Qb + r * dp32 + d);
        const __mmask32 dm = d + 32 <= a.D ? ~__mmask32{0} : tail;
#pragma GCC unroll 16
        for (int c = 0; c < 16; ++c) {
          const __m512bh kv = kMasked ? reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(km[c] & dm, kp[c] + d))
                                      : load_bh(k + c * ldk + d);
          acc[c] = _mm512_dpbf16_ps(acc[c], qv, kv);
        }
      }
      _mm512_storeu_ps(Ps + r * kNt + c0, _mm512_mul_ps(reduce16(acc), scale));
    }
  }
  // One query row (no GQA sharing): key by key, each row read front to back and summed on its
  // own. Here the kernel is bound by reading K and V from DRAM, and this steady order streams
  // best: with the 16-key blocks of scores16 (64 line misses issued at once per block, with or
  // without software prefetch) one thread read K and V at about half the rate.
  void scores1(i64 t0, i64 j_lo, i64 j_hi, float* ps) const {
    for (i64 j = j_lo; j < j_hi; ++j) {
      pf_row(vp_[j - t0], 2 * a.Dv);  // this key's V row, read next by pv()
      const std::uint16_t* k = krow(j);
      __m512 acc = _mm512_setzero_ps();
      for (i64 d = 0; d < dp32; d += 32) {
        const __mmask32 m = a.D - d >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (a.D - d)) - 1u);
        const __m512bh kv = reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, k + d));
        acc = _mm512_dpbf16_ps(acc, load_bh(Qb + d), kv);
      }
      ps[j - t0] = _mm512_reduce_add_ps(acc) * a.scale_log2;
    }
  }
  void scores(int nr, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, i64 j_end, float* Ps) {
    const bool v_fetched = b == vpf_b_ && hk == vpf_hk_ && t0 == vpf_t0_;  // by the previous tile's pv()
    b_ = b, hk_ = hk, j_end_ = j_end;
    const i64 ldk = a.sk[2];
    v_rows(t0, j_lo, j_hi);
    if (nr == 1) {
      scores1(t0, j_lo, j_hi, Ps);
      return;
    }
    for (i64 c0 = (j_lo - t0) / 16 * 16; t0 + c0 < j_hi; c0 += 16) {
      const i64 j0 = t0 + c0;
      // The V rows of these 16 keys into L2, read next by pv(), which in turn prefetches the
      // next tile's K rows (see pf_row in flash_tile.hpp); prefetching the next 16 keys' K and V
      // rows here instead streamed 20–25 % slower.
      if (!v_fetched) for (i64 j = imax(j0, j_lo); j < imin(j0 + 16, j_hi); ++j) pf_row(vp_[j - t0], 2 * a.Dv);
      if (j0 >= j_lo && j0 + 16 <= j_hi && a.D % 32 == 0) {
        scores16<false>(nr, krow(j0), ldk, nullptr, nullptr, Ps, c0);
        continue;
      }
      const std::uint16_t* kp[16];
      __mmask32 km[16];
      for (int c = 0; c < 16; ++c) {
        const bool in = j0 + c >= j_lo && j0 + c < j_hi;
        kp[c] = krow(in ? j0 + c : j_lo);
        km[c] = in ? ~__mmask32{0} : 0;
      }
      scores16<true>(nr, nullptr, 0, kp, km, Ps, c0);
    }
  }

  // Od rows [0, R) columns [e0, e0 + 32·NB) += P · V over the key pairs [jp0, jp1) of the tile at t0
  // (keys outside [j_lo, j_hi) read as zero: their probability is 0, but their memory may hold
  // anything, NaN included). Columns past Dv are read as zero; Od has Dvp ≥ Dv columns, so the
  // upper 16 of the last 32-column block may not exist (e0 + 16 ≥ Dvp): neither loaded nor stored.
  // Key pair jp's pass also prefetches the K rows of keys t0 + kNt + 2jp, + 1 (the next tile's)
  // below t0 + kNt + pf_n, each found through kv_row: paged or not, every row scores() reads next.
  template <int R, int NB>
  void pv_cols(const std::uint16_t* pb, i64 t0, i64 j_lo, i64 j_hi, i64 jp0, i64 jp1, float* o, i64 Dvp, i64 e0,
               i64 pf_n) const {
    // Accumulator lane i of a 32-column block: column lo_idx[i] (unpacklo) or hi_idx[i] (unpackhi),
    // as indices into the natural pair (columns 0–15, columns 16–31) for permutex2var.
    const __m512i lo_idx = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i hi_idx = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    // And back: natural columns 0–15 / 16–31 from the (lo, hi) pair.
    const __m512i n0_idx = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i n1_idx = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512 acc[R][NB][2];
    __mmask32 cm[NB];
#pragma GCC unroll 4
    for (int x = 0; x < NB; ++x) {
      const i64 e = e0 + 32 * x;
      cm[x] = static_cast<__mmask32>(a.Dv - e >= 32 ? ~0u : (1u << (a.Dv - e)) - 1u);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int x = 0; x < NB; ++x) {
        const float* od = o + r * Dvp + e0 + 32 * x;
        const __m512 n0 = _mm512_loadu_ps(od);
        const __m512 n1 = e0 + 32 * x + 16 < Dvp ? _mm512_loadu_ps(od + 16) : _mm512_setzero_ps();
        acc[r][x][0] = _mm512_permutex2var_ps(n0, lo_idx, n1);
        acc[r][x][1] = _mm512_permutex2var_ps(n0, hi_idx, n1);
      }
    for (i64 jp = jp0; jp < jp1; ++jp) {
      if (2 * jp < pf_n) pf_row(kn_[2 * jp], 2 * a.D), pf_row(vn_[2 * jp], 2 * a.Dv);
      if (2 * jp + 1 < pf_n) pf_row(kn_[2 * jp + 1], 2 * a.D), pf_row(vn_[2 * jp + 1], 2 * a.Dv);
      const i64 ja = t0 + 2 * jp, jb = ja + 1;
      const bool in_a = ja >= j_lo && ja < j_hi, in_b = jb >= j_lo && jb < j_hi;
      const std::uint16_t* va = vp_[2 * jp] + e0;  // a valid row even outside [j_lo, j_hi) (v_rows)
      const std::uint16_t* vb = vp_[2 * jp + 1] + e0;
      const __mmask32 ma = in_a ? ~__mmask32{0} : 0, mb = in_b ? ~__mmask32{0} : 0;
      __m512bh lo[NB], hi[NB];
#pragma GCC unroll 4
      for (int x = 0; x < NB; ++x) {
        const __m512i wa = _mm512_maskz_loadu_epi16(ma & cm[x], va + 32 * x);
        const __m512i wb = _mm512_maskz_loadu_epi16(mb & cm[x], vb + 32 * x);
        lo[x] = reinterpret_cast<__m512bh>(_mm512_unpacklo_epi16(wa, wb));
        hi[x] = reinterpret_cast<__m512bh>(_mm512_unpackhi_epi16(wa, wb));
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512bh pp = pair_bcast(pb + r * kNt + 2 * jp);
#pragma GCC unroll 4
        for (int x = 0; x < NB; ++x) {
          acc[r][x][0] = _mm512_dpbf16_ps(acc[r][x][0], pp, lo[x]);
          acc[r][x][1] = _mm512_dpbf16_ps(acc[r][x][1], pp, hi[x]);
        }
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int x = 0; x < NB; ++x) {
        float* od = o + r * Dvp + e0 + 32 * x;
        _mm512_storeu_ps(od, _mm512_permutex2var_ps(acc[r][x][0], n0_idx, acc[r][x][1]));
        if (e0 + 32 * x + 16 < Dvp) _mm512_storeu_ps(od + 16, _mm512_permutex2var_ps(acc[r][x][0], n1_idx, acc[r][x][1]));
      }
  }
  // All columns for R ≤ kRowsPv rows: 128-column blocks, then single 32-column blocks. Only the
  // first pass prefetches (pf_n keys, see pv_cols).
  template <int R>
  void pv_rows(const std::uint16_t* pb, i64 t0, i64 j_lo, i64 j_hi, i64 jp0, i64 jp1, float* o, i64 Dvp, i64 pf_n) const {
    constexpr int NB = 4;
    i64 e0 = 0;
    for (; e0 + 32 * NB <= Dvp; e0 += 32 * NB, pf_n = 0) pv_cols<R, NB>(pb, t0, j_lo, j_hi, jp0, jp1, o, Dvp, e0, pf_n);
    for (; e0 < Dvp; e0 += 32, pf_n = 0) pv_cols<R, 1>(pb, t0, j_lo, j_hi, jp0, jp1, o, Dvp, e0, pf_n);
  }
  void pv(int nr, const float* Ps, i64 b, i64 hk, i64 t0, i64 j_lo, i64 j_hi, float* Od, i64 Dvp) {
    b_ = b, hk_ = hk;
    for (int r = 0; r < nr; ++r)
      for (int c = 0; c < kNt; c += 32) {
        const __m512bh p = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(Ps + r * kNt + c + 16), _mm512_loadu_ps(Ps + r * kNt + c));
        _mm512_storeu_si512(reinterpret_cast<void*>(Pb + r * kNt + c), reinterpret_cast<__m512i>(p));
      }
    const i64 jp0 = (j_lo - t0) / 2, jp1 = (j_hi - t0 + 1) / 2;
    static_assert(kNt % 2 == 0, "key pairs stay inside a tile");
    // While this tile's V rows are read: the next tile's K rows that this item scores (when
    // scores() reads K, which set j_end_), through the block table when paged. Prefetching only
    // the rows evenly strided from the next tile's first (16 of 64 with 16-row blocks) left
    // paged decode 45–49 % slower than contiguous.
    i64 pf_n = takes_k(a) ? imax(imin(j_end_, t0 + 2 * kNt) - t0 - kNt, 0) : 0;
    if (!takes_k(a)) v_rows(t0, j_lo, j_hi);  // otherwise scores() found this tile's V rows
    rows_of(a.k, a.sk, t0 + kNt, t0 + kNt, t0 + kNt + pf_n, kn_);
    rows_of(a.v, a.sv, t0 + kNt, t0 + kNt, t0 + kNt + pf_n, vn_);
    vpf_b_ = b, vpf_hk_ = hk, vpf_t0_ = pf_n > 0 ? t0 + kNt : -1;
    for (int r = 0; r < nr; r += kRowsPv, pf_n = 0) {
      const std::uint16_t* pb = Pb + r * kNt;
      float* o = Od + r * Dvp;
      static_assert(kRowsPv == 2, "one case per row count below");
      if (nr - r == 1) pv_rows<1>(pb, t0, j_lo, j_hi, jp0, jp1, o, Dvp, pf_n);
      else pv_rows<2>(pb, t0, j_lo, j_hi, jp0, jp1, o, Dvp, pf_n);
    }
  }
};

}  // namespace

void flash_forward_avx512_bf16(const FlashArgs* list, std::int64_t n) { forward<S, OperandsBf16>(list, n); }
void flash_decode_avx512_bf16(const FlashArgs& a) { decode<S, DecodeOpsBf16>(a); }

}  // namespace qkv::kernels::cpu
