// The dense kernels' portable side: ISA dispatch, the split of output rows over threads, the
// scalar fallbacks and the f64 reference (dense.hpp). No intrinsics here.
#include "blocks/dense.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "blocks/dense_kernels.hpp"
#include "blocks/activation.hpp"
#include "core/parallel.hpp"
#include "kernels/cpu/simd_common.hpp"

namespace qkv::blocks {
namespace {

using detail::GemvArgs;
using i64 = std::int64_t;

// Scalar fallback: one output at a time, f32 accumulation.
template <class Wt>
void gemv_scalar(const GemvArgs& a, i64 o0, i64 o1) {
  const auto* W = static_cast<const Wt*>(a.W);
  for (i64 m = 0; m < a.M; ++m)
    for (i64 o = o0; o < o1; ++o) {
      float s = 0.0f;
      for (i64 i = 0; i < a.in; ++i) {
        float w;
        if constexpr (sizeof(Wt) == 2) w = kernels::cpu::bf16_bits_to_f32(W[o * a.in + i]);
        else w = W[o * a.in + i];
        s += a.x[m * a.in + i] * w;
      }
      float* y = a.y + m * a.out + o;
      *y = (a.beta == 0.0f ? 0.0f : *y) + s + (a.b ? a.b[o] : 0.0f);
    }
}

using Kernel = void (*)(const GemvArgs&, i64, i64);

// Rows [r0, r1) of the rows of all outputs, taken as one list [0, Σ out_k).
void run_rows(const GemvArgs& a, std::span<const GemvOut> outs, Kernel kernel, i64 r0, i64 r1) {
  i64 first = 0;  // row of the list where output `o` starts
  for (const GemvOut& o : outs) {
    const i64 lo = std::max(r0, first), hi = std::min(r1, first + o.out);
    if (lo < hi) {
      GemvArgs ak = a;
      ak.W = o.W;
      ak.b = o.b;
      ak.y = o.y;
      ak.out = o.out;
      kernel(ak, lo - first, hi - first);
    }
    first += o.out;
  }
}

i64 total_rows(std::span<const GemvOut> outs) {
  i64 total = 0;
  for (const GemvOut& o : outs) total += o.out;
  return total;
}

// The list split into `threads` contiguous ranges, so each thread streams its own part of the
// weights once, in address order.
void split_rows(const GemvArgs& a, std::span<const GemvOut> outs, int threads, Kernel kernel) {
  const i64 total = total_rows(outs);
  const int t = static_cast<int>(std::max<i64>(1, std::min<i64>(threads, total)));
  parallel_for(t, t, [&](i64 k) {
    const auto [r0, r1] = gemv_part_rows(total, static_cast<int>(k), t);
    run_rows(a, outs, kernel, r0, r1);
  });
}

Kernel f32_kernel(Isa isa) {
  return isa >= Isa::avx512 ? detail::gemv_f32_avx512 : isa == Isa::avx2 ? detail::gemv_f32_avx2 : gemv_scalar<float>;
}
Kernel bf16_kernel(Isa isa) {
  return isa == Isa::avx512_bf16 ? detail::gemv_bf16_avx512bf16
         : isa >= Isa::avx512    ? detail::gemv_bf16_avx512
         : isa == Isa::avx2      ? detail::gemv_bf16_avx2
                                 : gemv_scalar<std::uint16_t>;
}

// The vdpbf16ps kernel reads x split as xs [M][2][in] bf16 (dense_kernels.hpp), kept per thread.
const std::uint16_t* split_x(const float* x, i64 M, i64 in, Isa isa) {
  if (isa != Isa::avx512_bf16) return nullptr;
  thread_local std::vector<std::uint16_t> xs;
  xs.resize(static_cast<std::size_t>(2 * M * in));
  detail::split_bf16_avx512bf16(x, xs.data(), M, in);
  return xs.data();
}

void check_rows(const char* fn, i64 M, float beta) {
  if (M < 1 || M > kGemvMaxRows || (beta != 0.0f && beta != 1.0f))
    fail(fn, "M, beta: need 1 ≤ M ≤ " + std::to_string(kGemvMaxRows) + " and beta ∈ {0, 1}, got M = " +
                 std::to_string(M) + ", beta = " + std::to_string(beta));
}

void check_range(const char* fn, std::span<const GemvOut> outs, i64 r0, i64 r1) {
  const i64 total = total_rows(outs);
  if (r0 < 0 || r0 > r1 || r1 > total)
    fail(fn, "r0, r1: need 0 ≤ r0 ≤ r1 ≤ " + std::to_string(total) + " (the outputs' rows), got r0 = " +
                 std::to_string(r0) + ", r1 = " + std::to_string(r1));
}

}  // namespace

void gemv_f32_multi(const float* x, std::span<const GemvOut> outs, i64 M, i64 in, float beta, int threads,
                    Isa isa) {
  check_rows("qkv::blocks::gemv_f32", M, beta);
  split_rows({x, nullptr, nullptr, nullptr, M, in, 0, beta, nullptr}, outs, threads, f32_kernel(isa));
}

void gemv_bf16_multi(const float* x, std::span<const GemvOut> outs, i64 M, i64 in, float beta, int threads,
                     Isa isa) {
  check_rows("qkv::blocks::gemv_bf16", M, beta);
  split_rows({x, nullptr, nullptr, nullptr, M, in, 0, beta, split_x(x, M, in, isa)}, outs, threads, bf16_kernel(isa));
}

void gemv_f32_multi_rows(const float* x, std::span<const GemvOut> outs, i64 M, i64 in, float beta, Isa isa, i64 r0,
                         i64 r1) {
  check_rows("qkv::blocks::gemv_f32", M, beta);
  check_range("qkv::blocks::gemv_f32_multi_rows", outs, r0, r1);
  run_rows({x, nullptr, nullptr, nullptr, M, in, 0, beta, nullptr}, outs, f32_kernel(isa), r0, r1);
}

void gemv_bf16_multi_rows(const float* x, std::span<const GemvOut> outs, i64 M, i64 in, float beta, Isa isa,
                          i64 r0, i64 r1) {
  check_rows("qkv::blocks::gemv_bf16", M, beta);
  check_range("qkv::blocks::gemv_bf16_multi_rows", outs, r0, r1);
  if (r0 == r1) return;
  run_rows({x, nullptr, nullptr, nullptr, M, in, 0, beta, split_x(x, M, in, isa)}, outs, bf16_kernel(isa), r0, r1);
}

void gemv_f32(const float* x, const float* W, const float* b, float* y, i64 M, i64 in, i64 out, float beta,
              int threads, Isa isa) {
  const GemvOut one{W, b, y, out};
  gemv_f32_multi(x, std::span(&one, 1), M, in, beta, threads, isa);
}

void gemv_bf16(const float* x, const std::uint16_t* W, const float* b, float* y, i64 M, i64 in, i64 out,
               float beta, int threads, Isa isa) {
  const GemvOut one{W, b, y, out};
  gemv_bf16_multi(x, std::span(&one, 1), M, in, beta, threads, isa);
}

void gemv_reference(const float* x, const float* W, const std::uint16_t* Wbf16, const float* b, float* y, i64 M,
                    i64 in, i64 out, float beta) {
  for (i64 m = 0; m < M; ++m)
    for (i64 o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (i64 i = 0; i < in; ++i)
        s += static_cast<double>(x[m * in + i]) *
             (W ? W[o * in + i] : kernels::cpu::bf16_bits_to_f32(Wbf16[o * in + i]));
      float* yo = y + m * out + o;
      *yo = static_cast<float>((beta == 0.0f ? 0.0 : static_cast<double>(*yo)) + s);
    }
}

namespace {
// The CPU's side of gemv_walk: an AMD CPU (CPUID's vendor string) and the bytes of CPU 0's L3.
struct WalkCpu {
  bool amd = false;
  i64 l3_bytes = 0;
};
WalkCpu walk_cpu() {
  WalkCpu c;
  unsigned a = 0, b = 0, cx = 0, d = 0;
  __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(cx), "=d"(d));
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4), std::memcpy(vendor + 4, &d, 4), std::memcpy(vendor + 8, &cx, 4);
  c.amd = std::strcmp(vendor, "AuthenticAMD") == 0 || std::strcmp(vendor, "HygonGenuine") == 0;
  // sysfs says what this guest's CPU shares ("32768K"); sysconf may report the host's whole package.
  if (std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r")) {
    long v = 0;
    char unit = 0;
    if (std::fscanf(f, "%ld%c", &v, &unit) >= 1 && v > 0)
      c.l3_bytes = static_cast<i64>(v) * (unit == 'K' ? 1024 : unit == 'M' ? 1024 * 1024 : 1);
    std::fclose(f);
  }
  if (c.l3_bytes == 0) c.l3_bytes = std::max<long>(sysconf(_SC_LEVEL3_CACHE_SIZE), 0);
  return c;
}
}  // namespace

