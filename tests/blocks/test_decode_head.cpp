// The attention block's decode entry (blocks::attention_block_decode_head) against an f64 twin
// written here: rotary by its formula, the cache append, softmax(scale·q·Kᵀ)·V over every cached
// position, for B sequences of different lengths, GQA, with f32 and bf16 caches. With an i8 cache,
// the block's prefill (blocks::attention_block) and decode entry against the attention API itself
// (qkv::AttentionKvCache), which they call on a strided view of the heads-first layout.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "blocks/attention_block.hpp"
#include "blocks/rope.hpp"
#include "qkv/kv_cache.hpp"
#include "qkv/types.hpp"

namespace {

using i64 = std::int64_t;

// Hkv = 2 KV heads of G = 3 query heads, D = 20 (not a vector multiple: masked tails), sequences at
// lengths 0, 5 and 17 of a capacity 24, rotary θ = 10000, KV head 1 of a layer's cache [Hkv, cap, D].
// The appended k is checked against the twin's f64 rotation (1e-5 relative for f32; one bf16 ulp,
// 2^-7 relative, for bf16: the f32 rotation may round to the neighbouring bf16), and the twin
// attends with the k that was stored. Output: with either cache, q, the scores and the output stay
// f32 (a bf16 cache's k, v rows are widened exactly), so the f64 twin differs by the f32 rotary
// angle (pos·freq rounded: ≤ 17·2^-24 rad) and f32 sums of ≤ 20 products: 1e-5 on outputs of size
// ≤ 1 (seen ≈ 1e-7).
TEST(DecodeHead, MatchesF64TwinForF32AndBf16Caches) {
  const i64 B = 3, Hkv = 2, G = 3, D = 20, cap = 24, hk = 1, H = Hkv * G;
  const i64 len[B] = {0, 5, 17};
  const float theta = 10000.0f, scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::mt19937 gen(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (qkv::DType dt : {qkv::DType::f32, qkv::DType::bf16}) {
    const bool bf = dt == qkv::DType::bf16;
    auto round = [&](float x) { return bf ? qkv::bf16_to_f32(qkv::f32_to_bf16(x)) : x; };
    // Caches of B sequences, one layer: the old rows random (as stored), the rest NaN (never read).
    std::vector<std::vector<float>> kf(B), vf(B);            // the cache as f32 values
    std::vector<std::vector<std::uint16_t>> kb(B), vb(B);    // bf16 bits (bf16 cache)
    std::vector<qkv::blocks::KvSlot> slots(B);
    for (i64 b = 0; b < B; ++b) {
      kf[b].assign(Hkv * cap * D, NAN), vf[b].assign(Hkv * cap * D, NAN);
      for (i64 i = 0; i < Hkv * cap * D; ++i)
        if ((i / D) % cap < len[b]) kf[b][i] = round(nd(gen)), vf[b][i] = round(nd(gen));
      if (bf) {
        kb[b].resize(kf[b].size()), vb[b].resize(vf[b].size());
        for (std::size_t i = 0; i < kf[b].size(); ++i) kb[b][i] = qkv::f32_to_bf16(kf[b][i]), vb[b][i] = qkv::f32_to_bf16(vf[b][i]);
      }
      slots[b] = {bf ? static_cast<void*>(kb[b].data()) : kf[b].data(), bf ? static_cast<void*>(vb[b].data()) : vf[b].data(),
                  dt, cap, len[b]};
    }
    // Rows of the step as the model lays them out: q [B, H·D], k, v [B, Hkv·D]; this head's part.
    std::vector<float> q(B * H * D), k(B * Hkv * D), v(B * Hkv * D), out(B * H * D, NAN), cs(B * D);
    for (auto* t : {&q, &k, &v})
      for (float& x : *t) x = nd(gen);
    const std::vector<float> q0 = q, k0 = k;
    for (i64 b = 0; b < B; ++b) qkv::blocks::rope_angles(cs.data() + b * D, D, len[b], theta);
    std::vector<float> scores(cap);
    qkv::blocks::DecodeHeadCall call;
    call.B = B, call.G = G, call.D = D, call.hk = hk, call.cache = slots.data();
    call.q = q.data() + hk * G * D, call.k = k.data() + hk * D, call.v = v.data() + hk * D;
    call.out = out.data() + hk * G * D, call.ld_q = H * D, call.ld_kv = Hkv * D;
    call.cs = cs.data(), call.scale = scale, call.scores = scores.data();
    qkv::blocks::attention_block_decode_head(call);

    double worst = 0, worst_k = 0;
    for (i64 b = 0; b < B; ++b) {
      // The twin: rotate in f64 by pos·θ^(−2i/D), append, attend over positions 0 … len.
      auto rotate = [&](std::vector<double>& x, i64 nh) {
        for (i64 h = 0; h < nh; ++h)
          for (i64 i = 0; i < D / 2; ++i) {
            const double a = static_cast<double>(len[b]) * std::pow(double(theta), -2.0 * double(i) / double(D));
            double& x0 = x[h * D + 2 * i];
            double& x1 = x[h * D + 2 * i + 1];
            const double r0 = x0 * std::cos(a) - x1 * std::sin(a), r1 = x0 * std::sin(a) + x1 * std::cos(a);
            x0 = r0, x1 = r1;
          }
      };
      std::vector<double> qd(G * D), kd(D);
      for (i64 i = 0; i < G * D; ++i) qd[i] = q0[b * H * D + hk * G * D + i];
      for (i64 i = 0; i < D; ++i) kd[i] = k0[b * Hkv * D + hk * D + i];
      rotate(qd, G), rotate(kd, 1);
      const i64 n = len[b] + 1, at = hk * cap * D;
      std::vector<double> K(n * D), Vv(n * D);
      for (i64 j = 0; j < n; ++j)
        for (i64 d = 0; d < D; ++d) {
          const bool fresh = j == len[b];
          const float stored = bf ? qkv::bf16_to_f32(kb[b][at + j * D + d]) : kf[b][at + j * D + d];
          K[j * D + d] = stored;
          Vv[j * D + d] = fresh ? round(v[b * Hkv * D + hk * D + d]) : vf[b][at + j * D + d];
          if (fresh) worst_k = std::max(worst_k, std::abs(stored - kd[d]) / (bf ? 1.0 / 128 : 1e-5) / (1 + std::abs(kd[d])));
          const float stored_v = bf ? qkv::bf16_to_f32(vb[b][at + j * D + d]) : vf[b][at + j * D + d];
          if (fresh) {
            EXPECT_EQ(stored_v, round(v[b * Hkv * D + hk * D + d])) << "v appended, sequence " << b;
          }
        }
      for (i64 g = 0; g < G; ++g) {
        std::vector<double> s(n);
        double mx = -INFINITY, sum = 0;
        for (i64 j = 0; j < n; ++j) {
          double dot = 0;
          for (i64 d = 0; d < D; ++d) dot += qd[g * D + d] * K[j * D + d];
          s[j] = dot * scale, mx = std::max(mx, s[j]);
        }
        for (double& x : s) x = std::exp(x - mx), sum += x;
        for (i64 d = 0; d < D; ++d) {
          double o = 0;
          for (i64 j = 0; j < n; ++j) o += s[j] * Vv[j * D + d];
          o /= sum;
          const double got = out[b * H * D + (hk * G + g) * D + d];
          worst = std::max(worst, std::abs(got - o) / 1e-5 / std::max(1.0, std::abs(o)));
        }
      }
      // The other head's rows of out are not written.
      for (i64 i = 0; i < G * D; ++i) EXPECT_TRUE(std::isnan(out[b * H * D + i])) << "head 0 written";
    }
    std::printf("%s cache: max error / bound: output %.3g, appended k %.3g\n", qkv::dtype_name(dt), worst, worst_k);
    EXPECT_LE(worst, 1.0) << qkv::dtype_name(dt);
    EXPECT_LE(worst_k, 1.0) << qkv::dtype_name(dt);
  }
}

// Projections that hand the attention block fixed rows: q [S, H·D], k, v [S, Hkv·D] (rotated in
// place by the block), and the f32 att rows it writes [n, H·D]; W_O is not run (call.y null).
struct FixedRows final : qkv::blocks::AttentionProjections {
  float *q, *k, *v, *rows;
  i64 HD, KD;
  FixedRows(float* q_, float* k_, float* v_, float* att_, i64 hd, i64 kd) : q(q_), k(k_), v(v_), rows(att_), HD(hd), KD(kd) {}
  qkv::blocks::QkvRows qkv(qkv::DType) override { return {q, k, v, HD, KD, KD, qkv::DType::f32}; }
  void* att() override { return rows; }
  qkv::DType att_dtype() const override { return qkv::DType::f32; }
  void out(i64, float*, float) override {}
};

// An i8 cache in the model's heads-first layout [Hkv, cap, D] (scales [Hkv, cap]) against
// qkv::AttentionKvCache (token-major [1, max_len, Hkv, D], one per sequence) fed the same rows,
// rotated here by the blocks' rotary functions at each row's position: two sequences prefilled by attention_block in two calls each (5 + 4 rows, the second
// asking for rows 1 … 3 only: r0 = 1, and 3 + 6 rows), then three decoding steps of both by one
// attention_block_decode_head call on the whole run of KV heads (hk = 0, nh = Hkv). The block
// reaches the same kvcache_append and attention_kvcache through its strided views, so the stored
// int8 rows, the scales and every output are the API's bit for bit (tolerance 0). Hkv = 2 KV heads
// of G = 3 query heads, D = 20, rotary θ = 10000, capacity 24.
TEST(DecodeHead, I8CachePrefillAndDecodeEqualTheAttentionApi) {
  const i64 Hkv = 2, G = 3, H = Hkv * G, D = 20, cap = 24, HD = H * D, KD = Hkv * D;
  const float theta = 10000.0f;
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  struct Seq {
    std::vector<std::int8_t> k, v;
    std::vector<float> ks, vs;
    qkv::blocks::KvSlot slot;
    qkv::AttentionKvCache api{1, cap, Hkv, D, qkv::DType::i8};
  };
  std::vector<Seq> seqs(2);
  for (Seq& s : seqs) {
    s.k.assign(Hkv * cap * D, 0), s.v.assign(Hkv * cap * D, 0), s.ks.assign(Hkv * cap, 0.0f), s.vs.assign(Hkv * cap, 0.0f);
    s.slot = {s.k.data(), s.v.data(), qkv::DType::i8, cap, 0, s.ks.data(), s.vs.data()};
  }
  auto random_rows = [&](i64 n) {
    std::vector<float> x(static_cast<std::size_t>(n));
    for (float& e : x) e = nd(gen);
    return x;
  };
  // The stored rows and scales of sequence s, read through each layout.
  auto expect_same_cache = [&](Seq& s, const char* when) {
    const qkv::KvCacheView api = s.api.view();
    for (i64 h = 0; h < Hkv; ++h)
      for (i64 p = 0; p < s.slot.len; ++p) {
        EXPECT_EQ(s.ks[h * cap + p], api.k_scale->ptr<float>()[api.k_scale->offset(0, p, h)]) << when << " k scale " << p;
        EXPECT_EQ(s.vs[h * cap + p], api.v_scale->ptr<float>()[api.v_scale->offset(0, p, h)]) << when << " v scale " << p;
        EXPECT_EQ(std::memcmp(&s.k[(h * cap + p) * D], api.k.ptr<std::int8_t>() + api.k.offset(0, p, h, 0), D), 0) << when;
        EXPECT_EQ(std::memcmp(&s.v[(h * cap + p) * D], api.v.ptr<std::int8_t>() + api.v.offset(0, p, h, 0), D), 0) << when;
      }
  };
  i64 compared = 0;
  const i64 prefills[2][2] = {{5, 4}, {3, 6}};
  for (int call = 0; call < 2; ++call)
    for (std::size_t b = 0; b < 2; ++b) {
      Seq& s = seqs[b];
      const i64 S = prefills[b][call], r0 = call == 1 && b == 0 ? 1 : 0, n = S - r0;
      std::vector<float> q = random_rows(S * HD), k = random_rows(S * KD), v = random_rows(S * KD), att(n * HD, NAN);
      // The API gets rows rotated here (blocks::rope_forward at the positions the block must use).
      std::vector<float> qr = q, kr = k;
      for (i64 t = 0; t < S; ++t) {
        qkv::blocks::rope_forward(qr.data() + t * HD, 1, H, D, s.slot.len + t, theta);
        qkv::blocks::rope_forward(kr.data() + t * KD, 1, Hkv, D, s.slot.len + t, theta);
      }
      FixedRows proj(q.data(), k.data(), v.data(), att.data(), HD, KD);
      qkv::blocks::AttentionBlockCall c;
      c.S = S, c.r0 = r0, c.shape = qkv::MhaConfig{HD, HD, H, Hkv, D, D, false};
      c.cache = &s.slot, c.rope_theta = theta;
      c.opt.causal = true, c.opt.align = qkv::Align::bottom_right, c.opt.num_threads = 1;
      qkv::blocks::attention_block(proj, c);
      s.slot.len += S;
      // The API on the rotated rows: append, then attend with rows r0 … S − 1 of q.
      s.api.append_to(0, qkv::View::contiguous(kr.data(), qkv::DType::f32, {S, Hkv, D}),
                      qkv::View::contiguous(v.data(), qkv::DType::f32, {S, Hkv, D}));
      std::vector<float> want(n * HD, NAN);
      s.api.attend(qkv::View::strided(qr.data() + r0 * HD, qkv::DType::f32, {1, H, n, D}, {n * HD, D, HD, 1}),
                   qkv::View::strided(want.data(), qkv::DType::f32, {1, H, n, D}, {n * HD, D, HD, 1}));
      for (std::size_t i = 0; i < want.size(); ++i, ++compared) ASSERT_EQ(att[i], want[i]) << "prefill " << call << ", sequence " << b << ", element " << i;
      expect_same_cache(s, "prefill");
    }
  std::vector<float> scores(cap), cs(2 * D);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> q = random_rows(2 * HD), k = random_rows(2 * KD), v = random_rows(2 * KD), out(2 * HD, NAN);
    qkv::blocks::KvSlot slots[2] = {seqs[0].slot, seqs[1].slot};
    for (i64 b = 0; b < 2; ++b) qkv::blocks::rope_angles(cs.data() + b * D, D, slots[b].len, theta);
    std::vector<float> qr = q, kr = k;  // rotated here for the API (blocks::rope_apply, every head)
    for (i64 b = 0; b < 2; ++b) {
      qkv::blocks::rope_apply(qr.data() + b * HD, H, D, cs.data() + b * D);
      qkv::blocks::rope_apply(kr.data() + b * KD, Hkv, D, cs.data() + b * D);
    }
    qkv::blocks::DecodeHeadCall call;
    call.B = 2, call.G = G, call.D = D, call.hk = 0, call.nh = Hkv, call.cache = slots;
    call.q = q.data(), call.k = k.data(), call.v = v.data(), call.out = out.data(), call.ld_q = HD, call.ld_kv = KD;
    call.cs = cs.data(), call.scale = 1.0f / std::sqrt(static_cast<float>(D)), call.scores = scores.data();
    qkv::blocks::attention_block_decode_head(call);
    for (std::size_t b = 0; b < 2; ++b) {
      Seq& s = seqs[b];
      s.slot.len += 1;
      s.api.append_to(0, qkv::View::contiguous(kr.data() + b * KD, qkv::DType::f32, {1, Hkv, D}),
                      qkv::View::contiguous(v.data() + b * KD, qkv::DType::f32, {1, Hkv, D}));
      std::vector<float> want(HD, NAN);
      s.api.attend(qkv::View::contiguous(qr.data() + b * HD, qkv::DType::f32, {1, H, 1, D}),
                   qkv::View::contiguous(want.data(), qkv::DType::f32, {1, H, 1, D}));
      for (i64 i = 0; i < HD; ++i, ++compared) ASSERT_EQ(out[b * HD + i], want[i]) << "step " << step << ", sequence " << b << ", element " << i;
      expect_same_cache(s, "decode");
    }
  }
  std::printf("i8 cache: %lld outputs equal to qkv::AttentionKvCache's bit for bit\n", static_cast<long long>(compared));
}

}  // namespace
