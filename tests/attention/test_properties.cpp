// Properties attention must have whatever kernel runs it: rows of the pattern sum to 1, masked
// entries are exactly 0, self-attention without a mask is permutation-equivariant, a causal output
// ignores later tokens, GQA equals repeated kv heads, awkward sizes and strided views give the
// naive oracle's answer, varlen equals per-sequence calls, and the backward matches f64 central
// finite differences. Each property runs on the reference kernel and on whatever `automatic`
// picks (the fast kernels, once they exist).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "support/core_testing.hpp"
#include "support/naive_attention.hpp"

namespace {

using qkv::Align;
using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::Kernel;
using qkv::View;
using qkv::testing::fill_normal;
using qkv::testing::max_abs_diff;
using qkv::testing::max_err;
using qkv::testing::naive_attention;

// f32 inputs, f32 outputs, O(1) values: the reference errs only by the final f32 rounding (≤ 2.4e-7
// relative); a fast f32 kernel accumulates in f32 over ≤ a few hundred terms, which the FlashAttention
// rule (≤ ~2× a naive f32 computation) keeps well under 1e-5 for these sizes.
double tol_for(Kernel k) { return k == Kernel::reference ? 1e-6 : 1e-5; }

class Properties : public ::testing::TestWithParam<Kernel> {
 protected:
  AttentionOptions opts() const {
    AttentionOptions o;
    o.kernel = GetParam();
    return o;
  }
};

TEST_P(Properties, PatternRowsSumToOneAndMaskedEntriesAreZero) {
  const std::int64_t B = 2, H = 4, Hkv = 2, Sq = 9, Skv = 11, D = 8;
  Buffer q(DType::f32, {B, H, Sq, D}), k(DType::f32, {B, Hkv, Skv, D}), v(DType::f32, {B, Hkv, Skv, D}),
      out(DType::f32, {B, H, Sq, D}), pat(DType::f32, {B, H, Sq, Skv}), mask(DType::u8, {B, 1, Sq, Skv});
  fill_normal(q, 1);
  fill_normal(k, 2);
  fill_normal(v, 3);
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.ptr<std::uint8_t>()[i] = (i * 13 + 5) % 7 != 0;
  AttentionOptions opt = opts();
  opt.causal = true;
  opt.align = Align::bottom_right;
  opt.mask = mask.view();
  qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, std::nullopt, pat.view());
  double worst_sum = 0.0;
  int masked_seen = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Sq; ++i) {
        double sum = 0.0;
        bool any = false;
        for (std::int64_t j = 0; j < Skv; ++j) {
          const float p = pat.ptr<float>()[((b * H + h) * Sq + i) * Skv + j];
          const bool allowed = j <= i + Skv - Sq && mask.ptr<std::uint8_t>()[(b * Sq + i) * Skv + j] != 0;
          if (!allowed) {
            EXPECT_EQ(p, 0.0f) << "masked entry b " << b << " h " << h << " i " << i << " j " << j;
            ++masked_seen;
          }
          any = any || allowed;
          sum += p;
        }
        if (any) worst_sum = std::max(worst_sum, std::abs(sum - 1.0));
      }
  std::printf("max |row sum − 1| = %.3g over %d masked entries checked\n", worst_sum, masked_seen);
  EXPECT_GT(masked_seen, 0);
  EXPECT_LT(worst_sum, 1e-5);  // 11 f32 probabilities, each rounded (2^-24), summed in f64: ≪ 1e-5
}

