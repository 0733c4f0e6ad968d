// Score variants (issue #19): softcap, ALiBi, attention sinks, StreamingLLM's keep_first beside a
// window and the per-sequence causal alignment (Align::bottom_right_key_lengths), in every kernel against an independent oracle written here:
//   naive<T>: the definition of include/qkv/attention.hpp, plain loops, forward and backward,
//   sharing no code with src/. naive<double> is the oracle; naive<float> on the same (dtype-rounded)
//   inputs is "a naive computation in the kernel's precision".
// Tolerance (FlashAttention's rule, with test_backward.cpp's floor): a fast kernel's max error
// against naive<double> is at most 2× naive<float>'s, plus a few units in the last place of the
// largest value compared (2^-20 f32, 2^-7 bf16: 2 and 4 ulps) for entries where the naive error
// happens to be tiny. The f64 reference kernel must match naive<double> to 1e-10.
// Run on every instruction set this CPU has (set_isa), f32 and bf16, flash and flash_decode.
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
using qkv::testing::isas;
using qkv::testing::round_to;
using qkv::testing::fill_rounded;
using qkv::Isa;

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  Case(const char* n, std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t sq, std::int64_t skv,
       std::int64_t d, std::int64_t dv, bool causal_ = false, Align align_ = Align::top_left)
      : name(n), B(b), H(h), Hkv(hkv), Sq(sq), Skv(skv), D(d), Dv(dv), causal(causal_), align(align_) {}
  const char* name;
  std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  bool causal = false;
  Align align = Align::top_left;
  std::int64_t window_left = -1;
  std::int64_t keep_first = 0;          // keys below it escape window_left
  double softcap = 0.0;                 // 0: none
  bool alibi = false;                   // standard slopes for H heads
  bool sinks = false;                   // sink logits drawn N(0, 1)
  bool additive_mask = false;           // [Sq, Skv] N(0, 1) with −∞ entries (added after softcap)
  std::vector<std::int64_t> key_lengths;  // empty: none
};

