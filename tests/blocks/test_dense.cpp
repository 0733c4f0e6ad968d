// The dense kernels (blocks/dense.hpp) on every ISA this CPU runs, against their f64 twins:
// GEMV with f32 and bf16 weights at awkward sizes, and the vectorised GELU.
#include <atomic>
#include <thread>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "blocks/dense.hpp"
#include "blocks/dense_kernels.hpp"
#include "core/parallel.hpp"
#include "kernels/cpu/simd_common.hpp"
#include "qkv/attention.hpp"
#include "qkv/types.hpp"
#include "support/fork_testing.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::Isa;
using qkv::blocks::GemvWalk;
using qkv::testing::isas;
using qkv::testing::randn;

const char* walk_name(GemvWalk w) {
  return w == GemvWalk::blocks ? "blocks" : w == GemvWalk::rows ? "rows" : "rows_ahead";
}

// Every ISA, M = 1 … 4, input widths around each vector length (tails) and past the kernels'
// unrolled step (U vectors a step: 129 and 300 run the unrolled loop, the single-vector loop and a
// masked tail), output counts around the 2-thread split, beta 0 (y full of NaN, never read) and 1, with and without
// bias, the 2-thread row split at one width. Tolerance: an f32 sum of `in` products, in any order, errs by at most
// γ_in · Σ|x·w| with γ_in ≈ in · 2^-24 (Higham, Accuracy and Stability §3.1); the f64 reference
// is exact by comparison. The vdpbf16ps kernel (avx512_bf16 with bf16 weights) also rounds x to
// x_hi + x_lo, off by ≤ 2^-17·|x|, so its bound adds 2^-17 · Σ|x·w|. Measured errors print below.
TEST(Dense, GemvMatchesReferenceOnEveryIsa) {
  for (Isa isa : isas())
    for (bool bf16 : {false, true}) {
      double worst = 0;  // max |err| / bound
      for (std::int64_t M = 1; M <= qkv::blocks::kGemvMaxRows; ++M)
        for (std::int64_t in : {1, 7, 16, 17, 33, 64, 100, 129, 300})
          for (std::int64_t out : {1, 3, 4, 9, 13})
            for (float beta : {0.0f, 1.0f})
              for (int threads : {1, 2}) {
                if (threads == 2 && in != 100) continue;  // the split itself; one width is enough
                const auto x = randn(static_cast<std::size_t>(M * in), 1);
                auto W = randn(static_cast<std::size_t>(out * in), 2);
                const auto b = randn(static_cast<std::size_t>(out), 3);
                std::vector<std::uint16_t> Wb(W.size());
                qkv::blocks::f32_to_bf16(Wb.data(), W.data(), static_cast<std::int64_t>(W.size()));
                const auto y0 = beta == 0.0f ? std::vector<float>(static_cast<std::size_t>(M * out), std::nanf(""))
                                             : randn(static_cast<std::size_t>(M * out), 4);
                std::vector<float> y = y0, r = y0;
                const float* bias = (out % 2) ? b.data() : nullptr;
                if (bf16) {
                  qkv::blocks::gemv_bf16(x.data(), Wb.data(), bias, y.data(), M, in, out, beta, threads, isa);
                  qkv::blocks::gemv_reference(x.data(), nullptr, Wb.data(), bias, r.data(), M, in, out, beta);
                } else {
                  qkv::blocks::gemv_f32(x.data(), W.data(), bias, y.data(), M, in, out, beta, threads, isa);
                  qkv::blocks::gemv_reference(x.data(), W.data(), nullptr, bias, r.data(), M, in, out, beta);
                }
                for (std::int64_t m = 0; m < M; ++m)
                  for (std::int64_t o = 0; o < out; ++o) {
                    double mag = (bias ? std::abs(bias[o]) : 0.0) + (beta != 0.0f ? std::abs(y0[m * out + o]) : 0.0);
                    for (std::int64_t i = 0; i < in; ++i)
                      mag += std::abs(double(x[m * in + i]) *
                                      (bf16 ? qkv::bf16_to_f32(Wb[o * in + i]) : W[o * in + i]));
                    const double gamma = (in + 2) * std::ldexp(1.0, -24) +
                                         (bf16 && isa == Isa::avx512_bf16 ? std::ldexp(1.0, -17) : 0.0);
                    const double err = std::abs(double(y[m * out + o]) - r[m * out + o]);
                    ASSERT_LE(err, gamma * mag) << qkv::isa_name(isa) << " bf16=" << bf16 << " M=" << M
                                                << " in=" << in << " out=" << out << " beta=" << beta;
                    worst = std::max(worst, err / (gamma * mag));
                  }
              }
      std::printf("%-12s %s weights: max |err| / bound = %.3f\n", qkv::isa_name(isa), bf16 ? "bf16" : "f32 ", worst);
    }
}

// A large GEMV (the GPT-2-small MLP's shape, 3072 outputs of 768) on two threads, to cover the
// row split at real sizes; same bound as above.
TEST(Dense, GemvLargeShapeTwoThreads) {
  const std::int64_t in = 768, out = 3072;
  const auto x = randn(in, 5), W = randn(static_cast<std::size_t>(in * out), 6);
  std::vector<float> y(out), r(out);
  qkv::blocks::gemv_f32(x.data(), W.data(), nullptr, y.data(), 1, in, out, 0.0f, 2, qkv::cpu_isa());
  qkv::blocks::gemv_reference(x.data(), W.data(), nullptr, nullptr, r.data(), 1, in, out, 0.0f);
  double worst = 0;
  for (std::int64_t o = 0; o < out; ++o) {
    double mag = 0;
    for (std::int64_t i = 0; i < in; ++i) mag += std::abs(double(x[i]) * W[o * in + i]);
    const double err = std::abs(double(y[o]) - r[o]);
    EXPECT_LE(err, (in + 2) * std::ldexp(1.0, -24) * mag) << "row " << o;
    worst = std::max(worst, err);
  }
  std::printf("max |y - ref| = %.3g\n", worst);
}

