// One driver for every forward kernel: flash and flash_decode × every ISA this CPU has (via
// set_isa) × f32 and bf16, compared with the f64 reference over awkward shapes on purpose.
//
// Accuracy rule (FlashAttention's): against the f64 reference on the same (rounded) inputs, a
// kernel's max error may be at most 2× the max error of a naive computation in the same
// precision (naive_lowp below: scores, softmax and P·V in f32; for bf16 the scores and
// probabilities rounded to bf16 as a bf16 matmul would, and the output rounded to bf16), plus
// an absolute floor for the cases where the naive computation happens to be almost exact:
// 1e-6 in f32 (≈ 8 ulp at the |out| ≤ 1 of these inputs), 2^-8 in bf16 (1 ulp near 1: the
// output rounding alone can cost ½ ulp, and the naive path may get lucky on a given element).
// Every case prints the errors it saw.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/scratch.hpp"
#include "qkv/attention.hpp"
#include "support/random_data.hpp"

namespace qkv_test {
double exp2_max_rel_error_avx512(bool* zeros_ok);
double exp2_max_rel_error_avx2(bool* zeros_ok);
double exp2_max_rel_error_scalar(bool* zeros_ok);
double softcap_max_abs_error_avx512(bool* special_ok);
double softcap_max_abs_error_avx2(bool* special_ok);
double softcap_max_abs_error_scalar(bool* special_ok);
}  // namespace qkv_test

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
using qkv::View;
using i64 = std::int64_t;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kSentinel = -1024.0;  // guard value, exact in f32 and bf16

enum class MaskType { none, boolean, additive, boolean_2d };