GemvWalk gemv_walk(i64 weight_bytes) {
  if (const char* s = std::getenv("QKV_GEMV_WALK"); s && *s) {
    if (std::strcmp(s, "blocks") == 0) return GemvWalk::blocks;
    if (std::strcmp(s, "rows") == 0) return GemvWalk::rows;
    if (std::strcmp(s, "rows_ahead") == 0) return GemvWalk::rows_ahead;
    fail("qkv::blocks::gemv_walk",
         std::string("QKV_GEMV_WALK: must be blocks, rows or rows_ahead, got '") + s + "'");
  }
  static const WalkCpu cpu = walk_cpu();
  if (!cpu.amd || cpu.l3_bytes <= 0) return GemvWalk::blocks;
  return weight_bytes > cpu.l3_bytes ? GemvWalk::rows_ahead
         : weight_bytes > cpu.l3_bytes / 2 ? GemvWalk::rows
                                           : GemvWalk::blocks;
}

void gemv_batch_rows(const float* x, const float* W, const std::uint16_t* Wb, const float* b, float* y, i64 ldy,
                     i64 M, i64 in, float beta, Isa isa, i64 o0, i64 o1, std::pair<i64, i64> rows, GemvWalk walk) {
  constexpr const char* fn = "qkv::blocks::gemv_batch_rows";
  const auto [m0, m1] = rows;
  if (m0 < 0 || m0 > m1 || m1 > M)
    fail(fn, "rows: need 0 ≤ first ≤ second ≤ M = " + std::to_string(M) + ", got [" + std::to_string(m0) + ", " +
                 std::to_string(m1) + ")");
  if (o0 < 0 || o0 > o1)
    fail(fn, "o0, o1: need 0 ≤ o0 ≤ o1, got " + std::to_string(o0) + ", " + std::to_string(o1));
  if (in < 1 || (m1 - m0 > 1 && ldy < o1) || (beta != 0.0f && beta != 1.0f) || (W == nullptr) == (Wb == nullptr))
    fail(fn, "in, ldy, beta, W / Wb: need in ≥ 1, ldy ≥ o1 for several rows, beta ∈ {0, 1} and exactly one of "
             "W, Wb; got in = " + std::to_string(in) + ", ldy = " + std::to_string(ldy) + ", o1 = " +
                 std::to_string(o1) + ", beta = " + std::to_string(beta));
  const detail::BatchGemvArgs a{x, W ? static_cast<const void*>(W) : Wb, b, y, ldy, m0, m1, in, beta,
                                walk != GemvWalk::blocks, walk == GemvWalk::rows_ahead};
  if (isa >= Isa::avx512) return Wb ? detail::gemv_batch_bf16_avx512(a, o0, o1) : detail::gemv_batch_f32_avx512(a, o0, o1);
  if (isa == Isa::avx2) return Wb ? detail::gemv_batch_bf16_avx2(a, o0, o1) : detail::gemv_batch_f32_avx2(a, o0, o1);
  for (i64 m = m0; m < m1; ++m)
    for (i64 o = o0; o < o1; ++o) {
      float s = 0.0f;
      for (i64 i = 0; i < in; ++i)
        s += x[m * in + i] * (Wb ? kernels::cpu::bf16_bits_to_f32(Wb[o * in + i]) : W[o * in + i]);
      float* yo = y + m * ldy + o;
      *yo = (beta == 0.0f ? 0.0f : *yo) + s + (b ? b[o] : 0.0f);
    }
}

