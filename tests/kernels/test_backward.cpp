// The fast attention backward (Kernel::flash) against independent values:
//   - the f64 reference backward (analytic gradient, recomputed in f64 from q, k, v),
//   - a naive backward in the kernel's own precision written here (the FlashAttention rule:
//     the fast kernel may err at most 2× as much as the naive one, both measured against f64,
//     plus a small floor); for bf16 on avx512_bf16 (vdpbf16ps tiles) the naive one also rounds
//     P and dS to bf16 before the gradient products, as those tiles do,
//   - f64 central finite differences of the reference forward,
// on every instruction set this CPU has (set_isa), f32 and bf16, with every option of the
// forward and awkward shapes; and bit identity across thread counts.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::Align;
using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::testing::IsaGuard;
using qkv::testing::RoundedTensor;
using qkv::testing::isas;
using qkv::testing::round_to;
using qkv::Isa;
using qkv::View;

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class MaskKind { none, boolean, additive };

struct Case {
  Case(const char* n, std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t sq, std::int64_t skv,
       std::int64_t d, std::int64_t dv, bool causal_ = false, Align align_ = Align::top_left)
      : name(n), B(b), H(h), Hkv(hkv), Sq(sq), Skv(skv), D(d), Dv(dv), causal(causal_), align(align_) {}
  const char* name;
  std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  bool causal = false;
  Align align = Align::top_left;
  std::int64_t window_left = -1, window_right = -1;
  MaskKind mask = MaskKind::none;
  bool mask_per_head = false;          // mask [B, H, Sq, Skv] instead of [Sq, Skv]
  std::vector<std::int64_t> key_lengths;  // empty: none
};


double max_abs(const Buffer& a) {
  double m = 0.0;
  for (std::int64_t e = 0; e < a.numel(); ++e) m = std::max(m, std::abs(a.view().load(e)));
  return m;
}
double max_err(const Buffer& a, const Buffer& ref) {
  double m = 0.0;
  for (std::int64_t e = 0; e < a.numel(); ++e) {
    const double x = a.view().load(e), r = ref.view().load(e);
    if (std::isnan(x)) return kInf;
    m = std::max(m, std::abs(x - r));
  }
  return m;
}

// Everything one case needs: inputs in the tested dtype, the forward's out and lse, options.
struct Problem {
  Case c;
  DType t;
  RoundedTensor q, k, v, dout;
  Buffer out, lse, out64;
  Buffer mask, key_len;
  AttentionOptions opt;

  Problem(const Case& cs, DType dt, unsigned seed)
      : c(cs), t(dt), q(dt, {cs.B, cs.H, cs.Sq, cs.D}, rng(seed), 1.0), k(dt, {cs.B, cs.Hkv, cs.Skv, cs.D}, rng(seed + 1), 1.0),
        v(dt, {cs.B, cs.Hkv, cs.Skv, cs.Dv}, rng(seed + 2), 1.0), dout(dt, {cs.B, cs.H, cs.Sq, cs.Dv}, rng(seed + 3), 1.0),
        out(dt, {cs.B, cs.H, cs.Sq, cs.Dv}), lse(DType::f32, {cs.B, cs.H, cs.Sq}), out64(DType::f64, {cs.B, cs.H, cs.Sq, cs.Dv}) {
    opt.causal = cs.causal;
    opt.align = cs.align;
    opt.window_left = cs.window_left;
    opt.window_right = cs.window_right;
    std::mt19937 g(seed + 4);
    const std::int64_t Bm = cs.mask_per_head ? cs.B : 1, Hm = cs.mask_per_head ? cs.H : 1;
    if (cs.mask == MaskKind::boolean) {
      mask = Buffer(DType::u8, {Bm, Hm, cs.Sq, cs.Skv});
      std::bernoulli_distribution allow(0.7);
      for (std::int64_t e = 0; e < mask.numel(); ++e) mask.ptr<std::uint8_t>()[e] = allow(g) ? 1 : 0;
      // Query row 1 sees no key at all (its gradients must be exactly zero, never NaN).
      if (cs.Sq > 1)
        for (std::int64_t bh = 0; bh < Bm * Hm; ++bh)
          for (std::int64_t j = 0; j < cs.Skv; ++j) mask.ptr<std::uint8_t>()[(bh * cs.Sq + 1) * cs.Skv + j] = 0;
      opt.mask = mask.view();
    } else if (cs.mask == MaskKind::additive) {
      mask = Buffer(DType::f32, {Bm, Hm, cs.Sq, cs.Skv});
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::bernoulli_distribution blocked(0.1);
      for (std::int64_t e = 0; e < mask.numel(); ++e)
        mask.ptr<float>()[e] = blocked(g) ? -std::numeric_limits<float>::infinity() : nd(g);
      opt.mask = mask.view();
    }
    if (!cs.key_lengths.empty()) {
      key_len = Buffer(DType::i64, {cs.B});
      for (std::int64_t b = 0; b < cs.B; ++b) key_len.ptr<std::int64_t>()[b] = cs.key_lengths[static_cast<std::size_t>(b)];
      opt.key_lengths = key_len.view();
    }
    AttentionOptions fo = opt;
    fo.kernel = qkv::Kernel::reference;
    qkv::attention(q.buf.view(), k.buf.view(), v.buf.view(), out.view(), fo, lse.view());
    qkv::attention(q.f64.view(), k.f64.view(), v.f64.view(), out64.view(), fo);
  }
  static std::mt19937& rng(unsigned seed) {
    static thread_local std::mt19937 g;
    g.seed(seed);
    return g;
  }