struct Case {
  const char* name;
  i64 B, H, Hkv, Sq, Skv, D, Dv;
  bool causal = false;
  Align align = Align::top_left;
  i64 wl = -1, wr = -1;
  MaskType mask = MaskType::none;
  bool key_padding = false;
  bool strided = false;  // q, k, v, out stored [B, S, H, D] (PyTorch's BSHD), and misaligned by one element
  bool nan_padding = false;  // K and V hold NaN past key_lengths[b] (an uninitialised KV cache)
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// A tensor of logical shape [n0, n1, n2, n3] holding `vals` (row-major logical order), as a view
// of dtype t: contiguous, or stored [n0, n2, n1, n3] and shifted by one element (misaligned).
// `guard` elements after the storage are filled with a sentinel to catch stray writes.
struct Tensor {
  Buffer buf;
  View view;
  i64 used = 0, guard = 0;
  Tensor(DType t, const std::vector<i64>& s, bool strided, i64 guard_elems = 16) : guard(guard_elems) {
    const i64 n = s[0] * s[1] * s[2] * s[3];
    const i64 shift = strided ? 1 : 0;
    used = n + shift;
    buf = Buffer(t, {used + guard});
    char* base = static_cast<char*>(buf.data()) + shift * static_cast<i64>(qkv::dtype_size(t));
    if (strided)
      view = View::strided(base, t, {s[0], s[1], s[2], s[3]}, {s[1] * s[2] * s[3], s[3], s[1] * s[3], 1});
    else
      view = View::contiguous(base, t, {s[0], s[1], s[2], s[3]});
    for (i64 g = 0; g < guard; ++g) buf.view().store(used + g, kSentinel);
  }
  void fill(const std::vector<double>& vals) {
    i64 x = 0;
    for (i64 a = 0; a < view.dim(0); ++a)
      for (i64 b = 0; b < view.dim(1); ++b)
        for (i64 c = 0; c < view.dim(2); ++c)
          for (i64 d = 0; d < view.dim(3); ++d) view.store(view.offset(a, b, c, d), vals[static_cast<std::size_t>(x++)]);
  }
  double at(i64 a, i64 b, i64 c, i64 d) const { return view.load(view.offset(a, b, c, d)); }
  bool guard_intact() const {
    for (i64 g = 0; g < guard; ++g)
      if (buf.view().load(used + g) != kSentinel) return false;
    return true;
  }
};

struct Inputs {
  std::vector<double> q, k, v;  // logical [B,H,Sq,D] [B,Hkv,Skv,D] [B,Hkv,Skv,Dv], rounded to the dtype
  Buffer mask;                  // u8 or f32, [B, H, Sq, Skv] or [Sq, Skv]
  Buffer key_len;               // i32 [B]
};

Inputs make_inputs(const Case& c, DType t, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Inputs in;
  // Scores of a few units: softmax neither uniform nor one-hot.
  fill_rounded(in.q, c.B * c.H * c.Sq * c.D, t, 2.0, rng, u);
  fill_rounded(in.k, c.B * c.Hkv * c.Skv * c.D, t, 2.0, rng, u);
  fill_rounded(in.v, c.B * c.Hkv * c.Skv * c.Dv, t, 1.0, rng, u);
  if (c.mask == MaskType::boolean || c.mask == MaskType::boolean_2d) {
    const bool two_d = c.mask == MaskType::boolean_2d;
    in.mask = two_d ? Buffer(DType::u8, {c.Sq, c.Skv}) : Buffer(DType::u8, {c.B, c.H, c.Sq, c.Skv});
    auto* m = in.mask.ptr<std::uint8_t>();
    for (i64 x = 0; x < in.mask.numel(); ++x) m[x] = u(rng) > -0.6 ? 1 : 0;
    if (c.Sq > 1) std::memset(m + c.Skv, 0, static_cast<std::size_t>(c.Skv));  // row 1 of (0, 0): fully masked
  } else if (c.mask == MaskType::additive) {
    in.mask = Buffer(DType::f32, {c.B, c.H, c.Sq, c.Skv});
    auto* m = in.mask.ptr<float>();
    for (i64 x = 0; x < in.mask.numel(); ++x) m[x] = u(rng) > 0.8 ? -INFINITY : static_cast<float>(2.0 * u(rng));
    if (c.Sq > 2)
      for (i64 j = 0; j < c.Skv; ++j) m[2 * c.Skv + j] = -INFINITY;  // row 2 of (0, 0): all −∞
  }
  in.key_len = Buffer(DType::i32, {c.B});
  for (i64 b = 0; b < c.B; ++b)
    in.key_len.ptr<std::int32_t>()[b] = static_cast<std::int32_t>(
        !c.key_padding ? c.Skv : b % 3 == 0 ? c.Skv / 2 + 1 : b % 3 == 1 ? 0 : c.Skv);
  return in;
}

qkv::AttentionOptions options(const Case& c, const Inputs& in) {
  qkv::AttentionOptions o;
  o.causal = c.causal;
  o.align = c.align;
  o.window_left = c.wl;
  o.window_right = c.wr;
  if (c.mask != MaskType::none) o.mask = in.mask.view();
  if (c.key_padding) o.key_lengths = in.key_len.view();
  return o;
}

// The contract of qkv/attention.hpp written out again, independently of the library's KeyRange.
bool allowed(const Case& c, const Inputs& in, i64 b, i64 h, i64 i, i64 j) {
  const i64 diag = c.align == Align::bottom_right ? i + c.Skv - c.Sq : i;
  if (c.causal && j > diag) return false;
  if (c.wl >= 0 && j < diag - c.wl) return false;
  if (c.wr >= 0 && j > diag + c.wr) return false;
  if (j >= in.key_len.ptr<std::int32_t>()[b]) return false;
  if (c.mask == MaskType::boolean) return in.mask.ptr<std::uint8_t>()[((b * c.H + h) * c.Sq + i) * c.Skv + j] != 0;
  if (c.mask == MaskType::boolean_2d) return in.mask.ptr<std::uint8_t>()[i * c.Skv + j] != 0;
  return true;
}

// The naive computation in the working precision (see the rule at the top). out [B,H,Sq,Dv].
std::vector<double> naive_lowp(const Case& c, const Inputs& in, DType t) {
  const bool bf = t == DType::bf16;
  auto rb = [&](float x) { return bf ? qkv::bf16_to_f32(qkv::f32_to_bf16(x)) : x; };
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.D)));
  std::vector<double> out(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Dv));
  std::vector<float> s(static_cast<std::size_t>(c.Skv));
  const i64 G = c.H / c.Hkv;
  for (i64 b = 0; b < c.B; ++b)
    for (i64 h = 0; h < c.H; ++h)
      for (i64 i = 0; i < c.Sq; ++i) {
        const i64 hk = h / G;
        float m = -INFINITY;
        for (i64 j = 0; j < c.Skv; ++j) {
          s[j] = -INFINITY;
          if (!allowed(c, in, b, h, i, j)) continue;
          float dot = 0.0f;
          for (i64 d = 0; d < c.D; ++d)
            dot += static_cast<float>(in.q[((b * c.H + h) * c.Sq + i) * c.D + d]) *
                   static_cast<float>(in.k[((b * c.Hkv + hk) * c.Skv + j) * c.D + d]);
          float x = rb(dot) * scale;
          if (c.mask == MaskType::additive) x += in.mask.ptr<float>()[((b * c.H + h) * c.Sq + i) * c.Skv + j];
          s[j] = x;
          m = std::max(m, x);
        }
        float sum = 0.0f;
        for (i64 j = 0; j < c.Skv; ++j) {
          s[j] = m == -INFINITY || s[j] == -INFINITY ? 0.0f : std::exp(s[j] - m);
          sum += s[j];
        }
        for (i64 e = 0; e < c.Dv; ++e) {
          float acc = 0.0f;
          for (i64 j = 0; j < c.Skv; ++j)
            if (s[j] != 0.0f) acc += rb(s[j] / sum) * static_cast<float>(in.v[((b * c.Hkv + hk) * c.Skv + j) * c.Dv + e]);
          out[((b * c.H + h) * c.Sq + i) * c.Dv + e] = rb(acc);
        }
      }
  return out;
}