// The fused form (W_Q, W_K, W_V in one call): outputs of 5, 1, 13 and 0 rows, so the 2-thread split
// of the 19-row list falls inside an output, on 1 and 2 threads and (threads = 3 below) through
// the in-region form in uneven row ranges; every output against its own f64 reference, same
// bound as above. Ranges outside the list are refused.
TEST(Dense, GemvMultiMatchesReferencePerOutput) {
  const std::int64_t in = 300;
  const std::int64_t outs_n[4] = {5, 1, 13, 0};
  for (Isa isa : isas())
    for (bool bf16 : {false, true}) {
      double worst = 0;
      for (std::int64_t M = 1; M <= qkv::blocks::kGemvMaxRows; ++M)
        for (int threads : {1, 2, 3}) {
          const auto x = randn(static_cast<std::size_t>(M * in), 11);
          std::vector<std::vector<float>> W(4), b(4), y(4), r(4);
          std::vector<std::vector<std::uint16_t>> Wb(4);
          std::vector<qkv::blocks::GemvOut> outs;
          for (int k = 0; k < 4; ++k) {
            const auto n = static_cast<std::size_t>(outs_n[k]);
            W[k] = randn(n * in, 12 + k);
            Wb[k].resize(W[k].size());
            qkv::blocks::f32_to_bf16(Wb[k].data(), W[k].data(), static_cast<std::int64_t>(W[k].size()));
            b[k] = randn(n, 20 + k);
            y[k].assign(static_cast<std::size_t>(M) * n, std::nanf(""));
            r[k] = y[k];
            const void* Wk = bf16 ? static_cast<const void*>(Wb[k].data()) : W[k].data();
            outs.push_back({Wk, k == 1 ? nullptr : b[k].data(), y[k].data(), outs_n[k]});
          }
          if (threads == 3) {
            // The in-region form: the 19 rows in uneven ranges [0, 2), [2, 2), [2, 11), [11, 19).
            for (auto [r0, r1] : {std::pair<std::int64_t, std::int64_t>{0, 2}, {2, 2}, {2, 11}, {11, 19}}) {
              if (bf16) qkv::blocks::gemv_bf16_multi_rows(x.data(), outs, M, in, 0.0f, isa, r0, r1);
              else qkv::blocks::gemv_f32_multi_rows(x.data(), outs, M, in, 0.0f, isa, r0, r1);
            }
          } else if (bf16) {
            qkv::blocks::gemv_bf16_multi(x.data(), outs, M, in, 0.0f, threads, isa);
          } else {
            qkv::blocks::gemv_f32_multi(x.data(), outs, M, in, 0.0f, threads, isa);
          }
          for (int k = 0; k < 4; ++k) {
            const float* bias = k == 1 ? nullptr : b[k].data();
            qkv::blocks::gemv_reference(x.data(), bf16 ? nullptr : W[k].data(), bf16 ? Wb[k].data() : nullptr, bias,
                                        r[k].data(), M, in, outs_n[k], 0.0f);
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t o = 0; o < outs_n[k]; ++o) {
                double mag = bias ? std::abs(bias[o]) : 0.0;
                for (std::int64_t i = 0; i < in; ++i)
                  mag += std::abs(double(x[m * in + i]) *
                                  (bf16 ? qkv::bf16_to_f32(Wb[k][o * in + i]) : W[k][o * in + i]));
                const double gamma = (in + 2) * std::ldexp(1.0, -24) +
                                     (bf16 && isa == Isa::avx512_bf16 ? std::ldexp(1.0, -17) : 0.0);
                const double err = std::abs(double(y[k][m * outs_n[k] + o]) - r[k][m * outs_n[k] + o]);
                ASSERT_LE(err, gamma * mag) << qkv::isa_name(isa) << " bf16=" << bf16 << " M=" << M
                                            << " output " << k << " row " << o << " threads " << threads;
                worst = std::max(worst, err / (gamma * mag));
              }
          }
        }
      std::printf("%-12s %s weights, 4 outputs: max |err| / bound = %.3f\n", qkv::isa_name(isa),
                  bf16 ? "bf16" : "f32 ", worst);
    }
  float x[4] = {}, W[4] = {}, y[4] = {};
  const qkv::blocks::GemvOut one[1] = {{W, nullptr, y, 2}};
  EXPECT_THROW(qkv::blocks::gemv_f32_multi_rows(x, one, 1, 2, 0.0f, Isa::scalar, 1, 3), std::invalid_argument);
  EXPECT_THROW(qkv::blocks::gemv_f32_multi_rows(x, one, 1, 2, 0.0f, Isa::scalar, 2, 1), std::invalid_argument);
}

// The vdpbf16ps kernel's split of x into x_hi + x_lo, bit for bit against the scalar rounding
// (kernels::cpu::f32_to_bf16_bits, itself checked in the core tests): ties to even, NaN, ±inf,
// subnormals, values near the bf16 overflow, and a tail shorter than a vector.
TEST(Dense, SplitBf16MatchesScalarRounding) {
  if (qkv::cpu_isa() < Isa::avx512_bf16) GTEST_SKIP() << "no AVX-512 BF16 on this CPU";
  std::vector<float> x = randn(36, 30);
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x00000001u, 0x807fffffu, 0x7f7fffffu,
                             0xff7f8000u, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x00000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  const std::int64_t M = 2, in = static_cast<std::int64_t>(x.size()) / 2;  // two rows of 24 (one vector + 8)
  std::vector<std::uint16_t> xs(static_cast<std::size_t>(2 * M * in));
  qkv::blocks::detail::split_bf16_avx512bf16(x.data(), xs.data(), M, in);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t i = 0; i < in; ++i) {
      const float v = x[static_cast<std::size_t>(m * in + i)];
      const std::uint16_t hi = qkv::kernels::cpu::f32_to_bf16_bits(v);
      const std::uint16_t lo = qkv::kernels::cpu::f32_to_bf16_bits(v - qkv::kernels::cpu::bf16_bits_to_f32(hi));
      ASSERT_EQ(xs[static_cast<std::size_t>(2 * m * in + i)], hi) << "x_hi of " << v;
      ASSERT_EQ(xs[static_cast<std::size_t>((2 * m + 1) * in + i)], lo) << "x_lo of " << v;
    }
  std::printf("%lld values split, all bit-equal to the scalar rounding\n", static_cast<long long>(M * in));
}

// The epilogue's activation in f64: none, GELU in the tanh form, or in the erf form.
double act_reference(qkv::blocks::GemmAct act, double z) {
  using qkv::blocks::GemmAct;
  const double u = std::sqrt(2.0 / M_PI) * (z + 0.044715 * z * z * z);
  return act == GemmAct::none        ? z
         : act == GemmAct::gelu_tanh ? 0.5 * z * (1.0 + std::tanh(u))
                                     : 0.5 * z * (1.0 + std::erf(z / std::sqrt(2.0)));
}

// Random x [M, in], W [out, in], b [out] from seed, seed + 1, seed + 2, with x and W rounded to bf16
// (Wb, xb: nearest even) and xr the f32 values of xb: the inputs of the bf16 GEMM tests and their twin.
struct Bf16Gemm {
  std::vector<float> W, b, xr;
  std::vector<std::uint16_t> Wb, xb;
};
Bf16Gemm bf16_gemm_inputs(std::int64_t M, std::int64_t in, std::int64_t out, unsigned seed) {
  const auto x = randn(static_cast<std::size_t>(M * in), seed);
  Bf16Gemm g{randn(static_cast<std::size_t>(out * in), seed + 1), randn(static_cast<std::size_t>(out), seed + 2),
             std::vector<float>(x.size()), {}, {}};
  g.Wb.resize(g.W.size());
  g.xb.resize(x.size());
  qkv::blocks::f32_to_bf16(g.Wb.data(), g.W.data(), static_cast<std::int64_t>(g.W.size()));
  qkv::blocks::f32_to_bf16(g.xb.data(), x.data(), static_cast<std::int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) g.xr[i] = qkv::bf16_to_f32(g.xb[i]);
  return g;
}