TEST_P(Properties, SelfAttentionIsPermutationEquivariant) {
  // Permuting the tokens (rows of q, k, v alike) permutes the output rows the same way.
  const std::int64_t B = 1, H = 3, S = 10, D = 5;
  Buffer q(DType::f32, {B, H, S, D}), k(DType::f32, {B, H, S, D}), v(DType::f32, {B, H, S, D}), out(DType::f32, {B, H, S, D});
  Buffer qp(DType::f32, {B, H, S, D}), kp(DType::f32, {B, H, S, D}), vp(DType::f32, {B, H, S, D}), outp(DType::f32, {B, H, S, D});
  fill_normal(q, 4);
  fill_normal(k, 5);
  fill_normal(v, 6);
  std::vector<std::int64_t> perm(S);
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.begin() + 4);
  std::rotate(perm.begin() + 4, perm.begin() + 7, perm.end());  // a permutation with no fixed structure
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t d = 0; d < D; ++d) {
        const std::int64_t to = (h * S + s) * D + d, from = (h * S + perm[static_cast<std::size_t>(s)]) * D + d;
        qp.ptr<float>()[to] = q.ptr<float>()[from];
        kp.ptr<float>()[to] = k.ptr<float>()[from];
        vp.ptr<float>()[to] = v.ptr<float>()[from];
      }
  qkv::attention(q.view(), k.view(), v.view(), out.view(), opts());
  qkv::attention(qp.view(), kp.view(), vp.view(), outp.view(), opts());
  double err = 0.0;
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t d = 0; d < D; ++d)
        err = std::max(err, static_cast<double>(std::abs(outp.ptr<float>()[(h * S + s) * D + d] -
                                                         out.ptr<float>()[(h * S + perm[static_cast<std::size_t>(s)]) * D + d])));
  std::printf("max |out(permuted) − permuted(out)| = %.3g\n", err);
  EXPECT_LT(err, tol_for(GetParam()));  // the same sums in another order: rounding only
}

TEST_P(Properties, CausalOutputIgnoresLaterTokens) {
  const std::int64_t B = 2, H = 2, S = 12, D = 6;
  Buffer q(DType::f32, {B, H, S, D}), k(DType::f32, {B, H, S, D}), v(DType::f32, {B, H, S, D}), out1(DType::f32, {B, H, S, D}),
      out2(DType::f32, {B, H, S, D});
  fill_normal(q, 7);
  fill_normal(k, 8);
  fill_normal(v, 9);
  AttentionOptions opt = opts();
  opt.causal = true;
  qkv::attention(q.view(), k.view(), v.view(), out1.view(), opt);
  const std::int64_t cut = 5;  // change every token after position 5
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = cut + 1; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t at = ((b * H + h) * S + s) * D + d;
          q.ptr<float>()[at] += 3.0f;
          k.ptr<float>()[at] -= 2.0f;
          v.ptr<float>()[at] *= -5.0f;
        }
  qkv::attention(q.view(), k.view(), v.view(), out2.view(), opt);
  double before = 0.0, after = 0.0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t at = ((b * H + h) * S + s) * D + d;
          const double diff = std::abs(out1.ptr<float>()[at] - out2.ptr<float>()[at]);
          (s <= cut ? before : after) = std::max(s <= cut ? before : after, diff);
        }
  std::printf("max change of outputs 0..%lld: %.3g (later outputs changed by up to %.3g)\n", static_cast<long long>(cut), before,
              after);
  EXPECT_EQ(before, 0.0);  // a masked key contributes an exact 0; the same allowed keys give the same bits
  EXPECT_GT(after, 0.1);
}

