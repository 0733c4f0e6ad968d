// KV caches (issue #19 item 6): qkv::attention_kvcache over a contiguous, a paged (block table) and
// an int8 cache, and qkv::kvcache_append, on every instruction set this CPU has (set_isa).
//   - paged = contiguous, bit for bit: the decode kernel reads the same rows in the same order,
//     only their addresses differ (except bf16 on AVX-512 BF16 with blocks of < 16 rows, where the
//     contiguous cache takes the vdpbf16ps policy and the paged one the generic rows:
//     FlashAttention's rule there).
//   - int8 (decode_i8.hpp's contract: q quantised to int8 per row, P·V weights to 15-bit fixed
//     point per tile): on every ISA within qkv/attention.hpp's stated bound of an f64 twin on the
//     dequantised cache and the exact q, and within the bound's P·V term of the twin on q as the
//     contract quantises it; paged = contiguous, and scales stored head-major (a strided view) =
//     token-major, bit for bit.
//   - f16 = the f32 kernel on the widened cache (binary16 → f32 is exact), bit for bit.
//   - append writes the rows it is given (f32: exactly) and int8 rows within half a step:
//     |scale · q − x| ≤ scale / 2 with scale = max|x| / 127 (round to nearest).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"

namespace {

using qkv::Align;
using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::Isa;
using qkv::KvCacheView;

struct IsaGuard {
  Isa saved = qkv::active_isa();
  ~IsaGuard() { qkv::set_isa(saved); }
};

std::vector<Isa> isas() {
  std::vector<Isa> r;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_vnni, Isa::avx512_bf16})
    if (i <= qkv::cpu_isa()) r.push_back(i);
  return r;
}

void fill(const Buffer& b, unsigned seed, double sigma = 1.0) {
  std::mt19937 g(seed);
  std::normal_distribution<double> nd(0.0, sigma);
  for (std::int64_t e = 0; e < b.numel(); ++e) b.view().store(e, nd(g));
}

std::vector<double> values(const Buffer& b) {
  std::vector<double> r(static_cast<std::size_t>(b.numel()));
  for (std::int64_t e = 0; e < b.numel(); ++e) r[static_cast<std::size_t>(e)] = b.view().load(e);
  return r;
}

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (std::size_t e = 0; e < a.size(); ++e) m = std::max(m, std::isnan(a[e]) ? INFINITY : std::abs(a[e] - b[e]));
  return m;
}

// A shape of the tests: B sequences with their key lengths, the pool's block size Sc.
struct Shape {
  std::int64_t B, H, Hkv, Sq, D, Dv, Sc, max_blocks;
  std::vector<std::int64_t> lens;
  std::int64_t Skv() const { return Sc * max_blocks; }
};

// A contiguous cache [B, Skv, Hkv, D] and the same rows scattered over a pool of shuffled blocks
// [Bc, Sc, Hkv, D] (one spare block never referenced, holding NaN: reading it would show).
struct Caches {
  Buffer k, v, pk, pv, table, key_len;
  Caches(const Shape& s, DType t, unsigned seed) {
    k = Buffer(t, {s.B, s.Skv(), s.Hkv, s.D});
    v = Buffer(t, {s.B, s.Skv(), s.Hkv, s.Dv});
    fill(k, seed, 1.5);
    fill(v, seed + 1);
    const std::int64_t Bc = s.B * s.max_blocks + 1;
    pk = Buffer(t, {Bc, s.Sc, s.Hkv, s.D});
    pv = Buffer(t, {Bc, s.Sc, s.Hkv, s.Dv});
    for (std::int64_t e = 0; e < pk.numel(); ++e) pk.view().store(e, NAN);
    for (std::int64_t e = 0; e < pv.numel(); ++e) pv.view().store(e, NAN);
    std::vector<std::int32_t> ids(static_cast<std::size_t>(Bc));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed + 2));
    table = Buffer(DType::i32, {s.B, s.max_blocks});
    key_len = Buffer(DType::i64, {s.B});
    const std::size_t row_k = static_cast<std::size_t>(s.Hkv * s.D) * qkv::dtype_size(t);
    const std::size_t row_v = static_cast<std::size_t>(s.Hkv * s.Dv) * qkv::dtype_size(t);
    for (std::int64_t b = 0; b < s.B; ++b) {
      key_len.ptr<std::int64_t>()[b] = s.lens[static_cast<std::size_t>(b)];
      for (std::int64_t blk = 0; blk < s.max_blocks; ++blk) {
        const std::int32_t id = ids[static_cast<std::size_t>(b * s.max_blocks + blk)];
        table.ptr<std::int32_t>()[b * s.max_blocks + blk] = id;
        for (std::int64_t r = 0; r < s.Sc; ++r) {
          const std::int64_t j = blk * s.Sc + r;
          std::memcpy(static_cast<char*>(pk.data()) + static_cast<std::size_t>(id * s.Sc + r) * row_k,
                      static_cast<char*>(k.data()) + static_cast<std::size_t>(b * s.Skv() + j) * row_k, row_k);
          std::memcpy(static_cast<char*>(pv.data()) + static_cast<std::size_t>(id * s.Sc + r) * row_v,
                      static_cast<char*>(v.data()) + static_cast<std::size_t>(b * s.Skv() + j) * row_v, row_v);
        }
      }
    }
    // The spare block sits in the table past every sequence's keys (vLLM pads with anything).
    if (s.lens[0] <= (s.max_blocks - 1) * s.Sc) table.ptr<std::int32_t>()[s.max_blocks - 1] = ids.back();
  }
  KvCacheView contiguous() const { return {k.view(), v.view(), std::nullopt, std::nullopt, std::nullopt}; }
  KvCacheView paged() const { return {pk.view(), pv.view(), table.view(), std::nullopt, std::nullopt}; }
};

std::vector<Shape> shapes() {
  return {
      {2, 8, 2, 1, 128, 128, 16, 40, {640, 333}},    // decode, GQA, vLLM's block size
      {3, 4, 4, 1, 64, 64, 256, 3, {700, 1, 256}},    // FlashAttention's page size, a 1-key sequence
      {2, 6, 2, 7, 40, 24, 64, 5, {300, 130}},        // prefill of 7 queries, odd head dims
      {2, 6, 2, 1, 64, 48, 8, 20, {160, 77}},         // blocks of 8 rows, GQA 3
      {1, 2, 1, 3, 32, 32, 32, 9, {200}},             // lens[0] ≤ 8·32: the spare NaN block is in the table
  };
}

AttentionOptions options(const Caches& c, bool variants) {
  AttentionOptions o;
  o.causal = true;
  o.align = Align::bottom_right_key_lengths;
  o.key_lengths = c.key_len.view();
  if (variants) o.softcap = 4.0, o.window_left = 150;
  return o;
}