  // May query i of batch b attend key j (the header's rule, restated independently)?
  double allowed_bias(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j, bool* allowed) const {
    const std::int64_t diag = i + (c.align == Align::bottom_right ? c.Skv - c.Sq : 0);
    bool ok = true;
    if (c.causal && j > diag) ok = false;
    if (c.window_left >= 0 && j < diag - c.window_left) ok = false;
    if (c.window_right >= 0 && j > diag + c.window_right) ok = false;
    if (!c.key_lengths.empty() && j >= c.key_lengths[static_cast<std::size_t>(b)]) ok = false;
    double bias = 0.0;
    if (c.mask != MaskKind::none) {
      const std::int64_t bm = c.mask_per_head ? b : 0, hm = c.mask_per_head ? h : 0;
      const std::int64_t e = ((bm * (c.mask_per_head ? c.H : 1) + hm) * c.Sq + i) * c.Skv + j;
      if (c.mask == MaskKind::boolean) ok = ok && mask.ptr<std::uint8_t>()[e] != 0;
      else bias = mask.ptr<float>()[e];
    }
    *allowed = ok && bias != -kInf;
    return bias;
  }

  // The naive backward in f32 arithmetic on the dtype's values, outputs rounded to the dtype:
  // what a straightforward implementation in the kernel's precision would give. round_pds: P and
  // dS rounded to bf16 where they enter dV, dK and dQ (a bf16 matmul's operands), sums still f32.
  void naive(Buffer& dq, Buffer& dk, Buffer& dv, bool round_pds = false) const {
    auto rp = [&](float x) { return round_pds ? round_to(DType::bf16, x) : x; };
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
    std::vector<float> gq(static_cast<std::size_t>(dq.numel()), 0.0f), gk(static_cast<std::size_t>(dk.numel()), 0.0f),
        gv(static_cast<std::size_t>(dv.numel()), 0.0f);
    std::vector<float> p(static_cast<std::size_t>(c.Skv)), dp(static_cast<std::size_t>(c.Skv));
    std::vector<char> ok(static_cast<std::size_t>(c.Skv));
    auto at = [](const RoundedTensor& x, std::int64_t e) { return static_cast<float>(x.f64.ptr<double>()[e]); };
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.H; ++h) {
        const std::int64_t hk = h / (c.H / c.Hkv);
        for (std::int64_t i = 0; i < c.Sq; ++i) {
          float m = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j < c.Skv; ++j) {
            bool a;
            const auto bias = static_cast<float>(allowed_bias(b, h, i, j, &a));
            ok[static_cast<std::size_t>(j)] = a;
            float s = 0.0f;
            for (std::int64_t d = 0; d < c.D; ++d)
              s += at(q, ((b * c.H + h) * c.Sq + i) * c.D + d) * at(k, ((b * c.Hkv + hk) * c.Skv + j) * c.D + d);
            p[static_cast<std::size_t>(j)] = s * scale + bias;
            if (a) m = std::max(m, p[static_cast<std::size_t>(j)]);
          }
          float sum = 0.0f;
          for (std::int64_t j = 0; j < c.Skv; ++j) {
            float& pj = p[static_cast<std::size_t>(j)];
            pj = ok[static_cast<std::size_t>(j)] ? std::exp(pj - m) : 0.0f;
            sum += pj;
          }
          float pdp = 0.0f;
          for (std::int64_t j = 0; j < c.Skv; ++j) {
            float& pj = p[static_cast<std::size_t>(j)];
            pj = sum > 0.0f ? pj / sum : 0.0f;
            float d = 0.0f;
            for (std::int64_t e = 0; e < c.Dv; ++e)
              d += at(dout, ((b * c.H + h) * c.Sq + i) * c.Dv + e) * at(v, ((b * c.Hkv + hk) * c.Skv + j) * c.Dv + e);
            dp[static_cast<std::size_t>(j)] = d;
            pdp += pj * d;
          }
          for (std::int64_t j = 0; j < c.Skv; ++j) {
            const float pj = rp(p[static_cast<std::size_t>(j)]);
            const float ds = rp(p[static_cast<std::size_t>(j)] * (dp[static_cast<std::size_t>(j)] - pdp) * scale);
            for (std::int64_t e = 0; e < c.Dv; ++e)
              gv[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.Dv + e)] +=
                  pj * at(dout, ((b * c.H + h) * c.Sq + i) * c.Dv + e);
            for (std::int64_t d = 0; d < c.D; ++d) {
              gq[static_cast<std::size_t>(((b * c.H + h) * c.Sq + i) * c.D + d)] +=
                  ds * at(k, ((b * c.Hkv + hk) * c.Skv + j) * c.D + d);
              gk[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.D + d)] +=
                  ds * at(q, ((b * c.H + h) * c.Sq + i) * c.D + d);
            }
          }
        }
      }
    for (std::size_t e = 0; e < gq.size(); ++e) dq.view().store(static_cast<std::int64_t>(e), round_to(t, gq[e]));
    for (std::size_t e = 0; e < gk.size(); ++e) dk.view().store(static_cast<std::int64_t>(e), round_to(t, gk[e]));
    for (std::size_t e = 0; e < gv.size(); ++e) dv.view().store(static_cast<std::int64_t>(e), round_to(t, gv[e]));
  }
};