TEST_P(Properties, GroupedQueryEqualsRepeatedKvHeads) {
  // H = 6 on Hkv = 2, against (a) k, v with each kv head copied 3 times and (b) a stride-0 view that
  // repeats them without copying (MQA when Hkv = 1 is the same code path with group = H).
  for (std::int64_t Hkv : {2, 1}) {
    const std::int64_t B = 2, H = 6, Sq = 5, Skv = 7, D = 4, Dv = 3, G = H / Hkv;
    Buffer q(DType::f32, {B, H, Sq, D}), k(DType::f32, {B, Hkv, Skv, D}), v(DType::f32, {B, Hkv, Skv, Dv}),
        kr(DType::f32, {B, H, Skv, D}), vr(DType::f32, {B, H, Skv, Dv});
    Buffer o1(DType::f32, {B, H, Sq, Dv}), o2(DType::f32, {B, H, Sq, Dv}), o3(DType::f32, {B, H, Sq, Dv});
    fill_normal(q, 10);
    fill_normal(k, 11);
    fill_normal(v, 12);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h) {
        std::copy_n(k.ptr<float>() + (b * Hkv + h / G) * Skv * D, Skv * D, kr.ptr<float>() + (b * H + h) * Skv * D);
        std::copy_n(v.ptr<float>() + (b * Hkv + h / G) * Skv * Dv, Skv * Dv, vr.ptr<float>() + (b * H + h) * Skv * Dv);
      }
    AttentionOptions opt = opts();
    opt.causal = true;
    opt.align = Align::bottom_right;
    qkv::attention(q.view(), k.view(), v.view(), o1.view(), opt);
    qkv::attention(q.view(), kr.view(), vr.view(), o2.view(), opt);
    double e3 = 0.0;
    if (Hkv == 1) {  // MQA: one kv head seen by all H query heads through a stride-0 head dimension
      const View k0 = View::strided(k.data(), DType::f32, {B, H, Skv, D}, {Skv * D, 0, D, 1});
      const View v0 = View::strided(v.data(), DType::f32, {B, H, Skv, Dv}, {Skv * Dv, 0, Dv, 1});
      qkv::attention(q.view(), k0, v0, o3.view(), opt);
      e3 = max_abs_diff(o1.view(), o3.view());
    }
    const double e2 = max_abs_diff(o1.view(), o2.view());
    std::printf("Hkv %lld: max |GQA − repeated| = %.3g, |GQA − stride-0 view| = %.3g\n", static_cast<long long>(Hkv), e2, e3);
    EXPECT_LT(e2, tol_for(GetParam()));  // same arithmetic; a fast kernel may tile GQA differently
    EXPECT_LT(e3, tol_for(GetParam()));
  }
}

TEST_P(Properties, AwkwardSizesMatchNaiveOracle) {
  struct Size {
    std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  };
  const Size sizes[] = {
      {1, 1, 1, 1, 1, 1, 1},   {1, 1, 1, 1, 13, 1, 1},  {1, 2, 1, 13, 1, 3, 5},  {3, 5, 5, 7, 7, 1, 1},
      {2, 3, 1, 11, 17, 17, 3}, {1, 2, 2, 31, 29, 13, 7}, {1, 1, 1, 67, 71, 33, 31}, {2, 4, 2, 5, 3, 129, 65},
  };
  std::uint64_t seed = 20;
  for (const Size& z : sizes)
    for (bool causal : {false, true}) {
      SCOPED_TRACE(testing::Message() << "B " << z.B << " H " << z.H << " Hkv " << z.Hkv << " Sq " << z.Sq << " Skv " << z.Skv
                                      << " D " << z.D << " Dv " << z.Dv << (causal ? " causal" : ""));
      Buffer q(DType::f32, {z.B, z.H, z.Sq, z.D}), k(DType::f32, {z.B, z.Hkv, z.Skv, z.D}), v(DType::f32, {z.B, z.Hkv, z.Skv, z.Dv}),
          out(DType::f32, {z.B, z.H, z.Sq, z.Dv}), lse(DType::f32, {z.B, z.H, z.Sq});
      fill_normal(q, ++seed);
      fill_normal(k, ++seed);
      fill_normal(v, ++seed);
      AttentionOptions opt = opts();
      opt.causal = causal;
      qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
      const auto want = naive_attention(q.view(), k.view(), v.view(), opt);
      const double e = max_err(out.view(), want.out), el = max_err(lse.view(), want.lse);
      std::printf("B%lld H%lld/%lld Sq%lld Skv%lld D%lld Dv%lld%s: max error out %.3g lse %.3g\n", static_cast<long long>(z.B),
                  static_cast<long long>(z.H), static_cast<long long>(z.Hkv), static_cast<long long>(z.Sq),
                  static_cast<long long>(z.Skv), static_cast<long long>(z.D), static_cast<long long>(z.Dv), causal ? " causal" : "", e, el);
      EXPECT_LT(e, tol_for(GetParam()));
      EXPECT_LT(el, 1e-5);  // lse ≈ up to ~10 in size, stored as f32 (relative 6e-8), plus f32 accumulation
    }
}