// Inputs of one case as dtype-rounded f64 values (row-major), and the options' own data.
struct Inputs {
  Case c;
  std::vector<double> q, k, v, dout, mask, slopes, sinks;
  Inputs(const Case& cs, DType t, unsigned seed) : c(cs) {
    std::mt19937 g(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    fill_rounded(q, c.B * c.H * c.Sq * c.D, t, 1.5, g, nd);  // σ 1.5: scores of a few units, so softcap bites
    fill_rounded(k, c.B * c.Hkv * c.Skv * c.D, t, 1.5, g, nd);
    fill_rounded(v, c.B * c.Hkv * c.Skv * c.Dv, t, 1.0, g, nd);
    fill_rounded(dout, c.B * c.H * c.Sq * c.Dv, t, 1.0, g, nd);
    if (c.additive_mask) {
      fill_rounded(mask, c.Sq * c.Skv, t, 1.0, g, nd);
      std::bernoulli_distribution blocked(0.1);
      for (double& e : mask) e = blocked(g) ? -kInf : static_cast<float>(e);
    }
    if (c.alibi) slopes = qkv::alibi_standard_slopes(c.H);
    if (c.sinks) fill_rounded(sinks, c.H, t, 1.0, g, nd);
  }
  std::int64_t key_len(std::int64_t b) const {
    return c.key_lengths.empty() ? c.Skv : c.key_lengths[static_cast<std::size_t>(b)];
  }
};

// The header's definition in arithmetic T. Outputs (row-major): out [B,H,Sq,Dv], lse [B,H,Sq],
// dq, dk, dv, dsinks [H]; the score stages scaled, capped, masked [B,H,Sq,Skv] (−∞ where not allowed).
template <class T>
struct Naive {
  std::vector<T> out, lse, dq, dk, dv, dsinks, scaled, capped, masked;
};

template <class T>
Naive<T> naive(const Inputs& in) {
  const Case& c = in.c;
  Naive<T> r;
  r.out.assign(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Dv), 0);
  r.lse.assign(static_cast<std::size_t>(c.B * c.H * c.Sq), 0);
  r.dq.assign(static_cast<std::size_t>(c.B * c.H * c.Sq * c.D), 0);
  r.dk.assign(static_cast<std::size_t>(c.B * c.Hkv * c.Skv * c.D), 0);
  r.dv.assign(static_cast<std::size_t>(c.B * c.Hkv * c.Skv * c.Dv), 0);
  r.dsinks.assign(static_cast<std::size_t>(c.H), 0);
  for (auto* st : {&r.scaled, &r.capped, &r.masked}) st->assign(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Skv), 0);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(c.D)));
  std::vector<T> s(static_cast<std::size_t>(c.Skv)), dcap(static_cast<std::size_t>(c.Skv)), dp(static_cast<std::size_t>(c.Skv));
  std::vector<char> ok(static_cast<std::size_t>(c.Skv));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h) {
      const std::int64_t hk = h / (c.H / c.Hkv);
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        const std::int64_t diag = c.align == Align::top_left       ? i
                                  : c.align == Align::bottom_right ? i + c.Skv - c.Sq
                                                                   : i + in.key_len(b) - c.Sq;
        const T sink = c.sinks ? static_cast<T>(in.sinks[static_cast<std::size_t>(h)]) : static_cast<T>(-kInf);
        T m = sink;
        for (std::int64_t j = 0; j < c.Skv; ++j) {
          bool a = j < in.key_len(b) && !(c.causal && j > diag) &&
                   !(c.window_left >= 0 && j < diag - c.window_left && j >= c.keep_first);
          T x = 0;
          for (std::int64_t d = 0; d < c.D; ++d)
            x += static_cast<T>(in.q[static_cast<std::size_t>(((b * c.H + h) * c.Sq + i) * c.D + d)]) *
                 static_cast<T>(in.k[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.D + d)]);
          x *= scale;
          const std::size_t at = static_cast<std::size_t>(((b * c.H + h) * c.Sq + i) * c.Skv + j);
          r.scaled[at] = x;
          T dc = 1;
          if (c.softcap > 0) {
            const T t = std::tanh(x / static_cast<T>(c.softcap));
            x = static_cast<T>(c.softcap) * t;
            dc = 1 - t * t;
          }
          r.capped[at] = x;
          if (c.additive_mask) {
            const double mk = in.mask[static_cast<std::size_t>(i * c.Skv + j)];
            if (mk == -kInf) a = false;
            else x += static_cast<T>(mk);
          }
          if (c.alibi) x -= static_cast<T>(in.slopes[static_cast<std::size_t>(h)]) * static_cast<T>(std::abs(diag - j));
          ok[static_cast<std::size_t>(j)] = a;
          r.masked[at] = a ? x : static_cast<T>(-kInf);
          s[static_cast<std::size_t>(j)] = x;
          dcap[static_cast<std::size_t>(j)] = dc;
          if (a) m = std::max(m, x);
        }
        const std::size_t row = static_cast<std::size_t>((b * c.H + h) * c.Sq + i);
        if (m == static_cast<T>(-kInf)) {
          r.lse[row] = static_cast<T>(-kInf);
          continue;
        }
        T sum = c.sinks ? std::exp(sink - m) : 0;
        for (std::int64_t j = 0; j < c.Skv; ++j)
          if (ok[static_cast<std::size_t>(j)]) sum += std::exp(s[static_cast<std::size_t>(j)] - m);
        r.lse[row] = m + std::log(sum);
        T delta = 0;  // dout_i · out_i = Σ_j p_j dp_j
        for (std::int64_t j = 0; j < c.Skv; ++j) {
          T& p = s[static_cast<std::size_t>(j)];
          p = ok[static_cast<std::size_t>(j)] ? std::exp(p - m) / sum : 0;
          T d = 0;
          for (std::int64_t e = 0; e < c.Dv; ++e) {
            const T vj = static_cast<T>(in.v[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.Dv + e)]);
            r.out[row * static_cast<std::size_t>(c.Dv) + static_cast<std::size_t>(e)] += p * vj;
            d += static_cast<T>(in.dout[row * static_cast<std::size_t>(c.Dv) + static_cast<std::size_t>(e)]) * vj;
          }
          dp[static_cast<std::size_t>(j)] = d;
          delta += p * d;
        }
        if (c.sinks) r.dsinks[static_cast<std::size_t>(h)] -= std::exp(sink - r.lse[row]) * delta;
        for (std::int64_t j = 0; j < c.Skv; ++j) {
          const T p = s[static_cast<std::size_t>(j)];
          if (p == 0) continue;
          const T ds = p * (dp[static_cast<std::size_t>(j)] - delta) * dcap[static_cast<std::size_t>(j)] * scale;
          for (std::int64_t e = 0; e < c.Dv; ++e)
            r.dv[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.Dv + e)] +=
                p * static_cast<T>(in.dout[row * static_cast<std::size_t>(c.Dv) + static_cast<std::size_t>(e)]);
          for (std::int64_t d = 0; d < c.D; ++d) {
            r.dq[row * static_cast<std::size_t>(c.D) + static_cast<std::size_t>(d)] +=
                ds * static_cast<T>(in.k[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.D + d)]);
            r.dk[static_cast<std::size_t>(((b * c.Hkv + hk) * c.Skv + j) * c.D + d)] +=
                ds * static_cast<T>(in.q[row * static_cast<std::size_t>(c.D) + static_cast<std::size_t>(d)]);
          }
        }
      }
    }
  return r;
}

Buffer buffer(DType t, std::vector<std::int64_t> shape, const std::vector<double>& x) {
  Buffer b(t, shape);
  for (std::int64_t e = 0; e < b.numel(); ++e) b.view().store(e, x[static_cast<std::size_t>(e)]);
  return b;
}

// max |a − ref| over the elements (∞ for a NaN in a), with a optionally rounded to dtype t first.
template <class A, class R>
double max_err(const A& a, const R& ref, DType t = DType::f64) {
  double m = 0.0;
  for (std::size_t e = 0; e < ref.size(); ++e) {
    const double x = round_to(t, static_cast<double>(a[e])), r = static_cast<double>(ref[e]);
    if (std::isnan(x)) return kInf;
    if (x == r) continue;  // equal infinities (lse of empty rows)
    m = std::max(m, std::abs(x - r));
  }
  return m;
}

std::vector<double> values(const Buffer& b) {
  std::vector<double> r(static_cast<std::size_t>(b.numel()));
  for (std::int64_t e = 0; e < b.numel(); ++e) r[static_cast<std::size_t>(e)] = b.view().load(e);
  return r;
}

