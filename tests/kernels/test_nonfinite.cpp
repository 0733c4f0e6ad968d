// The non-finite policy of qkv/attention.hpp, on every kernel (reference in f64, flash and
// flash_decode on every ISA this CPU has, f32 and bf16) and on the backward:
//   a NaN or +∞ score on a key the row may attend makes the row NaN (out and lse), and, in the
//   backward, its dq and the dk, dv of the keys it may attend; masked keys stay ignored even when
//   their K is NaN (bool mask, causal rule, and additive −∞); a row with no allowed key stays zeros.
// Regression test for issue #16, item 4 ("NaN and ±inf in K are silently dropped"): before the
// fix the flash kernels gave finite or zero rows (the NaN lost by exp2, by a max, by the dead-tile
// test and by the lse clamp), and the backward gave finite dq.
//
// Which rows must be NaN is decided here, independently of the library: scores recomputed in f64
// from the rounded inputs, with the contract's `allowed` rule written out again. The finite rows
// are compared with the f64 reference on the same inputs (tolerances below).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "qkv/attention.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::Align;
using qkv::Buffer;
using qkv::DType;
using qkv::testing::IsaGuard;
using qkv::testing::isas;
using qkv::testing::round_to;
using qkv::testing::fill_rounded;
using qkv::Isa;
using qkv::Kernel;
using i64 = std::int64_t;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

enum class MaskType { none, boolean, additive };

struct Case {
  const char* name;
  i64 B, H, Hkv, Sq, Skv, D;
  bool causal;
  Align align;
  MaskType mask;
};

// Shapes: several 64-key tiles and 6-row strips; the decode shapes reach several 512-key chunks
// of flash_decode (its chunk merge is one of the places a NaN was lost).
const Case kCases[] = {
    {"causal_nomask", 2, 4, 2, 70, 150, 64, true, Align::top_left, MaskType::none},
    {"causal_additive", 2, 4, 2, 70, 150, 40, true, Align::top_left, MaskType::additive},
    {"full_bool", 2, 4, 2, 45, 150, 64, false, Align::top_left, MaskType::boolean},
    {"decode_additive", 2, 4, 2, 3, 1100, 64, true, Align::bottom_right, MaskType::additive},
    {"decode_bool", 2, 4, 2, 1, 1100, 48, false, Align::top_left, MaskType::boolean},
};



// Inputs as f64 values exactly representable in dtype t (NaN and ±∞ included), with the poisons:
//   K[b0, hk0, key 20, d 5] = NaN               rows of heads 0, 1 allowing key 20 → NaN
//   K[b0, hk1, key j1, d 3] = +∞                score +∞ (NaN row) or −∞ (key ignored), by sign(q_3)
//   Q[b1, h0, row 1 % Sq, d 0] = NaN            that row NaN
//   additive: mask[b0, h0, rows ≥ 25, key 20] = −∞ (the NaN key masked: finite rows),
//             mask[b1, h2, last row, key 15] = NaN, mask[b1, h1, last row, key 2] = +∞ (NaN rows),
//             mask[b1, h3, row 0, :] = −∞ with Q of that row NaN (a fully masked row: zeros)
//   bool:     mask[b0, h1, :, key 20] = 0 (the NaN key denied to head 1: finite rows),
//             mask[b1, h3, row 0, :] = 0 with Q of that row NaN (zeros)
struct Inputs {
  i64 B, H, Hkv, Sq, Skv, D, Dv;
  std::vector<double> q, k, v, mask;  // logical [B,H,Sq,D] [B,Hkv,Skv,D] [B,Hkv,Skv,Dv] [B,H,Sq,Skv]
  Buffer mask_buf;
  double& Q(i64 b, i64 h, i64 i, i64 d) { return q[static_cast<std::size_t>(((b * H + h) * Sq + i) * D + d)]; }
  double& K(i64 b, i64 h, i64 j, i64 d) { return k[static_cast<std::size_t>(((b * Hkv + h) * Skv + j) * D + d)]; }
  double& M(i64 b, i64 h, i64 i, i64 j) { return mask[static_cast<std::size_t>(((b * H + h) * Sq + i) * Skv + j)]; }
};

