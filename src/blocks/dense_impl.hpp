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
  static constexpr i64 bytes = 4;
  static typename S::V load(const void* W, i64 at) { return S::loadu(static_cast<const float*>(W) + at); }
  static typename S::V load_n(const void* W, i64 at, int n) { return S::load_n(static_cast<const float*>(W) + at, n); }
};
template <class S>
struct RowsBf16 {
  static constexpr i64 bytes = 2;
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

// The decode step's GEMV (gemv_batch_rows in dense.hpp): output rows [o, o + R) for the MB rows of
// x from m0, each (row, x row) summed exactly as gemv_row<M = 1> sums it (U = 4 vectors a step, the
// same tail, the same reduction), so a row's result does not depend on how many sequences share the
// step. The weight rows are read once for the MB rows; the caller loops over groups of MB with the
// rows in L1. R > 1 (at MB = 1: one sequence) reads R rows side by side, so each vector of x is
// loaded once for R rows and the R horizontal sums go together (S::hsum4: the same bits as S::hsum);
// for short rows (64 columns: one step) the call and the sums cost more than the FMAs.
// The loops are unrolled by pragma: GCC otherwise keeps acc[MB][U] on the stack at MB = 4.
// Measured and dropped: 4 adjacent weight rows at once with one chain per (row, x row) (8 loads for
// 16 FMAs, no partial sums) cost 2.0× the CPU time at one sequence and 1.4× at 8 (random 6.1M).
// `ahead` (one sequence, MB = 1): the first byte of the R rows the next call reads (null: none),
// prefetched into L1 as this call goes, each step of U·L columns the lines at the same place in
// that block that the step reads in its own (spread, not at once: a block's lines at once queue
// for the line-fill buffers this call's loads need). The hardware prefetcher follows the R row
// streams inside a 4 KiB page but restarts at every page boundary (a block of 4 f32 rows of 288
// columns is 4.5 KiB); the software prefetch crosses them. Locality: __builtin_prefetch's (3: into
// L1, prefetcht0, the blocks walk's; 2: prefetcht1, the rows walk's, see kRowsAhead).
template <class S, class Rows, int MB, int R = 1, int Locality = 3>
void gemv_batch_row(const BatchGemvArgs& a, i64 o, i64 m0, const char* ahead = nullptr) {
  using V = typename S::V;
  constexpr int U = 4;
  // Lines of the R rows that one step covers (block bytes in proportion: R·U·L columns' bytes).
  constexpr i64 step_bytes = R * U * S::L * Rows::bytes;
  static_assert(MB == 1 || R == 1, "ahead: one sequence's R rows");
  const i64 in = a.in;
  const float* x = a.x + m0 * in;
  V acc[R][MB][U];
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m)
      #pragma GCC unroll 16
      for (int u = 0; u < U; ++u) acc[r][m][u] = S::zero();
  i64 i = 0;
  for (; i + U * S::L <= in; i += U * S::L) {
    if (ahead) {
      #pragma GCC unroll 16
      for (i64 k = 0; k < step_bytes; k += 64) __builtin_prefetch(ahead + i * R * Rows::bytes + k, 0, Locality);
    }
    #pragma GCC unroll 16
    for (int u = 0; u < U; ++u)
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const V w = Rows::load(a.W, (o + r) * in + i + u * S::L);
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) acc[r][m][u] = S::fmadd(w, S::loadu(x + m * in + i + u * S::L), acc[r][m][u]);
      }
  }
  if (ahead) {  // the rest of the block, up to the line of its last byte
    const char* end = ahead + R * in * Rows::bytes;
    for (const char* p = ahead + i * R * Rows::bytes; p < end; p += 64) __builtin_prefetch(p, 0, Locality);
    __builtin_prefetch(end - 1, 0, Locality);
  }
  for (; i + S::L <= in; i += S::L)
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const V w = Rows::load(a.W, (o + r) * in + i);
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) acc[r][m][0] = S::fmadd(w, S::loadu(x + m * in + i), acc[r][m][0]);
    }
  if (i < in) {
    const int n = static_cast<int>(in - i);
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const V w = Rows::load_n(a.W, (o + r) * in + i, n);
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) acc[r][m][0] = S::fmadd(w, S::load_n(x + m * in + i, n), acc[r][m][0]);
    }
  }
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m)
      #pragma GCC unroll 16
      for (int u = 1; u < U; ++u) acc[r][m][0] = S::add(acc[r][m][0], acc[r][m][u]);
  float sum[R][MB];
  if constexpr (MB == 4 && requires { S::hsum4(acc[0][0][0], acc[0][1][0], acc[0][2][0], acc[0][3][0], sum[0]); })
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)  // S::hsum's sums, 4 vectors reduced together
      S::hsum4(acc[r][0][0], acc[r][1][0], acc[r][2][0], acc[r][3][0], sum[r]);
  else if constexpr (MB == 1 && R == 4 && requires(V v, float* t) { S::hsum4(v, v, v, v, t); }) {
    float s4[4];  // the same, over the R rows
    S::hsum4(acc[0][0][0], acc[1][0][0], acc[2][0][0], acc[3][0][0], s4);
    #pragma GCC unroll 4
    for (int r = 0; r < R; ++r) sum[r][0] = s4[r];
  } else
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) sum[r][m] = S::hsum(acc[r][m][0]);
  #pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      float* y = a.y + (m0 + m) * a.ldy + o + r;
      *y = (a.beta == 0.0f ? 0.0f : *y) + sum[r][m] + (a.b ? a.b[o + r] : 0.0f);
    }
}