// The call's tensors in dtype t and the options pointing at them.
struct Call {
  Buffer q, k, v, dout, mask, key_len, slopes, sinks;
  AttentionOptions opt;
  Call(const Inputs& in, DType t) {
    const Case& c = in.c;
    q = buffer(t, {c.B, c.H, c.Sq, c.D}, in.q);
    k = buffer(t, {c.B, c.Hkv, c.Skv, c.D}, in.k);
    v = buffer(t, {c.B, c.Hkv, c.Skv, c.Dv}, in.v);
    dout = buffer(t, {c.B, c.H, c.Sq, c.Dv}, in.dout);
    opt.causal = c.causal;
    opt.align = c.align;
    opt.window_left = c.window_left;
    opt.keep_first = c.keep_first;
    if (c.softcap > 0) opt.softcap = c.softcap;
    if (c.additive_mask) opt.mask = (mask = buffer(DType::f32, {c.Sq, c.Skv}, in.mask)).view();
    if (c.alibi) opt.alibi_slopes = (slopes = buffer(DType::f64, {c.H}, in.slopes)).view();
    if (c.sinks) opt.sinks = (sinks = buffer(DType::f64, {c.H}, in.sinks)).view();
    if (!c.key_lengths.empty()) {
      key_len = Buffer(DType::i64, {c.B});
      for (std::int64_t b = 0; b < c.B; ++b) key_len.ptr<std::int64_t>()[b] = c.key_lengths[static_cast<std::size_t>(b)];
      opt.key_lengths = key_len.view();
    }
  }
};

std::vector<Case> cases() {
  std::vector<Case> v;
  Case sc{"softcap_gqa", 2, 4, 2, 70, 90, 64, 64};
  sc.softcap = 3.0;
  v.push_back(sc);
  Case scm{"softcap_then_additive_mask_causal", 1, 2, 2, 50, 80, 32, 32, true, Align::bottom_right};
  scm.softcap = 2.0, scm.additive_mask = true;
  v.push_back(scm);
  Case al{"alibi_causal_top_left_sq_lt_skv", 1, 3, 1, 40, 100, 48, 40, true};
  al.alibi = true;
  v.push_back(al);
  // Non-causal, no mask: the forward adds the bias in the tiles nothing cuts (keys [0, 192)) and in
  // the masked path in the last, partial tile.
  Case aln{"alibi_unmasked_tiles", 1, 4, 2, 70, 200, 64, 48};
  aln.alibi = true;
  v.push_back(aln);
  Case alb{"alibi_bottom_right_window", 2, 4, 4, 65, 130, 17, 33, true, Align::bottom_right};
  alb.alibi = true, alb.window_left = 50;
  v.push_back(alb);
  Case sk{"sinks_key_padding", 3, 2, 1, 30, 75, 64, 64};
  sk.sinks = true, sk.key_lengths = {75, 0, 41};  // batch 1 sees no key: out 0, lse = sink
  v.push_back(sk);
  Case kl{"key_length_alignment_causal", 3, 2, 2, 20, 90, 32, 32, true, Align::bottom_right_key_lengths};
  kl.key_lengths = {90, 33, 7};  // batch 2: 7 keys < Sq = 20, its first 13 queries see none
  v.push_back(kl);
  Case all{"all_variants_key_length_alignment", 2, 4, 2, 33, 140, 64, 64, true, Align::bottom_right_key_lengths};
  all.softcap = 5.0, all.alibi = true, all.sinks = true, all.key_lengths = {140, 61};
  v.push_back(all);
  Case dec{"decode_all_variants", 2, 8, 2, 1, 1500, 128, 128, true, Align::bottom_right_key_lengths};
  dec.softcap = 4.0, dec.alibi = true, dec.sinks = true, dec.key_lengths = {1500, 777};
  v.push_back(dec);
  // StreamingLLM: 4 kept keys and a window; the prefill's gap between them grows from 0 (the first
  // rows: one range) to most of the row; with key lengths, one sequence's window reaches the kept keys.
  Case kf{"keep_first_window_prefill", 2, 4, 2, 300, 300, 64, 64, true, Align::bottom_right_key_lengths};
  kf.window_left = 70, kf.keep_first = 4, kf.key_lengths = {300, 60};
  v.push_back(kf);
  Case kfm{"keep_first_mask_sinks_softcap", 1, 2, 1, 40, 260, 32, 32, true, Align::bottom_right};
  kfm.window_left = 30, kfm.keep_first = 70, kfm.additive_mask = true, kfm.sinks = true, kfm.softcap = 3.0;
  v.push_back(kfm);
  // Decode over 3 chunks of keys: kept keys in the first, the window in the last, whole chunks between.
  Case kfd{"keep_first_decode", 2, 4, 1, 2, 1500, 64, 64, true, Align::bottom_right_key_lengths};
  kfd.window_left = 100, kfd.keep_first = 5, kfd.alibi = true, kfd.key_lengths = {1500, 1100};
  v.push_back(kfd);
  return v;
}


TEST(Variants, ReferenceMatchesNaiveF64) {
  for (const Case& c : cases()) {
    const Inputs in(c, DType::f64, 19);
    const Naive<double> want = naive<double>(in);
    Call call(in, DType::f64);
    call.opt.kernel = qkv::Kernel::reference;
    Buffer out(DType::f64, {c.B, c.H, c.Sq, c.Dv}), lse(DType::f64, {c.B, c.H, c.Sq});
    qkv::attention(call.q.view(), call.k.view(), call.v.view(), out.view(), call.opt, lse.view());
    EXPECT_LE(max_err(values(out), want.out), 1e-10) << c.name;
    EXPECT_LE(max_err(values(lse), want.lse), 1e-10) << c.name;
    Buffer dq(DType::f64, {c.B, c.H, c.Sq, c.D}), dk(DType::f64, {c.B, c.Hkv, c.Skv, c.D}),
        dv(DType::f64, {c.B, c.Hkv, c.Skv, c.Dv}), ds(DType::f64, {c.H});
    qkv::attention_backward(call.q.view(), call.k.view(), call.v.view(), out.view(), call.dout.view(), lse.view(),
                            dq.view(), dk.view(), dv.view(), call.opt,
                            c.sinks ? std::optional<qkv::View>(ds.view()) : std::nullopt);
    EXPECT_LE(max_err(values(dq), want.dq), 1e-10) << c.name;
    EXPECT_LE(max_err(values(dk), want.dk), 1e-10) << c.name;
    EXPECT_LE(max_err(values(dv), want.dv), 1e-10) << c.name;
    if (c.sinks) {
      EXPECT_LE(max_err(values(ds), want.dsinks), 1e-10) << c.name;
    }
  }
}