TEST(KvCache, PagedEqualsContiguousBitForBit) {
  IsaGuard guard;
  for (DType t : {DType::f32, DType::bf16})
    for (const Shape& s : shapes())
      for (bool variants : {false, true}) {
        const Caches c(s, t, 11);
        Buffer q(t, {s.B, s.H, s.Sq, s.D});
        fill(q, 3);
        AttentionOptions o = options(c, variants);
        for (Isa isa : isas()) {
          qkv::set_isa(isa);
          Buffer o1(t, {s.B, s.H, s.Sq, s.Dv}), o2(t, {s.B, s.H, s.Sq, s.Dv}), l1(DType::f32, {s.B, s.H, s.Sq}),
              l2(DType::f32, {s.B, s.H, s.Sq});
          o.kernel = qkv::Kernel::flash_decode;
          const auto i1 = qkv::attention_kvcache(q.view(), c.contiguous(), o1.view(), o, l1.view());
          o.kernel = qkv::Kernel::automatic;
          const auto i2 = qkv::attention_kvcache(q.view(), c.paged(), o2.view(), o, l2.view());
          EXPECT_EQ(i2.kernel, qkv::Kernel::flash_decode);
          const double e = max_abs_diff(values(o1), values(o2)), el = max_abs_diff(values(l1), values(l2));
          std::printf("Sc %3ld Sq %ld %-5s %-34s vs %-34s out %.2e lse %.2e\n", static_cast<long>(s.Sc),
                      static_cast<long>(s.Sq), qkv::dtype_name(t), i1.name, i2.name, e, el);
          if (t == DType::bf16 && isa == Isa::avx512_bf16 && s.Sc < 16) {
            // Different kernels (vdpbf16ps against f32 rows): within 2^-7 of the largest output,
            // bf16's 2 ulps (test_variants.cpp's floor), scores differing by f32 rounding only.
            double big = 1e-3;
            for (double x : values(o1)) big = std::max(big, std::abs(x));
            EXPECT_LE(e, 0x1p-7 * big) << i1.name;
          } else {
            EXPECT_EQ(e, 0.0) << s.Sc << " " << i1.name;
            EXPECT_EQ(el, 0.0) << s.Sc << " " << i1.name;
          }
        }
      }
}

// Decode takes up to 8 kv heads per work item (for f32 and bf16 caches of ≥ 16 MiB; fewer when
// there would be under 4 items per thread: flash_decode_impl.hpp), tile by tile across them, and
// prefetches the heads' rows together; no bit may depend on that grouping. Caches of 17–34 MB with
// runs of 8 + 2 heads (Hkv 10), an odd Hkv (3), GQA groups of 2 and 3 and MHA, blocks of 16 and
// 256 rows, key lengths off the block size: on 1, 3 and 32 threads (fewer heads per item),
// contiguous and paged, every output equal to the contiguous one-thread run, and that within its
// precision's bound of an f64 reference.
TEST(KvCache, DecodeHeadGroupingChangesNoBit) {
  IsaGuard guard;
  const std::vector<Shape> grouped = {
      {1, 20, 10, 1, 64, 64, 16, 420, {6700}},     // runs of 8 + 2 heads, GQA 2
      {1, 9, 3, 1, 128, 128, 256, 44, {11200}},     // odd Hkv, GQA 3
      {1, 8, 8, 2, 32, 48, 16, 1100, {17000}},      // MHA, 2 queries, Dv ≠ D
      {2, 8, 8, 2, 32, 48, 16, 30, {470, 33}},      // a small cache: one head per item
  };
  auto widen64 = [](const Buffer& x) {
    Buffer w(DType::f64, x.shape());
    for (std::int64_t e = 0; e < x.numel(); ++e) w.view().store(e, x.view().load(e));
    return w;
  };
  for (DType t : {DType::f32, DType::bf16})
    for (const Shape& s : grouped) {
      const Caches c(s, t, 17);
      Buffer q(t, {s.B, s.H, s.Sq, s.D});
      fill(q, 6);
      AttentionOptions o = options(c, false);
      // The f64 reference on the same (exactly widened) inputs.
      const Buffer q64 = widen64(q), k64 = widen64(c.k), v64 = widen64(c.v);
      Buffer ref(DType::f64, {s.B, s.H, s.Sq, s.Dv});
      o.kernel = qkv::Kernel::reference;
      qkv::attention_kvcache(q64.view(), {k64.view(), v64.view(), std::nullopt, std::nullopt, std::nullopt}, ref.view(), o);
      double big = 1e-3;
      for (double x : values(ref)) big = std::max(big, std::abs(x));
      // f32: 2^-17 of the largest output, 64 units of f32 rounding for the sums over ≤ 2^15 keys,
      // exp2's approximation and the merge of chunks (seen: ≤ 2^-21). bf16: the output's rounding
      // (2^-9) and the probabilities rounded to bf16 before P·V (2^-9 relative each, on a convex
      // sum), with a factor 2 (seen: ≤ 2^-8.3).
      const double tol = (t == DType::f32 ? 0x1p-17 : 0x1p-7) * big;
      o.kernel = qkv::Kernel::flash_decode;
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Buffer anchor(t, {s.B, s.H, s.Sq, s.Dv});
        o.num_threads = 1;
        const auto info = qkv::attention_kvcache(q.view(), c.contiguous(), anchor.view(), o);
        const double e_ref = max_abs_diff(values(anchor), values(ref));
        std::printf("Hkv %2ld Sc %3ld %-5s %-34s vs f64 %.2e (tol %.2e)\n", static_cast<long>(s.Hkv),
                    static_cast<long>(s.Sc), qkv::dtype_name(t), info.name, e_ref, tol);
        EXPECT_LE(e_ref, tol) << info.name;
        for (int threads : {1, 3, 32})
          for (bool paged : {false, true}) {
            Buffer out(t, {s.B, s.H, s.Sq, s.Dv});
            o.num_threads = threads;
            qkv::attention_kvcache(q.view(), paged ? c.paged() : c.contiguous(), out.view(), o);
            EXPECT_EQ(max_abs_diff(values(out), values(anchor)), 0.0)
                << info.name << " threads " << threads << (paged ? " paged" : " contiguous") << " Hkv " << s.Hkv;
          }
      }
    }
}

// The reference reads the paged cache through the table too: equal to its contiguous run (f64).
TEST(KvCache, ReferencePagedEqualsContiguous) {
  for (const Shape& s : shapes()) {
    const Caches c(s, DType::f64, 5);
    Buffer q(DType::f64, {s.B, s.H, s.Sq, s.D}), o1(DType::f64, {s.B, s.H, s.Sq, s.Dv}),
        o2(DType::f64, {s.B, s.H, s.Sq, s.Dv});
    fill(q, 4);
    AttentionOptions o = options(c, true);
    EXPECT_EQ(qkv::attention_kvcache(q.view(), c.contiguous(), o1.view(), o).kernel, qkv::Kernel::reference);
    qkv::attention_kvcache(q.view(), c.paged(), o2.view(), o);
    EXPECT_EQ(max_abs_diff(values(o1), values(o2)), 0.0) << s.Sc;
  }
}