// The weight lines [p, end) a later block will read, prefetched into L2 a few at a time from inside
// the compute loop of the blocks before it (step<K>(): K lines a step of gemv_batch_block's inner
// loop, while any are left; rest(): whatever is left once the block is done). Spread this way, the
// prefetches of a block do not queue at once for the few line-fill buffers the loads of the block
// compete for. K is a constant so that a step is K prefetches, one add and one test: the inner loop
// has 16 FMAs and 8 loads on AVX-512, and a counted loop of prefetches there costs as much issue
// width as the FMAs of a short row.
struct Ahead {
  const char* p = nullptr;  // the next line to prefetch (64-byte aligned)
  const char* end = nullptr;
  template <int K>
  void step() {
    // Expected: p < end in all but a block's last steps (GCC otherwise moves the prefetches out of
    // line, two taken jumps a step).
    if (__builtin_expect(p < end, 1)) {
      #pragma GCC unroll 4
      for (int k = 0; k < K; ++k) __builtin_prefetch(p + 64 * k, 0, 2);
      p += 64 * K;
    }
  }
  void rest() {
    for (; p < end; p += 64) __builtin_prefetch(p, 0, 2);
  }
};

// R output rows [o, o + R) for the MB rows of x from m0, register-blocked: R·MB accumulators, R + MB
// loads for R·MB FMAs (gemv_batch_row<MB> loads MB + 1 for MB, and the FMA unit waits on loads).
// Each (row, x row) is summed exactly as gemv_batch_row sums it: its U = 4 chains (chain u takes the
// vectors at i + u·L of every step of U·L columns; chain 0 also the full vectors after the last step
// and the masked tail) are added as ((c0 + c1) + c2) + c3, then reduced by S::hsum. Here the chains
// run one after the other (R·MB accumulators at a time, not R·MB·U), the finished ones summed into
// tot in that order, so the result is the same bits. Chain u reads every U-th vector of the R rows
// (cache line u of each 4 on AVX-512); the rows stay in L1 between the chains. K: lines prefetched a
// step (Ahead).
template <class S, class Rows, int R, int MB, int K>
void gemv_batch_block(const BatchGemvArgs& a, i64 o, i64 m0, Ahead& ahead_io) {
  using V = typename S::V;
  constexpr int U = 4, L = S::L;
  const i64 in = a.in, steps_end = in / (U * L) * (U * L);
  const float* x = a.x + m0 * in;
  Ahead ahead = ahead_io;  // a local copy keeps p in a register (through the reference GCC stores it every step)
  V tot[R][MB], acc[R][MB];
  #pragma GCC unroll 4
  for (int u = 0; u < U; ++u) {
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) acc[r][m] = S::zero();
    for (i64 i = u * L; i < steps_end; i += U * L) {
      ahead.template step<K>();
      V w[R];
      #pragma GCC unroll 16
      for (int r = 0; r < R; ++r) w[r] = Rows::load(a.W, (o + r) * in + i);
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) {
        V xv = S::loadu(x + m * in + i);
        // One load for the R FMAs: without this GCC may fold the load into each FMA (R loads of
        // the same vector; it does at R = 3, and the loads then outnumber the FMAs).
        asm("" : "+v"(xv));
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) acc[r][m] = S::fmadd(w[r], xv, acc[r][m]);
      }
    }
    if (u == 0) {  // chain 0 also takes what is left after the last step of U·L columns
      i64 i = steps_end;
      for (; i + L <= in; i += L)
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const V w = Rows::load(a.W, (o + r) * in + i);
          #pragma GCC unroll 16
          for (int m = 0; m < MB; ++m) acc[r][m] = S::fmadd(w, S::loadu(x + m * in + i), acc[r][m]);
        }
      if (i < in) {
        const int n = static_cast<int>(in - i);
        #pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          const V w = Rows::load_n(a.W, (o + r) * in + i, n);
          #pragma GCC unroll 16
          for (int m = 0; m < MB; ++m) acc[r][m] = S::fmadd(w, S::load_n(x + m * in + i, n), acc[r][m]);
        }
      }
    }
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) tot[r][m] = u == 0 ? acc[r][m] : S::add(tot[r][m], acc[r][m]);
  }
  ahead_io = ahead;
  // y [m0 + m, o + r] = ((beta·y or 0) + Σ) + (b [o + r] or 0), the expression of gemv_row.
  if constexpr (R == 4 && requires { S::hsum4x(tot[0][0], tot[1][0], tot[2][0], tot[3][0]); }) {
    // The R = 4 sums of one row of x are adjacent in y: reduced together into one 4-lane vector
    // (S::hsum4x: S::hsum's sums) and written with one 4-float load, two adds and one store.
    const __m128 bias = a.b ? _mm_loadu_ps(a.b + o) : _mm_setzero_ps();
    #pragma GCC unroll 16
    for (int m = 0; m < MB; ++m) {
      float* y = a.y + (m0 + m) * a.ldy + o;
      const __m128 sum = S::hsum4x(tot[0][m], tot[1][m], tot[2][m], tot[3][m]);
      _mm_storeu_ps(y, _mm_add_ps(_mm_add_ps(a.beta == 0.0f ? _mm_setzero_ps() : _mm_loadu_ps(y), sum), bias));
    }
  } else
    #pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      float sum[MB];
      if constexpr (MB == 4 && requires { S::hsum4(tot[r][0], tot[r][1], tot[r][2], tot[r][3], sum); })
        S::hsum4(tot[r][0], tot[r][1], tot[r][2], tot[r][3], sum);
      else
        #pragma GCC unroll 16
        for (int m = 0; m < MB; ++m) sum[m] = S::hsum(tot[r][m]);
      #pragma GCC unroll 16
      for (int m = 0; m < MB; ++m) {
        float* y = a.y + (m0 + m) * a.ldy + o + r;
        *y = (a.beta == 0.0f ? 0.0f : *y) + sum[m] + (a.b ? a.b[o + r] : 0.0f);
      }
    }
}