struct Grads {
  Buffer dq, dk, dv;
  Grads(DType t, const Case& c)
      : dq(t, {c.B, c.H, c.Sq, c.D}), dk(t, {c.B, c.Hkv, c.Skv, c.D}), dv(t, {c.B, c.Hkv, c.Skv, c.Dv}) {}
};

qkv::KernelInfo run_flash(const Problem& pr, Grads& g, int threads) {
  AttentionOptions o = pr.opt;
  o.kernel = qkv::Kernel::flash;
  o.num_threads = threads;
  return qkv::attention_backward(pr.q.buf.view(), pr.k.buf.view(), pr.v.buf.view(), pr.out.view(), pr.dout.buf.view(),
                                 pr.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), o);
}


const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    v.push_back(Case{"plain", 1, 2, 2, 64, 64, 64, 64});
    v.push_back(Case{"d128_multiblock", 1, 1, 1, 150, 200, 128, 128});
    v.push_back(Case{"causal_top_left", 1, 2, 2, 100, 130, 64, 64, true});
    v.push_back(Case{"causal_bottom_right_sq_gt_skv", 1, 2, 2, 130, 100, 32, 32, true, Align::bottom_right});
    Case w{"window_odd_dims", 1, 2, 2, 97, 97, 17, 33};
    w.window_left = 7, w.window_right = 3;
    v.push_back(w);
    Case cw{"causal_window_bottom_right", 2, 1, 1, 70, 190, 48, 80, true, Align::bottom_right};
    cw.window_left = 40;
    v.push_back(cw);
    Case kp{"key_padding", 3, 2, 1, 40, 90, 64, 64};
    kp.key_lengths = {90, 0, 37};  // batch 1 has no valid key: zero gradients, no NaN
    v.push_back(kp);
    Case bm{"bool_mask_per_head", 2, 2, 2, 45, 70, 24, 24};
    bm.mask = MaskKind::boolean, bm.mask_per_head = true;
    v.push_back(bm);
    Case am{"additive_mask_causal", 1, 2, 2, 80, 80, 64, 64, true};
    am.mask = MaskKind::additive;
    v.push_back(am);
    v.push_back(Case{"gqa", 1, 6, 2, 50, 77, 32, 32, true});
    v.push_back(Case{"mqa", 2, 4, 1, 33, 129, 16, 48});
    v.push_back(Case{"d1", 1, 1, 1, 19, 23, 1, 1});
    v.push_back(Case{"d256", 1, 1, 1, 20, 70, 256, 256});
    v.push_back(Case{"length_one", 1, 1, 1, 1, 1, 64, 64});
    v.push_back(Case{"primes", 1, 1, 1, 67, 131, 13, 7, true, Align::bottom_right});
    // Six key blocks: two passes of a task (4 + 2 blocks) over B·Hkv = 8 heads; the window keeps
    // the last query block out of the first pass, so its dQ rows are zeroed there and summed in
    // the second (the accumulators' first-store rule, attention_backward_impl.hpp).
    Case tp{"two_passes_window", 2, 4, 4, 330, 330, 32, 32, true};
    tp.window_left = 40;
    v.push_back(tp);
    return v;
  }();
  return all;
}