TEST_P(Properties, StridedViewsEqualContiguous) {
  // q as a transposed [B, Sq, H, D] buffer, k inside a padded buffer (row stride D + 3), v with its
  // head dimension outermost, out written through a transposed view: same numbers as contiguous.
  const std::int64_t B = 2, H = 3, Sq = 6, Skv = 9, D = 5, Dv = 4, P = D + 3;
  Buffer qt(DType::f32, {B, Sq, H, D}), kpad(DType::f32, {B, H, Skv, P}), vh(DType::f32, {H, B, Skv, Dv}),
      ot(DType::f32, {B, Sq, H, Dv});
  Buffer q(DType::f32, {B, H, Sq, D}), k(DType::f32, {B, H, Skv, D}), v(DType::f32, {B, H, Skv, Dv}), o(DType::f32, {B, H, Sq, Dv});
  fill_normal(qt, 30);
  fill_normal(kpad, 31);
  fill_normal(vh, 32);
  const View qs = View::strided(qt.data(), DType::f32, {B, H, Sq, D}, {Sq * H * D, D, H * D, 1});
  const View ks = View::strided(kpad.data(), DType::f32, {B, H, Skv, D}, {H * Skv * P, Skv * P, P, 1});
  const View vs = View::strided(vh.data(), DType::f32, {B, H, Skv, Dv}, {Skv * Dv, B * Skv * Dv, Dv, 1});
  const View os = View::strided(ot.data(), DType::f32, {B, H, Sq, Dv}, {Sq * H * Dv, Dv, H * Dv, 1});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t s = 0; s < Sq; ++s)
        for (std::int64_t d = 0; d < D; ++d) q.ptr<float>()[((b * H + h) * Sq + s) * D + d] = qs.ptr<float>()[qs.offset(b, h, s, d)];
      for (std::int64_t s = 0; s < Skv; ++s) {
        for (std::int64_t d = 0; d < D; ++d) k.ptr<float>()[((b * H + h) * Skv + s) * D + d] = ks.ptr<float>()[ks.offset(b, h, s, d)];
        for (std::int64_t d = 0; d < Dv; ++d) v.ptr<float>()[((b * H + h) * Skv + s) * Dv + d] = vs.ptr<float>()[vs.offset(b, h, s, d)];
      }
    }
  AttentionOptions opt = opts();
  opt.causal = true;
  opt.align = Align::bottom_right;
  qkv::attention(qs, ks, vs, os, opt);
  qkv::attention(q.view(), k.view(), v.view(), o.view(), opt);
  const double err = max_abs_diff(os, o.view());
  std::printf("max |strided − contiguous| = %.3g\n", err);
  EXPECT_LT(err, tol_for(GetParam()));  // a fast kernel may pack strided inputs into other tiles
}