struct Oracle {
  std::vector<double> out, lse;
};

Oracle reference_f64(const Case& c, const Inputs& in) {
  Tensor q(DType::f64, {c.B, c.H, c.Sq, c.D}, false), k(DType::f64, {c.B, c.Hkv, c.Skv, c.D}, false),
      v(DType::f64, {c.B, c.Hkv, c.Skv, c.Dv}, false), out(DType::f64, {c.B, c.H, c.Sq, c.Dv}, false);
  Buffer lse(DType::f64, {c.B, c.H, c.Sq});
  q.fill(in.q), k.fill(in.k), v.fill(in.v);
  auto o = options(c, in);
  o.kernel = Kernel::reference;
  qkv::attention(q.view, k.view, v.view, out.view, o, lse.view());
  Oracle r;
  r.out.assign(out.buf.ptr<double>(), out.buf.ptr<double>() + c.B * c.H * c.Sq * c.Dv);
  r.lse.assign(lse.ptr<double>(), lse.ptr<double>() + c.B * c.H * c.Sq);
  return r;
}


const Case kCases[] = {
    {"basic", 2, 3, 3, 37, 53, 64, 64},
    {"D1", 1, 2, 2, 9, 13, 1, 1},
    {"D3_Dv5", 1, 2, 1, 11, 70, 3, 5},
    {"D80_Dv96", 1, 2, 2, 20, 75, 80, 96},
    {"D17_Dv200", 1, 1, 1, 13, 67, 17, 200},
    {"D256", 1, 1, 1, 20, 70, 256, 256},
    {"D128_primes", 1, 2, 2, 197, 211, 128, 128},
    {"len1", 1, 2, 2, 1, 1, 32, 32},
    {"Sq1_long", 1, 4, 2, 1, 1537, 64, 64},
    {"Sq_gt_Skv", 1, 2, 2, 193, 1, 32, 32},
    {"gqa", 2, 8, 2, 29, 41, 32, 48},
    {"mqa_decode", 1, 4, 1, 3, 700, 64, 64},
    {"gqa_decode_rows", 1, 8, 2, 3, 300, 40, 40},
    {"causal_tl_short", 1, 2, 2, 40, 131, 64, 64, true, Align::top_left},
    {"causal_tl_tall", 1, 2, 2, 131, 40, 64, 64, true, Align::top_left},
    {"causal_br_short", 1, 2, 2, 40, 131, 64, 64, true, Align::bottom_right},
    {"causal_br_tall", 1, 2, 2, 131, 40, 64, 64, true, Align::bottom_right},
    {"causal_square", 2, 2, 1, 257, 257, 96, 96, true},
    {"window", 1, 2, 2, 150, 150, 32, 32, false, Align::top_left, 5, 3},
    {"causal_window", 1, 2, 2, 200, 200, 64, 64, true, Align::top_left, 70},
    {"window_br", 1, 2, 2, 30, 300, 32, 32, false, Align::bottom_right, 20, 0},
    {"key_padding", 3, 2, 2, 33, 130, 64, 64, false, Align::top_left, -1, -1, MaskType::none, true},
    {"decode_padding_window", 3, 2, 1, 2, 1500, 64, 64, true, Align::bottom_right, 900, -1, MaskType::none, true},
    {"bool_mask", 2, 2, 2, 35, 90, 32, 32, false, Align::top_left, -1, -1, MaskType::boolean},
    {"bool_mask_2d_causal", 2, 2, 2, 35, 90, 32, 32, true, Align::bottom_right, -1, -1, MaskType::boolean_2d},
    {"additive_mask", 2, 2, 1, 35, 90, 48, 48, false, Align::top_left, -1, -1, MaskType::additive},
    {"strided_misaligned", 2, 4, 2, 45, 77, 64, 64, true, Align::top_left, -1, -1, MaskType::none, false, true},
    {"strided_odd", 1, 3, 3, 19, 23, 33, 7, false, Align::top_left, -1, -1, MaskType::none, true, true},
    // Odd D with an even row stride: the bf16 K tile takes the 16 × 16 pair transpose plus an odd tail.
    {"strided_D33_even_rows", 1, 4, 2, 40, 90, 33, 40, true, Align::bottom_right, -1, -1, MaskType::none, false, true},
    {"empty_keys", 1, 2, 2, 5, 0, 16, 16},
    // bf16 decode on AVX-512 BF16: 4 rows per kv head (16-key blocks summed by one transpose-add,
    // P·V on key pairs), 3 rows with Dv = 96 (32-column blocks), 7 rows with D = 96 and Dv = 80
    // (a last block of 16 columns), and keys cut at odd lengths (a pair and a block across the end).
    {"gqa_decode_D128", 1, 16, 4, 1, 1000, 128, 128},
    {"gqa_decode_padding_Dv96", 3, 6, 2, 1, 777, 128, 96, false, Align::top_left, -1, -1, MaskType::none, true},
    {"decode_rows7_D96_Dv80", 1, 7, 1, 1, 300, 96, 80},
    // Long enough for the bf16 decode's chunks of 2048 keys (≥ 32 items at that length), with
    // key padding cutting the last chunk of each sequence at its own length.
    {"decode_long_chunks", 2, 8, 4, 1, 16400, 64, 64, false, Align::top_left, -1, -1, MaskType::none, true},
    // Padding keys hold NaN: no kernel may read them, not even to multiply them by a zero probability.
    {"decode_nan_padding", 3, 8, 2, 1, 700, 128, 128, false, Align::top_left, -1, -1, MaskType::none, true, false, true},
    {"nan_padding", 3, 2, 2, 33, 130, 64, 64, false, Align::top_left, -1, -1, MaskType::none, true, false, true},
};