// Naive attention in T over a dense dequantised cache kd/vd [B, Skv, Hkv, X] (f64 values), causal
// bottom_right_key_lengths: the oracle (T = double) and the naive low-precision error (T = float).
template <class T>
std::vector<double> naive(const Shape& s, const std::vector<double>& q, const std::vector<double>& kd,
                          const std::vector<double>& vd) {
  std::vector<double> out(static_cast<std::size_t>(s.B * s.H * s.Sq * s.Dv), 0.0);
  const T scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(s.D)));
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.H; ++h)
      for (std::int64_t i = 0; i < s.Sq; ++i) {
        const std::int64_t hk = h / (s.H / s.Hkv), len = s.lens[static_cast<std::size_t>(b)];
        const std::int64_t hi = std::min(len, i + len - s.Sq + 1);
        std::vector<T> sc(static_cast<std::size_t>(std::max<std::int64_t>(hi, 0)));
        T m = -INFINITY, sum = 0;
        for (std::int64_t j = 0; j < hi; ++j) {
          T x = 0;
          for (std::int64_t d = 0; d < s.D; ++d)
            x += static_cast<T>(q[static_cast<std::size_t>(((b * s.H + h) * s.Sq + i) * s.D + d)]) *
                 static_cast<T>(kd[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.D + d)]);
          sc[static_cast<std::size_t>(j)] = x * scale;
          m = std::max(m, x * scale);
        }
        for (std::int64_t j = 0; j < hi; ++j) sum += std::exp(sc[static_cast<std::size_t>(j)] - m);
        for (std::int64_t e = 0; e < s.Dv; ++e) {
          T acc = 0;
          for (std::int64_t j = 0; j < hi; ++j)
            acc += std::exp(sc[static_cast<std::size_t>(j)] - m) / sum *
                   static_cast<T>(vd[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.Dv + e)]);
          out[static_cast<std::size_t>(((b * s.H + h) * s.Sq + i) * s.Dv + e)] = static_cast<double>(acc);
        }
      }
  return out;
}

// q [B, H, Sq, D] as decode_i8.hpp's contract quantises each row, in f64: d · q8 with
// d = f32(max|q| / 127), q8 = round(f32(q · f32(127 / max|q|))); and each row's step d.
std::vector<double> quantise_q8(const Buffer& q, std::int64_t D, std::vector<double>* step) {
  std::vector<double> r(static_cast<std::size_t>(q.numel()));
  const float* x = q.ptr<float>();
  for (std::int64_t row = 0; row < q.numel() / D; ++row) {
    float amax = 0.0f;
    for (std::int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(x[row * D + d]));
    const float inv = 127.0f / amax, d8 = amax / 127.0f;
    step->push_back(d8);
    for (std::int64_t d = 0; d < D; ++d)
      r[static_cast<std::size_t>(row * D + d)] = std::nearbyint(x[row * D + d] * inv) * static_cast<double>(d8);
  }
  return r;
}

// An int8 cache filled by kvcache_append from the contiguous f32 cache, paged or not. The scales
// [Bc, Sc, Hkv] (ksv, vsv) in token-major storage ks, vs [Bc, Sc, Hkv], or head-major [Bc, Hkv, Sc]
// seen through strides (token stride 1: a caller's own layout, which the kernels read by the view's strides).
struct Int8Cache {
  Buffer k, v, ks, vs;
  qkv::View ksv, vsv;
  Int8Cache(const Shape& s, const Caches& c, bool paged, bool head_major = false) {
    const std::int64_t Bc = paged ? c.pk.shape()[0] : s.B, Sc = paged ? s.Sc : s.Skv();
    k = Buffer(DType::i8, {Bc, Sc, s.Hkv, s.D});
    v = Buffer(DType::i8, {Bc, Sc, s.Hkv, s.Dv});
    if (head_major) {
      ks = Buffer(DType::f32, {Bc, s.Hkv, Sc});
      vs = Buffer(DType::f32, {Bc, s.Hkv, Sc});
      ksv = qkv::View::strided(ks.data(), DType::f32, {Bc, Sc, s.Hkv}, {s.Hkv * Sc, 1, Sc});
      vsv = qkv::View::strided(vs.data(), DType::f32, {Bc, Sc, s.Hkv}, {s.Hkv * Sc, 1, Sc});
    } else {
      ks = Buffer(DType::f32, {Bc, Sc, s.Hkv});
      vs = Buffer(DType::f32, {Bc, Sc, s.Hkv});
      ksv = ks.view(), vsv = vs.view();
    }
    Buffer pos(DType::i64, {s.B});  // zeros: the whole cache in one append
    qkv::kvcache_append(view(paged ? &c : nullptr), c.k.view(), c.v.view(), pos.view());
  }
  KvCacheView view(const Caches* paged_by) const {
    return {k.view(), v.view(), paged_by ? std::optional<qkv::View>(paged_by->table.view()) : std::nullopt, ksv, vsv};
  }
};

// qkv/attention.hpp's int8 bound for each output row (b, h, i) of an int8 cache whose dequantised
// keys and values are kd, vd [B, Skv, Hkv, X] (f64), q's steps d (quantise_q8):
//   (e^{2Δ} − 1) · V + 64 / 65534 · V,  Δ = scale · d / 2 · (1 + 2^-14) · max_j ‖k_j‖₁,
//   V = max_j ‖v_j‖_∞ over the row's keys (here: every key of its sequence and kv head).
// With only_p: the P·V term alone (the kernel against the f64 twin on q quantised as it does).
std::vector<double> int8_bound(const Shape& s, const std::vector<double>& d, const std::vector<double>& kd,
                               const std::vector<double>& vd, bool only_p) {
  std::vector<double> r;
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.D));
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t h = 0; h < s.H; ++h)
      for (std::int64_t i = 0; i < s.Sq; ++i) {
        const std::int64_t hk = h / (s.H / s.Hkv);
        double k1 = 0.0, vmax = 0.0;
        for (std::int64_t j = 0; j < s.lens[static_cast<std::size_t>(b)]; ++j) {
          double n1 = 0.0;
          for (std::int64_t x = 0; x < s.D; ++x) n1 += std::abs(kd[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.D + x)]);
          k1 = std::max(k1, n1);
          for (std::int64_t x = 0; x < s.Dv; ++x)
            vmax = std::max(vmax, std::abs(vd[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.Dv + x)]));
        }
        const double delta = scale * d[static_cast<std::size_t>((b * s.H + h) * s.Sq + i)] / 2 * (1 + 0x1p-14) * k1;
        r.push_back(((only_p ? 0.0 : std::expm1(2 * delta)) + 64.0 / 65534.0) * vmax);
      }
  return r;
}