TEST_P(Properties, VarlenEqualsPerSequenceCalls) {
  // Three sequences packed: (Sq, Skv) = (3, 5), (0, 2), (6, 4); causal bottom-right per sequence, GQA.
  const std::int64_t H = 4, Hkv = 2, D = 6, Dv = 5;
  const std::vector<std::int64_t> cq = {0, 3, 3, 9}, ck = {0, 5, 7, 11};
  const std::int64_t Tq = cq.back(), Tk = ck.back();
  Buffer q(DType::f32, {Tq, H, D}), k(DType::f32, {Tk, Hkv, D}), v(DType::f32, {Tk, Hkv, Dv}), out(DType::f32, {Tq, H, Dv}),
      lse(DType::f32, {H, Tq}), cu_q(DType::i32, {4}), cu_k(DType::i64, {4});
  for (int i = 0; i < 4; ++i) {
    cu_q.ptr<std::int32_t>()[i] = static_cast<std::int32_t>(cq[static_cast<std::size_t>(i)]);
    cu_k.ptr<std::int64_t>()[i] = ck[static_cast<std::size_t>(i)];
  }
  fill_normal(q, 40);
  fill_normal(k, 41);
  fill_normal(v, 42);
  AttentionOptions opt = opts();
  opt.causal = true;
  opt.align = Align::bottom_right;
  qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cu_q.view(), cu_k.view(), opt, lse.view());
  double err = 0.0, err_lse = 0.0;
  for (std::size_t b = 0; b + 1 < cq.size(); ++b) {
    const std::int64_t q0 = cq[b], lq = cq[b + 1] - q0, k0 = ck[b], lk = ck[b + 1] - k0;
    if (lq == 0) continue;
    Buffer qb(DType::f32, {1, H, lq, D}), kb(DType::f32, {1, Hkv, lk, D}), vb(DType::f32, {1, Hkv, lk, Dv}),
        ob(DType::f32, {1, H, lq, Dv}), lb(DType::f32, {1, H, lq});
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < lq; ++s)
        for (std::int64_t d = 0; d < D; ++d) qb.ptr<float>()[(h * lq + s) * D + d] = q.ptr<float>()[((q0 + s) * H + h) * D + d];
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t s = 0; s < lk; ++s) {
        for (std::int64_t d = 0; d < D; ++d) kb.ptr<float>()[(h * lk + s) * D + d] = k.ptr<float>()[((k0 + s) * Hkv + h) * D + d];
        for (std::int64_t d = 0; d < Dv; ++d) vb.ptr<float>()[(h * lk + s) * Dv + d] = v.ptr<float>()[((k0 + s) * Hkv + h) * Dv + d];
      }
    qkv::attention(qb.view(), kb.view(), vb.view(), ob.view(), opt, lb.view());
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t s = 0; s < lq; ++s) {
        for (std::int64_t d = 0; d < Dv; ++d)
          err = std::max(err, static_cast<double>(std::abs(ob.ptr<float>()[(h * lq + s) * Dv + d] - out.ptr<float>()[((q0 + s) * H + h) * Dv + d])));
        const float a = lb.ptr<float>()[h * lq + s], c = lse.ptr<float>()[h * Tq + q0 + s];
        if (a != c) err_lse = std::max(err_lse, static_cast<double>(std::abs(a - c)));
      }
  }
  std::printf("max |varlen − per-sequence| out %.3g lse %.3g\n", err, err_lse);
  EXPECT_LT(err, tol_for(GetParam()));  // the same rows through the same kernel; a fast one may tile packed rows otherwise
  EXPECT_LT(err_lse, tol_for(GetParam()));
}

