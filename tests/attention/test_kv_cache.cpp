// qkv::AttentionKvCache (qkv/kv_cache.hpp): the owning KV cache, f32 / bf16 / f16 / i8, contiguous
// and paged, on every instruction set this CPU has.
//   - Storage: after batched and per-sequence appends and a reset, the rows a sequence holds (read
//     through the documented layout: block b · max_blocks + j / block_size) are its inputs, exactly
//     for f32, within half a step of the stored type otherwise (round to nearest): 2^-8 |x| for
//     bf16, 2^-11 |x| for f16 (normal range), scale / 2 for i8 with scale = max|x| / 127 per
//     (token, head), the scale recomputed here.
//   - attend = the f64 oracle (tests/support/naive_attention.hpp, one sequence at a time over its
//     own keys, causal from the bottom right) on the values stored, dequantised. Tolerances:
//     f32 queries 1e-5 (f32 sums of ≤ 70 terms of size ≤ 1: a few hundred ulps of slack);
//     i8 adds qkv/attention.hpp's int8 bound (q quantised to int8 per row, P·V weights to 15-bit
//     fixed point), computed here from the data, and Δ to the lse's; bf16 queries and
//     outputs 2^-6 of the largest output (q and out rounded to bf16, 2^-8 each, P rounded to bf16
//     on vdpbf16ps: FlashAttention's "2× the naive bf16 error" with a few ulps beside it).
//   - paged = contiguous, bit for bit (same rows, same order: test_kvcache.cpp's rule), for f32,
//     f16 and i8 with 16-row blocks.
//   - Bad input: named errors, and a refused append leaves the lengths as they were.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "qkv/kv_cache.hpp"
#include "support/expect_rejects.hpp"
#include "support/naive_attention.hpp"

