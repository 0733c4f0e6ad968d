// Internal: the model's inference-only dense kernels, per ISA (runtime dispatch on active_isa()).
//
// GEMV — the projections of decoding, where a call has only a few rows:
//   x [M, in] f32   W [out, in] f32 or bf16 (raw bits)   b [out] or null   y [M, out] f32
//   y = beta·y + x · Wᵀ + b          M ≤ kGemvMaxRows, beta ∈ {0, 1} (0 never reads y)
// At M = 1 every weight is read once and used once, so the speed is the memory bandwidth; the
// kernels read W one row at a time, front to back (one linear stream per thread), with several
// independent vector accumulators per row, and split the output rows over `threads`. bf16 weights halve the bytes read. Activations and accumulation stay f32.
//   avx512_bf16: vdpbf16ps on (W, x_hi) and (W, x_lo), x = x_hi + x_lo split into two bf16
//                (x_hi + x_lo carries 16 of x's 24 significand bits: error ≤ 2^-17·|x|).
//   avx512(_vnni), avx2: W widened to f32 (a 16-bit shift), f32 FMA: exact products.
//   scalar:      the plain loop below, in f32 (the fallback).
// gemv_reference is the f64 twin the tests compare with.
//
// GELU (tanh form), vectorised: gelu(x) = ½x(1 + tanh(u)) = x / (1 + e^(−2u)),
// u = √(2/π)(x + 0.044715x³), with e^ from the ISA's exp2 (relative error ≤ 2.4e-7).
// blocks::gelu_tanh_forward (std::tanh, blocks/activation.hpp) is its reference twin.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "qkv/runtime.hpp"  // Isa
#include "qkv/types.hpp"    // DType, fail