TEST_P(Properties, VarlenBackwardEqualsPerSequenceReference) {
  // Four sequences packed: (Sq, Skv) = (3, 5), (0, 2), (6, 4), (70, 75); causal bottom-right, GQA.
  // Oracle: each sequence copied out to a dense [1, H, S, D] call of the f64 reference backward.
  const std::int64_t H = 4, Hkv = 2, D = 6, Dv = 5;
  const std::vector<std::int64_t> cq = {0, 3, 3, 9, 79}, ck = {0, 5, 7, 11, 86};
  const std::int64_t Tq = cq.back(), Tk = ck.back(), n = static_cast<std::int64_t>(cq.size());
  Buffer q(DType::f32, {Tq, H, D}), k(DType::f32, {Tk, Hkv, D}), v(DType::f32, {Tk, Hkv, Dv}), out(DType::f32, {Tq, H, Dv}),
      dout(DType::f32, {Tq, H, Dv}), lse(DType::f32, {H, Tq}), dq(DType::f32, {Tq, H, D}), dk(DType::f32, {Tk, Hkv, D}),
      dv(DType::f32, {Tk, Hkv, Dv}), cu_q(DType::i64, {n}), cu_k(DType::i32, {n});
  for (std::int64_t i = 0; i < n; ++i) {
    cu_q.ptr<std::int64_t>()[i] = cq[static_cast<std::size_t>(i)];
    cu_k.ptr<std::int32_t>()[i] = static_cast<std::int32_t>(ck[static_cast<std::size_t>(i)]);
  }
  fill_normal(q, 50);
  fill_normal(k, 51);
  fill_normal(v, 52);
  fill_normal(dout, 53);
  fill_normal(dk, 54);  // garbage: every element must be overwritten (the keys of the empty sequence by zeros)
  fill_normal(dv, 55);
  AttentionOptions opt = opts();
  opt.causal = true;
  opt.align = Align::bottom_right;
  qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cu_q.view(), cu_k.view(), opt, lse.view());
  qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                                 dv.view(), cu_q.view(), cu_k.view(), opt);
  // Packed rows [t0, t0 + len) of [T, heads, X] <-> a dense [1, heads, len, X] buffer.
  auto gather = [](const Buffer& t, std::int64_t t0, std::int64_t len) {
    const std::int64_t heads = t.shape()[1], X = t.shape()[2];
    Buffer d(DType::f32, {1, heads, len, X});
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < len; ++s)
        for (std::int64_t x = 0; x < X; ++x) d.ptr<float>()[(h * len + s) * X + x] = t.ptr<float>()[((t0 + s) * heads + h) * X + x];
    return d;
  };
  auto diff = [](const Buffer& dense, const Buffer& t, std::int64_t t0, std::int64_t len) {
    const std::int64_t heads = t.shape()[1], X = t.shape()[2];
    double e = 0.0;
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t s = 0; s < len; ++s)
        for (std::int64_t x = 0; x < X; ++x)
          e = std::max(e, static_cast<double>(std::abs(dense.ptr<float>()[(h * len + s) * X + x] -
                                                       t.ptr<float>()[((t0 + s) * heads + h) * X + x])));
    return e;
  };
  AttentionOptions ref = opt;
  ref.kernel = Kernel::reference;
  double err_q = 0.0, err_k = 0.0, err_v = 0.0, max_g = 0.0;
  for (std::size_t b = 0; b + 1 < cq.size(); ++b) {
    const std::int64_t q0 = cq[b], lq = cq[b + 1] - q0, k0 = ck[b], lk = ck[b + 1] - k0;
    if (lq == 0) {  // no query reads these keys: their gradients are exactly zero
      for (std::int64_t i = k0 * Hkv * D; i < (k0 + lk) * Hkv * D; ++i) EXPECT_EQ(dk.ptr<float>()[i], 0.0f);
      for (std::int64_t i = k0 * Hkv * Dv; i < (k0 + lk) * Hkv * Dv; ++i) EXPECT_EQ(dv.ptr<float>()[i], 0.0f);
      continue;
    }
    const Buffer qb = gather(q, q0, lq), kb = gather(k, k0, lk), vb = gather(v, k0, lk), gb = gather(dout, q0, lq);
    Buffer ob(DType::f32, {1, H, lq, Dv}), lb(DType::f32, {1, H, lq}), dqb(DType::f32, {1, H, lq, D}),
        dkb(DType::f32, {1, Hkv, lk, D}), dvb(DType::f32, {1, Hkv, lk, Dv});
    qkv::attention(qb.view(), kb.view(), vb.view(), ob.view(), ref, lb.view());
    qkv::attention_backward(qb.view(), kb.view(), vb.view(), ob.view(), gb.view(), lb.view(), dqb.view(), dkb.view(),
                            dvb.view(), ref);
    err_q = std::max(err_q, diff(dqb, dq, q0, lq));
    err_k = std::max(err_k, diff(dkb, dk, k0, lk));
    err_v = std::max(err_v, diff(dvb, dv, k0, lk));
    for (const Buffer* g : {&dqb, &dkb, &dvb})
      for (std::int64_t i = 0; i < g->numel(); ++i) max_g = std::max(max_g, static_cast<double>(std::abs(g->ptr<float>()[i])));
  }
  std::printf("max |varlen backward − per-sequence reference| dq %.3g dk %.3g dv %.3g (max |grad| %.3g)\n", err_q, err_k,
              err_v, max_g);
  // f32 outputs of an f64 computation vs fp32 tiles summing up to 75 keys: the gradients reach ~4,
  // so 1e-4 is a few hundred ulps of their size and far below any wrong row or sequence (1.2e-6 seen).
  const double tol = GetParam() == Kernel::reference ? 1e-6 : 1e-4;
  EXPECT_LT(err_q, tol);
  EXPECT_LT(err_k, tol);
  EXPECT_LT(err_v, tol);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Properties, ::testing::Values(Kernel::reference, Kernel::automatic),
                         [](const auto& param_info) { return std::string(qkv::kernel_name(param_info.param)); });