// Score outputs (ONNX's qk_matmul_output modes 0–2): every stage of every case from the reference
// kernel, f64 and f32 inputs (f64 output: the reference works in f64 on the f32 values), equal to
// naive<double> on the same inputs to 1e-10 (both exact up to the rounding of D-term sums, ~1e-14);
// masked keys −∞ in 'masked' and finite in the other two. out and lse stay those of a call without.
TEST(Variants, ScoreOutputsMatchNaive) {
  for (DType t : {DType::f64, DType::f32})
    for (const Case& c : cases()) {
      const Inputs in(c, t, 41);
      const Naive<double> want = naive<double>(in);
      Call call(in, t);
      for (auto [stage, ref] : {std::pair{qkv::ScoreStage::scaled, &want.scaled},
                                std::pair{qkv::ScoreStage::softcapped, &want.capped},
                                std::pair{qkv::ScoreStage::masked, &want.masked}}) {
        Buffer out(t, {c.B, c.H, c.Sq, c.Dv}), lse(DType::f64, {c.B, c.H, c.Sq}),
            sc(DType::f64, {c.B, c.H, c.Sq, c.Skv});
        const auto info = qkv::attention(call.q.view(), call.k.view(), call.v.view(), out.view(), call.opt, lse.view(),
                                         std::nullopt, qkv::ScoresOutput{sc.view(), stage});
        EXPECT_EQ(info.kernel, qkv::Kernel::reference) << c.name;
        const std::vector<double> got = values(sc);
        const double e = max_err(got, *ref);
        std::size_t inf_mismatch = 0;
        for (std::size_t x = 0; x < got.size(); ++x) inf_mismatch += std::isinf(got[x]) != std::isinf((*ref)[x]);
        EXPECT_LE(e, 1e-10) << c.name << " stage " << static_cast<int>(stage) << " " << qkv::dtype_name(t);
        EXPECT_EQ(inf_mismatch, 0u) << c.name << " stage " << static_cast<int>(stage);
        if (t == DType::f64) {
          EXPECT_LE(max_err(values(out), want.out), 1e-10) << c.name;
          EXPECT_LE(max_err(values(lse), want.lse), 1e-10) << c.name;
        }
      }
    }
}