// The bf16 GEMM of prefill (ModelOptions::gemm_inputs = bf16) against its twin: x rounded to bf16
// by the scalar rounding, then gemv_reference in f64. Products of two bf16 are exact in f32, so
// only the f32 accumulation differs: the bound is γ_in · Σ|bf16(x)·w| with γ_in = (in + 2)·2^-24, as
// above. Row counts from one past the GEMV's 4 up to a prime above a typical block, widths with
// tails, beta 0 (y NaN) and 1, with and without bias, 1 and 2 threads.
TEST(Dense, GemmBf16MatchesReference) {
  double worst = 0;
  for (std::int64_t M : {5, 17, 67})
    for (std::int64_t in : {7, 100, 300})
      for (std::int64_t out : {3, 33})
        for (float beta : {0.0f, 1.0f})
          for (int threads : {1, 2}) {
            const auto x = randn(static_cast<std::size_t>(M * in), 41);  // the same x as bf16_gemm_inputs'
            const auto [W, b, xr, Wb, xb] = bf16_gemm_inputs(M, in, out, 41);
            const auto y0 = beta == 0.0f ? std::vector<float>(static_cast<std::size_t>(M * out), std::nanf(""))
                                         : randn(static_cast<std::size_t>(M * out), 44);
            std::vector<float> y = y0, r = y0;
            const float* bias = (out == 3) ? b.data() : nullptr;
            qkv::blocks::gemm_bf16(x.data(), Wb.data(), bias, y.data(), M, in, out, beta, threads, qkv::cpu_isa());
            qkv::blocks::gemv_reference(xr.data(), nullptr, Wb.data(), bias, r.data(), M, in, out, beta);
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t o = 0; o < out; ++o) {
                double mag = (bias ? std::abs(bias[o]) : 0.0) + (beta != 0.0f ? std::abs(y0[m * out + o]) : 0.0);
                for (std::int64_t i = 0; i < in; ++i) mag += std::abs(double(xr[m * in + i]) * qkv::bf16_to_f32(Wb[o * in + i]));
                const double bound = (in + 2) * std::ldexp(1.0, -24) * mag;
                const double err = std::abs(double(y[m * out + o]) - r[m * out + o]);
                ASSERT_LE(err, bound) << "M=" << M << " in=" << in << " out=" << out << " beta=" << beta;
                worst = std::max(worst, err / bound);
              }
          }
  std::printf("gemm_bf16: max |err| / bound = %.3f\n", worst);
  float x[8] = {}, y[8] = {};
  std::uint16_t W[8] = {};
  EXPECT_THROW(qkv::blocks::gemm_bf16(x, W, nullptr, y, 2, 2, 2, 0.5f, 1, Isa::scalar), std::invalid_argument);
  EXPECT_THROW(qkv::blocks::gemm_bf16(x, W, nullptr, y, 0, 2, 2, 0.0f, 1, Isa::scalar), std::invalid_argument);
}

// gemm_bf16_in, the prefill's GEMM with its epilogue, against an f64 twin: gemv_reference on the
// same bf16 rows, then the activation in f64 (tanh or erf form), then the rounding to bf16 for a
// bf16 y. Tolerance, per element, with mag = Σ|x·w| + |b| (+ |y0| for beta = 1):
//   e = 1.13 · (in + 2)·2^-24 · mag       the f32 accumulation (as above), through the activation,
//                                         whose slope is at most 1.13 in both forms
//     + 16·2^-24 · max(1, |r|)            oneDNN's f32 GELU: a few ulps of |r|, and of 1 where
//                                         ½r(1 + tanh) cancels for r ≪ 0 (its value → 0)
//   bf16 y: e·(1 + 2^-8) + 2^-8·|ref|     one more rounding to nearest even: half an ulp of an
//                                         8-bit significand, ≤ 2^-8 relative
// Each case also runs on W packed once (PackedBf16), which must give the same bound. Every case runs
// on the bf16 matmul where the CPU has AVX-512 BF16 and on the f32 matmul of the widened inputs (the
// path of every other CPU, chosen here by set_isa(avx2)), with W packed under either ISA.
TEST(Dense, GemmBf16InEpilogueMatchesReference) {
  using qkv::blocks::GemmAct;
  if (qkv::cpu_isa() < Isa::avx2) GTEST_SKIP() << "no AVX2 on this CPU";
  const Isa saved = qkv::active_isa();
  std::vector<Isa> paths{qkv::cpu_isa()};
  if (qkv::cpu_isa() != Isa::avx2) paths.push_back(Isa::avx2);
  double worst = 0;
  for (Isa run_isa : paths)
    for (Isa pack_isa : paths)
      for (std::int64_t M : {5, 67})
        for (std::int64_t in : {7, 300})
          for (std::int64_t out : {3, 33, 70})
            for (GemmAct act : {GemmAct::none, GemmAct::gelu_tanh, GemmAct::gelu_erf})
              for (qkv::DType yt : {qkv::DType::f32, qkv::DType::bf16})
                for (float beta : {0.0f, 1.0f})
                  for (bool pack : {false, true}) {
                    if (beta != 0.0f && (yt != qkv::DType::f32 || act != GemmAct::none)) continue;
                    if (!pack && pack_isa != run_isa) continue;
                    const auto [W, b, xr, Wb, xb] = bf16_gemm_inputs(M, in, out, 51);
                    const std::size_t n = static_cast<std::size_t>(M * out);
                    const auto y0 = beta == 0.0f ? std::vector<float>(n, std::nanf("")) : randn(n, 54);
                    std::vector<float> y = y0, r = y0;
                    std::vector<std::uint16_t> yb(n, 0x7fc0);  // NaN bits: every element must be written
                    const float* bias = (out != 33) ? b.data() : nullptr;
                    void* dst = yt == qkv::DType::f32 ? static_cast<void*>(y.data()) : static_cast<void*>(yb.data());
                    qkv::set_isa(pack_isa);
                    const qkv::blocks::PackedBf16 packed =
                        pack ? qkv::blocks::PackedBf16(Wb.data(), in, out) : qkv::blocks::PackedBf16();
                    qkv::set_isa(run_isa);
                    qkv::blocks::gemm_bf16_in(xb.data(), Wb.data(), bias, dst, yt, M, in, out, beta, act, &packed);
                    qkv::set_isa(saved);
                    qkv::blocks::gemv_reference(xr.data(), nullptr, Wb.data(), bias, r.data(), M, in, out, beta);
                    for (std::int64_t m = 0; m < M; ++m)
                      for (std::int64_t o = 0; o < out; ++o) {
                        const std::size_t e = static_cast<std::size_t>(m * out + o);
                        double mag = (bias ? std::abs(bias[o]) : 0.0) + (beta != 0.0f ? std::abs(y0[e]) : 0.0);
                        for (std::int64_t i = 0; i < in; ++i)
                          mag += std::abs(double(xr[m * in + i]) * qkv::bf16_to_f32(Wb[o * in + i]));
                        const double z = r[e];
                        const double ref = act_reference(act, z);
                        double bound = 1.13 * (in + 2) * std::ldexp(1.0, -24) * mag;
                        if (act != GemmAct::none) bound += 16 * std::ldexp(1.0, -24) * std::max(1.0, std::abs(z));
                        if (yt == qkv::DType::bf16)
                          bound = bound * (1 + std::ldexp(1.0, -8)) + std::ldexp(1.0, -8) * std::abs(ref);
                        const double got = yt == qkv::DType::f32 ? double(y[e]) : double(qkv::bf16_to_f32(yb[e]));
                        const double err = std::abs(got - ref);
                        ASSERT_LE(err, bound) << "M=" << M << " in=" << in << " out=" << out << " act="
                                              << static_cast<int>(act) << " bf16 y=" << (yt == qkv::DType::bf16)
                                              << " beta=" << beta << " packed=" << pack << " isa=" << int(run_isa)
                                              << "/" << int(pack_isa) << " at " << m << "," << o;
                        worst = std::max(worst, err / bound);
                      }
                  }
  std::printf("gemm_bf16_in: max |err| / bound = %.3f\n", worst);
  std::uint16_t xb[8] = {}, W[8] = {}, yb[8] = {};
  float y[8] = {};
  EXPECT_THROW(qkv::blocks::gemm_bf16_in(xb, W, nullptr, yb, qkv::DType::bf16, 2, 2, 2, 1.0f, GemmAct::none),
               std::invalid_argument);  // y += … needs an f32 y
  EXPECT_THROW(qkv::blocks::gemm_bf16_in(xb, W, nullptr, y, qkv::DType::f32, 2, 2, 2, 1.0f, GemmAct::gelu_tanh),
               std::invalid_argument);  // … and no activation
  EXPECT_THROW(qkv::blocks::gemm_bf16_in(xb, W, nullptr, y, qkv::DType::f64, 2, 2, 2, 0.0f, GemmAct::none),
               std::invalid_argument);
  EXPECT_THROW(qkv::blocks::gemm_bf16_in(xb, W, nullptr, y, qkv::DType::f32, 2, 0, 2, 0.0f, GemmAct::none),
               std::invalid_argument);
  const qkv::blocks::PackedBf16 p2x2(W, 2, 2);  // packed for in = 2, out = 2, used for in = 1, out = 4
  EXPECT_THROW(qkv::blocks::gemm_bf16_in(xb, W, nullptr, y, qkv::DType::f32, 2, 1, 4, 0.0f, GemmAct::none, &p2x2),
               std::invalid_argument);
  EXPECT_THROW(qkv::blocks::PackedBf16(nullptr, 2, 2), std::invalid_argument);
}