class Backward : public ::testing::TestWithParam<std::tuple<int, DType>> {};

// Fast vs f64 reference vs naive same-precision, on every ISA.
TEST_P(Backward, MatchesReferenceWithinNaiveError) {
  const Case& c = cases()[static_cast<std::size_t>(std::get<0>(GetParam()))];
  const DType t = std::get<1>(GetParam());
  IsaGuard guard;
  Problem pr(c, t, 1000u + static_cast<unsigned>(std::get<0>(GetParam())));

  Grads ref(DType::f64, c), naive(t, c), naive_pds(t, c);
  AttentionOptions ro = pr.opt;
  ro.kernel = qkv::Kernel::reference;
  qkv::attention_backward(pr.q.f64.view(), pr.k.f64.view(), pr.v.f64.view(), pr.out64.view(), pr.dout.f64.view(),
                          pr.lse.view(), ref.dq.view(), ref.dk.view(), ref.dv.view(), ro);
  pr.naive(naive.dq, naive.dk, naive.dv);
  if (t == DType::bf16) pr.naive(naive_pds.dq, naive_pds.dk, naive_pds.dv, /*round_pds=*/true);

  // Every path set_isa reaches: bf16 on avx512_bf16 runs the vdpbf16ps tiles, bf16 on avx512 and
  // below the f32 tiles on converted inputs; f32 on avx512_bf16, and both on avx512_vnni, run the
  // avx512 code.
  for (Isa isa : isas()) {
    qkv::set_isa(isa);
    const bool dot_tiles = t == DType::bf16 && isa == Isa::avx512_bf16;
    Grads fast(t, c);
    const auto info = run_flash(pr, fast, 2);
    EXPECT_EQ(info.kernel, qkv::Kernel::flash);
    EXPECT_EQ(info.isa, isa == Isa::avx512_vnni || (t == DType::f32 && isa == Isa::avx512_bf16) ? Isa::avx512 : isa);
    const Buffer* f[3] = {&fast.dq, &fast.dk, &fast.dv};
    const Grads& model = dot_tiles ? naive_pds : naive;
    const Buffer* n[3] = {&model.dq, &model.dk, &model.dv};
    const Buffer* r[3] = {&ref.dq, &ref.dk, &ref.dv};
    const char* names[3] = {"dq", "dk", "dv"};
    // FlashAttention's rule: at most 2× the naive same-precision error, plus a floor of a few
    // units in the last place of the largest gradient of the three (2^-20 f32, 2^-7 bf16: 2 and
    // 4 ulps), for entries where the naive error happens to be tiny (with a single key dq and dk
    // cancel to exactly 0 in the naive softmax, but carry the rounding of exp and lse here).
    // The vdpbf16ps tiles are held to the naive model with P and dS rounded to bf16: each such
    // rounding is ≤ 2^-9 relative and the sums are f32, so a gradient Σ_n x·y errs by at most
    // 2^-9·Σ|x·y| beyond the f32-tile path (about 2^-9·√n·|x·y| typically, what the model measures).
    const double scale_of_grads = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv), 1e-3});
    const double floor = (t == DType::f32 ? 0x1p-20 : 0x1p-7) * scale_of_grads;
    for (int g = 0; g < 3; ++g) {
      const double ef = max_err(*f[g], *r[g]), en = max_err(*n[g], *r[g]);
      std::printf("%-30s %-5s %-11s %s: max|ref| %.3g  err fast %.3g  naive %.3g  (%s)\n", c.name,
                  qkv::dtype_name(t), qkv::isa_name(isa), names[g], max_abs(*r[g]), ef, en, info.name);
      EXPECT_LE(ef, 2.0 * en + floor) << c.name << " " << names[g] << " " << qkv::isa_name(isa);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Backward,
                         ::testing::Combine(::testing::Range(0, static_cast<int>(cases().size())),
                                            ::testing::Values(DType::f32, DType::bf16)),
                         [](const auto& param_info) {
                           return std::string(cases()[static_cast<std::size_t>(std::get<0>(param_info.param))].name) + "_" +
                                  qkv::dtype_name(std::get<1>(param_info.param));
                         });