// max over rows of |got − want| / bound_row: ≤ 1 within the bound (out [rows, Dv]).
double ratio_to_bound(const std::vector<double>& got, const std::vector<double>& want, const std::vector<double>& bound,
                      std::int64_t Dv, double floor) {
  double worst = 0.0;
  for (std::size_t e = 0; e < got.size(); ++e) {
    const double err = std::isnan(got[e]) ? INFINITY : std::abs(got[e] - want[e]);
    worst = std::max(worst, err / (bound[e / static_cast<std::size_t>(Dv)] + floor));
  }
  return worst;
}

// The int8 decode on every ISA against an f64 twin on the dequantised cache (scale · int8 in f64)
// and the exact f32 q, within qkv/attention.hpp's bound (int8_bound) + FlashAttention's f32 rule
// (2× a naive f32 computation's error + 2^-20 of the largest); against the twin on q quantised as
// the contract says (quantise_q8), within the P·V term alone + that rule. Paged = contiguous and
// head-major scales = token-major ones, bit for bit on every ISA (the same scales at other
// addresses); the reference on the int8 cache = the f64 twin.
TEST(KvCache, Int8WithinItsBoundOfTheF64Twin) {
  IsaGuard guard;
  for (const Shape& s : shapes()) {
    // The spare block of the last shape is in the table past the keys: append writes whole
    // caches here, so that shape's table must reference real blocks only.
    if (s.lens[0] <= (s.max_blocks - 1) * s.Sc) continue;
    const Caches c(s, DType::f32, 21);
    std::vector<double> contiguous_out[5];  // per Isa: the contiguous token-major cache's output
    for (auto [paged, head_major] : {std::pair{false, false}, std::pair{false, true}, std::pair{true, false},
                                     std::pair{true, true}}) {
      const Int8Cache ic(s, c, paged, head_major);
      const KvCacheView cache = ic.view(paged ? &c : nullptr);
      // The dequantised cache, dense [B, Skv, Hkv, X], in f64.
      std::vector<double> kdv(static_cast<std::size_t>(s.B * s.Skv() * s.Hkv * s.D)),
          vdv(static_cast<std::size_t>(s.B * s.Skv() * s.Hkv * s.Dv));
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t j = 0; j < s.Skv(); ++j) {
          const std::int64_t blk = paged ? c.table.ptr<std::int32_t>()[b * s.max_blocks + j / s.Sc] : b;
          const std::int64_t r = paged ? j % s.Sc : j, rows = paged ? s.Sc : s.Skv();
          for (std::int64_t hk = 0; hk < s.Hkv; ++hk) {
            const double ksc = ic.ksv.load(ic.ksv.offset(blk, r, hk));
            const double vsc = ic.vsv.load(ic.vsv.offset(blk, r, hk));
            for (std::int64_t d = 0; d < s.D; ++d)
              kdv[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.D + d)] =
                  ic.k.ptr<std::int8_t>()[((blk * rows + r) * s.Hkv + hk) * s.D + d] * ksc;
            for (std::int64_t e = 0; e < s.Dv; ++e)
              vdv[static_cast<std::size_t>(((b * s.Skv() + j) * s.Hkv + hk) * s.Dv + e)] =
                  ic.v.ptr<std::int8_t>()[((blk * rows + r) * s.Hkv + hk) * s.Dv + e] * vsc;
          }
        }
      // Quantisation: every value within half a step of the original (a derived bound, not a tolerance).
      for (auto [orig, deq, X] : {std::tuple{&c.k, &kdv, s.D}, std::tuple{&c.v, &vdv, s.Dv}}) {
        double worst = 0.0;  // max |deq − x| / (step / 2), a step per row of X values
        for (std::int64_t row0 = 0; row0 < orig->numel(); row0 += X) {
          double amax = 0.0;
          for (std::int64_t x = 0; x < X; ++x) amax = std::max(amax, std::abs(orig->view().load(row0 + x)));
          const double step = static_cast<double>(static_cast<float>(amax / 127.0));
          for (std::int64_t e = row0; e < row0 + X; ++e)
            worst = std::max(worst, std::abs((*deq)[static_cast<std::size_t>(e)] - orig->view().load(e)) / (step / 2));
        }
        EXPECT_LE(worst, 1.0 + 1e-5) << "quantisation, Sc " << s.Sc;  // + the f32 rounding of scale / 127
      }
      Buffer q(DType::f32, {s.B, s.H, s.Sq, s.D});
      fill(q, 9);
      std::vector<double> qstep;
      const std::vector<double> qv = values(q), qq = quantise_q8(q, s.D, &qstep);
      const std::vector<double> want = naive<double>(s, qv, kdv, vdv), want_q = naive<double>(s, qq, kdv, vdv);
      const std::vector<double> bound = int8_bound(s, qstep, kdv, vdv, false), bound_p = int8_bound(s, qstep, kdv, vdv, true);
      double big = 1e-3;
      for (double x : want) big = std::max(big, std::abs(x));
      const double tol = 2 * max_abs_diff(naive<float>(s, qv, kdv, vdv), want) + 0x1p-20 * big;
      const double tol_q = 2 * max_abs_diff(naive<float>(s, qq, kdv, vdv), want_q) + 0x1p-20 * big;
      AttentionOptions o = options(c, false);
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Buffer out(DType::f32, {s.B, s.H, s.Sq, s.Dv});
        o.kernel = qkv::Kernel::automatic;
        const auto info = qkv::attention_kvcache(q.view(), cache, out.view(), o);
        const std::vector<double> got = values(out);
        const double r = ratio_to_bound(got, want, bound, s.Dv, tol), rq = ratio_to_bound(got, want_q, bound_p, s.Dv, tol_q);
        std::printf("int8 %s %s Sc %3ld Sq %ld %-28s err %.2e (bound %.2e, %.3f of it); on q8 err %.2e (%.3f of its bound)\n",
                    paged ? "paged " : "contig", head_major ? "hm" : "tm", static_cast<long>(s.Sc), static_cast<long>(s.Sq), info.name,
                    max_abs_diff(got, want), *std::max_element(bound.begin(), bound.end()), r,
                    max_abs_diff(got, want_q), rq);
        EXPECT_LE(r, 1.0) << info.name;
        EXPECT_LE(rq, 1.0) << info.name;
        // Paged: the same rows in the same order through the table; head-major: the same scales
        // elsewhere in memory. The same bits.
        std::vector<double>& first = contiguous_out[static_cast<std::size_t>(isa)];
        if (!paged && !head_major) first = got;
        else EXPECT_EQ(max_abs_diff(got, first), 0.0) << info.name << (paged ? " paged" : "") << (head_major ? " head-major" : "");
        // From avx512_vnni up the VNNI policy runs (one kernel, flash_avx512vnni.cpp), on avx512 the
        // widening one: the same integers (decode_i8.hpp), exact in int32, and the same f32 code
        // around them, so the same bits as avx512 (which isas() puts first).
        EXPECT_EQ(info.isa, isa >= Isa::avx512_vnni ? Isa::avx512_vnni : isa) << info.name;
        if (isa > Isa::avx512) {
          EXPECT_EQ(max_abs_diff(got, contiguous_out[static_cast<std::size_t>(Isa::avx512)]), 0.0) << info.name;
        }
      }
      // The reference on the int8 cache is the twin's computation in f64 (its output rounded to f32).
      Buffer ref(DType::f32, {s.B, s.H, s.Sq, s.Dv});
      o.kernel = qkv::Kernel::reference;
      qkv::attention_kvcache(q.view(), cache, ref.view(), o);
      EXPECT_LE(max_abs_diff(values(ref), want), 0x1p-23 * big) << "reference";
    }
  }
}