namespace {

using qkv::AttentionKvCache;
using qkv::Buffer;
using qkv::DType;
using qkv::Isa;

struct IsaGuard {
  Isa saved = qkv::active_isa();
  ~IsaGuard() { qkv::set_isa(saved); }
};

constexpr std::int64_t B = 3, H = 4, Hkv = 2, D = 40, Dv = 24, kMaxLen = 70;

void fill(const Buffer& b, std::mt19937& g) {
  std::normal_distribution<double> nd(0.0, 1.0);
  for (std::int64_t e = 0; e < b.numel(); ++e) b.view().store(e, nd(g));
}

// Row j of sequence b (kv head hk, element e) of a cache tensor t, through the documented layout.
double stored(const AttentionKvCache& c, const qkv::View& t, std::int64_t b, std::int64_t j, std::int64_t hk,
              std::int64_t e) {
  if (c.block_size() == 0) return t.load(t.offset(b, j, hk, e));
  const std::int64_t max_blocks = (c.max_len() + c.block_size() - 1) / c.block_size();
  return t.load(t.offset(b * max_blocks + j / c.block_size(), j % c.block_size(), hk, e));
}
double stored_scale(const AttentionKvCache& c, const qkv::View& t, std::int64_t b, std::int64_t j, std::int64_t hk) {
  if (c.block_size() == 0) return t.load(t.offset(b, j, hk));
  const std::int64_t max_blocks = (c.max_len() + c.block_size() - 1) / c.block_size();
  return t.load(t.offset(b * max_blocks + j / c.block_size(), j % c.block_size(), hk));
}

// What each sequence should hold: rows [B][len][Hkv][X] of f64 inputs.
struct Expected {
  std::vector<std::vector<double>> k, v;  // per sequence, row-major [len, Hkv, D | Dv]
  std::int64_t len(std::int64_t b) const {
    return static_cast<std::int64_t>(k[static_cast<std::size_t>(b)].size()) / (Hkv * D);
  }
};

void push_rows(Expected& x, std::int64_t b, const Buffer& kn, const Buffer& vn, std::int64_t seq_in_kn) {
  const std::int64_t S = kn.shape()[kn.shape().size() == 4 ? 1 : 0];
  const auto& ks = kn.shape();
  for (std::int64_t t = 0; t < S; ++t) {
    for (std::int64_t hk = 0; hk < Hkv; ++hk)
      for (std::int64_t d = 0; d < D; ++d)
        x.k[static_cast<std::size_t>(b)].push_back(ks.size() == 4
                                                       ? kn.view().load(kn.view().offset(seq_in_kn, t, hk, d))
                                                       : kn.view().load(kn.view().offset(t, hk, d)));
    for (std::int64_t hk = 0; hk < Hkv; ++hk)
      for (std::int64_t e = 0; e < Dv; ++e)
        x.v[static_cast<std::size_t>(b)].push_back(ks.size() == 4
                                                       ? vn.view().load(vn.view().offset(seq_in_kn, t, hk, e))
                                                       : vn.view().load(vn.view().offset(t, hk, e)));
  }
}

// A cache filled by: a batched append of 5 rows; per-sequence appends of 30, 1 and 50 rows;
// reset of sequence 1 and 7 new rows for it; a batched append of 2 rows. Lengths 37, 9, 57.
struct Filled {
  AttentionKvCache cache;
  Expected want;
  Filled(DType t, std::int64_t block, unsigned seed) : cache(B, kMaxLen, Hkv, D, t, Dv, block) {
    std::mt19937 g(seed);
    want.k.resize(B), want.v.resize(B);
    auto batched = [&](std::int64_t S) {
      Buffer kn(DType::f32, {B, S, Hkv, D}), vn(DType::f32, {B, S, Hkv, Dv});
      fill(kn, g), fill(vn, g);
      cache.append(kn.view(), vn.view());
      for (std::int64_t b = 0; b < B; ++b) push_rows(want, b, kn, vn, b);
    };
    auto one = [&](std::int64_t b, std::int64_t S) {
      Buffer kn(DType::f32, {S, Hkv, D}), vn(DType::f32, {S, Hkv, Dv});
      fill(kn, g), fill(vn, g);
      cache.append_to(b, kn.view(), vn.view());
      push_rows(want, b, kn, vn, 0);
    };
    batched(5);
    one(0, 30), one(1, 1), one(2, 50);
    cache.reset(1);
    want.k[1].clear(), want.v[1].clear();
    one(1, 7);
    batched(2);
  }
};

// |stored − x| allowed for an input x of a row whose largest magnitude is amax.
double step(DType t, double x, double amax) {
  switch (t) {
    case DType::bf16:
      return std::abs(x) * 0x1p-8;
    case DType::f16:
      return std::abs(x) * 0x1p-11 + 0x1p-25;  // + half the smallest subnormal step
    case DType::i8:
      return amax / 127.0 / 2.0 * (1 + 1e-6);  // scale / 2 (scale is f32: a relative 1e-6)
    default:
      return 0.0;
  }
}

// The dequantised value the cache holds (i8: scale · int8).
double dequantised(const AttentionKvCache& c, bool key, std::int64_t b, std::int64_t j, std::int64_t hk,
                   std::int64_t e) {
  const qkv::KvCacheView v = c.view();
  const double x = stored(c, key ? v.k : v.v, b, j, hk, e);
  return c.dtype() == DType::i8 ? x * stored_scale(c, key ? *v.k_scale : *v.v_scale, b, j, hk) : x;
}

TEST(AttentionKvCache, StorageHoldsTheAppendedRows) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i8})
    for (std::int64_t block : {0, 4, 16}) {
      const Filled f(t, block, 7);
      const std::int64_t lens[B] = {37, 9, 57};
      double worst = 0.0;
      for (std::int64_t b = 0; b < B; ++b) {
        ASSERT_EQ(f.cache.length(b), lens[b]);
        ASSERT_EQ(f.want.len(b), lens[b]);
        EXPECT_EQ(f.cache.lengths().load(b), static_cast<double>(lens[b]));
        for (std::int64_t j = 0; j < lens[b]; ++j)
          for (std::int64_t hk = 0; hk < Hkv; ++hk)
            for (bool key : {true, false}) {
              const std::int64_t X = key ? D : Dv;
              const auto& src = key ? f.want.k[static_cast<std::size_t>(b)] : f.want.v[static_cast<std::size_t>(b)];
              double amax = 0.0;
              for (std::int64_t e = 0; e < X; ++e)
                amax = std::max(amax, std::abs(src[static_cast<std::size_t>((j * Hkv + hk) * X + e)]));
              for (std::int64_t e = 0; e < X; ++e) {
                const double x = src[static_cast<std::size_t>((j * Hkv + hk) * X + e)];
                const double err = std::abs(dequantised(f.cache, key, b, j, hk, e) - x);
                worst = std::max(worst, err);
                ASSERT_LE(err, step(t, x, amax))
                    << qkv::dtype_name(t) << " block " << block << " b " << b << " j " << j;
              }
            }
      }
      std::printf("%-5s block %2lld: largest |stored - appended| %.3g\n", qkv::dtype_name(t),
                  static_cast<long long>(block), worst);
    }
}