// f32 gives the same bits on every vector instruction set: each gradient is a sum of the same
// fused multiply-adds in the same order whatever the register tile's width (partial sums over the
// same key or query ranges of kM-row tiles, kM = 6 on avx2 and avx512, added to the accumulator
// in the same order), and the tiles leave out only products with P = 0 or dS = 0, which change no
// bit of a sum (attention_backward_impl.hpp, Spans). Causal and windowed cases put the diagonal inside 64 × 64 tiles at offsets that are no
// multiple of any tile height. (The scalar tiles round a·b and a·b + c apart, simd_scalar.hpp's
// fmadd: their bits differ; MatchesReferenceWithinNaiveError holds them to the reference.)
TEST(BackwardIsas, F32SameBitsOnEveryVectorIsa) {
  IsaGuard guard;
  Case window{"window", 1, 2, 2, 150, 150, 64, 64};
  window.window_left = 37, window.window_right = 5;
  Case padded{"causal_key_padding", 2, 2, 1, 140, 140, 48, 48, true, Align::bottom_right};
  padded.key_lengths = {140, 77};
  for (const Case& c : {Case{"causal_square", 1, 2, 2, 200, 200, 64, 64, true},
                        Case{"causal_bottom_right", 1, 3, 1, 130, 197, 128, 128, true, Align::bottom_right}, window,
                        padded}) {
    Problem pr(c, DType::f32, 21);
    std::vector<Isa> all = isas();
    all.erase(std::remove(all.begin(), all.end(), Isa::scalar), all.end());
    if (all.empty()) GTEST_SKIP() << "no vector instruction set on this CPU";
    qkv::set_isa(all.front());
    Grads first(DType::f32, c);
    run_flash(pr, first, 2);
    for (Isa isa : all) {
      qkv::set_isa(isa);
      Grads g(DType::f32, c);
      run_flash(pr, g, 2);
      EXPECT_EQ(std::memcmp(first.dq.data(), g.dq.data(), first.dq.bytes()), 0) << c.name << " " << qkv::isa_name(isa);
      EXPECT_EQ(std::memcmp(first.dk.data(), g.dk.data(), first.dk.bytes()), 0) << c.name << " " << qkv::isa_name(isa);
      EXPECT_EQ(std::memcmp(first.dv.data(), g.dv.data(), first.dv.bytes()), 0) << c.name << " " << qkv::isa_name(isa);
    }
  }
}

// The same bits for 1, 2, 3 and 5 threads (the work split depends on the shapes only).
TEST(BackwardDeterminism, BitIdenticalForAnyThreadCount) {
  IsaGuard guard;
  for (const Case& c : {Case{"mqa_long", 1, 4, 1, 200, 300, 64, 64, true}, Case{"batch", 3, 2, 2, 70, 140, 32, 32}})
    for (DType t : {DType::f32, DType::bf16}) {
      Problem pr(c, t, 7);
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Grads one(t, c);
        run_flash(pr, one, 1);
        for (int threads : {2, 3, 5}) {
          Grads g(t, c);
          run_flash(pr, g, threads);
          EXPECT_EQ(std::memcmp(one.dq.data(), g.dq.data(), one.dq.bytes()), 0) << c.name << " threads " << threads;
          EXPECT_EQ(std::memcmp(one.dk.data(), g.dk.data(), one.dk.bytes()), 0) << c.name << " threads " << threads;
          EXPECT_EQ(std::memcmp(one.dv.data(), g.dv.data(), one.dv.bytes()), 0) << c.name << " threads " << threads;
        }
      }
    }
}