TEST(Variants, ScoreOutputValidation) {
  Buffer q(DType::f32, {1, 2, 3, 4}), k(DType::f32, {1, 2, 5, 4}), out(DType::f32, {1, 2, 3, 4});
  auto message = [&](const qkv::ScoresOutput& s, qkv::Kernel kern = qkv::Kernel::automatic,
                     std::optional<qkv::View> pattern = std::nullopt) {
    AttentionOptions o;
    o.kernel = kern;
    try {
      qkv::attention(q.view(), k.view(), k.view(), out.view(), o, std::nullopt, pattern, s);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  Buffer wrong(DType::f32, {1, 2, 3, 4}), bf(DType::bf16, {1, 2, 3, 5}), good(DType::f32, {1, 2, 3, 5});
  EXPECT_NE(message({wrong.view()}).find("scores.scores: expected [B, H, Sq, Skv] = [1, 2, 3, 5], got [1, 2, 3, 4]"),
            std::string::npos) << message({wrong.view()});
  EXPECT_NE(message({bf.view()}).find("scores.scores: dtype must be f32 or f64, got bf16"), std::string::npos);
  EXPECT_NE(message({good.view()}, qkv::Kernel::flash).find("no pattern or scores output (got f32, D = 4, Dv = 4, scores requested)"),
            std::string::npos) << message({good.view()}, qkv::Kernel::flash);
  EXPECT_NE(message({good.view()}, qkv::Kernel::automatic, good.view()).find("scores.scores: output memory overlaps pattern"),
            std::string::npos);
  EXPECT_NE(message({good.view(), static_cast<qkv::ScoreStage>(7)}).find("scores.stage: unknown value 7"),
            std::string::npos);
}

// dL/dsink by central differences of the f64 reference forward, L = Σ dout ∘ out: checks the
// closed form of the sink gradient (and naive's) independently.
TEST(Variants, SinkGradientMatchesFiniteDifferences) {
  Case c{"fd", 2, 2, 1, 9, 13, 8, 8, true, Align::bottom_right};
  c.sinks = true, c.softcap = 2.0, c.alibi = true;
  const Inputs in(c, DType::f64, 7);
  const Naive<double> want = naive<double>(in);
  for (std::int64_t h = 0; h < c.H; ++h) {
    double l[2];
    for (int side = 0; side < 2; ++side) {
      Inputs moved = in;
      moved.sinks[static_cast<std::size_t>(h)] += side ? 1e-6 : -1e-6;
      Call call(moved, DType::f64);
      call.opt.kernel = qkv::Kernel::reference;
      Buffer out(DType::f64, {c.B, c.H, c.Sq, c.Dv});
      qkv::attention(call.q.view(), call.k.view(), call.v.view(), out.view(), call.opt);
      l[side] = 0.0;
      for (std::size_t e = 0; e < in.dout.size(); ++e) l[side] += in.dout[e] * out.view().load(static_cast<std::int64_t>(e));
    }
    const double fd = (l[1] - l[0]) / 2e-6;
    EXPECT_NEAR(want.dsinks[static_cast<std::size_t>(h)], fd, 1e-7) << "head " << h;  // FD error ~ 1e-10 · |L|
  }
}

TEST(Variants, FastKernelsWithinTwiceNaive) {
  IsaGuard guard;
  for (DType t : {DType::f32, DType::bf16}) {
    const double ulps = t == DType::f32 ? 0x1p-20 : 0x1p-7;
    auto max_abs = [](const std::vector<double>& x) {
      double m = 1e-3;
      for (double e : x) m = std::isfinite(e) ? std::max(m, std::abs(e)) : m;
      return m;
    };
    for (const Case& c : cases()) {
      const Inputs in(c, t, 23);
      const Naive<double> want = naive<double>(in);
      const Naive<float> lowp = naive<float>(in);
      // The naive computation's error in the kernel's precision, outputs rounded to the dtype.
      const double grads = std::max({max_abs(want.dq), max_abs(want.dk), max_abs(want.dv)});
      const double tol_out = 2 * max_err(lowp.out, want.out, t) + ulps * max_abs(want.out);
      const double tol_lse = 2 * max_err(lowp.lse, want.lse) + 0x1p-20 * max_abs(want.lse);  // lse is f32
      const double tol_dq = 2 * max_err(lowp.dq, want.dq, t) + ulps * grads,
                   tol_dk = 2 * max_err(lowp.dk, want.dk, t) + ulps * grads,
                   tol_dv = 2 * max_err(lowp.dv, want.dv, t) + ulps * grads;
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Call call(in, t);
        for (qkv::Kernel kern : {qkv::Kernel::flash, qkv::Kernel::flash_decode}) {
          call.opt.kernel = kern;
          Buffer out(t, {c.B, c.H, c.Sq, c.Dv}), lse(DType::f32, {c.B, c.H, c.Sq});
          const auto info = qkv::attention(call.q.view(), call.k.view(), call.v.view(), out.view(), call.opt, lse.view());
          const double eo = max_err(values(out), want.out), el = max_err(values(lse), want.lse);
          std::printf("%-40s %-5s %-28s out %.2e (tol %.2e) lse %.2e (tol %.2e)\n", c.name, qkv::dtype_name(t), info.name,
                      eo, tol_out, el, tol_lse);
          EXPECT_LE(eo, tol_out) << c.name << " " << info.name;
          EXPECT_LE(el, tol_lse) << c.name << " " << info.name;
          if (kern != qkv::Kernel::flash) continue;
          // The backward gets the reference kernel's out (rounded to the dtype) and lse, as
          // test_backward.cpp does, so that its error is its own, not the forward's.
          AttentionOptions ro = call.opt;
          ro.kernel = qkv::Kernel::reference;
          qkv::attention(call.q.view(), call.k.view(), call.v.view(), out.view(), ro, lse.view());
          Buffer dq(t, {c.B, c.H, c.Sq, c.D}), dk(t, {c.B, c.Hkv, c.Skv, c.D}), dv(t, {c.B, c.Hkv, c.Skv, c.Dv}),
              ds(DType::f64, {c.H});
          // The flash backward, keep_first included (checked: no fallback to the reference).
          const auto binfo = qkv::attention_backward(call.q.view(), call.k.view(), call.v.view(), out.view(), call.dout.view(),
                                                     lse.view(), dq.view(), dk.view(), dv.view(), call.opt,
                                                     c.sinks ? std::optional<qkv::View>(ds.view()) : std::nullopt);
          EXPECT_EQ(binfo.kernel, qkv::Kernel::flash) << c.name;
          const double eq = max_err(values(dq), want.dq), ek = max_err(values(dk), want.dk),
                       ev = max_err(values(dv), want.dv);
          std::printf("%-40s %-5s %-28s dq %.2e (%.2e) dk %.2e (%.2e) dv %.2e (%.2e)\n", c.name, qkv::dtype_name(t),
                      binfo.name, eq, tol_dq, ek, tol_dk, ev, tol_dv);
          EXPECT_LE(eq, tol_dq) << c.name << " " << binfo.name;
          EXPECT_LE(ek, tol_dk) << c.name << " " << binfo.name;
          EXPECT_LE(ev, tol_dv) << c.name << " " << binfo.name;
          if (c.sinks) {
            // dsinks is a sum over B·Sq rows of exp(sink − lse) (dout · out), computed in f64 from
            // the kernel's out and lse: each row adds at most Dv · |dout| (≤ 5σ) · tol_out + |delta| · tol_lse.
            const double es = max_err(values(ds), want.dsinks);
            const double tol_ds = 2 * max_err(lowp.dsinks, want.dsinks) +
                                  static_cast<double>(c.B * c.Sq) * (5.0 * static_cast<double>(c.Dv) * tol_out + 5.0 * tol_lse);
            EXPECT_LE(es, tol_ds) << c.name << " " << binfo.name;
          }
        }
      }
    }
  }
}

// With dropout (issue #17) the variants go through the same kernels: the fast forward and backward
// against the f64 reference kernel on the same f32 inputs (the reference regenerates the same mask).
// Tolerance: the f32 rule's order of magnitude, 2^-16 of the largest value (a few hundred f32 ulps
// of the largest gradient: the naive oracle above has no dropout to measure the naive error with).
TEST(Variants, CombineWithDropout) {
  IsaGuard guard;
  Case c{"dropout_all_variants", 2, 4, 2, 40, 90, 32, 32, true, Align::bottom_right_key_lengths};
  c.softcap = 3.0, c.alibi = true, c.sinks = true, c.key_lengths = {90, 50};
  const Inputs in(c, DType::f32, 31);
  for (Isa isa : isas()) {
    qkv::set_isa(isa);
    Call call(in, DType::f32);
    call.opt.dropout_p = 0.25, call.opt.dropout_seed = 1234;
    Buffer out[2] = {Buffer(DType::f32, {c.B, c.H, c.Sq, c.Dv}), Buffer(DType::f32, {c.B, c.H, c.Sq, c.Dv})};
    Buffer lse[2] = {Buffer(DType::f32, {c.B, c.H, c.Sq}), Buffer(DType::f32, {c.B, c.H, c.Sq})};
    std::vector<double> g[2][4];
    for (int r = 0; r < 2; ++r) {  // 0: reference, 1: flash
      call.opt.kernel = r ? qkv::Kernel::flash : qkv::Kernel::reference;
      qkv::attention(call.q.view(), call.k.view(), call.v.view(), out[r].view(), call.opt, lse[r].view());
      Buffer dq(DType::f32, {c.B, c.H, c.Sq, c.D}), dk(DType::f32, {c.B, c.Hkv, c.Skv, c.D}),
          dv(DType::f32, {c.B, c.Hkv, c.Skv, c.Dv}), ds(DType::f64, {c.H});
      qkv::attention_backward(call.q.view(), call.k.view(), call.v.view(), out[0].view(), call.dout.view(),
                              lse[0].view(), dq.view(), dk.view(), dv.view(), call.opt, ds.view());
      g[r][0] = values(dq), g[r][1] = values(dk), g[r][2] = values(dv), g[r][3] = values(ds);
    }
    const std::vector<double> o0 = values(out[0]);
    double big = 1e-3;
    for (double x : o0) big = std::max(big, std::abs(x));
    EXPECT_LE(max_err(values(out[1]), o0), 0x1p-16 * big) << qkv::isa_name(isa);
    for (int t = 0; t < 4; ++t) {
      double gb = 1e-3;
      for (double x : g[0][t]) gb = std::max(gb, std::abs(x));
      EXPECT_LE(max_err(g[1][t], g[0][t]), 0x1p-16 * gb) << qkv::isa_name(isa) << " gradient " << t;
    }
  }
}

// Packed sequences take the variants per sequence: each must equal its own [1, H, S, D] call.
TEST(Variants, VarlenMatchesPerSequence) {
  const std::vector<std::int64_t> lq = {5, 0, 17}, lk = {9, 4, 30};
  const std::int64_t H = 4, Hkv = 2, D = 32;
  std::int64_t Tq = 0, Tk = 0;
  for (std::size_t s = 0; s < lq.size(); ++s) Tq += lq[s], Tk += lk[s];
  Buffer q(DType::f32, {Tq, H, D}), k(DType::f32, {Tk, Hkv, D}), v(DType::f32, {Tk, Hkv, D}), out(DType::f32, {Tq, H, D});
  std::mt19937 g(5);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  for (Buffer* b : {&q, &k, &v})
    for (std::int64_t e = 0; e < b->numel(); ++e) b->ptr<float>()[e] = nd(g);
  Buffer slopes(DType::f64, {H}), sinks(DType::f32, {H}), cq(DType::i64, {4}), ck(DType::i64, {4});
  const auto st = qkv::alibi_standard_slopes(H);
  for (std::int64_t h = 0; h < H; ++h) slopes.ptr<double>()[h] = st[static_cast<std::size_t>(h)], sinks.ptr<float>()[h] = 0.5f * static_cast<float>(h) - 1.0f;
  cq.ptr<std::int64_t>()[0] = ck.ptr<std::int64_t>()[0] = 0;
  for (std::size_t s = 0; s < lq.size(); ++s)
    cq.ptr<std::int64_t>()[s + 1] = cq.ptr<std::int64_t>()[s] + lq[s], ck.ptr<std::int64_t>()[s + 1] = ck.ptr<std::int64_t>()[s] + lk[s];
  AttentionOptions o;
  o.causal = true, o.align = Align::bottom_right, o.softcap = 3.0, o.alibi_slopes = slopes.view(), o.sinks = sinks.view();
  qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view(), o);
  std::int64_t q0 = 0, k0 = 0;
  for (std::size_t s = 0; s < lq.size(); ++s) {
    if (lq[s] > 0) {
      Buffer qs(DType::f32, {1, H, lq[s], D}), ks(DType::f32, {1, Hkv, lk[s], D}), vs(DType::f32, {1, Hkv, lk[s], D}),
          os(DType::f32, {1, H, lq[s], D});
      for (std::int64_t t = 0; t < lq[s]; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d) qs.ptr<float>()[(h * lq[s] + t) * D + d] = q.ptr<float>()[((q0 + t) * H + h) * D + d];
      for (std::int64_t t = 0; t < lk[s]; ++t)
        for (std::int64_t h = 0; h < Hkv; ++h)
          for (std::int64_t d = 0; d < D; ++d) {
            ks.ptr<float>()[(h * lk[s] + t) * D + d] = k.ptr<float>()[((k0 + t) * Hkv + h) * D + d];
            vs.ptr<float>()[(h * lk[s] + t) * D + d] = v.ptr<float>()[((k0 + t) * Hkv + h) * D + d];
          }
      AttentionOptions so = o;
      so.kernel = qkv::Kernel::flash;
      qkv::attention(qs.view(), ks.view(), vs.view(), os.view(), so);
      for (std::int64_t t = 0; t < lq[s]; ++t)
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t d = 0; d < D; ++d)
            EXPECT_EQ(out.ptr<float>()[((q0 + t) * H + h) * D + d], os.ptr<float>()[(h * lq[s] + t) * D + d]) << "sequence " << s;
    }
    q0 += lq[s], k0 += lk[s];
  }
}