// gemm_f32_packed, the encoder's f32 GEMM on a packed W with its epilogue, against the f64 twin
// gemv_reference, then the activation in f64. Tolerance as gemm_bf16_in's above (f32 y):
//   1.13 · (in + 2)·2^-24 · mag  (+ 16·2^-24 · max(1, |r|) with a GELU).
TEST(Dense, GemmF32PackedEpilogueMatchesReference) {
  using qkv::blocks::GemmAct;
  double worst = 0;
  for (std::int64_t M : {5, 128})
    for (std::int64_t in : {7, 300})
      for (std::int64_t out : {3, 33, 70})
        for (GemmAct act : {GemmAct::none, GemmAct::gelu_tanh, GemmAct::gelu_erf})
          for (float beta : {0.0f, 1.0f}) {
            if (beta != 0.0f && act != GemmAct::none) continue;
            const auto x = randn(static_cast<std::size_t>(M * in), 61);
            const auto W = randn(static_cast<std::size_t>(out * in), 62);
            const auto b = randn(static_cast<std::size_t>(out), 63);
            const std::size_t n = static_cast<std::size_t>(M * out);
            const auto y0 = beta == 0.0f ? std::vector<float>(n, std::nanf("")) : randn(n, 64);
            std::vector<float> y = y0, r = y0;
            const float* bias = (out != 33) ? b.data() : nullptr;
            const qkv::blocks::PackedF32 packed(W.data(), in, out);
            qkv::blocks::gemm_f32_packed(x.data(), packed, bias, y.data(), M, in, out, beta, act);
            qkv::blocks::gemv_reference(x.data(), W.data(), nullptr, bias, r.data(), M, in, out, beta);
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t o = 0; o < out; ++o) {
                const std::size_t e = static_cast<std::size_t>(m * out + o);
                double mag = (bias ? std::abs(bias[o]) : 0.0) + (beta != 0.0f ? std::abs(y0[e]) : 0.0);
                for (std::int64_t i = 0; i < in; ++i) mag += std::abs(double(x[m * in + i]) * W[o * in + i]);
                const double z = r[e];
                const double ref = act_reference(act, z);
                double bound = 1.13 * (in + 2) * std::ldexp(1.0, -24) * mag;
                if (act != GemmAct::none) bound += 16 * std::ldexp(1.0, -24) * std::max(1.0, std::abs(z));
                const double err = std::abs(double(y[e]) - ref);
                ASSERT_LE(err, bound) << "M=" << M << " in=" << in << " out=" << out << " act=" << static_cast<int>(act)
                                      << " beta=" << beta << " at " << m << "," << o;
                worst = std::max(worst, err / bound);
              }
          }
  std::printf("gemm_f32_packed: max |err| / bound = %.3f\n", worst);
  const float W[4] = {1, 2, 3, 4};
  float x[8] = {}, y[8] = {};
  const qkv::blocks::PackedF32 p2x2(W, 2, 2);
  EXPECT_THROW(qkv::blocks::gemm_f32_packed(x, p2x2, nullptr, y, 2, 1, 4, 0.0f, GemmAct::none),
               std::invalid_argument);  // packed for in = 2, out = 2
  EXPECT_THROW(qkv::blocks::gemm_f32_packed(x, p2x2, nullptr, y, 2, 2, 2, 1.0f, GemmAct::gelu_erf),
               std::invalid_argument);  // y += … takes no activation
  EXPECT_THROW(qkv::blocks::gemm_f32_packed(x, qkv::blocks::PackedF32(), nullptr, y, 2, 2, 2, 0.0f, GemmAct::none),
               std::invalid_argument);  // empty W
  EXPECT_THROW(qkv::blocks::PackedF32(nullptr, 2, 2), std::invalid_argument);
}

// Two threads running the same packed GEMM primitives at once (the encoder's row blocks) must get
// what each gets alone, bit for bit: each run has its own scratchpad. With oneDNN's shared
// ("library") scratchpad the two overwrote each other's partial sums (the encoder's embeddings
// came out with cosine 0.2 and NaN).
TEST(Dense, PackedGemmsRunConcurrently) {
  using qkv::blocks::GemmAct;
  const std::int64_t M = 128, in = 384, out = 1152;
  const auto W = randn(static_cast<std::size_t>(out * in), 71);
  std::vector<std::uint16_t> Wb(W.size());
  qkv::blocks::f32_to_bf16(Wb.data(), W.data(), static_cast<std::int64_t>(W.size()));
  const qkv::blocks::PackedF32 pf(W.data(), in, out);
  const qkv::blocks::PackedBf16 pb(Wb.data(), in, out);
  std::vector<std::vector<float>> xs, want_f, want_b;
  std::vector<std::vector<std::uint16_t>> xbs;
  for (unsigned t = 0; t < 2; ++t) {
    xs.push_back(randn(static_cast<std::size_t>(M * in), 72 + t));
    xbs.emplace_back(xs.back().size());
    qkv::blocks::f32_to_bf16(xbs.back().data(), xs.back().data(), M * in);
  }
  auto run = [&](unsigned t, std::vector<float>& yf, std::vector<float>& yb) {
    const qkv::ScopedThreads one(1);  // one oneDNN thread, as inside the encoder's blocks
    yf.assign(static_cast<std::size_t>(M * out), 0.0f);
    yb.assign(static_cast<std::size_t>(M * out), 0.0f);
    qkv::blocks::gemm_f32_packed(xs[t].data(), pf, nullptr, yf.data(), M, in, out, 0.0f, GemmAct::none);
    qkv::blocks::gemm_bf16_in(xbs[t].data(), Wb.data(), nullptr, yb.data(), qkv::DType::f32, M, in, out, 0.0f,
                              GemmAct::none, &pb);
  };
  want_f.resize(2);
  want_b.resize(2);
  for (unsigned t = 0; t < 2; ++t) run(t, want_f[t], want_b[t]);
  const int rounds = 40;
  int mismatches = 0;
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (unsigned t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> yf, yb;
      for (int r = 0; r < rounds; ++r) {
        run(t, yf, yb);
        if (yf != want_f[t] || yb != want_b[t]) ++bad;
      }
    });
  for (auto& th : threads) th.join();
  mismatches = bad.load();
  EXPECT_EQ(mismatches, 0) << "of " << 2 * rounds << " concurrent runs";
}