// GemvWalk::rows_ahead's software prefetch distance: one sequence reading W row after row from
// memory asks for the bytes 768 ahead of its loads into L2 (prefetcht1). The hardware prefetcher
// alone kept fewer lines in flight than a plain read of the same bytes: on Zen 4 (bench/results/
// bw_2026-11-28.md) decode of the 110M shape in bf16 ran 1.22× faster with it at 1 thread, 1.18×
// at 2; 512–1024 B ahead were about as fast, and on a bare read 2.5–5 KiB and prefetcht0 slower
// than none. From L3 (the 6.1 M model) the prefetches only cost: hence a walk of its own.
inline constexpr i64 kRowsAhead = 768;

// Rows [o0, o1) for the rows [a.m0, a.m1) of x: blocks of R rows × MB rows of x (gemv_batch_block)
// while both are whole, then the n = (m1 − m0) mod MB rows of x left over as one block of R × n
// when n ≥ 2 (a B = 2, 3, 6 or 7 step reads each weight vector once for them, not once a row), and
// a last single row of x R rows of W at a time (gemv_batch_row<1, R>: contiguous loads, which the
// hardware prefetcher follows; B = 1 is only that, each block prefetching the next one, see
// gemv_batch_row's `ahead`, unless a.walk_rows: then B = 1 reads W row after row, with a.rows_ahead
// each row prefetching kRowsAhead bytes ahead, below); then the rows of W left over one at a time, MB
// rows of x at a time (MB · 4 accumulators must fit the registers: 4 on AVX-512's 32, 2 on AVX2's
// 16), then single rows of x. Every path sums a (row, x row) the same way: the batch, its range and
// the split of the rows do not change a bit.
template <class S, class Rows, int MB, int R>
void gemv_batch_rows(const BatchGemvArgs& a, i64 o0, i64 o1) {
  constexpr i64 U = 4;
  const i64 mb = a.m0 + (a.m1 - a.m0) / MB * MB;  // rows of x [m0, mb) in whole groups of MB
  const i64 left = a.m1 - mb;                     // then `left` < MB rows: a block of them if ≥ 2
  const i64 groups = (mb - a.m0) / MB + (left >= 2 ? 1 : 0);
  // Block o prefetches block o + 2R (R rows, one contiguous range) into L2 while it computes, spread
  // over the groups · (in / (U·L)) · U steps of its inner loops: chain u of a block reads every
  // U-th cache line, a pattern the hardware prefetchers do not follow (without the prefetch the
  // blocks ran at half the one-row kernel's speed from memory; 1 block ahead into L1: slower).
  // K lines a step: lines / steps rounded down to 1, 2 or 4, the rest left to rest() (f32 rows of
  // 288 columns at 8 rows of x: 72 lines in 32 steps, K = 2 and 8 lines at the end; of 768: 192 in
  // 96). Rounded up instead (K = 4 at 288), the prefetches of a block came in its first half and the
  // 6.1 M model's weight pass took longer.
  const i64 block_bytes = R * a.in * Rows::bytes;
  const i64 steps = groups * (a.in / (U * S::L) * U);
  const i64 lines = (block_bytes + 63) / 64;
  static_assert(MB == 2 || MB == 4, "the rows of x left over form a block of 2 or 3 only when MB = 4");
  i64 o = o0;
  auto blocks = [&]<int K>() {
    for (; o + R <= o1; o += R) {
      Ahead ahead;
      if (o + 3 * R <= o1) {
        const auto first =
            reinterpret_cast<std::uintptr_t>(a.W) + static_cast<std::uintptr_t>((o + 2 * R) * a.in * Rows::bytes);
        ahead.p = reinterpret_cast<const char*>(first & ~std::uintptr_t{63});
        ahead.end = reinterpret_cast<const char*>(first + static_cast<std::uintptr_t>(block_bytes));
      }
      for (i64 m = a.m0; m < mb; m += MB) gemv_batch_block<S, Rows, R, MB, K>(a, o, m, ahead);
      if constexpr (MB == 4) {  // the `left` rows from mb as one block (a template constant)
        if (left == 2) gemv_batch_block<S, Rows, R, 2, K>(a, o, mb, ahead);
        else if (left == 3) gemv_batch_block<S, Rows, R, 3, K>(a, o, mb, ahead);
      }
      ahead.rest();
      if (left == 1) gemv_batch_row<S, Rows, 1, R>(a, o, mb);
    }
  };
  if (groups > 0) {
    const i64 per_step = steps > 0 ? lines / steps : 0;
    if (per_step >= 4) blocks.template operator()<4>();
    else if (per_step >= 2) blocks.template operator()<2>();
    else blocks.template operator()<1>();
  } else if (!a.walk_rows)  // one row of x (or none): R rows of W at a time, each block prefetching the next
    for (; o + R <= o1; o += R) {
      const char* next = o + 2 * R <= o1 ? static_cast<const char*>(a.W) + (o + R) * a.in * Rows::bytes : nullptr;
      for (i64 m = a.m0; m < a.m1; ++m) gemv_batch_row<S, Rows, 1, R>(a, o, m, next);
    }
  if (a.rows_ahead && a.m1 - a.m0 == 1) {
    // One row of x, W row after row: each row prefetches the bytes kRowsAhead past its own, as
    // many as it reads, while they are inside [o0, o1) (the rows left at the end: none).
    const char* W = static_cast<const char*>(a.W);
    const i64 row_bytes = a.in * Rows::bytes, end = o1 * row_bytes;
    for (; o < o1; ++o) {
      const i64 at = o * row_bytes + kRowsAhead;
      gemv_batch_row<S, Rows, 1, 1, 2>(a, o, a.m0, at + row_bytes <= end ? W + at : nullptr);
    }
  }
  for (; o < o1; ++o) {
    i64 m = a.m0;
    for (; m + MB <= a.m1; m += MB) gemv_batch_row<S, Rows, MB>(a, o, m);
    for (; m < a.m1; ++m) gemv_batch_row<S, Rows, 1>(a, o, m);
  }
}