// Overwrites K and V past key_lengths[b] with NaN (Case::nan_padding).
void poison_padding(const Case& c, const Inputs& in, Tensor& k, Tensor& v) {
  for (i64 b = 0; b < c.B; ++b)
    for (i64 hk = 0; hk < c.Hkv; ++hk)
      for (i64 j = in.key_len.ptr<std::int32_t>()[b]; j < c.Skv; ++j) {
        for (i64 d = 0; d < c.D; ++d) k.view.store(k.view.offset(b, hk, j, d), std::nan(""));
        for (i64 e = 0; e < c.Dv; ++e) v.view.store(v.view.offset(b, hk, j, e), std::nan(""));
      }
}

void run_case(const Case& c) {
  IsaGuard guard;
  for (DType t : {DType::f32, DType::bf16}) {
    const Inputs in = make_inputs(c, t, 1234u + static_cast<unsigned>(c.Sq * 31 + c.Skv));
    const Oracle ref = reference_f64(c, in);
    const std::vector<double> naive = naive_lowp(c, in, t);
    double naive_err = 0.0;
    for (std::size_t x = 0; x < naive.size(); ++x) naive_err = std::max(naive_err, std::abs(naive[x] - ref.out[x]));
    const double floor = t == DType::f32 ? 1e-6 : 1.0 / 256;
    // lse: f32 stored; 4e-6 relative to |lse| + 1 covers the f32 rounding of scores and sums.
    const double lse_tol_rel = 4e-6;
    for (Kernel kern : {Kernel::flash, Kernel::flash_decode}) {
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Tensor q(t, {c.B, c.H, c.Sq, c.D}, c.strided), k(t, {c.B, c.Hkv, c.Skv, c.D}, c.strided),
            v(t, {c.B, c.Hkv, c.Skv, c.Dv}, c.strided), out(t, {c.B, c.H, c.Sq, c.Dv}, c.strided);
        q.fill(in.q), k.fill(in.k), v.fill(in.v);
        if (c.nan_padding) poison_padding(c, in, k, v);
        Buffer lse_buf(DType::f32, {c.B * c.H * c.Sq + 8});
        for (i64 x = 0; x < lse_buf.numel(); ++x) lse_buf.ptr<float>()[x] = 1234.5f;
        const View lse = View::contiguous(lse_buf.data(), DType::f32, {c.B, c.H, c.Sq});
        auto o = options(c, in);
        o.kernel = kern;
        o.num_threads = 2;
        const qkv::KernelInfo info = qkv::attention(q.view, k.view, v.view, out.view, o, lse);
        EXPECT_EQ(info.kernel, kern);
        double err = 0.0, lse_err = 0.0;
        bool bad_inf = false;
        for (i64 b = 0; b < c.B; ++b)
          for (i64 h = 0; h < c.H; ++h)
            for (i64 i = 0; i < c.Sq; ++i) {
              for (i64 e = 0; e < c.Dv; ++e) {
                const double got = out.at(b, h, i, e), want = ref.out[static_cast<std::size_t>(((b * c.H + h) * c.Sq + i) * c.Dv + e)];
                err = std::max(err, std::isnan(got) ? kInf : std::abs(got - want));
              }
              const double gl = lse_buf.ptr<float>()[(b * c.H + h) * c.Sq + i];
              const double wl = ref.lse[static_cast<std::size_t>((b * c.H + h) * c.Sq + i)];
              if (std::isinf(wl) || std::isinf(gl)) bad_inf = bad_inf || gl != wl;
              else lse_err = std::max(lse_err, std::abs(gl - wl) / (std::abs(wl) + 1.0));
            }
        const double tol = 2.0 * naive_err + floor;
        std::printf("%-22s %-12s %-24s err %.3g (naive %.3g, tol %.3g)  lse rel err %.3g\n", c.name,
                    qkv::dtype_name(t), info.name, err, naive_err, tol, lse_err);
        EXPECT_LE(err, tol) << c.name << " " << info.name;
        EXPECT_LE(lse_err, lse_tol_rel) << c.name << " " << info.name;
        EXPECT_FALSE(bad_inf) << c.name << " " << info.name << ": lse −∞ where the reference is finite or back";
        EXPECT_TRUE(out.guard_intact()) << c.name << " " << info.name << ": wrote past out";
        for (i64 x = c.B * c.H * c.Sq; x < lse_buf.numel(); ++x)
          EXPECT_EQ(lse_buf.ptr<float>()[x], 1234.5f) << c.name << ": wrote past lse";
      }
    }
  }
}