Inputs make_inputs(const Case& c, DType t) {
  Inputs in{c.B, c.H, c.Hkv, c.Sq, c.Skv, c.D, c.D, {}, {}, {}, {}, {}};
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  fill_rounded(in.q, c.B * c.H * c.Sq * c.D, t, 2.0, rng, u);
  fill_rounded(in.k, c.B * c.Hkv * c.Skv * c.D, t, 2.0, rng, u);
  fill_rounded(in.v, c.B * c.Hkv * c.Skv * c.D, t, 1.0, rng, u);
  in.mask.assign(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Skv), c.mask == MaskType::boolean ? 1.0 : 0.0);
  if (c.mask == MaskType::additive)
    for (auto& m : in.mask) m = round_to(t, u(rng));
  const i64 j1 = c.Skv - 7;
  in.K(0, 0, 20, 5) = kNaN;
  in.K(0, 1, j1, 3) = kInf;
  in.Q(1, 0, 1 % c.Sq, 0) = kNaN;
  if (c.mask == MaskType::additive) {
    for (i64 i = 25; i < c.Sq; ++i) in.M(0, 0, i, 20) = -kInf;
    in.M(1, 2, c.Sq - 1, 15) = kNaN;
    in.M(1, 1, c.Sq - 1, 2) = kInf;
    for (i64 j = 0; j < c.Skv; ++j) in.M(1, 3, 0, j) = -kInf;
    in.Q(1, 3, 0, 1) = kNaN;
  } else if (c.mask == MaskType::boolean) {
    for (i64 i = 0; i < c.Sq; ++i) in.M(0, 1, i, 20) = 0.0;
    for (i64 j = 0; j < c.Skv; ++j) in.M(1, 3, 0, j) = 0.0;
    in.Q(1, 3, 0, 1) = kNaN;
  }
  if (c.mask != MaskType::none) {
    in.mask_buf = Buffer(c.mask == MaskType::boolean ? DType::u8 : DType::f32, {c.B, c.H, c.Sq, c.Skv});
    for (i64 x = 0; x < in.mask_buf.numel(); ++x) in.mask_buf.view().store(x, in.mask[static_cast<std::size_t>(x)]);
  }
  return in;
}

// The contract's rule, written again: causal (with its alignment) and the dense mask.
bool allowed(const Case& c, Inputs& in, i64 b, i64 h, i64 i, i64 j) {
  const i64 diag = c.align == Align::bottom_right ? i + c.Skv - c.Sq : i;
  if (c.causal && j > diag) return false;
  if (c.mask == MaskType::boolean) return in.M(b, h, i, j) != 0.0;
  if (c.mask == MaskType::additive) return in.M(b, h, i, j) != -kInf;
  return true;
}

enum class Row { finite, nan, dead };

// Expected class of every row [B, H, Sq], from f64 scores of the rounded inputs.
std::vector<Row> expected_rows(const Case& c, Inputs& in) {
  std::vector<Row> r;
  const i64 G = c.H / c.Hkv;
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.H; ++h)
      for (i64 i = 0; i < c.Sq; ++i) {
        bool nan = false, live = false;
        for (i64 j = 0; j < c.Skv; ++j) {
          if (!allowed(c, in, b, h, i, j)) continue;
          double s = 0.0;
          for (i64 d = 0; d < c.D; ++d) s += in.Q(b, h, i, d) * in.K(b, h / G, j, d);
          if (c.mask == MaskType::additive) s += in.M(b, h, i, j);
          nan = nan || std::isnan(s) || s == kInf;
          live = live || s > -kInf;
        }
        r.push_back(nan ? Row::nan : live ? Row::finite : Row::dead);
      }
  return r;
}

qkv::AttentionOptions options(const Case& c, const Inputs& in) {
  qkv::AttentionOptions o;
  o.causal = c.causal;
  o.align = c.align;
  if (c.mask != MaskType::none) o.mask = in.mask_buf.view();
  return o;
}

Buffer to_buffer(DType t, const std::vector<double>& x, std::vector<i64> shape) {
  Buffer b(t, std::move(shape));
  for (i64 e = 0; e < b.numel(); ++e) b.view().store(e, x[static_cast<std::size_t>(e)]);
  return b;
}

struct Forward {
  Buffer out, lse;
  qkv::KernelInfo info;
};

Forward run_forward(const Case& c, const Inputs& in, DType t, Kernel kern) {
  Buffer q = to_buffer(t, in.q, {c.B, c.H, c.Sq, c.D}), k = to_buffer(t, in.k, {c.B, c.Hkv, c.Skv, c.D}),
         v = to_buffer(t, in.v, {c.B, c.Hkv, c.Skv, c.D});
  Forward f{Buffer(t, {c.B, c.H, c.Sq, c.D}), Buffer(t == DType::f64 ? DType::f64 : DType::f32, {c.B, c.H, c.Sq}), {}};
  auto o = options(c, in);
  o.kernel = kern;
  o.num_threads = 2;
  f.info = qkv::attention(q.view(), k.view(), v.view(), f.out.view(), o, f.lse.view());
  return f;
}