// Gradients against f64 central differences of the reference forward, L = Σ out ∘ dout.
TEST(BackwardFiniteDifferences, MatchesCentralDifferences) {
  Case c{"fd", 1, 2, 1, 5, 7, 3, 4, true, Align::bottom_right};
  c.mask = MaskKind::additive;
  Problem pr(c, DType::f32, 11);
  Grads fast(DType::f32, c), ref(DType::f64, c);
  run_flash(pr, fast, 2);
  AttentionOptions ro = pr.opt;
  ro.kernel = qkv::Kernel::reference;
  qkv::attention_backward(pr.q.f64.view(), pr.k.f64.view(), pr.v.f64.view(), pr.out64.view(), pr.dout.f64.view(),
                          pr.lse.view(), ref.dq.view(), ref.dk.view(), ref.dv.view(), ro);
  auto loss = [&] {
    Buffer o(DType::f64, {c.B, c.H, c.Sq, c.Dv});
    qkv::attention(pr.q.f64.view(), pr.k.f64.view(), pr.v.f64.view(), o.view(), ro);
    double s = 0.0;
    for (std::int64_t e = 0; e < o.numel(); ++e) s += o.ptr<double>()[e] * pr.dout.f64.ptr<double>()[e];
    return s;
  };
  const double step = 1e-5;
  double worst_fast = 0.0, worst_ref = 0.0;
  auto check = [&](const RoundedTensor& x, const Buffer& g_fast, const Buffer& g_ref) {
    double* data = x.f64.ptr<double>();
    for (std::int64_t e = 0; e < x.f64.numel(); ++e) {
      const double x0 = data[e];
      data[e] = x0 + step;
      const double up = loss();
      data[e] = x0 - step;
      const double down = loss();
      data[e] = x0;
      const double fd = (up - down) / (2 * step);  // truncation O(step²) ≈ 1e-10, rounding ≈ 1e-11
      worst_fast = std::max(worst_fast, std::abs(g_fast.view().load(e) - fd));
      worst_ref = std::max(worst_ref, std::abs(g_ref.view().load(e) - fd));
    }
  };
  check(pr.q, fast.dq, ref.dq);
  check(pr.k, fast.dk, ref.dk);
  check(pr.v, fast.dv, ref.dv);
  std::printf("finite differences: max |fast f32 − fd| %.3g, max |reference f64 − fd| %.3g\n", worst_fast, worst_ref);
  // f32 kernel: gradients of size ~1 carry ~1e-6 of rounding; the f64 reference only the fd error.
  EXPECT_LT(worst_fast, 2e-5);
  EXPECT_LT(worst_ref, 1e-8);
}