// A sliding window on an int8 cache: rows' first keys fall inside tiles (and blocks), so the
// decode policy fills the columns before them with j_lo's rows and scale 0 (tile_kv), here also
// from head-major scales. With keep_first (StreamingLLM's first keys beside the window) the tile
// after a kept tile is not the one pv() gathered ahead (keys 4: the window starts elsewhere, so
// scores() gathers its own; keys 70: the kept run ends 6 keys into its second 64-key tile): there
// the output must also equal, within the P·V rounding term of the bound (the scores are the same
// integers; only the tiles' 15-bit weight steps and f32 sums may differ), the same call with the
// window and the kept keys as an explicit mask [B, 1, Sq, Skv] (diag(i) = i + lens[b] − Sq).
// Paged = contiguous, and head-major scales = token-major,
// bit for bit on every ISA (the same rows and scales in the same order); the contiguous output
// within qkv/attention.hpp's int8 bound of the reference (the f64 twin on the dequantised cache),
// taken over the whole cache (max ‖k‖₁, max |v|, max q step: a looser bound than each row's) + an
// f32 allowance 2 · n · 2⁻²⁴ · max |v| for sums over n ≤ Skv keys.
TEST(KvCache, Int8WindowPagedEqualsContiguous) {
  IsaGuard guard;
  for (const Shape& s : shapes()) {
    if (s.lens[0] <= (s.max_blocks - 1) * s.Sc) continue;  // as Int8WithinItsBoundOfTheF64Twin
    const Caches c(s, DType::f32, 31);
    const Int8Cache contig(s, c, false), paged(s, c, true), contig_hm(s, c, false, true), paged_hm(s, c, true, true);
    Buffer q(DType::f32, {s.B, s.H, s.Sq, s.D});
    fill(q, 13);
    std::vector<double> qstep;
    quantise_q8(q, s.D, &qstep);
    double k1 = 0.0, vmax = 0.0;
    for (std::int64_t row = 0; row < s.B * s.Skv() * s.Hkv; ++row) {
      double n1 = 0.0;
      for (std::int64_t d = 0; d < s.D; ++d) n1 += std::abs(contig.k.ptr<std::int8_t>()[row * s.D + d] * double{contig.ks.ptr<float>()[row]});
      k1 = std::max(k1, n1);
      for (std::int64_t e = 0; e < s.Dv; ++e)
        vmax = std::max(vmax, std::abs(contig.v.ptr<std::int8_t>()[row * s.Dv + e] * double{contig.vs.ptr<float>()[row]}));
    }
    const double delta = 1.0 / std::sqrt(static_cast<double>(s.D)) * *std::max_element(qstep.begin(), qstep.end()) / 2 *
                         (1 + 0x1p-14) * k1;
    const double bound = (std::expm1(2 * delta) + 64.0 / 65534.0) * vmax + 2.0 * static_cast<double>(s.Skv()) * 0x1p-24 * vmax;
    for (std::int64_t keep : {0, 4, 70}) {
      AttentionOptions o = options(c, false);
      o.window_left = 150;
      o.keep_first = keep;
      Buffer ref(DType::f32, {s.B, s.H, s.Sq, s.Dv});
      o.kernel = qkv::Kernel::reference;
      qkv::attention_kvcache(q.view(), contig.view(nullptr), ref.view(), o);
      o.kernel = qkv::Kernel::flash_decode;
      Buffer mask(DType::u8, {s.B, 1, s.Sq, s.Skv()});
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t i = 0; i < s.Sq; ++i) {
          const std::int64_t diag = i + s.lens[static_cast<std::size_t>(b)] - s.Sq;
          for (std::int64_t j = 0; j < s.Skv(); ++j)
            mask.ptr<std::uint8_t>()[(b * s.Sq + i) * s.Skv() + j] = j >= diag - o.window_left || j < keep;
        }
      AttentionOptions om = o;
      om.window_left = -1, om.keep_first = 0, om.mask = mask.view();
      const double pv_bound = 2 * 64.0 / 65534.0 * vmax + 2.0 * static_cast<double>(s.Skv()) * 0x1p-24 * vmax;
      for (Isa isa : isas()) {
        qkv::set_isa(isa);
        Buffer o1(DType::f32, {s.B, s.H, s.Sq, s.Dv}), o2(DType::f32, {s.B, s.H, s.Sq, s.Dv}),
            o4(DType::f32, {s.B, s.H, s.Sq, s.Dv});
        const auto info = qkv::attention_kvcache(q.view(), contig.view(nullptr), o1.view(), o);
        qkv::attention_kvcache(q.view(), paged.view(&c), o2.view(), o);
        qkv::attention_kvcache(q.view(), paged.view(&c), o4.view(), om);
        EXPECT_LE(max_abs_diff(values(o4), values(o1)), pv_bound) << info.name << " keep_first " << keep << " as a mask";
        const double err = max_abs_diff(values(o1), values(ref));
        std::printf("int8 window keep_first %2ld Sc %3ld Sq %ld %-28s err %.2e (bound %.2e)\n", static_cast<long>(keep),
                    static_cast<long>(s.Sc), static_cast<long>(s.Sq), info.name, err, bound);
        EXPECT_LE(err, bound) << info.name << " keep_first " << keep;
        EXPECT_EQ(max_abs_diff(values(o2), values(o1)), 0.0) << info.name << " Sc " << s.Sc << " keep_first " << keep;
        for (const Int8Cache* hm : {&contig_hm, &paged_hm}) {
          Buffer o3(DType::f32, {s.B, s.H, s.Sq, s.Dv});
          qkv::attention_kvcache(q.view(), hm->view(hm == &paged_hm ? &c : nullptr), o3.view(), o);
          EXPECT_EQ(max_abs_diff(values(o3), values(o1)), 0.0) << info.name << " Sc " << s.Sc << " head-major"
                                                               << (hm == &paged_hm ? " paged" : "");
        }
      }
    }
  }
}