TEST(AttentionKvCache, AttendMatchesOracleOnStoredValues) {
  IsaGuard guard;
  const std::int64_t Sq = 3;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (isa > qkv::cpu_isa()) continue;
    qkv::set_isa(isa);
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i8})
      for (std::int64_t block : {0, 16})
        for (DType qt : {DType::f32, DType::bf16}) {
          if ((t == DType::f32 && qt != DType::f32) || (t == DType::bf16 && qt != DType::bf16)) continue;
          const Filled f(t, block, 11);
          std::mt19937 g(5);
          Buffer q(qt, {B, H, Sq, D}), out(qt, {B, H, Sq, Dv}), lse(DType::f32, {B, H, Sq});
          fill(q, g);
          const qkv::KernelInfo info =
              f.cache.attend(q.view(), out.view(), AttentionKvCache::causal_options(), lse.view());
          double err = 0.0, err_lse = 0.0, amax = 0.0;
          double qstep = 0.0, k1 = 0.0, vmax = 0.0;  // i8: the bound's max|q| / 127, max ‖k_j‖₁, max |v|
          for (std::int64_t b = 0; b < B; ++b) {
            // Sequence b alone over its len keys, as stored: the last query row at key len − 1.
            const std::int64_t len = f.cache.length(b);
            Buffer qb(DType::f64, {1, H, Sq, D}), kb(DType::f64, {1, Hkv, len, D}), vb(DType::f64, {1, Hkv, len, Dv});
            for (std::int64_t h = 0; h < H; ++h)
              for (std::int64_t i = 0; i < Sq; ++i)
                for (std::int64_t d = 0; d < D; ++d)
                  qb.view().store(qb.view().offset(0, h, i, d), q.view().load(q.view().offset(b, h, i, d)));
            for (std::int64_t j = 0; j < len; ++j)
              for (std::int64_t hk = 0; hk < Hkv; ++hk) {
                for (std::int64_t d = 0; d < D; ++d)
                  kb.view().store(kb.view().offset(0, hk, j, d), dequantised(f.cache, true, b, j, hk, d));
                for (std::int64_t e = 0; e < Dv; ++e)
                  vb.view().store(vb.view().offset(0, hk, j, e), dequantised(f.cache, false, b, j, hk, e));
                double n1 = 0.0;
                for (std::int64_t d = 0; d < D; ++d) n1 += std::abs(kb.view().load(kb.view().offset(0, hk, j, d)));
                k1 = std::max(k1, n1);
                for (std::int64_t e = 0; e < Dv; ++e) vmax = std::max(vmax, std::abs(vb.view().load(vb.view().offset(0, hk, j, e))));
              }
            for (std::int64_t h = 0; h < H; ++h)
              for (std::int64_t i = 0; i < Sq; ++i) {
                double m = 0.0;
                for (std::int64_t d = 0; d < D; ++d) m = std::max(m, std::abs(qb.view().load(qb.view().offset(0, h, i, d))));
                qstep = std::max(qstep, m / 127);
              }
            qkv::AttentionOptions o;
            o.causal = true;
            o.align = qkv::Align::bottom_right;
            const auto want = qkv::testing::naive_attention(qb.view(), kb.view(), vb.view(), o);
            for (std::int64_t h = 0; h < H; ++h)
              for (std::int64_t i = 0; i < Sq; ++i) {
                const std::size_t row = static_cast<std::size_t>(h * Sq + i);
                err_lse = std::max(err_lse, std::abs(lse.view().load(lse.view().offset(b, h, i)) - want.lse[row]));
                for (std::int64_t e = 0; e < Dv; ++e) {
                  const double w = want.out[row * Dv + static_cast<std::size_t>(e)];
                  amax = std::max(amax, std::abs(w));
                  err = std::max(err, std::abs(out.view().load(out.view().offset(b, h, i, e)) - w));
                }
              }
          }
          // i8: qkv/attention.hpp's bound, Δ = scale · d / 2 · max ‖k_j‖₁ (the lse moves by ≤ Δ).
          const double delta = t == DType::i8 ? qstep / 2 * (1 + 0x1p-14) * k1 / std::sqrt(static_cast<double>(D)) : 0.0;
          const double bound = t == DType::i8 ? (std::expm1(2 * delta) + 64.0 / 65534.0) * vmax : 0.0;
          const double tol = (qt == DType::bf16 ? 0x1p-6 * amax : 1e-5) + bound;
          const double tol_lse = (qt == DType::bf16 ? 1e-2 : 1e-5) + delta;
          std::printf("%-12s cache %-4s q %-4s block %2lld %-28s out %.2e (tol %.2e) lse %.2e (tol %.2e)\n",
                      qkv::isa_name(isa), qkv::dtype_name(t), qkv::dtype_name(qt), static_cast<long long>(block),
                      info.name, err, tol, err_lse, tol_lse);
          EXPECT_LE(err, tol) << qkv::isa_name(isa) << " " << qkv::dtype_name(t) << " " << qkv::dtype_name(qt) << " "
                              << block;
          EXPECT_LE(err_lse, tol_lse) << qkv::isa_name(isa) << " " << qkv::dtype_name(t) << " " << qkv::dtype_name(qt)
                                      << " " << block;
        }
  }
}