// Checks every row of `f` against its expected class; finite rows against the f64 reference
// within `tol` (out) and lse_tol relative to |lse| + 1.
void check_forward(const Case& c, const std::vector<Row>& want, const Forward& f, const Forward& ref, double tol,
                   double lse_tol, const char* what) {
  int wrong = 0;
  double err = 0.0, lse_err = 0.0;
  i64 nan_rows = 0;
  for (i64 r = 0; r < c.B * c.H * c.Sq; ++r) {
    const double lse = f.lse.view().load(r);
    bool ok = true;
    for (i64 e = 0; e < c.D; ++e) {
      const double got = f.out.view().load(r * c.D + e);
      switch (want[static_cast<std::size_t>(r)]) {
        case Row::nan: ok = ok && std::isnan(got); break;
        case Row::dead: ok = ok && got == 0.0; break;
        case Row::finite: {
          const double d = std::abs(got - ref.out.view().load(r * c.D + e));
          ok = ok && std::isfinite(got);
          err = std::max(err, d);
          break;
        }
      }
    }
    switch (want[static_cast<std::size_t>(r)]) {
      case Row::nan: ok = ok && std::isnan(lse), ++nan_rows; break;
      case Row::dead: ok = ok && lse == -kInf; break;
      case Row::finite: {
        const double wl = ref.lse.view().load(r);
        ok = ok && std::isfinite(lse);
        lse_err = std::max(lse_err, std::abs(lse - wl) / (std::abs(wl) + 1.0));
        break;
      }
    }
    if (!ok && wrong++ < 3)
      ADD_FAILURE() << c.name << " " << what << ": row " << r << " (b, h, i) = (" << r / (c.H * c.Sq) << ", "
                    << r / c.Sq % c.H << ", " << r % c.Sq << ") expected "
                    << (want[static_cast<std::size_t>(r)] == Row::nan ? "NaN" : want[static_cast<std::size_t>(r)] == Row::dead ? "zeros" : "finite")
                    << ", lse " << lse;
  }
  std::printf("%-16s %-28s NaN rows %lld, finite rows: err %.3g (tol %.3g), lse rel err %.3g\n", c.name, what,
              static_cast<long long>(nan_rows), err, tol, lse_err);
  EXPECT_EQ(wrong, 0) << c.name << " " << what;
  EXPECT_LE(err, tol) << c.name << " " << what;
  EXPECT_LE(lse_err, lse_tol) << c.name << " " << what;
}

class NonFinite : public ::testing::TestWithParam<Case> {};

TEST_P(NonFinite, NanInfInScoresMakeTheRowNanForward) {
  const Case& c = GetParam();
  IsaGuard guard;
  for (DType t : {DType::f32, DType::bf16}) {
    Inputs in = make_inputs(c, t);
    const std::vector<Row> want = expected_rows(c, in);
    i64 n_nan = 0, n_dead = 0;
    for (Row r : want) n_nan += r == Row::nan, n_dead += r == Row::dead;
    // The poisons above must produce both kinds, or the test would prove nothing.
    ASSERT_GT(n_nan, 0) << c.name;
    if (c.mask != MaskType::none) {
      ASSERT_GT(n_dead, 0) << c.name;
    }
    const Forward ref = run_forward(c, in, DType::f64, Kernel::reference);
    // The reference's own rows follow the rule (its finite rows are compared with themselves).
    check_forward(c, want, ref, ref, 0.0, 0.0, "reference_f64");
    // Tolerances: scores of a few units, |out| ≤ 1. f32 kernels differ from f64 by a few ulp of
    // the sums (test_flash.cpp measures ≈ 1e-6); 2e-5 leaves room for the 1100-key rows. bf16
    // kernels round P to bf16 for P·V and the output to bf16 (½ ulp = 2^-9 near 1): 2e-2.
    const double tol = t == DType::f32 ? 2e-5 : 2e-2, lse_tol = 4e-6;
    for (Kernel kern : {Kernel::flash, Kernel::flash_decode})
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        const Forward f = run_forward(c, in, t, kern);
        check_forward(c, want, f, ref, tol, lse_tol, f.info.name);
      }
  }
}