namespace qkv::blocks {

inline constexpr std::int64_t kGemvMaxRows = 4;

void gemv_f32(const float* x, const float* W, const float* b, float* y, std::int64_t M, std::int64_t in,
              std::int64_t out, float beta, int threads, Isa isa);
void gemv_bf16(const float* x, const std::uint16_t* W, const float* b, float* y, std::int64_t M, std::int64_t in,
               std::int64_t out, float beta, int threads, Isa isa);

// Several GEMVs that read the same x [M, in] (W_Q, W_K, W_V of one layer) in one parallel region:
// output k is y_k [M, out_k] = beta·y_k + x · W_kᵀ + b_k, W_k [out_k, in] (f32, or bf16 bits for
// gemv_bf16_multi); b_k may be null. The rows of all outputs are split over `threads` as one list,
// so the threads meet once instead of once per matrix. gemv_f32 / gemv_bf16 are the case of one.
struct GemvOut {
  const void* W;
  const float* b;
  float* y;
  std::int64_t out;
};
void gemv_f32_multi(const float* x, std::span<const GemvOut> outs, std::int64_t M, std::int64_t in, float beta,
                    int threads, Isa isa);
void gemv_bf16_multi(const float* x, std::span<const GemvOut> outs, std::int64_t M, std::int64_t in, float beta,
                     int threads, Isa isa);
// The same for a caller already inside a parallel region (the decoding step of src/model/decode.cpp): computes
// rows [r0, r1) of the list of all outputs' rows (0 ≤ r0 ≤ r1 ≤ Σ out_k) on the calling thread.
// Callers hand out disjoint ranges that together cover the list. A row's result does not depend on
// the range it was computed in.
void gemv_f32_multi_rows(const float* x, std::span<const GemvOut> outs, std::int64_t M, std::int64_t in,
                         float beta, Isa isa, std::int64_t r0, std::int64_t r1);
void gemv_bf16_multi_rows(const float* x, std::span<const GemvOut> outs, std::int64_t M, std::int64_t in,
                          float beta, Isa isa, std::int64_t r0, std::int64_t r1);
// Rows [first, second) of a list of n rows that part `part` of `parts` takes (contiguous, in order).
inline std::pair<std::int64_t, std::int64_t> gemv_part_rows(std::int64_t n, int part, int parts) {
  return {n * part / parts, n * (part + 1) / parts};
}

// How gemv_batch_rows reads W for a lone row of x (one sequence); all three give the same bits.
//   blocks:     R rows of W side by side (4 on AVX-512, 2 on AVX2: x loaded once for R rows, the R
//               sums reduced together), each block prefetching the next one into L1;
//   rows:       one row of W after the other, one contiguous stream left to the hardware prefetcher;
//   rows_ahead: the same, each row prefetching the bytes 768 ahead of its own into L2 (weights
//               streamed from memory: the hardware prefetcher alone keeps too few lines in flight).
// Measured (bench_gemv_step --batch 1, bench/results/gemv_walk_2026-11-27.md): on an Intel Cascade
// Lake guest blocks are the faster walk, from caches and from memory; on AMD Zen 4 blocks are faster
// (1.2–1.5×) while the weights stay in L3, but from memory the R interleaved streams defeat its
// prefetchers, and rows take 0.4–0.8× blocks' time (24.5–440 MB of weights). rows_ahead against
// rows on Zen 4 (bench/results/bw_2026-11-28.md, decode): 110M shape in bf16 (220 MB) 1.22× at
// 1 thread, 1.18× at 2; in f32 (438 MB) 1.04–1.06×; the 6.1 M model (24.5 MB, from L3) 0.93–0.95×.
enum class GemvWalk { blocks, rows, rows_ahead };
// The walk for a decode step that streams weight_bytes of weights: QKV_GEMV_WALK=blocks|rows|
// rows_ahead when set and not empty (A/B measurements, tests; anything else throws, naming the
// variable and the value), else on AMD CPUs rows_ahead when weight_bytes exceed the L3 cache of
// CPU 0 (Linux sysfs; sysconf's when sysfs has none), rows when they exceed half of it; blocks
// otherwise.
GemvWalk gemv_walk(std::int64_t weight_bytes);

// The decode step's GEMV (Model's one-token steps, one or many sequences), on the calling thread:
//   y [m·ldy + o] = beta·y + x [m, :] · W [o, :] + b [o]      m ∈ rows = [m0, m1) ⊆ [0, M), o ∈ [o0, o1)
// x [M, in]; W [·, in] f32 (Wb null) or bf16 bits (W null, widened exactly); beta ∈ {0, 1}; rows of
// y outside `rows` are not touched. Each (m, o) is summed in one fixed order, whatever M, `rows` and
// [o0, o1) are: a sequence's result does not depend on the batch it is in or on the thread that
// computed its rows. Each row of W is read from memory once for all rows of x: with ≥ 4 of them
// (AVX-512; 2 on AVX2) in blocks of 4 rows of W × 4 rows of x (2 × 2); a lone row of x as `walk`
// says (GemvWalk); rows of W past the last whole block one at a time.
// Throws (naming the argument) unless 0 ≤ m0 ≤ m1 ≤ M, 0 ≤ o0 ≤ o1, in ≥ 1, ldy ≥ o1 when m1 − m0 > 1,
// and beta ∈ {0, 1}. Twin: gemv_reference.
void gemv_batch_rows(const float* x, const float* W, const std::uint16_t* Wb, const float* b, float* y,
                     std::int64_t ldy, std::int64_t M, std::int64_t in, float beta, Isa isa, std::int64_t o0,
                     std::int64_t o1, std::pair<std::int64_t, std::int64_t> rows,
                     GemvWalk walk);

// The cache rows the caller's next attend_one call will read (bytes [0, bytes) of k and of v):
// attend_one prefetches them into L2 spread over its own first score pass, so that a decode step
// going through B sequences' caches reads them as one stream (each call otherwise starts cold on
// rows from memory). Only a hint: the result does not depend on it.
struct KvNext {
  const void* k = nullptr;
  const void* v = nullptr;
  std::int64_t bytes = 0;
};

// One query position per head against the keys and values of one kv head (f32), on the calling thread:
//   q, out [nh, D]; k, v [Skv, D] (contiguous rows); scores [Skv] scratch
//   out_r = softmax(scale · q_r · kᵀ) · v   for each of the nh query heads sharing that kv head.
// Two passes over the keys (scores with exp2, a vector's lanes of keys at a time, then P·V): no
// tiles, no per-call scratch, D of any size (stories260K's 8). Twin: qkv::attention
// (tests/blocks/test_dense.cpp).
void attend_one(const float* q, const float* k, const float* v, float* out, float* scores, std::int64_t nh,
                std::int64_t D, std::int64_t Skv, float scale, Isa isa, KvNext next = {});
// The same on a bf16 cache: k, v [Skv, D] bf16 bits, widened exactly as they are read; q, out,
// the scores and every sum stay f32 (the decode step's attention on a bf16 KV cache).
void attend_one_bf16(const float* q, const std::uint16_t* k, const std::uint16_t* v, float* out, float* scores,
                     std::int64_t nh, std::int64_t D, std::int64_t Skv, float scale, Isa isa, KvNext next = {});

// f64 accumulation of the same sum; W as f32 (Wbf16 null) or as bf16 bits (W null).
void gemv_reference(const float* x, const float* W, const std::uint16_t* Wbf16, const float* b, float* y,
                    std::int64_t M, std::int64_t in, std::int64_t out, float beta);

// GEMM with bf16 inputs, for calls with many rows (prefill) when the model asks for it
// (ModelOptions::gemm_inputs = bf16):
//   y [M, out] = beta·y + bf16(x) [M, in] · Wᵀ + b      W [out, in] bf16 bits, b [out] or null
// x is rounded to bf16 (nearest even) row by row, then oneDNN's matmul multiplies bf16 × bf16
// (products exact in f32) and accumulates in f32 (AVX-512 BF16 where the CPU has it: ≈ 2× its f32
// sgemm here; on other CPUs, and under QKV_ISA below avx512_bf16, the same bf16 values widened to
// f32 on oneDNN's f32 matmul). beta ∈ {0, 1} (0 never reads y). Its twin: gemv_reference on the
// rounded x.
void gemm_bf16(const float* x, const std::uint16_t* W, const float* b, float* y, std::int64_t M, std::int64_t in,
               std::int64_t out, float beta, int threads, Isa isa);

// The same GEMM on inputs already in bf16, with more of the layer done in its epilogue, on each
// tile of y while it is in registers (the model's prefill: the norms write bf16 rows, and the MLP's
// up-projection hands bf16 straight to the down-projection):
//   y [M, out] = act(xb [M, in] · Wᵀ + b)            y f32, or bf16 bits (nearest even) by y_dtype
//   y [M, out] += xb · Wᵀ + b                         beta = 1: f32 y and act = none only
// act: GELU in the tanh form (GPT-2, blocks::gelu_tanh_forward) or the erf form (gelu_exact_forward),
// computed in f32 by oneDNN. Its twin: gemv_reference on the same bf16 rows, then the activation.
enum class GemmAct : std::uint8_t { none, gelu_tanh, gelu_erf };
// W packed once (PackedBf16 below) is read from its packed copy: the same products and sums, without
// the matmul re-blocking the plain W on every call (≈ 3–8% of a prefill GEMM here).
class PackedBf16;
void gemm_bf16_in(const std::uint16_t* xb, const std::uint16_t* W, const float* b, void* y, DType y_dtype,
                  std::int64_t M, std::int64_t in, std::int64_t out, float beta, GemmAct act,
                  const PackedBf16* packed = nullptr);

// A copy of W [out, in] bf16 in the blocked layout oneDNN's bf16 matmul asks for (format "any" for
// W of that shape; on oneDNN 2.6 the same for every row count M), or, where gemm_bf16_in runs the
// f32 matmul (no AVX-512 BF16), W widened to f32 in that matmul's layout. Empty (default): none.
// gemm_bf16_in checks the layout against each primitive it builds and reads the plain W when a
// primitive wants another one. Holds in·out bf16 or f32 (or a little more: blocks are padded).
struct PackedImpl;  // gemm_bf16.cpp: oneDNN's memory and its descriptor
class PackedBf16 {
 public:
  PackedBf16() = default;
  PackedBf16(const std::uint16_t* W, std::int64_t in, std::int64_t out);
  bool empty() const { return !impl_; }
  const PackedImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const PackedImpl> impl_;
};

// The f32 GEMM on W packed once, with the same epilogues (the encoder's projections, qkv embed):
//   y [M, out] = act(x [M, in] · Wᵀ + b)    or    y [M, out] += x · Wᵀ + b   (beta = 1, act none)
// x, W, b, y f32 (oneDNN's f32 matmul, f32 accumulation). W [out, in] is packed by PackedF32 in
// the blocked layout oneDNN's f32 matmul asks for (its plain copy is not kept: the packed one is
// all this GEMM reads). Primitives are compiled once per M, so callers run a fixed M (row blocks).
// Its twin: gemv_reference, then the activation.
class PackedF32 {
 public:
  PackedF32() = default;
  PackedF32(const float* W, std::int64_t in, std::int64_t out);
  bool empty() const { return !impl_; }
  const PackedImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const PackedImpl> impl_;
};
void gemm_f32_packed(const float* x, const PackedF32& W, const float* b, float* y, std::int64_t M, std::int64_t in,
                     std::int64_t out, float beta, GemmAct act);

// out [n] (may equal x), split over `threads`.
void gelu_fast(float* out, const float* x, std::int64_t n, int threads, Isa isa);

// dst [n] f32 = src [n] bf16 bits (exact), split over `threads`.
void bf16_to_f32(float* dst, const std::uint16_t* src, std::int64_t n, int threads);
// dst [n] bf16 bits = src [n] rounded to nearest even (NaN stays NaN).
void f32_to_bf16(std::uint16_t* dst, const float* src, std::int64_t n);
// The same, vectorised on AVX-512 (bit-equal): on the calling thread, or split over `threads`.
void f32_to_bf16(std::uint16_t* dst, const float* src, std::int64_t n, Isa isa);
void f32_to_bf16(std::uint16_t* dst, const float* src, std::int64_t n, int threads, Isa isa);

}  // namespace qkv::blocks