// ---------------------------------------------------------------------------------------------
// Backward against f64 central finite differences of L = Σ out ⊙ w (so dout = w).
// ---------------------------------------------------------------------------------------------
struct GradCase {
  const char* name;
  std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  bool causal;
  Align align;
  bool additive_mask, key_lengths;
};

TEST(Backward, ReferenceMatchesCentralDifferences) {
  const GradCase cases[] = {
      {"plain", 1, 2, 2, 3, 4, 3, 2, false, Align::top_left, false, false},
      {"gqa_causal_br", 2, 4, 2, 3, 5, 2, 3, true, Align::bottom_right, false, false},
      {"mask_keylen", 2, 2, 1, 4, 4, 3, 3, true, Align::top_left, true, true},
  };
  std::uint64_t seed = 50;
  for (const GradCase& c : cases) {
    SCOPED_TRACE(c.name);
    Buffer q(DType::f64, {c.B, c.H, c.Sq, c.D}), k(DType::f64, {c.B, c.Hkv, c.Skv, c.D}), v(DType::f64, {c.B, c.Hkv, c.Skv, c.Dv}),
        out(DType::f64, {c.B, c.H, c.Sq, c.Dv}), w(DType::f64, {c.B, c.H, c.Sq, c.Dv}), lse(DType::f32, {c.B, c.H, c.Sq});
    Buffer dq(DType::f64, {c.B, c.H, c.Sq, c.D}), dk(DType::f64, {c.B, c.Hkv, c.Skv, c.D}), dv(DType::f64, {c.B, c.Hkv, c.Skv, c.Dv});
    fill_normal(q, ++seed);
    fill_normal(k, ++seed);
    fill_normal(v, ++seed);
    fill_normal(w, ++seed);
    AttentionOptions opt;
    opt.kernel = Kernel::reference;
    opt.causal = c.causal;
    opt.align = c.align;
    Buffer mask(DType::f64, {c.Sq, c.Skv}), kl(DType::i32, {c.B});
    if (c.additive_mask) {
      fill_normal(mask, ++seed);
      opt.mask = mask.view();
    }
    if (c.key_lengths) {
      for (std::int64_t b = 0; b < c.B; ++b) kl.ptr<std::int32_t>()[b] = static_cast<std::int32_t>(c.Skv - 1 - b);
      opt.key_lengths = kl.view();
    }
    qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
    qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), w.view(), lse.view(), dq.view(), dk.view(), dv.view(), opt);
    auto loss = [&] {
      Buffer o(DType::f64, {c.B, c.H, c.Sq, c.Dv});
      qkv::attention(q.view(), k.view(), v.view(), o.view(), opt);
      double s = 0.0;
      for (std::int64_t i = 0; i < o.numel(); ++i) s += o.ptr<double>()[i] * w.ptr<double>()[i];
      return s;
    };
    // Step 1e-5: truncation error ~h²·|f'''| ≈ 1e-10, rounding ~1e-16/h ≈ 1e-11; 1e-7 leaves room for both.
    const double h = 1e-5, tol = 1e-7;
    double worst = 0.0;
    for (auto [name, x, g] : {std::tuple{"dq", &q, &dq}, std::tuple{"dk", &k, &dk}, std::tuple{"dv", &v, &dv}}) {
      double e = 0.0;
      for (std::int64_t i = 0; i < x->numel(); ++i) {
        double& xi = x->ptr<double>()[i];
        const double x0 = xi;
        xi = x0 + h;
        const double lp = loss();
        xi = x0 - h;
        const double lm = loss();
        xi = x0;
        e = std::max(e, std::abs((lp - lm) / (2 * h) - g->ptr<double>()[i]));
      }
      std::printf("%-14s %s: max |analytic − central difference| = %.3g\n", c.name, name, e);
      worst = std::max(worst, e);
    }
    EXPECT_LT(worst, tol);
  }
}