// One query per head (nh heads sharing one kv head) against Skv cached keys and values, f32:
//   s_j = q·k_j · scale · log2 e,  p_j = 2^(s_j − max s),  out = Σ p_j v_j / Σ p_j.
// Two passes over the keys (scores, then P·V) instead of flash's online softmax: one query has no
// tiles to reuse. The scores are computed L keys at a time: key t of a block leaves its products
// q ⊙ k_t in vector f[t] (its D values folded into one vector of L lanes, the last one masked), and
// S::hsum_lanes turns the L vectors into the vector of their L sums (L − 1 adds and 2(L − 1)
// shuffles for L keys; a horizontal sum per key costs that much for each key). D may be smaller
// than a vector (D = 8 in stories260K: one masked load a key).
inline i64 imin(i64 x, i64 y) { return x < y ? x : y; }

// out [NV·L columns, the last vector `tail` lanes] = inv · Σ_j p_j · v [j, d0 + …] over Skv rows of
// D values (Rows: f32 or bf16). NV a constant so the accumulators stay in registers (with the count
// variable, GCC kept them on the stack: a store and a reload on every key's chain). Keys go to K
// chains of accumulators in turn (K = 4 at one vector a row, 2 at more; the keys after the last
// whole turn to chain 0), summed at the end: with one chain, each key waits for the FMA of the key
// before it.
template <class S, class Rows, int NV>
void attend_pv(const float* p, const void* v, i64 d0, i64 Skv, i64 D, int tail, float inv, float* out) {
  using V = typename S::V;
  constexpr int K = NV == 1 ? 4 : 2;
  V acc[K][NV];
  #pragma GCC unroll 4
  for (int u = 0; u < K; ++u)
    #pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[u][c] = S::zero();
  i64 j = 0;
  for (; j + K <= Skv; j += K)
    #pragma GCC unroll 4
    for (int u = 0; u < K; ++u) {
      const V pj = S::set1(p[j + u]);
      const i64 vr = (j + u) * D + d0;
      #pragma GCC unroll 4
      for (int c = 0; c + 1 < NV; ++c) acc[u][c] = S::fmadd(pj, Rows::load(v, vr + c * S::L), acc[u][c]);
      acc[u][NV - 1] = S::fmadd(pj, Rows::load_n(v, vr + (NV - 1) * S::L, tail), acc[u][NV - 1]);
    }
  for (; j < Skv; ++j) {
    const V pj = S::set1(p[j]);
    const i64 vr = j * D + d0;
    #pragma GCC unroll 4
    for (int c = 0; c + 1 < NV; ++c) acc[0][c] = S::fmadd(pj, Rows::load(v, vr + c * S::L), acc[0][c]);
    acc[0][NV - 1] = S::fmadd(pj, Rows::load_n(v, vr + (NV - 1) * S::L, tail), acc[0][NV - 1]);
  }
  #pragma GCC unroll 4
  for (int c = 0; c < NV; ++c) {
    V sum = acc[0][c];
    #pragma GCC unroll 4
    for (int u = 1; u < K; ++u) sum = S::add(sum, acc[u][c]);
    S::store_n(out + c * S::L, S::mul(sum, S::set1(inv)), c + 1 < NV ? S::L : tail);
  }
}