class FlashCases : public ::testing::TestWithParam<Case> {};
TEST_P(FlashCases, MatchesReference) { run_case(GetParam()); }
INSTANTIATE_TEST_SUITE_P(All, FlashCases, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// Same bits for 1, 2 and 3 threads, for both kernels and dtypes. The forward case also changes
// its query blocks with the thread count (1 and 2 threads: 150 rows; 3 threads: 78, to give
// each thread 8 items): a row's result must not depend on them.
TEST(Flash, BitIdenticalAcrossThreadCounts) {
  const Case c{"threads", 2, 4, 2, 300, 1100, 64, 64, true, Align::bottom_right};
  const Case d{"threads_decode", 1, 4, 1, 2, 3000, 64, 64};
  for (const Case* cc : {&c, &d})
    for (DType t : {DType::f32, DType::bf16}) {
      const Inputs in = make_inputs(*cc, t, 7u);
      Tensor q(t, {cc->B, cc->H, cc->Sq, cc->D}, false), k(t, {cc->B, cc->Hkv, cc->Skv, cc->D}, false),
          v(t, {cc->B, cc->Hkv, cc->Skv, cc->Dv}, false);
      q.fill(in.q), k.fill(in.k), v.fill(in.v);
      std::vector<std::vector<unsigned char>> results;
      for (int threads : {1, 2, 3}) {
        Tensor out(t, {cc->B, cc->H, cc->Sq, cc->Dv}, false);
        Buffer lse(DType::f32, {cc->B, cc->H, cc->Sq});
        auto o = options(*cc, in);
        o.num_threads = threads;
        const auto info = qkv::attention(q.view, k.view, v.view, out.view, o, lse.view());
        std::vector<unsigned char> bytes(static_cast<const unsigned char*>(out.buf.data()),
                                         static_cast<const unsigned char*>(out.buf.data()) + out.buf.bytes());
        bytes.insert(bytes.end(), lse.ptr<unsigned char>(), lse.ptr<unsigned char>() + lse.bytes());
        results.push_back(bytes);
        std::printf("%s %s threads=%d kernel %s\n", cc->name, qkv::dtype_name(t), threads, info.name);
      }
      EXPECT_EQ(results[0], results[1]) << cc->name;
      EXPECT_EQ(results[0], results[2]) << cc->name;
    }
}

// Several caller threads running attention at once (each with its own thread pool, 2 threads, all
// leasing scratch from the one pool): every call gives the bits of the same call made alone.
// Shapes differ per caller (forward and decode, f32 and bf16), so their scratch sizes differ.
TEST(Flash, ConcurrentCallersGetTheirOwnResults) {
  const Case cases[] = {{"conc_fwd", 1, 4, 2, 97, 130, 64, 48, true},
                        {"conc_fwd_big", 2, 3, 3, 200, 200, 128, 128},
                        {"conc_decode", 1, 8, 2, 1, 1500, 64, 64},
                        {"conc_fwd_small", 1, 2, 1, 7, 9, 16, 16}};
  struct Run {
    const Case* c;
    DType t;
    Inputs in;
    std::vector<unsigned char> alone;
  };
  std::vector<Run> runs;
  for (const Case& c : cases)
    for (DType t : {DType::f32, DType::bf16}) runs.push_back({&c, t, make_inputs(c, t, 11u), {}});
  // One call: out and lse as bytes.
  auto call = [](const Run& r) {
    const Case& c = *r.c;
    Tensor q(r.t, {c.B, c.H, c.Sq, c.D}, false), k(r.t, {c.B, c.Hkv, c.Skv, c.D}, false),
        v(r.t, {c.B, c.Hkv, c.Skv, c.Dv}, false), out(r.t, {c.B, c.H, c.Sq, c.Dv}, false);
    q.fill(r.in.q), k.fill(r.in.k), v.fill(r.in.v);
    Buffer lse(DType::f32, {c.B, c.H, c.Sq});
    auto o = options(c, r.in);
    o.num_threads = 2;
    qkv::attention(q.view, k.view, v.view, out.view, o, lse.view());
    std::vector<unsigned char> bytes(static_cast<const unsigned char*>(out.buf.data()),
                                     static_cast<const unsigned char*>(out.buf.data()) + out.buf.bytes());
    bytes.insert(bytes.end(), lse.ptr<unsigned char>(), lse.ptr<unsigned char>() + lse.bytes());
    return bytes;
  };
  for (Run& r : runs) r.alone = call(r);
  std::vector<int> mismatches(runs.size(), 0);
  std::vector<std::thread> callers;
  for (std::size_t i = 0; i < runs.size(); ++i)
    callers.emplace_back([&, i] {
      for (int rep = 0; rep < 6; ++rep) mismatches[i] += call(runs[i]) != runs[i].alone;
    });
  for (auto& th : callers) th.join();
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::printf("%s %s: %d of 6 concurrent calls differ from the call made alone\n", runs[i].c->name,
                qkv::dtype_name(runs[i].t), mismatches[i]);
    EXPECT_EQ(mismatches[i], 0) << runs[i].c->name;
  }
}