TEST(Variants, ValidationNamesArgumentAndValue) {
  Buffer q(DType::f32, {1, 2, 3, 4}), k(DType::f32, {1, 2, 3, 4}), out(DType::f32, {1, 2, 3, 4});
  auto message = [&](const AttentionOptions& o) {
    try {
      qkv::attention(q.view(), k.view(), k.view(), out.view(), o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  AttentionOptions o;
  o.softcap = -1.0;
  EXPECT_NE(message(o).find("opt.softcap: must be a finite number > 0, got -1"), std::string::npos) << message(o);
  Buffer three(DType::f32, {3});
  o = {};
  o.alibi_slopes = three.view();
  EXPECT_NE(message(o).find("opt.alibi_slopes: expected [H] = [2], got [3]"), std::string::npos) << message(o);
  Buffer two(DType::f32, {2});
  two.ptr<float>()[0] = 0.0f, two.ptr<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  o = {};
  o.sinks = two.view();
  EXPECT_NE(message(o).find("opt.sinks[1]: must be finite"), std::string::npos) << message(o);
  EXPECT_THROW(qkv::alibi_standard_slopes(0), std::invalid_argument);
}

// Per-batch ALiBi slopes [B, H] (FlashAttention's (batch_size, nheads)): each batch row's output,
// lse and gradients equal a call on that row alone with its [H] slopes, bit for bit (every kernel
// computes a batch row independently), on the reference, flash, flash_decode and the backward.
TEST(Variants, PerBatchAlibiEqualsOneCallPerRow) {
  IsaGuard guard;
  const std::int64_t B = 3, H = 4, Hkv = 2, D = 32;
  for (std::int64_t Sq : {std::int64_t{1}, std::int64_t{37}})
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      const std::int64_t Skv = 90;
      Buffer q(DType::f32, {B, H, Sq, D}), k(DType::f32, {B, Hkv, Skv, D}), v(DType::f32, {B, Hkv, Skv, D}),
          dout(DType::f32, {B, H, Sq, D}), slopes(DType::f32, {B, H});
      std::mt19937 g(3);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (Buffer* t : {&q, &k, &v, &dout})
        for (std::int64_t e = 0; e < t->numel(); ++e) t->ptr<float>()[e] = nd(g);
      for (std::int64_t e = 0; e < B * H; ++e) slopes.ptr<float>()[e] = 0.05f * static_cast<float>(e + 1);
      for (qkv::Kernel kern : {qkv::Kernel::reference, qkv::Kernel::flash, qkv::Kernel::flash_decode}) {
        AttentionOptions o;
        o.causal = true, o.align = Align::bottom_right, o.kernel = kern, o.alibi_slopes = slopes.view();
        Buffer out(DType::f32, {B, H, Sq, D}), lse(DType::f32, {B, H, Sq});
        qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view());
        Buffer dq(DType::f32, {B, H, Sq, D}), dk(DType::f32, {B, Hkv, Skv, D}), dv(DType::f32, {B, Hkv, Skv, D});
        AttentionOptions ob = o;
        ob.kernel = kern == qkv::Kernel::flash_decode ? qkv::Kernel::flash : kern;
        qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                                dv.view(), ob);
        for (std::int64_t b = 0; b < B; ++b) {
          auto row = [b](const Buffer& t) {  // batch row b as a [1, ...] view
            qkv::View r = t.view();
            r.data = t.ptr<float>() + b * r.stride(0);
            r.shape[0] = 1;
            return r;
          };
          qkv::View s1 = slopes.view();
          s1.rank = 1, s1.data = slopes.ptr<float>() + b * H, s1.shape = {H, 0, 0, 0}, s1.strides = {1, 0, 0, 0};
          AttentionOptions o1 = o;
          o1.alibi_slopes = s1;
          Buffer out1(DType::f32, {1, H, Sq, D}), lse1(DType::f32, {1, H, Sq});
          qkv::attention(row(q), row(k), row(v), out1.view(), o1, lse1.view());
          Buffer dq1(DType::f32, {1, H, Sq, D}), dk1(DType::f32, {1, Hkv, Skv, D}), dv1(DType::f32, {1, Hkv, Skv, D});
          AttentionOptions o1b = o1;
          o1b.kernel = ob.kernel;
          qkv::attention_backward(row(q), row(k), row(v), row(out), row(dout), row(lse), dq1.view(), dk1.view(), dv1.view(),
                                  o1b);
          for (auto [whole, one] : {std::pair{&out, &out1}, std::pair{&lse, &lse1}, std::pair{&dq, &dq1},
                                    std::pair{&dk, &dk1}, std::pair{&dv, &dv1}}) {
            const std::int64_t n = one->numel();
            EXPECT_EQ(std::memcmp(whole->ptr<float>() + b * n, one->ptr<float>(), static_cast<std::size_t>(n) * 4), 0)
                << qkv::kernel_name(kern) << " " << qkv::isa_name(isa) << " Sq " << Sq << " batch " << b;
          }
        }
      }
    }
}