// Strided, misaligned inputs and outputs, with guard elements after every output that must
// survive; compared with the same call on contiguous copies (same values, same bits expected
// from the f32 result up to the kernel's own rounding, checked against the reference).
TEST(BackwardLayouts, StridedMisalignedViewsAndGuards) {
  IsaGuard guard;
  const Case c{"strided", 2, 4, 2, 37, 53, 32, 16, true, Align::bottom_right};
  Problem pr(c, DType::f32, 21);
  Grads ref(DType::f64, c);
  AttentionOptions ro = pr.opt;
  ro.kernel = qkv::Kernel::reference;
  qkv::attention_backward(pr.q.f64.view(), pr.k.f64.view(), pr.v.f64.view(), pr.out64.view(), pr.dout.f64.view(),
                          pr.lse.view(), ref.dq.view(), ref.dk.view(), ref.dv.view(), ro);
  // Token-major storage [B, S, H, D] (as a projection writes it), one float off alignment.
  auto token_major = [](const Buffer& src, std::vector<float>& store) {
    const auto& s = src.shape();
    store.assign(static_cast<std::size_t>(src.numel() + 1 + 8), 12345.0f);
    float* base = store.data() + 1;
    View v = View::strided(base, DType::f32, {s[0], s[1], s[2], s[3]}, {s[2] * s[1] * s[3], s[3], s[1] * s[3], 1});
    for (std::int64_t b = 0; b < s[0]; ++b)
      for (std::int64_t h = 0; h < s[1]; ++h)
        for (std::int64_t i = 0; i < s[2]; ++i)
          for (std::int64_t d = 0; d < s[3]; ++d)
            v.store(v.offset(b, h, i, d), src.view().load(((b * s[1] + h) * s[2] + i) * s[3] + d));
    return v;
  };
  std::vector<float> sq, sk, sv, so, sdo, gq, gk, gv;
  const View q = token_major(pr.q.buf, sq), k = token_major(pr.k.buf, sk), v = token_major(pr.v.buf, sv);
  const View o = token_major(pr.out, so), d = token_major(pr.dout.buf, sdo);
  Buffer zq(DType::f32, {c.B, c.H, c.Sq, c.D}), zk(DType::f32, {c.B, c.Hkv, c.Skv, c.D}), zv(DType::f32, {c.B, c.Hkv, c.Skv, c.Dv});
  const View dq = token_major(zq, gq), dk = token_major(zk, gk), dv = token_major(zv, gv);
  for (Isa isa : isas(/*with_bf16=*/false)) {
    qkv::set_isa(isa);
    AttentionOptions fo = pr.opt;
    fo.kernel = qkv::Kernel::flash;
    qkv::attention_backward(q, k, v, o, d, pr.lse.view(), dq, dk, dv, fo);
    double err = 0.0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.H; ++h)
        for (std::int64_t i = 0; i < c.Sq; ++i)
          for (std::int64_t e = 0; e < c.D; ++e)
            err = std::max(err, std::abs(dq.load(dq.offset(b, h, i, e)) - ref.dq.ptr<double>()[((b * c.H + h) * c.Sq + i) * c.D + e]));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hkv; ++h)
        for (std::int64_t j = 0; j < c.Skv; ++j) {
          for (std::int64_t e = 0; e < c.D; ++e)
            err = std::max(err, std::abs(dk.load(dk.offset(b, h, j, e)) - ref.dk.ptr<double>()[((b * c.Hkv + h) * c.Skv + j) * c.D + e]));
          for (std::int64_t e = 0; e < c.Dv; ++e)
            err = std::max(err, std::abs(dv.load(dv.offset(b, h, j, e)) - ref.dv.ptr<double>()[((b * c.Hkv + h) * c.Skv + j) * c.Dv + e]));
        }
    std::printf("strided %s: max err %.3g\n", qkv::isa_name(isa), err);
    // Gradients of size ~10 summed over ~50 keys in f32: 1e-4 leaves ~10× margin.
    EXPECT_LT(err, 1e-4) << qkv::isa_name(isa);
    for (const std::vector<float>* s : {&gq, &gk, &gv}) {
      EXPECT_EQ((*s)[0], 12345.0f);  // the element before the misaligned start
      for (std::size_t e = s->size() - 8; e < s->size(); ++e) EXPECT_EQ((*s)[e], 12345.0f);
    }
  }
}