// DecodeHeadGroupingChangesNoBit for int8: paged int8 caches of ≥ 32 MiB take runs of up to 8 kv
// heads per work item (flash_decode_impl.hpp's NH; contiguous ones one head), and the AVX-512
// policy fetches the next tile's V rows from P·V when it has a second pass (decode_i8_avx512.hpp's
// pv_rows): neither may change a bit. Caches of 33–35 MB: runs of 8 + 2 heads (Hkv 10, GQA 2, one
// P·V pass), GQA 4 with 256-row blocks (two passes: V fetched a tile ahead), MHA with 2 queries,
// D = 96 and Dv = 160 (R = 2, a second pass of one block); key lengths off the block size. On 1, 3
// and 32 threads (fewer heads per item), every ISA: the paged output equals the contiguous
// one-thread run (one head per item) bit for bit, and that one is within qkv/attention.hpp's int8
// bound of the reference (the f64 twin on the dequantised cache), taken over the whole cache as
// in Int8WindowPagedEqualsContiguous (max ‖k‖₁, max |v|, max q step) + the f32 allowance
// 2 · Skv · 2⁻²⁴ · max |v| for sums over Skv keys.
TEST(KvCache, Int8DecodeHeadGroupingChangesNoBit) {
  IsaGuard guard;
  const std::vector<Shape> grouped = {
      {1, 20, 10, 1, 64, 64, 16, 1650, {26390}},     // runs of 8 + 2 heads, GQA 2
      {1, 32, 8, 1, 128, 128, 256, 66, {16850}},     // GQA 4: P·V in two passes
      {1, 8, 8, 2, 96, 160, 16, 1030, {16470}},      // MHA, 2 queries, Dv ≠ D
  };
  for (const Shape& s : grouped) {
    ASSERT_GE(s.B * s.Skv() * s.Hkv * (s.D + s.Dv), std::int64_t{32} << 20);  // the heads go together
    const Caches c(s, DType::f32, 41);
    const Int8Cache contig(s, c, false), paged(s, c, true);
    Buffer q(DType::f32, {s.B, s.H, s.Sq, s.D});
    fill(q, 15);
    std::vector<double> qstep;
    quantise_q8(q, s.D, &qstep);
    double k1 = 0.0, vmax = 0.0;
    for (std::int64_t row = 0; row < s.B * s.Skv() * s.Hkv; ++row) {
      double n1 = 0.0;
      for (std::int64_t d = 0; d < s.D; ++d) n1 += std::abs(contig.k.ptr<std::int8_t>()[row * s.D + d] * double{contig.ks.ptr<float>()[row]});
      k1 = std::max(k1, n1);
      for (std::int64_t e = 0; e < s.Dv; ++e)
        vmax = std::max(vmax, std::abs(contig.v.ptr<std::int8_t>()[row * s.Dv + e] * double{contig.vs.ptr<float>()[row]}));
    }
    const double delta = 1.0 / std::sqrt(static_cast<double>(s.D)) * *std::max_element(qstep.begin(), qstep.end()) / 2 *
                         (1 + 0x1p-14) * k1;
    const double bound = (std::expm1(2 * delta) + 64.0 / 65534.0) * vmax + 2.0 * static_cast<double>(s.Skv()) * 0x1p-24 * vmax;
    AttentionOptions o = options(c, false);
    Buffer ref(DType::f32, {s.B, s.H, s.Sq, s.Dv});
    o.kernel = qkv::Kernel::reference;
    qkv::attention_kvcache(q.view(), contig.view(nullptr), ref.view(), o);
    o.kernel = qkv::Kernel::flash_decode;
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      Buffer anchor(DType::f32, {s.B, s.H, s.Sq, s.Dv});
      o.num_threads = 1;
      const auto info = qkv::attention_kvcache(q.view(), contig.view(nullptr), anchor.view(), o);
      const double err = max_abs_diff(values(anchor), values(ref));
      std::printf("int8 Hkv %2ld Sc %3ld %-28s vs reference %.2e (bound %.2e)\n", static_cast<long>(s.Hkv),
                  static_cast<long>(s.Sc), info.name, err, bound);
      EXPECT_LE(err, bound) << info.name;
      for (int threads : {1, 3, 32}) {
        Buffer out(DType::f32, {s.B, s.H, s.Sq, s.Dv});
        o.num_threads = threads;
        qkv::attention_kvcache(q.view(), paged.view(&c), out.view(), o);
        EXPECT_EQ(max_abs_diff(values(out), values(anchor)), 0.0)
            << info.name << " threads " << threads << " Hkv " << s.Hkv << " Sc " << s.Sc;
      }
    }
  }
}

// Non-finite and zero query rows on an int8 cache (qkv/attention.hpp's policy), every ISA: a NaN
// or +∞ in q makes its row NaN, an all-zero q row averages V uniformly (the reference's value,
// within the bound's P·V term, 64 / 65534 of the largest |v|, + 2^-20 of the largest output: f32
// sums), and the other rows are untouched (= their own run).
TEST(KvCache, Int8NonFiniteAndZeroQueries) {
  IsaGuard guard;
  const Shape s{1, 4, 1, 1, 64, 64, 16, 4, {64}};
  const Caches c(s, DType::f32, 41);
  const Int8Cache ic(s, c, false);
  const KvCacheView cache = ic.view(nullptr);
  Buffer q(DType::f32, {1, 4, 1, 64}), q3(DType::f32, {1, 1, 1, 64});
  fill(q, 12);
  float* x = q.ptr<float>();
  x[3] = NAN;                                 // head 0
  x[64 + 5] = INFINITY;                       // head 1
  std::fill(x + 128, x + 192, 0.0f);          // head 2
  std::copy(x + 192, x + 256, q3.ptr<float>());  // head 3 on its own (Hkv = 1: same cache)
  AttentionOptions o = options(c, false);
  o.key_lengths = std::nullopt, o.align = Align::bottom_right;
  Buffer ref(DType::f32, {1, 4, 1, 64});
  o.kernel = qkv::Kernel::reference;
  qkv::attention_kvcache(q.view(), cache, ref.view(), o);
  const std::vector<double> r = values(ref);
  double big = 1e-3;
  for (std::int64_t e = 128; e < 192; ++e) big = std::max(big, std::abs(r[static_cast<std::size_t>(e)]));
  double vmax = 0.0;  // the largest dequantised |v|
  for (std::int64_t e = 0; e < ic.v.numel(); ++e)
    vmax = std::max(vmax, std::abs(ic.v.ptr<std::int8_t>()[e] * static_cast<double>(ic.vs.ptr<float>()[e / 64])));
  for (Isa isa : isas()) {
    qkv::set_isa(isa);
    Buffer out(DType::f32, {1, 4, 1, 64}), out3(DType::f32, {1, 1, 1, 64});
    o.kernel = qkv::Kernel::flash_decode;
    const auto info = qkv::attention_kvcache(q.view(), cache, out.view(), o);
    qkv::attention_kvcache(q3.view(), cache, out3.view(), o);
    const std::vector<double> got = values(out);
    for (std::int64_t e = 0; e < 128; ++e) EXPECT_TRUE(std::isnan(got[static_cast<std::size_t>(e)])) << info.name << " " << e;
    double err = 0.0;
    for (std::int64_t e = 128; e < 192; ++e)
      err = std::max(err, std::abs(got[static_cast<std::size_t>(e)] - r[static_cast<std::size_t>(e)]));
    EXPECT_LE(err, 64.0 / 65534.0 * vmax + 0x1p-20 * big) << info.name;
    for (std::int64_t e = 0; e < 64; ++e) EXPECT_EQ(got[static_cast<std::size_t>(192 + e)], out3.ptr<float>()[e]) << info.name;
  }
}