// StreamingLLM's keep_first beside a window equals, on every kernel, the same call with the window
// written out as an explicit bool mask [Sq, Skv] (window_left and keep_first off), forward and
// backward (dout = q, a stand-in with the right shape; tolerances of the backward below): bit for bit on
// the fast kernels (the same scores in the same tiles; the kept call only skips tiles that are
// masked for every row), to 1e-12 on the f64 reference (f64 rounding of identical sums). Shapes put
// the gap across whole key tiles (64) and whole decode chunks (512), and rows without a gap.
TEST(Variants, KeepFirstEqualsExplicitMask) {
  IsaGuard guard;
  struct Shape { std::int64_t Sq, Skv, window_left, keep_first; Align align; };
  for (const Shape sh : {Shape{1, 1500, 100, 4, Align::bottom_right}, Shape{7, 1300, 64, 130, Align::bottom_right},
                         Shape{200, 200, 20, 1, Align::top_left}, Shape{50, 400, 0, 64, Align::bottom_right}})
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      const std::int64_t B = 1, H = 4, Hkv = 2, D = 32;
      Buffer q(DType::f32, {B, H, sh.Sq, D}), k(DType::f32, {B, Hkv, sh.Skv, D}), v(DType::f32, {B, Hkv, sh.Skv, D}),
          mask(DType::u8, {sh.Sq, sh.Skv});
      std::mt19937 g(5);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (Buffer* t : {&q, &k, &v})
        for (std::int64_t e = 0; e < t->numel(); ++e) t->ptr<float>()[e] = nd(g);
      for (std::int64_t i = 0; i < sh.Sq; ++i) {
        const std::int64_t diag = sh.align == Align::top_left ? i : i + sh.Skv - sh.Sq;
        for (std::int64_t j = 0; j < sh.Skv; ++j)
          mask.ptr<std::uint8_t>()[i * sh.Skv + j] = j >= diag - sh.window_left || j < sh.keep_first;
      }
      for (qkv::Kernel kern : {qkv::Kernel::reference, qkv::Kernel::flash, qkv::Kernel::flash_decode}) {
        AttentionOptions kept, explicit_mask;
        kept.causal = explicit_mask.causal = true;
        kept.align = explicit_mask.align = sh.align;
        kept.kernel = explicit_mask.kernel = kern;
        kept.window_left = sh.window_left, kept.keep_first = sh.keep_first;
        explicit_mask.mask = mask.view();
        Buffer o1(DType::f32, {B, H, sh.Sq, D}), o2(DType::f32, {B, H, sh.Sq, D}), l1(DType::f32, {B, H, sh.Sq}),
            l2(DType::f32, {B, H, sh.Sq});
        qkv::attention(q.view(), k.view(), v.view(), o1.view(), kept, l1.view());
        qkv::attention(q.view(), k.view(), v.view(), o2.view(), explicit_mask, l2.view());
        const double eo = max_err(values(o1), values(o2)), el = max_err(values(l1), values(l2));
        const double tol = kern == qkv::Kernel::reference ? 1e-12 : 0.0;
        EXPECT_LE(eo, tol) << qkv::kernel_name(kern) << " " << qkv::isa_name(isa) << " Sq " << sh.Sq << " Skv " << sh.Skv;
        EXPECT_LE(el, tol) << qkv::kernel_name(kern) << " " << qkv::isa_name(isa) << " Sq " << sh.Sq << " Skv " << sh.Skv;
        if (kern == qkv::Kernel::flash_decode) continue;  // no backward of its own
        // The backward, from one forward's out and lse so that only the rule differs. Flash: the same
        // P and dS in the same tiles (the gap's tiles skipped, or adding exact zeros), but the key
        // chunks are cut by the rule's work, so dq's per-chunk sums may add in another grouping:
        // 2^-18 of the largest gradient (a few f32 roundings), where a wrong key range errs by O(1).
        Buffer dq[2] = {Buffer(DType::f32, {B, H, sh.Sq, D}), Buffer(DType::f32, {B, H, sh.Sq, D})};
        Buffer dk[2] = {Buffer(DType::f32, {B, Hkv, sh.Skv, D}), Buffer(DType::f32, {B, Hkv, sh.Skv, D})};
        Buffer dv[2] = {Buffer(DType::f32, {B, Hkv, sh.Skv, D}), Buffer(DType::f32, {B, Hkv, sh.Skv, D})};
        for (int r = 0; r < 2; ++r) {
          const auto info = qkv::attention_backward(q.view(), k.view(), v.view(), o1.view(), q.view(), l1.view(),
                                                    dq[r].view(), dk[r].view(), dv[r].view(), r ? explicit_mask : kept);
          EXPECT_EQ(info.kernel, kern);
        }
        for (Buffer* grad : {dq, dk, dv}) {
          double big = 0;
          for (double x : values(grad[1])) big = std::max(big, std::abs(x));
          const double gtol = kern == qkv::Kernel::reference ? 1e-12 : 0x1p-18 * big;
          EXPECT_LE(max_err(values(grad[0]), values(grad[1])), gtol)
              << "backward " << qkv::kernel_name(kern) << " " << qkv::isa_name(isa) << " Sq " << sh.Sq << " Skv " << sh.Skv;
        }
      }
    }
}

TEST(Variants, KeepFirstValidation) {
  Buffer q(DType::f32, {1, 1, 2, 4});
  AttentionOptions o;
  o.keep_first = -3;
  try {
    qkv::attention(q.view(), q.view(), q.view(), Buffer(DType::f32, {1, 1, 2, 4}).view(), o);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("opt.keep_first: must be ≥ 0, got -3"), std::string::npos) << e.what();
  }
}

// The paper's slopes: H = 8 → 2^-1 … 2^-8; H = 12 → those of 8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5.
TEST(Variants, StandardAlibiSlopes) {
  const auto s8 = qkv::alibi_standard_slopes(8);
  for (int h = 0; h < 8; ++h) EXPECT_DOUBLE_EQ(s8[static_cast<std::size_t>(h)], std::pow(2.0, -(h + 1)));
  const auto s12 = qkv::alibi_standard_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int m = 0; m < 4; ++m) EXPECT_DOUBLE_EQ(s12[static_cast<std::size_t>(8 + m)], std::pow(2.0, -0.5 - m));
}

}  // namespace