// Packed variable-length batches run as one parallel loop over all sequences: each sequence must
// give the same bits as its own attention() call with the flash kernel, and match the f64
// reference (tolerance 2e-6: the f32 cases above stay below 6e-7 on the same value ranges).
TEST(Flash, VarlenMatchesPerSequenceCalls) {
  const std::vector<i64> lq = {3, 0, 1, 37, 200, 5}, lk = {50, 7, 1, 37, 260, 0};
  const i64 H = 4, Hkv = 2, D = 40, Tq = 246, Tk = 355;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Buffer q(DType::f32, {Tq, H, D}), k(DType::f32, {Tk, Hkv, D}), v(DType::f32, {Tk, Hkv, D}), out(DType::f32, {Tq, H, D});
  Buffer q64(DType::f64, {Tq, H, D}), k64(DType::f64, {Tk, Hkv, D}), v64(DType::f64, {Tk, Hkv, D}), out64(DType::f64, {Tq, H, D});
  for (auto [a, b] : {std::pair{&q, &q64}, std::pair{&k, &k64}, std::pair{&v, &v64}})
    for (i64 x = 0; x < a->numel(); ++x) {
      const float f = 2.0f * u(rng);
      a->ptr<float>()[x] = f;
      b->ptr<double>()[x] = f;
    }
  Buffer cq(DType::i32, {7}), ck(DType::i32, {7});
  for (std::size_t b = 0; b <= lq.size(); ++b) {
    cq.ptr<std::int32_t>()[b] = b ? cq.ptr<std::int32_t>()[b - 1] + static_cast<std::int32_t>(lq[b - 1]) : 0;
    ck.ptr<std::int32_t>()[b] = b ? ck.ptr<std::int32_t>()[b - 1] + static_cast<std::int32_t>(lk[b - 1]) : 0;
  }
  qkv::AttentionOptions o;
  o.causal = true;
  o.align = Align::bottom_right;
  o.num_threads = 2;
  o.kernel = Kernel::flash;
  const auto info = qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view(), o);
  EXPECT_EQ(info.kernel, Kernel::flash);
  auto o64 = o;
  o64.kernel = Kernel::reference;
  qkv::attention_varlen(q64.view(), k64.view(), v64.view(), out64.view(), cq.view(), ck.view(), o64);
  double err = 0.0;
  for (i64 x = 0; x < out.numel(); ++x) err = std::max(err, std::abs(out.ptr<float>()[x] - out64.ptr<double>()[x]));
  std::printf("varlen %s: max error vs f64 reference %.3g\n", info.name, err);
  EXPECT_LE(err, 2e-6);
  // Sequence by sequence through attention() on [1, H, S, D] views of the packed tensors.
  i64 q0 = 0, k0 = 0;
  for (std::size_t b = 0; b < lq.size(); ++b) {
    if (lq[b] > 0) {
      Buffer ob(DType::f32, {1, H, lq[b], D});
      const auto win = [](const Buffer& t, i64 t0, i64 len, i64 heads) {
        return View::strided(t.ptr<float>() + t0 * heads * 40, DType::f32, {1, heads, len, 40}, {0, 40, heads * 40, 1});
      };
      qkv::attention(win(q, q0, lq[b], H), win(k, k0, lk[b], Hkv), win(v, k0, lk[b], Hkv), ob.view(), o);
      for (i64 h = 0; h < H; ++h)
        for (i64 i = 0; i < lq[b]; ++i)
          for (i64 d = 0; d < D; ++d)
            ASSERT_EQ(ob.ptr<float>()[(h * lq[b] + i) * D + d], out.ptr<float>()[((q0 + i) * H + h) * D + d])
                << "sequence " << b;
    }
    q0 += lq[b], k0 += lk[b];
  }
}

