// Internal: what dense.cpp (portable) hands to the per-ISA dense kernels (dense_<isa>.cpp).
// Each entry computes output rows [o0, o1) of one GEMV, or GELU on [0, n): see dense.hpp.
#pragma once

#include <cstdint>

#include "blocks/dense.hpp"  // KvNext

namespace qkv::blocks::detail {

// y [M, out] = beta·y + x [M, in] · Wᵀ + b, W [out, in] (f32 or bf16 bits, per entry point).
// xs: for the vdpbf16ps kernel only, x split as bf16 pairs: xs [M][2][in] = (x_hi rows, x_lo rows).
struct GemvArgs {
  const float* x;
  const void* W;
  const float* b;
  float* y;
  std::int64_t M, in, out;
  float beta;
  const std::uint16_t* xs;
};

void gemv_f32_avx2(const GemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_f32_avx512(const GemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_bf16_avx2(const GemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_bf16_avx512(const GemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_bf16_avx512bf16(const GemvArgs& a, std::int64_t o0, std::int64_t o1);
// x [M, in] → xs [M][2][in] for the kernel above: x_hi = bf16(x), x_lo = bf16(x − x_hi), both
// rounded to nearest even (kernels::cpu::f32_to_bf16_bits, vectorised).
void split_bf16_avx512bf16(const float* x, std::uint16_t* xs, std::int64_t M, std::int64_t in);

// The decode step's GEMV (dense.hpp, gemv_batch_rows): rows [o0, o1) of W for the rows [m0, m1)
// of x, y [m·ldy + o]; bf16 weights are widened (exact), whatever the ISA.
struct BatchGemvArgs {
  const float* x;  // [·, in]
  const void* W;   // [·, in] f32 or bf16 bits
  const float* b;  // [·] or null
  float* y;        // rows of ldy floats
  std::int64_t ldy, m0, m1, in;
  float beta;
  bool walk_rows;   // a lone row of x: W row after row (GemvWalk::rows), not R rows side by side
  bool rows_ahead;  // and each row prefetching the bytes kRowsAhead ahead (GemvWalk::rows_ahead)
};
void gemv_batch_f32_avx2(const BatchGemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_batch_f32_avx512(const BatchGemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_batch_bf16_avx2(const BatchGemvArgs& a, std::int64_t o0, std::int64_t o1);
void gemv_batch_bf16_avx512(const BatchGemvArgs& a, std::int64_t o0, std::int64_t o1);

// One query per head against an f32 or bf16 cache (dense.hpp, attend_one / attend_one_bf16).
struct AttendArgs {
  const float* q;    // [nh, D]
  const void* k;     // [Skv, D] rows of one kv head, f32 or bf16 bits (per entry point)
  const void* v;     // [Skv, D]
  float* out;        // [nh, D]
  float* scores;     // [Skv] scratch
  std::int64_t nh, D, Skv;
  float scale;
  KvNext next;       // rows to prefetch for the next call (dense.hpp)
};
void attend_one_avx2(const AttendArgs& a);
void attend_one_avx512(const AttendArgs& a);
void attend_one_bf16_avx2(const AttendArgs& a);
void attend_one_bf16_avx512(const AttendArgs& a);

void to_bf16_avx512(std::uint16_t* dst, const float* src, std::int64_t n);  // f32_to_bf16, vectorised

void gelu_avx2(float* out, const float* x, std::int64_t n);
void gelu_avx512(float* out, const float* x, std::int64_t n);

}  // namespace qkv::blocks::detail