namespace {
// attend_one's portable path (no AVX2): K, V as f32 or bf16 bits (widened), sums in f32.
template <class T>
void attend_one_scalar(const float* q, const T* k, const T* v, float* out, float* scores, i64 nh, i64 D, i64 Skv,
                       float scale) {
  auto at = [](const T* p, i64 i) {
    if constexpr (std::is_same_v<T, float>) return p[i];
    else return kernels::cpu::bf16_bits_to_f32(p[i]);
  };
  for (i64 r = 0; r < nh; ++r) {
    float mx = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (i64 j = 0; j < Skv; ++j) {
      float s = 0.0f;
      for (i64 d = 0; d < D; ++d) s += q[r * D + d] * at(k, j * D + d);
      scores[j] = s * scale;
      mx = std::max(mx, scores[j]);
    }
    for (i64 j = 0; j < Skv; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
    for (i64 d = 0; d < D; ++d) {
      float acc = 0.0f;
      for (i64 j = 0; j < Skv; ++j) acc += scores[j] * at(v, j * D + d);
      out[r * D + d] = acc / sum;
    }
  }
}
}  // namespace

void attend_one(const float* q, const float* k, const float* v, float* out, float* scores, i64 nh, i64 D, i64 Skv,
                float scale, Isa isa, KvNext next) {
  const detail::AttendArgs a{q, k, v, out, scores, nh, D, Skv, scale, next};
  if (isa >= Isa::avx512) return detail::attend_one_avx512(a);
  if (isa == Isa::avx2) return detail::attend_one_avx2(a);
  attend_one_scalar(q, k, v, out, scores, nh, D, Skv, scale);
}

void attend_one_bf16(const float* q, const std::uint16_t* k, const std::uint16_t* v, float* out, float* scores, i64 nh,
                     i64 D, i64 Skv, float scale, Isa isa, KvNext next) {
  const detail::AttendArgs a{q, k, v, out, scores, nh, D, Skv, scale, next};
  if (isa >= Isa::avx512) return detail::attend_one_bf16_avx512(a);
  if (isa == Isa::avx2) return detail::attend_one_bf16_avx2(a);
  attend_one_scalar(q, k, v, out, scores, nh, D, Skv, scale);
}

void gelu_fast(float* out, const float* x, i64 n, int threads, Isa isa) {
  // Chunks of 4096 values (a multiple of every ISA's lanes) shared over the threads.
  constexpr i64 kChunk = 4096;
  const i64 chunks = (n + kChunk - 1) / kChunk;
  using Kernel = void (*)(float*, const float*, i64);
  const Kernel reference = [](float* o, const float* xs, i64 len) { gelu_tanh_forward(o, xs, len); };
  const Kernel kernel = isa >= Isa::avx512 ? detail::gelu_avx512 : isa == Isa::avx2 ? detail::gelu_avx2 : reference;
  parallel_for(chunks, threads, [&](i64 c) {
    const i64 i0 = c * kChunk, len = std::min(kChunk, n - i0);
    kernel(out + i0, x + i0, len);
  });
}

void bf16_to_f32(float* dst, const std::uint16_t* src, i64 n, int threads) {
  constexpr i64 kChunk = 1 << 16;
  parallel_for((n + kChunk - 1) / kChunk, threads, [&](i64 c) {
    const i64 i1 = std::min(n, (c + 1) * kChunk);
    for (i64 i = c * kChunk; i < i1; ++i) dst[i] = kernels::cpu::bf16_bits_to_f32(src[i]);
  });
}

void f32_to_bf16(std::uint16_t* dst, const float* src, i64 n) {
  for (i64 i = 0; i < n; ++i) dst[i] = kernels::cpu::f32_to_bf16_bits(src[i]);
}

void f32_to_bf16(std::uint16_t* dst, const float* src, i64 n, Isa isa) {
  if (isa >= Isa::avx512) detail::to_bf16_avx512(dst, src, n);
  else f32_to_bf16(dst, src, n);
}

void f32_to_bf16(std::uint16_t* dst, const float* src, i64 n, int threads, Isa isa) {
  constexpr i64 kChunk = 1 << 14;  // a multiple of every vector length
  parallel_for((n + kChunk - 1) / kChunk, threads, [&](i64 c) {
    const i64 i0 = c * kChunk, len = std::min(kChunk, n - i0);
    f32_to_bf16(dst + i0, src + i0, len, isa);
  });
}

}  // namespace qkv::blocks