// The scaled scores of the n ≤ L keys from k [j0·D] against q (rows of D values: nf full vectors,
// then one of dt lanes), lane t for key j0 + t; the lanes past n hold 0. Inlined so that a whole
// block (n = L) has no test per key. Meanwhile the bytes [pf.at, pf.end) of k and of v are
// prefetched, pf.per_key lines with each key: a block's lines at once would queue for the few
// line-fill buffers its own loads need.
struct KvAhead {
  const char* k;
  const char* v;
  i64 at, end, per_key;
};
// The next call's rows (KvNext), into L2 a few lines a block of L keys: [at, end) of k and of v
// (64-byte steps from the rows' start: when it is not on a line, the line of the last byte may be left).
struct KvNextAhead {
  const char* k;
  const char* v;
  i64 at, end, per_block;
  void step() {
    for (i64 i = 0; i < per_block && at < end; ++i, at += 64) {
      __builtin_prefetch(k + at, 0, 2);
      __builtin_prefetch(v + at, 0, 2);
    }
  }
  void rest() {
    for (; at < end; at += 64) {
      __builtin_prefetch(k + at, 0, 2);
      __builtin_prefetch(v + at, 0, 2);
    }
  }
};
template <class S, class Rows>
[[gnu::always_inline]] inline typename S::V attend_scores(const float* q, const void* k, i64 j0, int n, i64 D, i64 nf,
                                                          int dt, typename S::V sl2, KvAhead& pf) {
  using V = typename S::V;
  V f[S::L];
  #pragma GCC unroll 16
  for (int t = 0; t < S::L; ++t) {
    f[t] = S::zero();
    if (t < n) {
      for (i64 i = 0; i < pf.per_key && pf.at < pf.end; ++i, pf.at += 64) {
        __builtin_prefetch(pf.k + pf.at, 0, 3);
        __builtin_prefetch(pf.v + pf.at, 0, 2);
      }
      const i64 kr = (j0 + t) * D;
      for (i64 c = 0; c < nf; ++c) f[t] = S::fmadd(S::loadu(q + c * S::L), Rows::load(k, kr + c * S::L), f[t]);
      f[t] = S::fmadd(S::load_n(q + nf * S::L, dt), Rows::load_n(k, kr + nf * S::L, dt), f[t]);
    }
  }
  return S::mul(S::hsum_lanes(f), sl2);
}