// An error probe of every ISA's SIMD layer the CPU runs (exp2_<isa>.cpp): fn returns the error and
// sets *ok when its special values come out as they must; both checked against the bound.
using ErrorProbe = double (*)(bool*);
void check_probes(const char* what, const ErrorProbe (&fn)[3], double bound) {
  const Isa isa[3] = {Isa::scalar, Isa::avx2, Isa::avx512};
  for (int x = 0; x < 3; ++x) {
    if (isa[x] > qkv::cpu_isa()) continue;
    bool ok = false;
    const double err = fn[x](&ok);
    std::printf("%s %-7s max error %.3g\n", what, qkv::isa_name(isa[x]), err);
    EXPECT_LE(err, bound) << what << " " << qkv::isa_name(isa[x]);
    EXPECT_TRUE(ok) << what << " " << qkv::isa_name(isa[x]);
  }
}

// The vectorised exp2 of every ISA: relative error within 2.5e-7 (≈ 2 ulp of f32; the
// polynomial's own error is 2.3e-7 in f32 arithmetic, see simd_common.hpp), exact 0 below −126.
TEST(Flash, Exp2Accuracy) {
  check_probes("exp2 (relative)",
               {qkv_test::exp2_max_rel_error_scalar, qkv_test::exp2_max_rel_error_avx2, qkv_test::exp2_max_rel_error_avx512},
               2.5e-7);
}