// binary16 conversions (qkv/types.hpp): every half survives f16 → f32 → f16; hand-computed values
// for the largest, smallest and ties (round to nearest even, normal and subnormal).
TEST(KvCache, Float16Conversions) {
  int mismatches = 0;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = qkv::f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      mismatches += (h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0 || !std::isnan(qkv::f16_to_f32(qkv::f32_to_f16(f)));
      continue;
    }
    mismatches += qkv::f32_to_f16(f) != h;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(qkv::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(qkv::f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(qkv::f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(qkv::f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(qkv::f32_to_f16(65519.0f), 0x7bff);  // below the midpoint to 65536: stays finite
  EXPECT_EQ(qkv::f32_to_f16(65520.0f), 0x7c00);  // the midpoint rounds to even: inf
  EXPECT_EQ(qkv::f32_to_f16(1.0f + 0x1p-11f), 0x3c00);      // tie → even mantissa 0
  EXPECT_EQ(qkv::f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie → even mantissa 2
  EXPECT_EQ(qkv::f32_to_f16(0x1p-25f), 0x0000);             // subnormal tie → 0
  EXPECT_EQ(qkv::f32_to_f16(3 * 0x1p-25f), 0x0002);         // 1.5 → 2
  EXPECT_EQ(qkv::f32_to_f16(-0x1p-26f), 0x8000);            // underflow keeps the sign
}

// An f16 cache (q f32 or bf16): the kernel widens each row exactly, so with f32 queries it gives the
// bits of the same kernel on the widened f32 cache (contiguous and paged, with and without
// variants); the reference on the f16 cache equals the reference on the widened cache bit for bit;
// bf16 queries within 2^-8 of the largest output of the f64 reference (bf16 output rounding and
// bf16 q, as the int8 bf16 test in python/tests/test_kvcache.py).
TEST(KvCache, Float16EqualsF32KernelOnWidenedCache) {
  IsaGuard guard;
  auto widen = [](const Buffer& x) {
    Buffer w(DType::f32, x.shape());
    for (std::int64_t e = 0; e < x.numel(); ++e) w.view().store(e, x.view().load(e));
    return w;
  };
  for (const Shape& s : shapes()) {
    const Caches h(s, DType::f16, 31);
    const Buffer k32 = widen(h.k), v32 = widen(h.v), pk32 = widen(h.pk), pv32 = widen(h.pv);
    for (bool paged : {false, true}) {
      const KvCacheView c16 = paged ? h.paged() : h.contiguous();
      const KvCacheView c32{paged ? pk32.view() : k32.view(), paged ? pv32.view() : v32.view(),
                            paged ? std::optional<qkv::View>(h.table.view()) : std::nullopt, std::nullopt, std::nullopt};
      for (DType qt : {DType::f32, DType::bf16}) {
        Buffer q(qt, {s.B, s.H, s.Sq, s.D});
        fill(q, 9);
        AttentionOptions o = options(h, paged);
        o.kernel = qkv::Kernel::reference;
        Buffer ref(DType::f32, {s.B, s.H, s.Sq, s.Dv}), ref32(DType::f32, {s.B, s.H, s.Sq, s.Dv});
        Buffer q32 = widen(q);
        qkv::attention_kvcache(q32.view(), c16, ref.view(), o);
        qkv::attention_kvcache(q32.view(), c32, ref32.view(), o);
        EXPECT_EQ(max_abs_diff(values(ref), values(ref32)), 0.0) << "reference";
        double big = 1e-3;
        for (double x : values(ref)) big = std::max(big, std::abs(x));
        for (Isa isa : isas()) {
          qkv::set_isa(isa);
          Buffer out(qt, {s.B, s.H, s.Sq, s.Dv});
          o.kernel = qkv::Kernel::automatic;
          const auto info = qkv::attention_kvcache(q.view(), c16, out.view(), o);
          EXPECT_EQ(info.kernel, qkv::Kernel::flash_decode) << info.name;
          if (qt == DType::bf16) {
            EXPECT_LE(max_abs_diff(values(out), values(ref)), 0x1p-8 * big) << info.name;
            continue;
          }
          Buffer dense(DType::f32, {s.B, s.H, s.Sq, s.Dv});
          o.kernel = qkv::Kernel::flash_decode;
          qkv::attention_kvcache(q.view(), c32, dense.view(), o);
          EXPECT_EQ(max_abs_diff(values(out), values(dense)), 0.0) << info.name << (paged ? " paged" : " contiguous");
        }
      }
    }
  }
  // f64 queries have no f16 cache path (the reference's own precision: give it an f64 cache).
  const Shape s = shapes()[0];
  const Caches h(s, DType::f16, 3);
  Buffer q(DType::f64, {s.B, s.H, s.Sq, s.D}), out(DType::f64, {s.B, s.H, s.Sq, s.Dv});
  try {
    qkv::attention_kvcache(q.view(), h.contiguous(), out.view());
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("q: an f16 cache takes f32 or bf16 queries, got f64"), std::string::npos) << e.what();
  }
}

TEST(KvCache, AppendWritesRowsAtPositions) {
  const Shape s{2, 4, 2, 1, 16, 8, 16, 4, {64, 64}};
  const Caches c(s, DType::f32, 31);
  Buffer kn(DType::f32, {2, 3, 2, 16}), vn(DType::f32, {2, 3, 2, 8}), pos(DType::i32, {2});
  fill(kn, 1), fill(vn, 2);
  pos.ptr<std::int32_t>()[0] = 14, pos.ptr<std::int32_t>()[1] = 40;  // row 14–16 crosses a block boundary
  const KvCacheView paged = c.paged();
  qkv::kvcache_append(paged, kn.view(), vn.view(), pos.view());
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t t = 0; t < 3; ++t) {
      const std::int64_t j = pos.ptr<std::int32_t>()[b] + t;
      const std::int64_t blk = c.table.ptr<std::int32_t>()[b * s.max_blocks + j / s.Sc];
      for (std::int64_t hk = 0; hk < 2; ++hk)
        for (std::int64_t d = 0; d < 16; ++d)
          EXPECT_EQ(c.pk.ptr<float>()[((blk * s.Sc + j % s.Sc) * 2 + hk) * 16 + d], kn.ptr<float>()[((b * 3 + t) * 2 + hk) * 16 + d]);
    }
}

// A block that holds only keys below every query row's window (and no keep_first key) is never
// read: its table entry may be anything (−1, or far outside the pool: 0x7fffffff faults if a
// kernel loads through it, and ASan flags a load through −1). With the entries of such
// blocks overwritten, every ISA's decode, the f64 reference and int8 / f16 caches give the same
// bits as with the valid table. Hand-counted: row 0's window starts at len − Sq − window_left, so
// sequence b's blocks [0, (len − Sq − 150) / Sc) are skipped (window_left = 150, options()).
TEST(KvCache, SkippedBlocksAreNeverRead) {
  IsaGuard guard;
  const Shape s{2, 8, 2, 3, 64, 64, 16, 40, {640, 333}};  // skipped: 30 and 11 blocks of 16
  const std::int64_t skipped[2] = {(640 - 3 - 150) / 16, (333 - 3 - 150) / 16};
  const std::int32_t junk[2] = {-1, 0x7fffffff};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i8}) {
    const Caches c(s, t == DType::i8 ? DType::f32 : t, 13);
    std::optional<Int8Cache> c8;
    if (t == DType::i8) c8.emplace(s, c, true);
    const KvCacheView cache = c8 ? c8->view(&c) : c.paged();
    const DType qt = t == DType::f16 || t == DType::i8 ? DType::f32 : t;
    Buffer q(qt, {s.B, s.H, s.Sq, s.D});
    fill(q, 6);
    Buffer saved(DType::i32, {s.B, s.max_blocks});
    std::memcpy(saved.data(), c.table.data(), static_cast<std::size_t>(saved.bytes()));
    for (Isa isa : isas()) {
      qkv::set_isa(isa);
      for (qkv::Kernel kernel : {qkv::Kernel::flash_decode, qkv::Kernel::reference}) {
        AttentionOptions o = options(c, true);
        o.kernel = kernel;
        Buffer o1(qt, {s.B, s.H, s.Sq, s.Dv}), o2(qt, {s.B, s.H, s.Sq, s.Dv});
        std::memcpy(c.table.data(), saved.data(), static_cast<std::size_t>(saved.bytes()));
        const auto info = qkv::attention_kvcache(q.view(), cache, o1.view(), o);
        for (std::int64_t b = 0; b < s.B; ++b)
          for (std::int64_t blk = 0; blk < skipped[b]; ++blk) c.table.ptr<std::int32_t>()[b * s.max_blocks + blk] = junk[b];
        qkv::attention_kvcache(q.view(), cache, o2.view(), o);
        EXPECT_EQ(max_abs_diff(values(o1), values(o2)), 0.0) << qkv::dtype_name(t) << " " << info.name;
        // One block further is read (row 0's window starts in it): its entry is checked.
        c.table.ptr<std::int32_t>()[skipped[0]] = -1;
        try {
          qkv::attention_kvcache(q.view(), cache, o2.view(), o);
          ADD_FAILURE() << "no error for the first block read";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("cache.block_table[0, " + std::to_string(skipped[0]) + "] = -1 outside the pool"),
                    std::string::npos) << e.what();
        }
        // keep_first keeps keys of block 0: then every entry up to the key length is read and checked.
        c.table.ptr<std::int32_t>()[skipped[0]] = saved.ptr<std::int32_t>()[skipped[0]];
        o.keep_first = 4;
        try {
          qkv::attention_kvcache(q.view(), cache, o2.view(), o);
          ADD_FAILURE() << "no error with keep_first";
        } catch (const std::invalid_argument& e) {
          EXPECT_NE(std::string(e.what()).find("cache.block_table[0, 0] = -1 outside the pool"), std::string::npos) << e.what();
        }
      }
    }
    std::memcpy(c.table.data(), saved.data(), static_cast<std::size_t>(saved.bytes()));
  }
  // kvcache_append checks only the blocks it writes: rows [32, 48) of a table whose first two entries are junk.
  const Shape a{1, 2, 1, 1, 8, 8, 16, 4, {64}};
  const Caches c(a, DType::f32, 3);
  c.table.ptr<std::int32_t>()[0] = -1, c.table.ptr<std::int32_t>()[1] = 0x7fffffff;
  Buffer kn(DType::f32, {1, 16, 1, 8}), pos(DType::i64, {1});
  fill(kn, 8);
  pos.ptr<std::int64_t>()[0] = 32;
  qkv::kvcache_append(c.paged(), kn.view(), kn.view(), pos.view());
  const std::int32_t blk = c.table.ptr<std::int32_t>()[2];
  for (std::int64_t r = 0; r < 16; ++r)
    for (std::int64_t d = 0; d < 8; ++d)
      EXPECT_EQ(c.pk.view().load(c.pk.view().offset(blk, r, 0, d)), kn.view().load(kn.view().offset(0, r, 0, d)));
}