// The vectorised f32 → bf16 rounding, bit for bit against the scalar one on every ISA: random
// values, ties to even, NaN, ±inf, subnormals, the largest finite values, and a tail.
TEST(Dense, F32ToBf16VectorisedMatchesScalar) {
  std::vector<float> x = randn(70001, 45);
  for (std::uint32_t bits : {0x3f808000u, 0x3f818000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0xff7f8000u,
                             0x7f800000u, 0xff800000u, 0x7fc00001u, 0xffa00000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<std::uint16_t> ref(x.size());
  qkv::blocks::f32_to_bf16(ref.data(), x.data(), n);
  for (Isa isa : isas())
    for (int threads : {1, 2}) {
      std::vector<std::uint16_t> got(x.size());
      qkv::blocks::f32_to_bf16(got.data(), x.data(), n, threads, isa);
      std::int64_t diff = 0;
      for (std::int64_t i = 0; i < n; ++i) diff += got[i] != ref[i];
      EXPECT_EQ(diff, 0) << qkv::isa_name(isa) << " threads " << threads;
      std::printf("%-12s threads %d: %lld of %lld values differ from the scalar rounding\n", qkv::isa_name(isa),
                  threads, static_cast<long long>(diff), static_cast<long long>(n));
    }
}

TEST(Dense, GemvRefusesRowsOutsideItsRange) {
  float x[8] = {}, W[8] = {}, y[8] = {};
  EXPECT_THROW(qkv::blocks::gemv_f32(x, W, nullptr, y, 5, 1, 1, 0.0f, 1, Isa::scalar), std::invalid_argument);
  EXPECT_THROW(qkv::blocks::gemv_f32(x, W, nullptr, y, 1, 1, 1, 0.5f, 1, Isa::scalar), std::invalid_argument);
}

// GELU against ½x(1 + tanh(u)) in f64. The fast form x / (1 + 2^a), a = −2u·log2 e, errs through
// a's rounding (a few ulp of |a|, i.e. ≈ 3·2^-24·|a|·ln 2 relative in 2^a), the exp2 polynomial
// (≤ 2.4e-7 relative) and two f32 operations; relative to |x| that is below
// 4e-7 + 1.3e-7·|a|. The test allows twice that: |err| ≤ |x|·(8e-7 + 2.6e-7·|a|) (+ 1e-38).
TEST(Dense, GeluMatchesTanhFormOnEveryIsa) {
  std::vector<float> x;
  for (int i = -2000; i <= 2000; ++i) x.push_back(static_cast<float>(i) * 0.006f);  // [−12, 12]
  for (float v : randn(1001, 7)) x.push_back(3.0f * v);
  x.push_back(0.0f);
  x.push_back(-0.0f);
  x.push_back(1e-30f);
  x.push_back(-60.0f);
  x.push_back(60.0f);
  const double k = std::sqrt(2.0 / M_PI);
  for (Isa isa : isas()) {
    for (int threads : {1, 2}) {
      std::vector<float> y(x.size());
      qkv::blocks::gelu_fast(y.data(), x.data(), static_cast<std::int64_t>(x.size()), threads, isa);
      double worst = 0;
      for (std::size_t i = 0; i < x.size(); ++i) {
        const double v = x[i], u = k * (v + 0.044715 * v * v * v);
        const double ref = 0.5 * v * (1.0 + std::tanh(u));
        const double a = 2.0 * u * 1.4426950408889634;
        const double tol = std::abs(v) * (8e-7 + 2.6e-7 * std::min(std::abs(a), 126.0)) + 1e-38;
        ASSERT_LE(std::abs(y[i] - ref), tol) << qkv::isa_name(isa) << " x = " << v << " got " << y[i];
        worst = std::max(worst, std::abs(y[i] - ref) / std::max(std::abs(v), 1e-30));
      }
      std::printf("%-12s threads %d: max |gelu - ref| / |x| = %.3g\n", qkv::isa_name(isa), threads, worst);
    }
    float nan = std::numeric_limits<float>::quiet_NaN(), out = 0;
    qkv::blocks::gelu_fast(&out, &nan, 1, 1, isa);
    EXPECT_TRUE(std::isnan(out)) << qkv::isa_name(isa) << ": NaN in, NaN out";
  }
}

// fork() while another thread is building and running bf16 GEMMs (issue #16, item 2): each new
// shape compiles a oneDNN primitive under gemm_bf16.cpp's cache mutex, and each PackedBf16 makes a
// reorder primitive; a child forked meanwhile must still run one of its own (blocks/onednn_call.hpp).
// The busy thread's shapes never repeat (M, in, out from k), so it spends most of its time inside
// that mutex: before OneDnnCall the child hung within the first 20 forks in each of three runs.
// The child's GEMM is checked against the f64 twin with GemmBf16MatchesReference's bound.
TEST(Dense, ForkedChildRunsBf16GemmWhileAnotherThreadBuildsOne) {
  constexpr std::int64_t kMaxM = 20, kMaxIn = 72, kMaxOut = 72;
  const auto xs = randn(kMaxM * kMaxIn, 61), Ws = randn(kMaxOut * kMaxIn, 62);
  std::vector<std::uint16_t> Wsb(Ws.size());
  qkv::blocks::f32_to_bf16(Wsb.data(), Ws.data(), static_cast<std::int64_t>(Ws.size()));
  std::vector<float> ys(kMaxM * kMaxOut);
  auto busy = [&](long k) {
    const std::int64_t M = 5 + k % 16, in = 8 + (k / 16) % 64, out = 8 + (k / 1024) % 64;
    if (k % 2) {
      qkv::blocks::gemm_bf16(xs.data(), Wsb.data(), nullptr, ys.data(), M, in, out, 0.0f, 1, qkv::cpu_isa());
    } else {
      std::vector<std::uint16_t> xb(static_cast<std::size_t>(M * in));
      qkv::blocks::f32_to_bf16(xb.data(), xs.data(), M * in);
      const qkv::blocks::PackedBf16 packed(Wsb.data(), in, out);
      qkv::blocks::gemm_bf16_in(xb.data(), Wsb.data(), nullptr, ys.data(), qkv::DType::f32, M, in, out, 0.0f,
                                qkv::blocks::GemmAct::none, &packed);
    }
  };
  auto child = [] {
    const std::int64_t M = 6, in = 7, out = 3;
    const auto x = randn(M * in, 63), W = randn(out * in, 64);
    std::vector<std::uint16_t> Wb(W.size()), xb(x.size());
    qkv::blocks::f32_to_bf16(Wb.data(), W.data(), out * in);
    qkv::blocks::f32_to_bf16(xb.data(), x.data(), M * in);
    std::vector<float> xr(x.size()), y(M * out), r(M * out);
    for (std::size_t i = 0; i < x.size(); ++i) xr[i] = qkv::bf16_to_f32(xb[i]);
    qkv::blocks::gemm_bf16(x.data(), Wb.data(), nullptr, y.data(), M, in, out, 0.0f, 2, qkv::cpu_isa());
    qkv::blocks::gemv_reference(xr.data(), nullptr, Wb.data(), nullptr, r.data(), M, in, out, 0.0f);
    for (std::int64_t m = 0; m < M; ++m)
      for (std::int64_t o = 0; o < out; ++o) {
        double mag = 0;
        for (std::int64_t i = 0; i < in; ++i) mag += std::abs(double(xr[m * in + i]) * qkv::bf16_to_f32(Wb[o * in + i]));
        if (!(std::abs(double(y[m * out + o]) - r[m * out + o]) <= (in + 2) * std::ldexp(1.0, -24) * mag)) return false;
      }
    return true;
  };
  ASSERT_TRUE(child()) << "the call the children make, in the parent";
  EXPECT_EQ(qkv::testing::fork_while_busy(busy, child, 60), "");
}

// The decode step's batched GEMV (gemv_batch_rows): against the f64 twin within the bound of
// GemvMatchesReferenceOnEveryIsa (γ_in · Σ|x·w|, bf16 weights widened exactly, so no extra term),
// and bit for bit equal, row by row, to the same call with M = 1 and to calls over other row
// ranges: a sequence's result must not depend on its batch or on the thread's share of the rows
// (M ≥ 2 runs the register-blocked path, which sums each chain separately: the same bits; M = 2, 3,
// 6, 7 its blocks of the 2 or 3 rows of x left over after the groups of 4 on AVX-512), with a bias
// and without (the blocks of 4 rows write y 4 floats at a time on AVX-512). M ∈ {2, …, 8} × in ∈
// {64, 100, 300} × f32 / bf16 take every count of prefetched lines a step (1, 2 and 4). The rows
// one at a time walk W all three ways (GemvWalk): the same bits (rows_ahead prefetches from rows
// whose next 768 bytes and a row's worth lie inside the range: here at in ≥ 64).
TEST(Dense, GemvBatchMatchesReferenceAndIsIndependentOfTheBatch) {
  for (Isa isa : isas())
    for (bool bf16 : {false, true}) {
      double worst = 0;
      for (std::int64_t M : {1, 2, 3, 4, 5, 6, 7, 8})
        for (std::int64_t in : {7, 16, 64, 100, 300})
          for (std::int64_t out : {13, 29})  // blocks of 4 rows (AVX-512) and 2 (AVX2), a row left over
          for (float beta : {0.0f, 1.0f})
          for (bool bias : {true, false}) {
            const std::int64_t ldy = out + 3;
            const auto x = randn(static_cast<std::size_t>(M * in), 1);
            const auto W = randn(static_cast<std::size_t>(out * in), 2);
            const auto b = randn(static_cast<std::size_t>(out), 3);
            std::vector<std::uint16_t> Wb(W.size());
            qkv::blocks::f32_to_bf16(Wb.data(), W.data(), static_cast<std::int64_t>(W.size()));
            std::vector<float> Wr(W.size());  // the weights the kernel multiplies by
            for (std::size_t i = 0; i < W.size(); ++i) Wr[i] = bf16 ? qkv::kernels::cpu::bf16_bits_to_f32(Wb[i]) : W[i];
            const auto y0 = randn(static_cast<std::size_t>(M * ldy), 4);
            std::vector<float> y = y0;
            const float* Wf = bf16 ? nullptr : W.data();
            const std::uint16_t* Wh = bf16 ? Wb.data() : nullptr;
            const float* bp = bias ? b.data() : nullptr;
            qkv::blocks::gemv_batch_rows(x.data(), Wf, Wh, bp, y.data(), ldy, M, in, beta, isa, 0, out, {0, M},
                                         GemvWalk::blocks);
            for (GemvWalk walk : {GemvWalk::blocks, GemvWalk::rows, GemvWalk::rows_ahead}) {
              std::vector<float> y1 = y0;
              for (std::int64_t m = 0; m < M; ++m)  // one row of x at a time, the rows of W in two ranges
                for (auto [o0, o1] : {std::pair<std::int64_t, std::int64_t>{0, 5}, {5, out}})
                  qkv::blocks::gemv_batch_rows(x.data() + m * in, Wf, Wh, bp, y1.data() + m * ldy, ldy, 1, in, beta,
                                               isa, o0, o1, {0, 1}, walk);
              EXPECT_EQ(std::memcmp(y.data(), y1.data(), 4 * y.size()), 0)
                  << qkv::isa_name(isa) << (bf16 ? " bf16" : " f32") << " M " << M << " in " << in << " bias " << bias
                  << " walk " << walk_name(walk);
            }
            for (std::int64_t m = 0; m < M; ++m)
              for (std::int64_t o = 0; o < out; ++o) {
                double ref = (bias ? b[o] : 0.0) + (beta == 0.0f ? 0.0 : y0[m * ldy + o]), mag = std::abs(ref);
                for (std::int64_t i = 0; i < in; ++i) {
                  ref += double(x[m * in + i]) * Wr[o * in + i];
                  mag += std::abs(double(x[m * in + i]) * Wr[o * in + i]);
                }
                const double bound = (in + 2) * std::ldexp(1.0, -24) * mag + 1e-30;
                worst = std::max(worst, std::abs(y[m * ldy + o] - ref) / bound);
              }
            for (std::int64_t m = 0; m < M; ++m)  // the gap between rows of y is untouched
              for (std::int64_t o = out; o < ldy; ++o) EXPECT_EQ(y[m * ldy + o], y0[m * ldy + o]);
          }
      std::printf("%-12s %s weights: max |err| / bound = %.3f\n", qkv::isa_name(isa), bf16 ? "bf16" : "f32 ", worst);
      EXPECT_LE(worst, 1.0) << qkv::isa_name(isa);
    }
}

// gemv_walk: QKV_GEMV_WALK forces any walk and any other value throws, naming the variable and
// the value; unset (or empty), the machine's rule, checked against what /proc/cpuinfo and sysfs say
// of this CPU (read here, not through the library): on an AMD CPU rows_ahead for more weights than
// its L3, rows for more than half of it, blocks for fewer and on other vendors.
TEST(Dense, GemvWalkFollowsTheEnvironmentThenTheCpu) {
  using qkv::blocks::gemv_walk;
  const char* old = std::getenv("QKV_GEMV_WALK");
  const std::string saved = old ? old : "";
  ::setenv("QKV_GEMV_WALK", "rows", 1);
  EXPECT_EQ(gemv_walk(1), GemvWalk::rows);
  ::setenv("QKV_GEMV_WALK", "rows_ahead", 1);
  EXPECT_EQ(gemv_walk(1), GemvWalk::rows_ahead);
  ::setenv("QKV_GEMV_WALK", "blocks", 1);
  EXPECT_EQ(gemv_walk(std::int64_t{1} << 40), GemvWalk::blocks);
  ::setenv("QKV_GEMV_WALK", "row", 1);
  try {
    gemv_walk(1);
    ADD_FAILURE() << "QKV_GEMV_WALK=row: no exception";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const char* part : {"qkv::blocks::gemv_walk", "QKV_GEMV_WALK", "blocks, rows or rows_ahead", "'row'"})
      EXPECT_NE(m.find(part), std::string::npos) << m;
  }
  ::setenv("QKV_GEMV_WALK", "", 1);  // empty: the machine's rule, as unset
  std::string vendor, line;
  for (std::ifstream f("/proc/cpuinfo"); vendor.empty() && std::getline(f, line);)
    if (line.rfind("vendor_id", 0) == 0) vendor = line.substr(line.find(':') + 2);
  long l3 = 0;
  std::string unit;
  if (std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size"); f >> l3 >> unit)
    l3 *= unit == "K" ? 1024 : unit == "M" ? 1024 * 1024 : 1;
  std::printf("vendor %s, L3 %ld bytes\n", vendor.c_str(), l3);
  const bool amd = vendor == "AuthenticAMD" || vendor == "HygonGenuine";
  EXPECT_EQ(gemv_walk(0), GemvWalk::blocks);
  if (l3 > 0) {
    EXPECT_EQ(gemv_walk(l3 / 2), GemvWalk::blocks);  // "more than half": the half itself is blocks
    EXPECT_EQ(gemv_walk(l3 / 2 + 1), amd ? GemvWalk::rows : GemvWalk::blocks) << vendor;
    EXPECT_EQ(gemv_walk(l3), amd ? GemvWalk::rows : GemvWalk::blocks) << vendor;  // the whole L3: rows
    EXPECT_EQ(gemv_walk(l3 + 1), amd ? GemvWalk::rows_ahead : GemvWalk::blocks) << vendor;
  }
  if (old) ::setenv("QKV_GEMV_WALK", saved.c_str(), 1);
  else ::unsetenv("QKV_GEMV_WALK");
}

// gemv_batch_rows over a range of the rows of x: rows inside the range equal, bit for bit, the
// one-row GEMV of the multi-row API (gemv_f32 / gemv_bf16 at M = 1: gemv_row's sums, which the batched
// kernel reproduces; with bf16 weights on avx512_bf16 that API runs vdpbf16ps, so its widening
// avx512 twin is the oracle there); rows outside it are not touched. M = 9 with ranges of 0–9 rows
// runs the 4-row groups, the rows left over and empty ranges; 45 rows of W take the prefetching
// blocks (a block prefetches the one 2 ahead) and a row left over, at M = 1 under every walk (rows,
// rows_ahead: W row after row). Bad ranges throw.
TEST(Dense, GemvBatchRowRangeEqualsOneRowGemv) {
  const std::int64_t M = 9, out = 45, ldy = out + 2;
  for (Isa isa : isas())
    for (bool bf16 : {false, true})
      for (std::int64_t in : {7, 100, 300})
        for (float beta : {0.0f, 1.0f})
          for (auto [m0, m1] : {std::pair<std::int64_t, std::int64_t>{0, 9}, {1, 6}, {3, 7}, {4, 4}, {8, 9}}) {
            const auto x = randn(static_cast<std::size_t>(M * in), 11);
            const auto W = randn(static_cast<std::size_t>(out * in), 12);
            const auto b = randn(static_cast<std::size_t>(out), 13);
            std::vector<std::uint16_t> Wb(W.size());
            qkv::blocks::f32_to_bf16(Wb.data(), W.data(), static_cast<std::int64_t>(W.size()));
            const auto y0 = randn(static_cast<std::size_t>(M * ldy), 14);
            for (GemvWalk walk : {GemvWalk::blocks, GemvWalk::rows, GemvWalk::rows_ahead}) {
              std::vector<float> y = y0;
              qkv::blocks::gemv_batch_rows(x.data(), bf16 ? nullptr : W.data(), bf16 ? Wb.data() : nullptr, b.data(),
                                           y.data(), ldy, M, in, beta, isa, 0, out, {m0, m1}, walk);
              for (std::int64_t m = 0; m < M; ++m) {
                std::vector<float> one(y0.begin() + m * ldy, y0.begin() + (m + 1) * ldy);
                if (m >= m0 && m < m1) {
                  if (bf16)
                    qkv::blocks::gemv_bf16(x.data() + m * in, Wb.data(), b.data(), one.data(), 1, in, out, beta, 1,
                                           isa == Isa::avx512_bf16 ? Isa::avx512 : isa);
                  else
                    qkv::blocks::gemv_f32(x.data() + m * in, W.data(), b.data(), one.data(), 1, in, out, beta, 1, isa);
                }
                EXPECT_EQ(std::memcmp(one.data(), y.data() + m * ldy, 4 * ldy), 0)
                    << qkv::isa_name(isa) << (bf16 ? " bf16" : " f32") << " in " << in << " rows [" << m0 << ", " << m1
                    << ") row " << m << " walk " << walk_name(walk);
              }
            }
          }
  float x[4] = {}, W[4] = {}, y[4] = {};
  auto call = [&](std::int64_t m0, std::int64_t m1) {
    qkv::blocks::gemv_batch_rows(x, W, nullptr, nullptr, y, 2, 2, 2, 0.0f, Isa::scalar, 0, 2, {m0, m1},
                                 GemvWalk::blocks);
  };
  EXPECT_NO_THROW(call(0, 2));
  EXPECT_THROW(call(-1, 1), std::invalid_argument);
  EXPECT_THROW(call(2, 1), std::invalid_argument);
  EXPECT_THROW(call(0, 3), std::invalid_argument);
}

// attend_one (one query per head, the decode step's attention on an f32 cache) against the
// library's reference attention in f64 (qkv::attention with Kernel::reference), for D below, at and
// above each vector length and key counts 1, a tail, whole blocks of 8 and 16 keys (the scores are
// computed a vector's lanes of keys at a time) and several blocks, G = 1 and 3 heads per kv head. Tolerance 1e-5 absolute on outputs of magnitude ≤ ~3 (unit normal inputs): f32 scores, the
// exp2 polynomial (relative error ≤ 2.4e-7) and an f32 weighted sum of ≤ 300 rows, measured ≤ ~1e-6.
// attend_one_bf16 (bf16 keys and values, f32 q) against the same reference on the bf16 values
// widened to f32 (exact), with the same tolerance: only the storage differs.
TEST(Dense, AttendOneMatchesReferenceAttention) {
  for (Isa isa : isas())
    for (bool bf16 : {false, true}) {
      double worst = 0;
      for (std::int64_t D : {1, 4, 8, 16, 17, 48, 64})
        for (std::int64_t Skv : {1, 8, 16, 37, 300})
          for (std::int64_t G : {1, 3}) {
            const auto q = randn(static_cast<std::size_t>(G * D), 5);
            auto k = randn(static_cast<std::size_t>(Skv * D), 6);
            auto v = randn(static_cast<std::size_t>(Skv * D), 7);
            std::vector<std::uint16_t> kb(k.size()), vb(v.size());
            if (bf16)
              for (std::size_t i = 0; i < k.size(); ++i) {
                kb[i] = qkv::f32_to_bf16(k[i]), vb[i] = qkv::f32_to_bf16(v[i]);
                k[i] = qkv::bf16_to_f32(kb[i]), v[i] = qkv::bf16_to_f32(vb[i]);
              }
            std::vector<float> out(static_cast<std::size_t>(G * D)), ref(out.size()), scores(static_cast<std::size_t>(Skv));
            const float scale = 1.0f / std::sqrt(static_cast<float>(D));
            if (bf16)
              qkv::blocks::attend_one_bf16(q.data(), kb.data(), vb.data(), out.data(), scores.data(), G, D, Skv, scale, isa);
            else
              qkv::blocks::attend_one(q.data(), k.data(), v.data(), out.data(), scores.data(), G, D, Skv, scale, isa);
            qkv::AttentionOptions opt;
            opt.kernel = qkv::Kernel::reference;
            opt.scale = scale;
            qkv::attention(qkv::View::contiguous(const_cast<float*>(q.data()), qkv::DType::f32, {1, G, 1, D}),
                           qkv::View::contiguous(k.data(), qkv::DType::f32, {1, 1, Skv, D}),
                           qkv::View::contiguous(v.data(), qkv::DType::f32, {1, 1, Skv, D}),
                           qkv::View::contiguous(ref.data(), qkv::DType::f32, {1, G, 1, D}), opt);
            for (std::size_t i = 0; i < out.size(); ++i) {
              const double e = std::abs(double(out[i]) - ref[i]);
              if (!(e <= worst)) worst = e;  // a NaN stays
            }
          }
      std::printf("%-12s attend_one%s: max |out − reference| = %.3g\n", qkv::isa_name(isa), bf16 ? "_bf16" : "", worst);
      EXPECT_LT(worst, 1e-5) << qkv::isa_name(isa) << (bf16 ? " bf16" : " f32");
    }
}

// attend_one with KvNext (the rows of the caller's next call, prefetched during this one): only a
// hint, so the output must be the same bits as without it, on every ISA, f32 and bf16 caches, for
// key counts below, at and past a block of L keys (the prefetches go a few lines a block, the rest
// after the last whole one) and next regions smaller and larger than this call's rows. The next
// rows are NaN: a kernel that read them into a sum (or a call that mixed next.k up with k) would
// give NaN, not the same bits.
TEST(Dense, AttendOneNextRowsChangeNoBit) {
  constexpr std::int64_t D = 48, G = 1;
  for (Isa isa : isas())
    for (bool bf16 : {false, true})
      for (std::int64_t Skv : {1, 15, 16, 17, 130})
        for (std::int64_t next_rows : {1, 16, 131, 400}) {
          const auto q = randn(static_cast<std::size_t>(G * D), 11);
          const auto k = randn(static_cast<std::size_t>(Skv * D), 12), v = randn(static_cast<std::size_t>(Skv * D), 13);
          std::vector<std::uint16_t> kb(k.size()), vb(v.size());
          for (std::size_t i = 0; i < k.size(); ++i) kb[i] = qkv::f32_to_bf16(k[i]), vb[i] = qkv::f32_to_bf16(v[i]);
          const std::size_t n = static_cast<std::size_t>(next_rows * D);
          const std::vector<float> nk(n, std::nanf("")), nv(n, std::nanf(""));
          const std::vector<std::uint16_t> nkb(n, 0x7fc0), nvb(n, 0x7fc0);  // bf16 NaN
          const std::int64_t es = bf16 ? 2 : 4;
          const qkv::blocks::KvNext next{bf16 ? static_cast<const void*>(nkb.data()) : nk.data(),
                                         bf16 ? static_cast<const void*>(nvb.data()) : nv.data(),
                                         next_rows * D * es};
          std::vector<float> out(static_cast<std::size_t>(G * D)), with(out.size()), scores(static_cast<std::size_t>(Skv));
          const float scale = 1.0f / std::sqrt(static_cast<float>(D));
          for (bool use : {false, true}) {
            float* o = use ? with.data() : out.data();
            if (bf16)
              qkv::blocks::attend_one_bf16(q.data(), kb.data(), vb.data(), o, scores.data(), G, D, Skv, scale, isa,
                                           use ? next : qkv::blocks::KvNext{});
            else
              qkv::blocks::attend_one(q.data(), k.data(), v.data(), o, scores.data(), G, D, Skv, scale, isa,
                                      use ? next : qkv::blocks::KvNext{});
          }
          ASSERT_EQ(0, std::memcmp(out.data(), with.data(), sizeof(float) * out.size()))
              << qkv::isa_name(isa) << (bf16 ? " bf16" : " f32") << " Skv " << Skv << " next rows " << next_rows;
        }
}

// attend_one when every score is far below 0: the softmax subtracts the largest score, and the
// lanes of a block past the last key (which hold 0) must not count as one, or every 2^(s − max)
// underflows to 0 and the output is NaN. Scores −300 − j/4 (q = e_0, scale 1, k_j[0] = −300 − j/4,
// exact in f32); 5 keys (one partial block) and 21 (whole blocks then a partial one). Reference:
// qkv::attention in f64. Tolerance 1e-4: each score carries an f32 rounding error ≤ 300·log2 e·2^-24
// ≈ 3e-5 in its exponent, so each weight is off by ≤ ~2e-5 relative, on outputs of magnitude ≤ ~3.
TEST(Dense, AttendOneWithVeryNegativeScores) {
  constexpr std::int64_t D = 8;
  for (Isa isa : isas())
    for (std::int64_t Skv : {5, 21}) {
      std::vector<float> q(D, 0.0f);
      q[0] = 1.0f;
      auto k = randn(static_cast<std::size_t>(Skv * D), 8);
      const auto v = randn(static_cast<std::size_t>(Skv * D), 9);
      for (std::int64_t j = 0; j < Skv; ++j) k[j * D] = -300.0f - 0.25f * static_cast<float>(j);
      std::vector<float> out(D), ref(D), scores(static_cast<std::size_t>(Skv));
      qkv::blocks::attend_one(q.data(), k.data(), v.data(), out.data(), scores.data(), 1, D, Skv, 1.0f, isa);
      qkv::AttentionOptions opt;
      opt.kernel = qkv::Kernel::reference;
      opt.scale = 1.0f;
      qkv::attention(qkv::View::contiguous(q.data(), qkv::DType::f32, {1, 1, 1, D}),
                     qkv::View::contiguous(k.data(), qkv::DType::f32, {1, 1, Skv, D}),
                     qkv::View::contiguous(const_cast<float*>(v.data()), qkv::DType::f32, {1, 1, Skv, D}),
                     qkv::View::contiguous(ref.data(), qkv::DType::f32, {1, 1, 1, D}), opt);
      double worst = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        const double e = std::abs(double(out[d]) - ref[d]);
        if (!(e <= worst)) worst = e;  // a NaN stays
      }
      std::printf("%-12s Skv %2ld: max |out − reference| = %.3g\n", qkv::isa_name(isa), static_cast<long>(Skv), worst);
      EXPECT_LT(worst, 1e-4) << qkv::isa_name(isa) << " Skv " << Skv;
    }
}

}  // namespace