// Keys and values as f32 (RowsF32) or bf16 bits widened exactly (RowsBf16); q, out and every sum f32.
template <class S, class Rows>
void attend_one_impl(const AttendArgs& a) {
  using V = typename S::V;
  constexpr int L = S::L;
  const i64 D = a.D, Skv = a.Skv;
  const i64 nf = (D - 1) / L;                   // full vectors of a row before its last one
  const int dt = static_cast<int>(D - nf * L);  // lanes of the last vector, in [1, L]
  const V sl2 = S::set1(a.scale * 1.4426950408889634f);
  float* sc = a.scores;
  // The cache's rows come from L3 or memory (a decode step streams the weights between two visits
  // of a head), and the loads of one key's dot product wait on them: the first query head's score
  // pass prefetches the key and value rows kAhead keys ahead (the values for the P·V pass after it;
  // the other heads of the group then find both in cache), every line of a block's rows once.
  // Measured with perf on the 6.1 M model, B = 1 and 8, f32 and bf16 caches: 8 to 64 keys ahead all
  // helped; without the value rows, half the gain.
  constexpr i64 kAhead = 16;
  const i64 row_bytes = D * Rows::bytes;
  const char* kb = static_cast<const char*>(a.k);
  const char* vb = static_cast<const char*>(a.v);
  // Every line of rows [j0, j1) of k and v (rows need not start on a line): at once, or spread
  // over the keys of a block of scores (KvAhead).
  auto ahead = [&](i64 j0, i64 j1) {
    return j0 < j1 ? KvAhead{kb, vb, j0 * row_bytes, j1 * row_bytes, (row_bytes + 63) / 64} : KvAhead{kb, vb, 0, 0, 0};
  };
  auto rest = [&](KvAhead& pf) {
    for (; pf.at < pf.end; pf.at += 64) {
      __builtin_prefetch(kb + pf.at, 0, 3);
      __builtin_prefetch(vb + pf.at, 0, 2);
    }
    if (pf.end > 0) {  // the line of the last byte (the steps of 64 from a row's start can miss it)
      __builtin_prefetch(kb + pf.end - 1, 0, 3);
      __builtin_prefetch(vb + pf.end - 1, 0, 2);
    }
  };
  // The next call's rows, spread over the first head's blocks of L keys (≥ 1 line a block).
  const i64 next_lines = (a.next.bytes + 63) / 64, blocks = Skv / L;
  KvNextAhead next{static_cast<const char*>(a.next.k), static_cast<const char*>(a.next.v), 0, next_lines * 64,
                   blocks > 0 ? (next_lines + blocks - 1) / blocks : 0};
  for (i64 r = 0; r < a.nh; ++r) {
    const float* q = a.q + r * D;
    if (r == 0) {
      KvAhead first = ahead(0, imin(kAhead, Skv));
      rest(first);
    }
    V vmx = S::set1(-__builtin_inff());
    float mx = -__builtin_inff();
    i64 j0 = 0;
    for (; j0 + L <= Skv; j0 += L) {
      KvAhead pf = r == 0 ? ahead(j0 + kAhead, imin(j0 + kAhead + L, Skv)) : ahead(0, 0);
      const V s = attend_scores<S, Rows>(q, a.k, j0, L, D, nf, dt, sl2, pf);
      rest(pf);
      if (r == 0) next.step();
      S::storeu(sc + j0, s);
      vmx = S::max(vmx, s);
    }
    if (r == 0) next.rest();
    if (j0 < Skv) {  // the last keys (nothing left to prefetch): lanes past them hold 0, not part of the max
      const int n = static_cast<int>(Skv - j0);
      KvAhead none = ahead(0, 0);
      S::store_n(sc + j0, attend_scores<S, Rows>(q, a.k, j0, n, D, nf, dt, sl2, none), n);
      for (int t = 0; t < n; ++t) mx = sc[j0 + t] > mx ? sc[j0 + t] : mx;
    }
    if (Skv >= L) {
      const float m = S::hmax(vmx);
      mx = m > mx ? m : mx;
    }
    const V vm = S::set1(mx);
    V vsum = S::zero();
    i64 j = 0;
    for (; j + L <= Skv; j += L) {
      const V p = S::exp2(S::sub(S::loadu(sc + j), vm));
      S::storeu(sc + j, p);
      vsum = S::add(vsum, p);
    }
    if (j < Skv) {
      const int n = static_cast<int>(Skv - j);
      const V p = S::exp2(S::sub(S::load_n(sc + j, n), vm));
      S::store_n(sc + j, p, n);
      vsum = S::add(vsum, S::load_n(sc + j, n));
    }
    const float inv = 1.0f / S::hsum(vsum);
    // P·V, up to 4 vectors of columns at a time (one pass over the keys for D ≤ 4L), the last
    // vector of a row masked when D is not a multiple of L.
    float* o = a.out + r * D;
    for (i64 d0 = 0; d0 < D; d0 += 4 * L) {
      const int nv = static_cast<int>((imin(D - d0, 4 * L) + L - 1) / L);
      const int tail = static_cast<int>(imin(D - d0, 4 * L) - (nv - 1) * L);  // lanes of the last vector
      switch (nv) {
        case 1: attend_pv<S, Rows, 1>(sc, a.v, d0, Skv, D, tail, inv, o + d0); break;
        case 2: attend_pv<S, Rows, 2>(sc, a.v, d0, Skv, D, tail, inv, o + d0); break;
        case 3: attend_pv<S, Rows, 3>(sc, a.v, d0, Skv, D, tail, inv, o + d0); break;
        default: attend_pv<S, Rows, 4>(sc, a.v, d0, Skv, D, tail, inv, o + d0); break;
      }
    }
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