// bf16 in token-major storage [B, S, H, D], one element off 4-byte alignment (so no bf16 pair of a
// row is a 32-bit word in place), odd D, with rows contiguous (inner stride 1: the vector packing
// of the vdpbf16ps tiles) and with every other element (inner stride 2: their scalar packing): on
// every path (the vdpbf16ps tiles on avx512_bf16, f32 tiles below) the gradients equal, bit for
// bit, those of the same call on contiguous copies, which Backward.MatchesReferenceWithinNaiveError
// holds to the f64 reference; guards (before, after and between the elements) survive.
TEST(BackwardLayouts, StridedMisalignedBf16SameBitsAsContiguous) {
  IsaGuard guard;
  const Case c{"strided_bf16", 2, 4, 2, 37, 71, 33, 17, true, Align::bottom_right};
  Problem pr(c, DType::bf16, 22);
  static constexpr std::uint16_t kGuard = 0x4640;  // bf16 12288
  for (std::int64_t inner : {1, 2}) {
    auto token_major = [&](const Buffer& src, std::vector<std::uint16_t>& store) {
      const auto& s = src.shape();
      store.assign(static_cast<std::size_t>(src.numel() * inner + 1 + 8), kGuard);
      View v = View::strided(store.data() + 1, DType::bf16, {s[0], s[1], s[2], s[3]},
                             {s[2] * s[1] * s[3] * inner, s[3] * inner, s[1] * s[3] * inner, inner});
      for (std::int64_t b = 0; b < s[0]; ++b)
        for (std::int64_t h = 0; h < s[1]; ++h)
          for (std::int64_t i = 0; i < s[2]; ++i)
            for (std::int64_t d = 0; d < s[3]; ++d)
              v.store(v.offset(b, h, i, d), src.view().load(((b * s[1] + h) * s[2] + i) * s[3] + d));
      return v;
    };
    std::vector<std::uint16_t> sq, sk, sv, so, sdo, gq, gk, gv;
    const View q = token_major(pr.q.buf, sq), k = token_major(pr.k.buf, sk), v = token_major(pr.v.buf, sv);
    const View o = token_major(pr.out, so), d = token_major(pr.dout.buf, sdo);
    Grads zero(DType::bf16, c);
    const View dq = token_major(zero.dq, gq), dk = token_major(zero.dk, gk), dv = token_major(zero.dv, gv);
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      Grads contiguous(DType::bf16, c);
      const auto info = run_flash(pr, contiguous, 2);
      AttentionOptions fo = pr.opt;
      fo.kernel = qkv::Kernel::flash;
      fo.num_threads = 2;
      qkv::attention_backward(q, k, v, o, d, pr.lse.view(), dq, dk, dv, fo);
      std::int64_t differ = 0;
      auto compare = [&](const View& strided, const Buffer& ref) {
        const auto& s = ref.shape();
        for (std::int64_t b = 0; b < s[0]; ++b)
          for (std::int64_t h = 0; h < s[1]; ++h)
            for (std::int64_t i = 0; i < s[2]; ++i)
              for (std::int64_t e = 0; e < s[3]; ++e)
                differ += strided.load(strided.offset(b, h, i, e)) != ref.view().load(((b * s[1] + h) * s[2] + i) * s[3] + e);
      };
      compare(dq, contiguous.dq), compare(dk, contiguous.dk), compare(dv, contiguous.dv);
      std::printf("strided bf16, inner stride %lld, %s (%s): %lld elements differ from the contiguous call\n",
                  static_cast<long long>(inner), qkv::isa_name(isa), info.name, static_cast<long long>(differ));
      EXPECT_EQ(differ, 0) << qkv::isa_name(isa) << " inner stride " << inner;
      for (const std::vector<std::uint16_t>* s : {&gq, &gk, &gv}) {
        EXPECT_EQ((*s)[0], kGuard);  // the element before the misaligned start
        for (std::size_t e = s->size() - 8; e < s->size(); ++e) EXPECT_EQ((*s)[e], kGuard);
        if (inner == 2) {  // the elements between those of the view: storage offsets 1 + 2n + 1
          for (std::size_t e = 2; e + 8 < s->size(); e += 2) ASSERT_EQ((*s)[e], kGuard) << e;
        }
      }
    }
  }
}

TEST(BackwardDispatch, AutomaticPicksFlashAndRefusesWhatItCannotRun) {
  const Case c{"small", 1, 1, 1, 4, 4, 8, 8};
  Problem pr(c, DType::f32, 3);
  Grads g(DType::f32, c);
  const auto info = qkv::attention_backward(pr.q.buf.view(), pr.k.buf.view(), pr.v.buf.view(), pr.out.view(),
                                            pr.dout.buf.view(), pr.lse.view(), g.dq.view(), g.dk.view(), g.dv.view());
  EXPECT_EQ(info.kernel, qkv::Kernel::flash);

  Problem p64(c, DType::f64, 3);
  Grads g64(DType::f64, c);
  AttentionOptions o;
  o.kernel = qkv::Kernel::flash;
  EXPECT_THROW(qkv::attention_backward(p64.q.buf.view(), p64.k.buf.view(), p64.v.buf.view(), p64.out.view(),
                                       p64.dout.buf.view(), p64.lse.view(), g64.dq.view(), g64.dk.view(), g64.dv.view(), o),
               std::invalid_argument);
  o.kernel = qkv::Kernel::automatic;  // f64 falls back to the reference
  EXPECT_EQ(qkv::attention_backward(p64.q.buf.view(), p64.k.buf.view(), p64.v.buf.view(), p64.out.view(),
                                    p64.dout.buf.view(), p64.lse.view(), g64.dq.view(), g64.dk.view(), g64.dv.view(), o)
                .kernel,
            qkv::Kernel::reference);
  o.kernel = qkv::Kernel::flash_decode;
  EXPECT_THROW(qkv::attention_backward(pr.q.buf.view(), pr.k.buf.view(), pr.v.buf.view(), pr.out.view(),
                                       pr.dout.buf.view(), pr.lse.view(), g.dq.view(), g.dk.view(), g.dv.view(), o),
               std::invalid_argument);
}

}  // namespace