// The softcap of every ISA (score_mod.hpp: tanh from exp2 and rcp + Newton) against std::tanh in
// f64, over the whole range, ±0, tiny and huge scores, with ±∞ and NaN as the policy says:
// absolute error within 5e-7 · c (4 ulps of c; measured 2.8e-7 scalar, 3.6e-7 AVX2, 3.1e-7
// AVX-512: exp2's 2.4e-7 halved, the Newton reciprocal's ≈ 1 ulp, and the roundings of 1 + E
// and of c − 2c · r).
TEST(Flash, SoftcapAccuracy) {
  check_probes("softcap (absolute, · c)",
               {qkv_test::softcap_max_abs_error_scalar, qkv_test::softcap_max_abs_error_avx2,
                qkv_test::softcap_max_abs_error_avx512},
               5e-7);
}

// Automatic choice: the fast kernels for f32/bf16, decode for few queries against many keys, and
// the reference for f64 or when the pattern is requested.
TEST(Flash, AutomaticChoice) {
  Buffer q(DType::f32, {1, 2, 64, 32}), k(DType::f32, {1, 2, 2048, 32}), v(DType::f32, {1, 2, 2048, 32}),
      out(DType::f32, {1, 2, 64, 32});
  EXPECT_EQ(qkv::attention(q.view(), k.view(), v.view(), out.view()).kernel, Kernel::flash);
  Buffer q1(DType::f32, {1, 2, 1, 32}), o1(DType::f32, {1, 2, 1, 32});
  EXPECT_EQ(qkv::attention(q1.view(), k.view(), v.view(), o1.view()).kernel, Kernel::flash_decode);
  // The decode rule's boundary (src/attention/dispatch.cpp): Sq ≤ 2 always, Sq ≤ 8 from Skv = 512.
  const auto choice = [](i64 Sq, i64 Skv) {
    Buffer qq(DType::f32, {1, 2, Sq, 32}), kk(DType::f32, {1, 2, Skv, 32}), vv(DType::f32, {1, 2, Skv, 32}),
        oo(DType::f32, {1, 2, Sq, 32});
    return qkv::attention(qq.view(), kk.view(), vv.view(), oo.view()).kernel;
  };
  EXPECT_EQ(choice(1, 1), Kernel::flash_decode);
  EXPECT_EQ(choice(2, 100), Kernel::flash_decode);
  EXPECT_EQ(choice(3, 511), Kernel::flash);
  EXPECT_EQ(choice(8, 512), Kernel::flash_decode);
  EXPECT_EQ(choice(9, 4096), Kernel::flash);
  Buffer pat(DType::f32, {1, 2, 1, 2048});
  EXPECT_EQ(qkv::attention(q1.view(), k.view(), v.view(), o1.view(), {}, std::nullopt, pat.view()).kernel,
            Kernel::reference);
  qkv::AttentionOptions o;
  o.kernel = Kernel::flash;
  EXPECT_THROW(qkv::attention(q1.view(), k.view(), v.view(), o1.view(), o, std::nullopt, pat.view()),
               std::invalid_argument);
}

// The forward's scratch goes back to the pool with its size and serves the next call: after a
// first call, further calls of the same shape leave the pool holding the same blocks and bytes
// (independent values: the counts before the repeated calls). A block returned with a wrong size
// (0) would never be leased again, and the count of blocks would grow by each call's leases.
TEST(Flash, ScratchReusedAcrossCalls) {
  Buffer q(DType::f32, {1, 2, 100, 64}), k(DType::f32, {1, 2, 100, 64}), v(DType::f32, {1, 2, 100, 64}),
      out(DType::f32, {1, 2, 100, 64});
  for (const Buffer* b : {&q, &k, &v})
    for (std::int64_t i = 0; i < b->numel(); ++i) b->view().store(i, 0.01 * static_cast<double>(i % 97));
  qkv::AttentionOptions o;
  o.num_threads = 2;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), o);
  std::size_t blocks = 0, bytes = 0;
  qkv::scratch_pool_held(&blocks, &bytes);
  for (int i = 0; i < 3; ++i) qkv::attention(q.view(), k.view(), v.view(), out.view(), o);
  std::size_t blocks2 = 0, bytes2 = 0;
  qkv::scratch_pool_held(&blocks2, &bytes2);
  std::printf("pool after 1 call: %zu blocks, %zu bytes; after 3 more: %zu blocks, %zu bytes\n", blocks, bytes,
              blocks2, bytes2);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(blocks2, blocks);
  EXPECT_EQ(bytes2, bytes);
}

}  // namespace