TEST(Backward, F32AndBf16AgreeWithF64) {
  // The same call in f32 and bf16 against f64 on the rounded inputs: the reference computes in f64 and
  // only the stored gradients round (f32: 2^-24 relative, bf16: 2^-9 relative on |g| ≲ 4).
  const std::int64_t B = 1, H = 2, Hkv = 1, Sq = 5, Skv = 6, D = 4, Dv = 3;
  for (DType t : {DType::f32, DType::bf16}) {
    Buffer q(t, {B, H, Sq, D}), k(t, {B, Hkv, Skv, D}), v(t, {B, Hkv, Skv, Dv}), out(t, {B, H, Sq, Dv}), dout(t, {B, H, Sq, Dv}),
        lse(DType::f32, {B, H, Sq}), dq(t, {B, H, Sq, D}), dk(t, {B, Hkv, Skv, D}), dv(t, {B, Hkv, Skv, Dv});
    Buffer q8(DType::f64, {B, H, Sq, D}), k8(DType::f64, {B, Hkv, Skv, D}), v8(DType::f64, {B, Hkv, Skv, Dv}), o8(DType::f64, {B, H, Sq, Dv}),
        do8(DType::f64, {B, H, Sq, Dv}), dq8(DType::f64, {B, H, Sq, D}), dk8(DType::f64, {B, Hkv, Skv, D}), dv8(DType::f64, {B, Hkv, Skv, Dv});
    fill_normal(q, 60);
    fill_normal(k, 61);
    fill_normal(v, 62);
    fill_normal(dout, 63);
    for (auto [lo, hi] : {std::pair{&q, &q8}, std::pair{&k, &k8}, std::pair{&v, &v8}, std::pair{&dout, &do8}})
      for (std::int64_t i = 0; i < lo->numel(); ++i) hi->ptr<double>()[i] = lo->view().load(i);
    AttentionOptions opt;
    opt.causal = true;
    opt.kernel = Kernel::reference;
    qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
    qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv.view(), opt);
    qkv::attention(q8.view(), k8.view(), v8.view(), o8.view(), opt, lse.view());
    qkv::attention_backward(q8.view(), k8.view(), v8.view(), o8.view(), do8.view(), lse.view(), dq8.view(), dk8.view(), dv8.view(), opt);
    const double e = std::max({max_abs_diff(dq.view(), dq8.view()), max_abs_diff(dk.view(), dk8.view()), max_abs_diff(dv.view(), dv8.view())});
    std::printf("%s backward: max |g − g(f64)| = %.3g\n", qkv::dtype_name(t), e);
    EXPECT_LT(e, t == DType::f32 ? 1e-6 : 2e-2);
  }
}

}  // namespace
