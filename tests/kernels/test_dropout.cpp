// Attention dropout (opt.dropout_p, qkv/attention.hpp) against independent values:
//   - the keep/drop decisions: with q = 0 (uniform p_ij = 1/n) and V = the identity, out_ij is
//     keep_ij / (1 − p) / n, so every fast kernel's mask is read off its output and compared, key by
//     key, with qkv::dropout_mask (the f64 reference's own decisions), on every ISA and dtype;
//   - the f64 reference forward and backward with the same seed, on random inputs, every ISA,
//     f32 and bf16, flash and flash_decode, causal / GQA / masks / key padding;
//   - f64 central finite differences of the reference forward with a fixed seed (fixed mask);
//   - statistics: keep rate within a binomial bound of 1 − p, pairs of keys independent, and
//     the mean output over seeds within a variance bound of the output without dropout;
//   - determinism: same seed → same bits, other seed or offset → other mask, any thread count
//     → same bits, p = 0 → the bits of a call without dropout; varlen = batched.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::testing::IsaGuard;
using qkv::testing::RoundedTensor;
using qkv::testing::isas;
using qkv::testing::round_to;
using qkv::Isa;
using qkv::Kernel;
using qkv::View;
using i64 = std::int64_t;


double max_err(const Buffer& a, const Buffer& ref) {
  double m = 0.0;
  for (i64 e = 0; e < a.numel(); ++e) {
    const double x = a.view().load(e), r = ref.view().load(e);
    if (std::isnan(x) != std::isnan(r)) return std::numeric_limits<double>::infinity();
    if (!std::isnan(x)) m = std::max(m, std::abs(x - r));
  }
  return m;
}

bool same_bits(const Buffer& a, const Buffer& b) { return a.bytes() == b.bytes() && std::memcmp(a.data(), b.data(), a.bytes()) == 0; }


AttentionOptions dropout_opts(double p, std::uint64_t seed, std::uint64_t offset = 0) {
  AttentionOptions o;
  o.dropout_p = p;
  o.dropout_seed = seed;
  o.dropout_offset = offset;
  return o;
}