TEST(AttentionKvCache, PagedEqualsContiguousBitForBit) {
  IsaGuard guard;
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_bf16}) {
    if (isa > qkv::cpu_isa()) continue;
    qkv::set_isa(isa);
    for (DType t : {DType::f32, DType::f16, DType::i8}) {
      const Filled contiguous(t, 0, 3), paged(t, 16, 3);
      std::mt19937 g(9);
      Buffer q(DType::f32, {B, H, 1, D}), o1(DType::f32, {B, H, 1, Dv}), o2(DType::f32, {B, H, 1, Dv});
      fill(q, g);
      contiguous.cache.attend(q.view(), o1.view());
      paged.cache.attend(q.view(), o2.view());
      for (std::int64_t e = 0; e < o1.numel(); ++e)
        ASSERT_EQ(o1.ptr<float>()[e], o2.ptr<float>()[e])
            << qkv::isa_name(isa) << " " << qkv::dtype_name(t) << " element " << e;
    }
  }
}

TEST(AttentionKvCache, ValidationNamesArgumentAndValue) {
  using qkv::testing::expect_rejects;
  expect_rejects([] { AttentionKvCache(0, 8, 1, 4); }, {"qkv::AttentionKvCache", "batch: must be ≥ 1, got 0"});
  expect_rejects([] { AttentionKvCache(1, 8, 1, 4, DType::f64); },
                 {"qkv::AttentionKvCache", "dtype: must be f32, bf16, f16 or i8, got f64"});
  expect_rejects([] { AttentionKvCache(1, 8, 1, 4, DType::f32, 0, 12); },
                 {"block_size: must be 0 (contiguous) or a power of two, got 12"});
  expect_rejects([] { AttentionKvCache(1, 8, 1, 4, DType::f32, -1); }, {"value_dim: must be ≥ 0"});
  EXPECT_EQ(AttentionKvCache(1, 10, 1, 4, DType::f32, 0, 4).max_len(), 12);  // paged: 3 whole blocks of 4
  EXPECT_EQ(AttentionKvCache(1, 10, 1, 4).max_len(), 10);

  AttentionKvCache c(2, 8, 1, 4, DType::f32, 0, 4);
  Buffer k6(DType::f32, {2, 6, 1, 4}), k3(DType::f32, {2, 3, 1, 4}), bad(DType::f32, {2, 3, 1, 5});
  c.append(k6.view(), k6.view());
  expect_rejects([&] { c.append(k3.view(), k3.view()); },
                 {"qkv::kvcache_append", "pos[0] = 6: rows [pos, pos + 3) must lie in [0, Skv = 8)"});
  EXPECT_EQ(c.length(0), 6);  // refused: nothing appended
  EXPECT_EQ(c.length(1), 6);
  expect_rejects([&] { c.append(bad.view(), bad.view()); },
                 {"qkv::AttentionKvCache::append", "D = 4", "got k_new [2, 3, 1, 5]"});
  Buffer r2(DType::f32, {2, 1, 4}), r3(DType::f32, {3, 1, 4});
  c.reset(1);
  c.append_to(1, r3.view(), r3.view());
  EXPECT_EQ(c.length(0), 6);
  EXPECT_EQ(c.length(1), 3);
  expect_rejects(
      [&] { c.append_to(0, r3.view(), r3.view()); },
      {"qkv::AttentionKvCache::append_to", "k_new: 3 new rows for sequence 0, which holds 6 of at most max_len = 8"});
  expect_rejects([&] { c.append_to(2, r2.view(), r2.view()); },
                 {"qkv::AttentionKvCache::append_to", "b = 2: must be in [0, batch = 2)"});
  expect_rejects([&] { c.append_to(0, k3.view(), k3.view()); },
                 {"qkv::AttentionKvCache::append_to", "expected [Snew, Hkv = 1, D = 4]"});
  expect_rejects([&] { (void)c.length(-1); }, {"qkv::AttentionKvCache::length", "b = -1"});
  expect_rejects([&] { c.reset(5); }, {"qkv::AttentionKvCache::reset", "b = 5"});

  Buffer q(DType::f32, {2, 2, 1, 4}), out(DType::f32, {2, 2, 1, 4}), q1(DType::f32, {1, 2, 1, 4}), kl(DType::i64, {2});
  qkv::AttentionOptions o = AttentionKvCache::causal_options();
  o.key_lengths = kl.view();
  expect_rejects([&] { c.attend(q.view(), out.view(), o); },
                 {"qkv::AttentionKvCache::attend", "opt.key_lengths: must be unset"});
  expect_rejects([&] { c.attend(q1.view(), out.view()); },
                 {"qkv::AttentionKvCache::attend", "q: expected [B = 2, H, Sq, D], got [1, 2, 1, 4]"});
  Buffer qb(DType::bf16, {2, 2, 1, 4}), ob(DType::bf16, {2, 2, 1, 4});
  expect_rejects([&] { c.attend(qb.view(), ob.view()); },
                 {"qkv::attention_kvcache", "cache.k: dtype must be q's (bf16)"});
  c.reset();
  EXPECT_EQ(c.length(0), 0);
  EXPECT_EQ(c.length(1), 0);
  // A cache with no tokens: every row sees no key, so out = 0 (qkv/attention.hpp).
  std::fill(out.ptr<float>(), out.ptr<float>() + out.numel(), 1.0f);
  c.attend(q.view(), out.view());
  for (std::int64_t e = 0; e < out.numel(); ++e) EXPECT_EQ(out.ptr<float>()[e], 0.0f);
}

}  // namespace