// The backward: NaN rows give NaN dq, and NaN dk, dv on every key some NaN row may attend; every
// other gradient is finite and matches the f64 reference backward (where torch's full-matrix
// backward spreads 0·NaN to the keys a NaN row masks, and to every dq if one K is NaN).
TEST_P(NonFinite, NanRowsGiveNanGradients) {
  const Case& c = GetParam();
  IsaGuard guard;
  for (DType t : {DType::f32, DType::bf16}) {
    Inputs in = make_inputs(c, t);
    const std::vector<Row> want = expected_rows(c, in);
    const i64 G = c.H / c.Hkv;
    std::vector<char> key_nan(static_cast<std::size_t>(c.B * c.Hkv * c.Skv), 0);
    for (i64 b = 0; b < c.B; ++b)
      for (i64 h = 0; h < c.H; ++h)
        for (i64 i = 0; i < c.Sq; ++i)
          if (want[static_cast<std::size_t>((b * c.H + h) * c.Sq + i)] == Row::nan)
            for (i64 j = 0; j < c.Skv; ++j)
              if (allowed(c, in, b, h, i, j)) key_nan[static_cast<std::size_t>((b * c.Hkv + h / G) * c.Skv + j)] = 1;
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<double> dout(static_cast<std::size_t>(c.B * c.H * c.Sq * c.D));
    for (auto& x : dout) x = round_to(t, u(rng));

    auto run = [&](DType dt, Kernel kern, Buffer* dq, Buffer* dk, Buffer* dv) {
      const Forward f = run_forward(c, in, dt, kern == Kernel::reference ? Kernel::reference : Kernel::flash);
      Buffer q = to_buffer(dt, in.q, {c.B, c.H, c.Sq, c.D}), k = to_buffer(dt, in.k, {c.B, c.Hkv, c.Skv, c.D}),
             v = to_buffer(dt, in.v, {c.B, c.Hkv, c.Skv, c.D}), go = to_buffer(dt, dout, {c.B, c.H, c.Sq, c.D});
      Buffer lse32(DType::f32, {c.B, c.H, c.Sq});
      for (i64 x = 0; x < lse32.numel(); ++x) lse32.view().store(x, f.lse.view().load(x));
      *dq = Buffer(dt, {c.B, c.H, c.Sq, c.D}), *dk = Buffer(dt, {c.B, c.Hkv, c.Skv, c.D}), *dv = Buffer(dt, {c.B, c.Hkv, c.Skv, c.D});
      auto o = options(c, in);
      o.kernel = kern;
      o.num_threads = 2;
      return qkv::attention_backward(q.view(), k.view(), v.view(), f.out.view(), go.view(), lse32.view(), dq->view(),
                                     dk->view(), dv->view(), o);
    };
    Buffer rq, rk, rv;
    run(DType::f64, Kernel::reference, &rq, &rk, &rv);
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      Buffer dq, dk, dv;
      const qkv::KernelInfo info = run(t, Kernel::flash, &dq, &dk, &dv);
      int wrong = 0;
      double err = 0.0, scale = 0.0;
      auto check = [&](const Buffer& got, const Buffer& ref, i64 rows, i64 cols, auto row_nan, const char* name) {
        for (i64 r = 0; r < rows; ++r)
          for (i64 e = 0; e < cols; ++e) {
            const double g = got.view().load(r * cols + e), w = ref.view().load(r * cols + e);
            const bool want_nan = row_nan(r);
            if (want_nan ? !std::isnan(g) || !std::isnan(w) : !std::isfinite(g) || !std::isfinite(w)) {
              if (wrong++ < 3)
                ADD_FAILURE() << c.name << " " << info.name << " " << name << " row " << r << " col " << e << ": got " << g
                              << ", reference " << w << ", expected " << (want_nan ? "NaN" : "finite");
              continue;
            }
            if (!want_nan) err = std::max(err, std::abs(g - w)), scale = std::max(scale, std::abs(w));
          }
      };
      check(dq, rq, c.B * c.H * c.Sq, c.D, [&](i64 r) { return want[static_cast<std::size_t>(r)] == Row::nan; }, "dq");
      check(dk, rk, c.B * c.Hkv * c.Skv, c.D, [&](i64 r) { return key_nan[static_cast<std::size_t>(r)] != 0; }, "dk");
      check(dv, rv, c.B * c.Hkv * c.Skv, c.D, [&](i64 r) { return key_nan[static_cast<std::size_t>(r)] != 0; }, "dv");
      // Finite gradients against f64: test_backward.cpp holds the kernels to 2× a naive
      // computation in their precision; here a plain bound relative to the largest gradient:
      // 1e-4 in f32 (sums of ≤ 1100 products, ≈ 1e-6 each), 3e-2 in bf16 (inputs of P·V, dS
      // and the outputs rounded to 8 bits).
      const double tol = (t == DType::f32 ? 1e-4 : 3e-2) * (scale + 1e-3);
      std::printf("%-16s %-28s backward: finite gradients err %.3g (tol %.3g)\n", c.name, info.name, err, tol);
      EXPECT_EQ(wrong, 0) << c.name << " " << info.name;
      EXPECT_LE(err, tol) << c.name << " " << info.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, NonFinite, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

}  // namespace