// ---------------------------------------------------------------------------------------------
// The decisions, read off the output. q = 0 gives every allowed key p_ij = 1/n exactly (n keys),
// V = I (Dv = Skv) makes out_ij = keep_ij · rs / n: nonzero exactly where the key is kept.
TEST(DropoutMask, EveryKernelDecidesAsTheReference) {
  IsaGuard guard;
  const i64 B = 2, H = 3, Skv = 150;  // 150 keys: three tiles of 64, the last one partial
  const double p = 0.3, rs = 1.0 / (1.0 - p);
  for (i64 Sq : {i64{1}, i64{37}}) {  // 1: flash_decode's shape; 37: flash's strips and a partial block
    Buffer mask(DType::u8, {B, H, Sq, Skv});
    qkv::dropout_mask(mask.view(), p, 1234, 5);
    for (DType t : {DType::f32, DType::bf16, DType::f64}) {
      Buffer q(t, {B, H, Sq, 8}), k(t, {B, H, Skv, 8}), v(t, {B, H, Skv, Skv}), out(t, {B, H, Sq, Skv});
      for (i64 e = 0; e < q.numel(); ++e) q.view().store(e, 0.0);
      std::mt19937 rng(7);
      std::normal_distribution<double> nd;
      for (i64 e = 0; e < k.numel(); ++e) k.view().store(e, round_to(t, nd(rng)));
      for (i64 e = 0; e < v.numel(); ++e) v.view().store(e, e / Skv % Skv == e % Skv ? 1.0 : 0.0);
      for (Isa isa : t == DType::f64 ? std::vector<Isa>{Isa::scalar} : isas()) {
        qkv::set_isa(isa);
        for (Kernel kern : {Kernel::flash, Kernel::flash_decode}) {
          AttentionOptions o = dropout_opts(p, 1234, 5);
          o.kernel = t == DType::f64 ? Kernel::reference : kern;
          const auto info = qkv::attention(q.view(), k.view(), v.view(), out.view(), o);
          i64 wrong = 0;
          double worst = 0.0;  // relative error of the kept weights against rs / n
          for (i64 e = 0; e < out.numel(); ++e) {
            const double x = out.view().load(e);
            const bool kept = mask.ptr<std::uint8_t>()[e] != 0;
            if ((x != 0.0) != kept) ++wrong;
            if (kept) worst = std::max(worst, std::abs(x * Skv / rs - 1.0));
          }
          std::printf("  %-28s Sq=%-3lld mask mismatches %lld, kept weights rel. err %.2e\n", info.name,
                      static_cast<long long>(Sq), static_cast<long long>(wrong), worst);
          EXPECT_EQ(wrong, 0) << info.name;
          // f32: rs/n computed with a few roundings (≤ 1e-6); bf16: output rounded to 8 bits
          // (½ ulp = 2^-9) and, on avx512_bf16, P rounded to bf16 before P·V (another 2^-9).
          EXPECT_LE(worst, t == DType::bf16 ? 2.0 * std::ldexp(1.0, -8) : 1e-6) << info.name;
          if (t == DType::f64) break;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward and backward against the f64 reference on random inputs.
struct Case {
  const char* name;
  i64 B, H, Hkv, Sq, Skv, D, Dv;
  bool causal = false;
  bool bool_mask = false;
  bool key_padding = false;
};

struct Result {
  Buffer out, lse, dq, dk, dv;
};

// Forward (+ backward of dout) of one case in dtype t with kernel `kern`.
Result run(const Case& c, DType t, const AttentionOptions& base, Kernel kern, const RoundedTensor& q, const RoundedTensor& k,
        const RoundedTensor& v, const RoundedTensor& dout, const Buffer& mask, const Buffer& key_len, bool use_f64,
        bool backward = true) {
  const DType dt = use_f64 ? DType::f64 : t;
  Result r{Buffer(dt, {c.B, c.H, c.Sq, c.Dv}), Buffer(DType::f32, {c.B, c.H, c.Sq}), Buffer(dt, {c.B, c.H, c.Sq, c.D}),
        Buffer(dt, {c.B, c.Hkv, c.Skv, c.D}), Buffer(dt, {c.B, c.Hkv, c.Skv, c.Dv})};
  AttentionOptions o = base;
  o.causal = c.causal;
  o.kernel = kern;
  if (c.bool_mask) o.mask = mask.view();
  if (c.key_padding) o.key_lengths = key_len.view();
  auto pick = [&](const RoundedTensor& x) { return use_f64 ? x.f64.view() : x.buf.view(); };
  qkv::attention(pick(q), pick(k), pick(v), r.out.view(), o, r.lse.view());
  if (backward) {
    if (kern == Kernel::flash_decode) o.kernel = Kernel::flash;
    qkv::attention_backward(pick(q), pick(k), pick(v), r.out.view(), pick(dout), r.lse.view(), r.dq.view(),
                            r.dk.view(), r.dv.view(), o);
  }
  return r;
}

class DropoutKernels : public ::testing::TestWithParam<Case> {};

TEST_P(DropoutKernels, FlashMatchesReferenceOnEveryIsaAndDtype) {
  IsaGuard guard;
  const Case c = GetParam();
  for (DType t : {DType::f32, DType::bf16}) {
    RoundedTensor q(t, {c.B, c.H, c.Sq, c.D}, 1, 1.0), k(t, {c.B, c.Hkv, c.Skv, c.D}, 2, 1.0), v(t, {c.B, c.Hkv, c.Skv, c.Dv}, 3, 1.0),
        dout(t, {c.B, c.H, c.Sq, c.Dv}, 4, 1.0);
    Buffer mask(DType::u8, {c.Sq, c.Skv}), key_len(DType::i32, {c.B});
    std::mt19937 g(5);
    for (i64 e = 0; e < mask.numel(); ++e) mask.ptr<std::uint8_t>()[e] = g() % 4 != 0;
    for (i64 b = 0; b < c.B; ++b) key_len.ptr<std::int32_t>()[b] = static_cast<std::int32_t>(c.Skv - 3 * b);
    for (double p : {0.1, 0.5}) {
      const AttentionOptions o = dropout_opts(p, 42 + static_cast<std::uint64_t>(p * 10), 3);
      const Result ref = run(c, t, o, Kernel::reference, q, k, v, dout, mask, key_len, true);
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        for (Kernel kern : {Kernel::flash, Kernel::flash_decode}) {
          const Result got = run(c, t, o, kern, q, k, v, dout, mask, key_len, false);
          const double rs = 1.0 / (1.0 - p);
          // Tolerances: the FlashAttention rule's floors (test_flash.cpp, test_backward.cpp) with
          // the weights scaled by rs = 1/(1 − p) ≤ 2: f32 forward 1e-6 of |out| ≤ a few units, so
          // 1e-5 · rs; bf16 a few output ulps, 2^-6 · rs. Backward: f32 sums of Sq or Skv terms of
          // size ≈ 1: 1e-4 · rs; bf16 outputs rounded to 8 bits at |grad| ≤ ~8: 2^-3 · rs. A
          // flipped keep decision moves out by p_ij · rs · v_j, which the mask test above catches.
          const bool bf = t == DType::bf16;
          const double tol_f = (bf ? std::ldexp(1.0, -6) : 1e-5) * rs, tol_b = (bf ? std::ldexp(1.0, -3) : 1e-4) * rs;
          const double eo = max_err(got.out, ref.out), eq = max_err(got.dq, ref.dq), ek = max_err(got.dk, ref.dk),
                       ev = max_err(got.dv, ref.dv);
          std::printf("  %-8s %-5s p=%.1f isa=%d %-12s out %.2e dq %.2e dk %.2e dv %.2e\n", c.name, bf ? "bf16" : "f32", p,
                      static_cast<int>(isa), kern == Kernel::flash ? "flash" : "flash_decode", eo, eq, ek, ev);
          EXPECT_LE(eo, tol_f);
          EXPECT_LE(eq, tol_b);
          EXPECT_LE(ek, tol_b);
          EXPECT_LE(ev, tol_b);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, DropoutKernels,
                         ::testing::Values(Case{"mha", 2, 2, 2, 70, 130, 32, 32},
                                           Case{"causal", 1, 4, 2, 100, 100, 64, 48, true},
                                           Case{"decode", 2, 4, 1, 2, 300, 16, 16},
                                           Case{"masked", 2, 2, 1, 33, 77, 24, 24, false, true, true}),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// ---------------------------------------------------------------------------------------------
// f64 central differences of the reference forward with a fixed seed (the mask does not move).
TEST(DropoutGradient, ReferenceBackwardMatchesFiniteDifferences) {
  const Case c{"fd", 1, 2, 1, 5, 7, 4, 3, true};
  RoundedTensor q(DType::f64, {c.B, c.H, c.Sq, c.D}, 11, 1.0), k(DType::f64, {c.B, c.Hkv, c.Skv, c.D}, 12, 1.0),
      v(DType::f64, {c.B, c.Hkv, c.Skv, c.Dv}, 13, 1.0), dout(DType::f64, {c.B, c.H, c.Sq, c.Dv}, 14, 1.0);
  Buffer none_u8(DType::u8, {1, 1}), none_i32(DType::i32, {1});
  const AttentionOptions o = dropout_opts(0.4, 99);
  const Result g = run(c, DType::f64, o, Kernel::reference, q, k, v, dout, none_u8, none_i32, true);
  // L = Σ out ∘ dout; dL/dx by (L(x + h) − L(x − h)) / 2h. Error O(h²) · |L'''| ≈ 1e-10, plus
  // rounding ≈ 1e-16 / h: 1e-7 is far above both and far below a wrong gradient.
  auto loss = [&]() {
    Buffer out(DType::f64, {c.B, c.H, c.Sq, c.Dv});
    AttentionOptions oo = o;
    oo.causal = c.causal;
    oo.kernel = Kernel::reference;
    qkv::attention(q.f64.view(), k.f64.view(), v.f64.view(), out.view(), oo);
    double s = 0.0;
    for (i64 e = 0; e < out.numel(); ++e) s += out.ptr<double>()[e] * dout.f64.ptr<double>()[e];
    return s;
  };
  const double h = 1e-5;
  double worst = 0.0;
  for (auto [x, grad] : {std::pair{&q, &g.dq}, std::pair{&k, &g.dk}, std::pair{&v, &g.dv}}) {
    for (i64 e = 0; e < x->f64.numel(); ++e) {
      double& xe = x->f64.ptr<double>()[e];
      const double x0 = xe;
      xe = x0 + h;
      const double lp = loss();
      xe = x0 - h;
      const double lm = loss();
      xe = x0;
      worst = std::max(worst, std::abs((lp - lm) / (2 * h) - grad->ptr<double>()[e]));
    }
  }
  std::printf("  max |analytic − central difference| = %.2e\n", worst);
  EXPECT_LE(worst, 1e-7);
}

// ---------------------------------------------------------------------------------------------
// Statistics of the mask. N Bernoulli(1 − p) draws: the count's standard deviation is
// √(N p (1 − p)); 5σ bounds fail by chance with probability < 6e-7 (and the seeds are fixed).
TEST(DropoutStatistics, KeepRateAndPairIndependenceWithinBinomialBounds) {
  const i64 B = 2, H = 4, Sq = 128, Skv = 512;
  Buffer mask(DType::u8, {B, H, Sq, Skv});
  for (double p : {0.1, 0.5, 0.9}) {
    for (std::uint64_t seed : {0ull, 1ull, 0xdeadbeefcafeull}) {
      qkv::dropout_mask(mask.view(), p, seed, 0);
      const auto* m = mask.ptr<std::uint8_t>();
      const double n = static_cast<double>(mask.numel());
      double kept = 0.0, pairs = 0.0, npairs = 0.0, col0 = 0.0;
      for (i64 e = 0; e < mask.numel(); ++e) {
        kept += m[e];
        if (e % Skv + 1 < Skv) pairs += m[e] & m[e + 1], npairs += 1;  // neighbouring keys
        if (e % Skv == 0) col0 += m[e];                                 // one key across rows
      }
      const double q = 1.0 - p;
      const double rate = kept / n, pair_rate = pairs / npairs, col_rate = col0 / (n / Skv);
      std::printf("  p=%.1f seed=%llu keep %.5f (want %.5f) neighbours %.5f (want %.5f) key 0 %.4f\n", p,
                  static_cast<unsigned long long>(seed), rate, q, pair_rate, q * q, col_rate);
      EXPECT_LE(std::abs(rate - q), 5 * std::sqrt(p * q / n));
      EXPECT_LE(std::abs(pair_rate - q * q), 5 * std::sqrt(q * q * (1 - q * q) / npairs));
      EXPECT_LE(std::abs(col_rate - q), 5 * std::sqrt(p * q / (n / Skv)));
    }
  }
}

// E[out] over seeds = the output without dropout. Per element, one seed's out_i − out0_i =
// Σ_j p_ij (w_ij − 1) v_j has variance σ² = Σ_j p_ij² v_j² · p / (1 − p) (the w_ij independent,
// E w = 1, Var w = p / (1 − p)); the mean of N seeds deviates by at most 5 σ / √N (5σ as above).
TEST(DropoutStatistics, MeanOverSeedsIsTheOutputWithoutDropout) {
  const Case c{"mean", 1, 2, 2, 6, 20, 8, 4};
  const double p = 0.3;
  RoundedTensor q(DType::f32, {c.B, c.H, c.Sq, c.D}, 21, 0.5), k(DType::f32, {c.B, c.Hkv, c.Skv, c.D}, 22, 0.5),
      v(DType::f32, {c.B, c.Hkv, c.Skv, c.Dv}, 23, 1.0);
  Buffer out0(DType::f64, {c.B, c.H, c.Sq, c.Dv}), pat(DType::f64, {c.B, c.H, c.Sq, c.Skv});
  AttentionOptions o;
  o.kernel = Kernel::reference;
  qkv::attention(q.f64.view(), k.f64.view(), v.f64.view(), out0.view(), o, std::nullopt, pat.view());
  const int N = 4000;
  std::vector<double> sum(static_cast<std::size_t>(out0.numel()), 0.0);
  Buffer out(DType::f32, {c.B, c.H, c.Sq, c.Dv});
  for (int s = 0; s < N; ++s) {
    AttentionOptions od = dropout_opts(p, static_cast<std::uint64_t>(s));
    od.kernel = Kernel::flash;
    qkv::attention(q.buf.view(), k.buf.view(), v.buf.view(), out.view(), od);
    for (i64 e = 0; e < out.numel(); ++e) sum[static_cast<std::size_t>(e)] += out.ptr<float>()[e];
  }
  double worst = 0.0;  // in units of the bound
  for (i64 h = 0; h < c.H; ++h)
    for (i64 i = 0; i < c.Sq; ++i)
      for (i64 e = 0; e < c.Dv; ++e) {
        double var = 0.0;
        for (i64 j = 0; j < c.Skv; ++j) {
          const double pij = pat.view().load(pat.view().offset(0, h, i, j)), vj = v.f64.view().load(v.f64.view().offset(0, h, j, e));
          var += pij * pij * vj * vj * p / (1 - p);
        }
        const double mean = sum[static_cast<std::size_t>((h * c.Sq + i) * c.Dv + e)] / N;
        // + 1e-6: the f32 kernel's own error per call, which averaging does not remove.
        const double bound = 5 * std::sqrt(var / N) + 1e-6;
        worst = std::max(worst, std::abs(mean - out0.view().load(out0.view().offset(0, h, i, e))) / bound);
      }
  std::printf("  max |mean over %d seeds − out without dropout| = %.3f of the 5σ bound\n", N, worst);
  EXPECT_LE(worst, 1.0);
}

// ---------------------------------------------------------------------------------------------
TEST(DropoutDeterminism, SeedOffsetThreadsAndPZero) {
  const Case c{"det", 2, 4, 2, 300, 300, 64, 64, true};
  RoundedTensor q(DType::f32, {c.B, c.H, c.Sq, c.D}, 31, 1.0), k(DType::f32, {c.B, c.Hkv, c.Skv, c.D}, 32, 1.0),
      v(DType::f32, {c.B, c.Hkv, c.Skv, c.Dv}, 33, 1.0), dout(DType::f32, {c.B, c.H, c.Sq, c.Dv}, 34, 1.0);
  Buffer none_u8(DType::u8, {1, 1}), none_i32(DType::i32, {1});
  auto go = [&](const AttentionOptions& o) { return run(c, DType::f32, o, Kernel::flash, q, k, v, dout, none_u8, none_i32, false); };
  AttentionOptions a = dropout_opts(0.2, 7);
  const Result r1 = go(a);
  for (int threads : {1, 2, 3, 5}) {
    AttentionOptions t = a;
    t.num_threads = threads;
    const Result rt = go(t);
    EXPECT_TRUE(same_bits(rt.out, r1.out) && same_bits(rt.dq, r1.dq) && same_bits(rt.dk, r1.dk) && same_bits(rt.dv, r1.dv))
        << threads << " threads";
  }
  EXPECT_FALSE(same_bits(go(dropout_opts(0.2, 8)).out, r1.out)) << "another seed, the same output";
  EXPECT_FALSE(same_bits(go(dropout_opts(0.2, 7, 1)).out, r1.out)) << "another offset, the same output";
  Buffer m1(DType::u8, {c.B, c.H, c.Sq, c.Skv}), m2(DType::u8, {c.B, c.H, c.Sq, c.Skv});
  qkv::dropout_mask(m1.view(), 0.2, 7, 0);
  qkv::dropout_mask(m2.view(), 0.2, 8, 0);
  i64 differ = 0;
  for (i64 e = 0; e < m1.numel(); ++e) differ += m1.ptr<std::uint8_t>()[e] != m2.ptr<std::uint8_t>()[e];
  // Two independent masks differ on a fraction 2 p (1 − p) = 0.32 of the keys.
  EXPECT_NEAR(static_cast<double>(differ) / static_cast<double>(m1.numel()), 0.32, 0.01);
  // p = 0 with a seed is the call without dropout, bit for bit.
  const Result plain = go(AttentionOptions{});
  const Result p0 = go(dropout_opts(0.0, 12345, 6));
  EXPECT_TRUE(same_bits(plain.out, p0.out) && same_bits(plain.lse, p0.lse) && same_bits(plain.dq, p0.dq) &&
              same_bits(plain.dk, p0.dk) && same_bits(plain.dv, p0.dv));
  // The lse is the softmax's, before dropout.
  EXPECT_TRUE(same_bits(plain.lse, r1.lse));
}

// Packed sequences of equal lengths are the batched call: sequence b uses the mask of batch b.
TEST(DropoutVarlen, EqualLengthsGiveTheBatchedCall) {
  const i64 B = 3, H = 2, S = 50, D = 16;
  RoundedTensor q(DType::f32, {B * S, H, D}, 41, 1.0), k(DType::f32, {B * S, H, D}, 42, 1.0), v(DType::f32, {B * S, H, D}, 43, 1.0),
      dout(DType::f32, {B * S, H, D}, 44, 1.0);
  auto bhsd = [&](const Buffer& x) {  // [B·S, H, D] viewed as [B, H, S, D]
    return View::strided(x.data(), x.dtype(), {B, H, S, D}, {S * H * D, D, H * D, 1});
  };
  Buffer cu(DType::i32, {B + 1});
  for (i64 b = 0; b <= B; ++b) cu.ptr<std::int32_t>()[b] = static_cast<std::int32_t>(b * S);
  AttentionOptions o = dropout_opts(0.25, 77, 2);
  o.causal = true;
  Buffer out_v(DType::f32, {B * S, H, D}), lse_v(DType::f32, {H, B * S}), out_b(DType::f32, {B * S, H, D}),
      lse_b(DType::f32, {B, H, S});
  qkv::attention_varlen(q.buf.view(), k.buf.view(), v.buf.view(), out_v.view(), cu.view(), cu.view(), o, lse_v.view());
  qkv::attention(bhsd(q.buf), bhsd(k.buf), bhsd(v.buf), bhsd(out_b), o, lse_b.view());
  EXPECT_TRUE(same_bits(out_v, out_b));
  Buffer g_v[3] = {Buffer(DType::f32, {B * S, H, D}), Buffer(DType::f32, {B * S, H, D}), Buffer(DType::f32, {B * S, H, D})};
  Buffer g_b[3] = {Buffer(DType::f32, {B * S, H, D}), Buffer(DType::f32, {B * S, H, D}), Buffer(DType::f32, {B * S, H, D})};
  qkv::attention_varlen_backward(q.buf.view(), k.buf.view(), v.buf.view(), out_v.view(), dout.buf.view(), lse_v.view(),
                                 g_v[0].view(), g_v[1].view(), g_v[2].view(), cu.view(), cu.view(), o);
  qkv::attention_backward(bhsd(q.buf), bhsd(k.buf), bhsd(v.buf), bhsd(out_b), bhsd(dout.buf), lse_b.view(), bhsd(g_b[0]),
                          bhsd(g_b[1]), bhsd(g_b[2]), o);
  // The backward cuts the keys into chunks by B · Hkv (per sequence in varlen), so dq's partial
  // sums may associate differently: f32 rounding of a few sums of |dq| ≲ 10, far below 1e-5.
  for (int x = 0; x < 3; ++x) EXPECT_LE(max_err(g_v[x], g_b[x]), 1e-5) << "gradient " << x;
}

TEST(DropoutValidation, POutsideZeroOneIsRefusedByName) {
  Buffer q(DType::f32, {1, 1, 2, 4}), out(DType::f32, {1, 1, 2, 4});
  for (double bad : {1.0, -0.1, 1.5, std::nan("")}) {
    AttentionOptions o = dropout_opts(bad, 0);
    try {
      qkv::attention(q.view(), q.view(), q.view(), out.view(), o);
      ADD_FAILURE() << "p = " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("qkv::attention"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("opt.dropout_p: must be in [0, 1)"), std::string::npos) << e.what();
    }
    Buffer m(DType::u8, {1, 1, 2, 2});
    EXPECT_THROW(qkv::dropout_mask(m.view(), bad, 0), std::invalid_argument);
  }
  Buffer wrong(DType::f32, {1, 1, 2, 2});
  EXPECT_THROW(qkv::dropout_mask(wrong.view(), 0.1, 0), std::invalid_argument);
}

}  // namespace