TEST(KvCache, ValidationNamesArgumentAndValue) {
  const Shape s{1, 2, 1, 1, 8, 8, 16, 2, {32}};
  const Caches c(s, DType::f32, 41);
  Buffer q(DType::f32, {1, 2, 1, 8}), out(DType::f32, {1, 2, 1, 8});
  auto message = [&](const KvCacheView& cache, AttentionOptions o = {}) {
    try {
      qkv::attention_kvcache(q.view(), cache, out.view(), o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  c.table.ptr<std::int32_t>()[1] = 99;
  EXPECT_NE(message(c.paged()).find("cache.block_table[0, 1] = 99 outside the pool [0, Bc = 3)"), std::string::npos)
      << message(c.paged());
  AttentionOptions shorter;
  Buffer kl(DType::i64, {1});
  kl.ptr<std::int64_t>()[0] = 16;  // only block 0 is read: the bad entry is never used
  shorter.key_lengths = kl.view();
  EXPECT_EQ(message(c.paged(), shorter), "no error");
  c.table.ptr<std::int32_t>()[1] = 0;
  Buffer odd(DType::f32, {3, 12, 1, 8});
  EXPECT_NE(message({odd.view(), odd.view(), c.table.view(), std::nullopt, std::nullopt}).find("the block size Sc = 12 must be a power of two"),
            std::string::npos);
  Buffer i8(DType::i8, {3, 16, 1, 8});
  EXPECT_NE(message({i8.view(), i8.view(), c.table.view(), std::nullopt, std::nullopt}).find("an i8 cache needs both scales"),
            std::string::npos);
  AttentionOptions flash;
  flash.kernel = qkv::Kernel::flash;
  EXPECT_NE(message(c.paged(), flash).find("flash does not read a paged, int8 or f16 KV cache"), std::string::npos);
  Buffer pos(DType::i64, {1}), kn(DType::f32, {1, 1, 1, 8});
  pos.ptr<std::int64_t>()[0] = 32;
  try {
    qkv::kvcache_append(c.paged(), kn.view(), kn.view(), pos.view());
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pos[0] = 32: rows [pos, pos + 1) must lie in [0, Skv = 32)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
