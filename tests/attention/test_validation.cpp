// Every rejection of the attention entry points: each bad argument throws std::invalid_argument
// naming the function, the argument and the shapes it got. Nothing here may crash, write, or
// return quietly.
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"
#include "support/expect_rejects.hpp"

namespace {

using qkv::AttentionOptions;
using qkv::Buffer;
using qkv::DType;
using qkv::View;
using qkv::testing::expect_rejects;

constexpr const char* kFwd = "[qkv::attention]";
constexpr const char* kBwd = "[qkv::attention_backward]";
constexpr const char* kVarlen = "[qkv::attention_varlen]";

// A valid call: B 2, H 4, Hkv 2, Sq 3, Skv 5, D 4, Dv 6, f32.
struct Valid {
  Buffer q{DType::f32, {2, 4, 3, 4}}, k{DType::f32, {2, 2, 5, 4}}, v{DType::f32, {2, 2, 5, 6}}, out{DType::f32, {2, 4, 3, 6}};
  void run(const AttentionOptions& opt = {}) const { qkv::attention(q.view(), k.view(), v.view(), out.view(), opt); }
};

TEST(Validation, AttentionShapesAndDtypes) {
  Valid a;
  a.run();  // the baseline is accepted
  Buffer q3(DType::f32, {2, 4, 3}), qu8(DType::u8, {2, 4, 3, 4}), k64(DType::f64, {2, 2, 5, 4}), kb(DType::f32, {3, 2, 5, 4}),
      kd(DType::f32, {2, 2, 5, 7}), v_s(DType::f32, {2, 2, 6, 6}), k3(DType::f32, {2, 3, 5, 4}), v3(DType::f32, {2, 3, 5, 6}),
      k0(DType::f32, {2, 0, 5, 4}), v0(DType::f32, {2, 0, 5, 6}), out_bad(DType::f32, {2, 4, 3, 5});
  expect_rejects([&] { qkv::attention(q3.view(), a.k.view(), a.v.view(), a.out.view()); },
                 {kFwd, "q: expected rank 4 [B, H, Sq, D], got rank 3 [2, 4, 3]"});
  expect_rejects([&] { qkv::attention(qu8.view(), a.k.view(), a.v.view(), a.out.view()); }, {kFwd, "q: dtype must be", "got u8"});
  expect_rejects([&] { qkv::attention(a.q.view(), k64.view(), a.v.view(), a.out.view()); }, {kFwd, "k: dtype f64 differs from q's f32"});
  expect_rejects([&] { qkv::attention(a.q.view(), kb.view(), a.v.view(), a.out.view()); },
                 {kFwd, "batch sizes differ", "q f32[2, 4, 3, 4]", "k f32[3, 2, 5, 4]"});
  expect_rejects([&] { qkv::attention(a.q.view(), kd.view(), a.v.view(), a.out.view()); }, {kFwd, "k: head dim D differs", "[2, 2, 5, 7]"});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), v_s.view(), a.out.view()); },
                 {kFwd, "v: [B, Hkv, Skv] must match k's", "v f32[2, 2, 6, 6]"});
  expect_rejects([&] { qkv::attention(a.q.view(), k3.view(), v3.view(), a.out.view()); },
                 {kFwd, "query heads H = 4 must be a multiple of key/value heads Hkv = 3"});
  expect_rejects([&] { qkv::attention(a.q.view(), k0.view(), v0.view(), a.out.view()); }, {kFwd, "k: Hkv must be ≥ 1"});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), out_bad.view()); },
                 {kFwd, "out: expected [B, H, Sq, Dv] = [2, 4, 3, 6], got [2, 4, 3, 5]"});
}

TEST(Validation, AttentionStridesPointersAndOverflow) {
  Valid a;
  const View neg_stride = View::strided(a.q.data(), DType::f32, {2, 4, 3, 4}, {48, 12, 4, -1});
  expect_rejects([&] { qkv::attention(neg_stride, a.k.view(), a.v.view(), a.out.view()); }, {kFwd, "q: negative stride -1 in dim 3"});
  const View neg_dim = View::strided(a.q.data(), DType::f32, {2, 4, -3, 4}, {48, 12, 4, 1});
  expect_rejects([&] { qkv::attention(neg_dim, a.k.view(), a.v.view(), a.out.view()); }, {kFwd, "q: negative dimension in [2, 4, -3, 4]"});
  const View null_q = View::contiguous(nullptr, DType::f32, {2, 4, 3, 4});
  expect_rejects([&] { qkv::attention(null_q, a.k.view(), a.v.view(), a.out.view()); }, {kFwd, "q: null data pointer", "[2, 4, 3, 4]"});
  const std::int64_t big = std::int64_t{1} << 40;
  const View huge_offsets = View::strided(a.q.data(), DType::f32, {2, 4, big, 4}, {48, 12, big, 1});
  expect_rejects([&] { qkv::attention(huge_offsets, a.k.view(), a.v.view(), a.out.view()); },
                 {kFwd, "q: shape [2, 4, 1099511627776, 4] with its strides overflows 64-bit offsets"});
  // Stride 0 everywhere keeps every offset 0, but B·H·Sq·D = 2^80 elements cannot be counted.
  const View huge_count = View::strided(a.q.data(), DType::f32, {big, big, 1, 4}, {0, 0, 0, 1});
  expect_rejects([&] { qkv::attention(huge_count, a.k.view(), a.v.view(), a.out.view()); },
                 {kFwd, "q: element count overflows 64 bits"});
  // Outputs: overlapping an input, or overlapping themselves (stride 0 on a dimension of size > 1).
  Buffer big_q(DType::f32, {2, 4, 3, 6});
  const View q_in_big = View::strided(big_q.data(), DType::f32, {2, 4, 3, 4}, {72, 18, 6, 1});
  expect_rejects([&] { qkv::attention(q_in_big, a.k.view(), a.v.view(), big_q.view()); }, {kFwd, "out: output memory overlaps input q"});
  const View out_bcast = View::strided(a.out.data(), DType::f32, {2, 4, 3, 6}, {0, 18, 6, 1});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), out_bcast); },
                 {kFwd, "out: output elements overlap each other", "[2, 4, 3, 6]"});
  const View out_short = View::strided(a.out.data(), DType::f32, {2, 4, 3, 6}, {72, 18, 3, 1});  // rows of 6 on a stride of 3
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), out_short); }, {kFwd, "out: output elements overlap each other"});
}

TEST(Validation, AttentionOptions) {
  Valid a;
  AttentionOptions o;
  o.scale = std::numeric_limits<double>::quiet_NaN();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.scale: must be finite"});
  o = {};
  o.scale = std::numeric_limits<double>::infinity();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.scale: must be finite"});
  o = {};
  o.window_left = -2;
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.window_left: must be ≥ 0 or -1", "got -2"});
  o = {};
  o.window_right = -5;
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.window_right", "got -5"});
  o = {};
  o.num_threads = -1;
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.num_threads: must be ≥ 0, got -1"});

  Buffer kl_f32(DType::f32, {2}), kl_3(DType::i32, {3}), kl_big(DType::i64, {2}), kl_neg(DType::i32, {2});
  kl_big.ptr<std::int64_t>()[1] = 9;
  kl_neg.ptr<std::int32_t>()[0] = -1;
  o = {};
  o.key_lengths = kl_f32.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.key_lengths: dtype must be i32 or i64, got f32"});
  o.key_lengths = kl_3.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.key_lengths: expected [B] = [2], got [3]"});
  o.key_lengths = kl_big.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.key_lengths[1] = 9 outside [0, Skv = 5]"});
  o.key_lengths = kl_neg.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.key_lengths[0] = -1"});

  // (NaN and +∞ additive entries are valid input: tests/kernels/test_nonfinite.cpp checks the
  // NaN rows they give.)
  Buffer m1(DType::u8, {5}), mi32(DType::i32, {3, 5}), m_bad(DType::u8, {2, 3, 3, 5});
  o = {};
  o.mask = m1.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.mask: expected rank 2..4", "got [5]"});
  o.mask = mi32.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.mask: dtype must be u8 (boolean) or f32/bf16/f64 (additive), got i32"});
  o.mask = m_bad.view();
  expect_rejects([&] { a.run(o); }, {kFwd, "opt.mask: shape [2, 3, 3, 5] does not broadcast to [B, H, Sq, Skv] = [2, 4, 3, 5]"});
}

TEST(Validation, AttentionOutputsLseAndPattern) {
  Valid a;
  Buffer lse_bf(DType::bf16, {2, 4, 3}), lse_shape(DType::f32, {2, 4, 4}), lse_ok(DType::f32, {2, 4, 3}), pat_i(DType::i32, {2, 4, 3, 5}),
      pat_shape(DType::f32, {2, 4, 3, 4}), pat_ok(DType::f32, {2, 4, 3, 5});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, lse_bf.view()); },
                 {kFwd, "lse: dtype must be f32 or f64, got bf16"});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, lse_shape.view()); },
                 {kFwd, "lse: expected [B, H, Sq] = [2, 4, 3], got [2, 4, 4]"});
  const View lse_bcast = View::strided(lse_ok.data(), DType::f32, {2, 4, 3}, {12, 0, 1});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, lse_bcast); },
                 {kFwd, "lse: output elements overlap each other"});
  const View lse_on_out = View::contiguous(a.out.data(), DType::f32, {2, 4, 3});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, lse_on_out); },
                 {kFwd, "lse: output memory overlaps input out"});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, std::nullopt, pat_i.view()); },
                 {kFwd, "pattern: dtype must be f32 or f64, got i32"});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, std::nullopt, pat_shape.view()); },
                 {kFwd, "pattern: expected [B, H, Sq, Skv] = [2, 4, 3, 5], got [2, 4, 3, 4]"});
  const View pat_bcast = View::strided(pat_ok.data(), DType::f32, {2, 4, 3, 5}, {60, 15, 0, 1});
  expect_rejects([&] { qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, std::nullopt, pat_bcast); },
                 {kFwd, "pattern: output elements overlap each other"});
}

TEST(Validation, Backward) {
  Valid a;
  Buffer lse(DType::f32, {2, 4, 3}), dout(DType::f32, {2, 4, 3, 6}), dq(DType::f32, {2, 4, 3, 4}), dk(DType::f32, {2, 2, 5, 4}),
      dv(DType::f32, {2, 2, 5, 6});
  qkv::attention(a.q.view(), a.k.view(), a.v.view(), a.out.view(), {}, lse.view());
  qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv.view());
  Buffer dout_bad(DType::f32, {2, 4, 3, 4}), dq64(DType::f64, {2, 4, 3, 4}), dk_bad(DType::f32, {2, 4, 5, 4}), lse_bad(DType::f32, {2, 4});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout_bad.view(), lse.view(), dq.view(), dk.view(), dv.view()); },
                 {kBwd, "dout: expected [B, H, Sq, Dv] = [2, 4, 3, 6], got [2, 4, 3, 4]"});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq64.view(), dk.view(), dv.view()); },
                 {kBwd, "dq: dtype f64 differs from q's f32"});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq.view(), dk_bad.view(), dv.view()); },
                 {kBwd, "dk: expected [B, Hkv, Skv, D] = [2, 2, 5, 4], got [2, 4, 5, 4]"});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse_bad.view(), dq.view(), dk.view(), dv.view()); },
                 {kBwd, "lse: expected rank 3 [B, H, Sq], got rank 2 [2, 4]"});
  const View dq_on_q = a.q.view();
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq_on_q, dk.view(), dv.view()); },
                 {kBwd, "dq: output memory overlaps input q"});
  Buffer dkv(DType::f32, {2, 2, 5, 6});
  const View dk_in_dkv = View::strided(dkv.data(), DType::f32, {2, 2, 5, 4}, {60, 30, 6, 1});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq.view(), dk_in_dkv, dkv.view()); },
                 {kBwd, "dq, dk, dv: gradient outputs overlap each other"});
  const View dv_bcast = View::strided(dv.data(), DType::f32, {2, 2, 5, 6}, {60, 30, 0, 1});
  expect_rejects([&] { qkv::attention_backward(a.q.view(), a.k.view(), a.v.view(), a.out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv_bcast); },
                 {kBwd, "dv: output elements overlap each other"});
}

TEST(Validation, VarlenBackward) {
  // Packed: Tq 5, Tk 7, H 2, Hkv 1, D 3, Dv 4; two sequences (2, 3) and (3, 4).
  Buffer q(DType::f32, {5, 2, 3}), k(DType::f32, {7, 1, 3}), v(DType::f32, {7, 1, 4}), out(DType::f32, {5, 2, 4}),
      dout(DType::f32, {5, 2, 4}), lse(DType::f32, {2, 5}), dq(DType::f32, {5, 2, 3}), dk(DType::f32, {7, 1, 3}),
      dv(DType::f32, {7, 1, 4}), cq(DType::i32, {3}), ck(DType::i32, {3});
  const std::int32_t oq[3] = {0, 2, 5}, ok[3] = {0, 3, 7};
  for (int i = 0; i < 3; ++i) {
    cq.ptr<std::int32_t>()[i] = oq[i];
    ck.ptr<std::int32_t>()[i] = ok[i];
  }
  qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view(), {}, lse.view());
  qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                                 dv.view(), cq.view(), ck.view());
  constexpr const char* kVb = "[qkv::attention_varlen_backward]";
  Buffer lse_t(DType::f32, {5, 2}), dk_bad(DType::f32, {7, 1, 4}), dq64(DType::f64, {5, 2, 3}), dout_bad(DType::f32, {5, 2, 3});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_t.view(), dq.view(), dk.view(), dv.view(), cq.view(), ck.view()); },
                 {kVb, "lse: expected [H, Tq] = [2, 5], got [5, 2]"});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk_bad.view(), dv.view(), cq.view(), ck.view()); },
                 {kVb, "dk", "[Tk, Hkv, D]"});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq64.view(), dk.view(), dv.view(), cq.view(), ck.view()); },
                 {kVb, "dq: dtype f64 differs from q's f32"});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout_bad.view(), lse.view(), dq.view(), dk.view(), dv.view(), cq.view(), ck.view()); },
                 {kVb, "dout", "[Tq, H, Dv]"});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dq.view(), dv.view(), cq.view(), ck.view()); },
                 {kVb, "dk"});
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv.view(), cq.view(), cq.view()); },
                 {kVb, "cu_seqlens_k: must start at 0 and end at the token count 7"});
  AttentionOptions o;
  o.kernel = qkv::Kernel::flash_decode;
  expect_rejects([&] { qkv::attention_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(), dv.view(), cq.view(), ck.view(), o); },
                 {kVb, "opt.kernel", "has no backward"});
}

TEST(Validation, Varlen) {
  // Packed: Tq 5, Tk 7, H 2, Hkv 1, D 3, Dv 4; two sequences (2, 3) and (3, 4).
  Buffer q(DType::f32, {5, 2, 3}), k(DType::f32, {7, 1, 3}), v(DType::f32, {7, 1, 4}), out(DType::f32, {5, 2, 4}), cq(DType::i32, {3}),
      ck(DType::i32, {3});
  const std::int32_t oq[3] = {0, 2, 5}, ok[3] = {0, 3, 7};
  for (int i = 0; i < 3; ++i) {
    cq.ptr<std::int32_t>()[i] = oq[i];
    ck.ptr<std::int32_t>()[i] = ok[i];
  }
  qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view());
  Buffer mask(DType::u8, {5, 7}), ck2(DType::i32, {2}), cf(DType::f32, {3}), c_start(DType::i32, {3}), c_dec(DType::i32, {3}),
      v_short(DType::f32, {6, 1, 4}), k_d(DType::f32, {7, 1, 2}), k_h(DType::f32, {7, 3, 3}), v_h(DType::f32, {7, 3, 4}),
      lse_bad(DType::f32, {5, 2}), q64(DType::f64, {5, 2, 3}), out_bad(DType::f32, {5, 2, 3});
  const std::int32_t start[3] = {1, 2, 5}, dec[3] = {0, 3, 2};
  for (int i = 0; i < 3; ++i) {
    c_start.ptr<std::int32_t>()[i] = start[i];
    c_dec.ptr<std::int32_t>()[i] = dec[i];
  }
  AttentionOptions o;
  o.mask = mask.view();
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view(), o); },
                 {kVarlen, "opt.mask / opt.key_lengths: not accepted"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck2.view()); },
                 {kVarlen, "need the same length B + 1", "[3] and [2]"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cf.view(), ck.view()); },
                 {kVarlen, "cu_seqlens_q: dtype must be i32 or i64, got f32"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), c_start.view(), ck.view()); },
                 {kVarlen, "cu_seqlens_q: must start at 0 and end at the token count 5, got 1"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), cq.view()); },
                 {kVarlen, "cu_seqlens_k: must start at 0 and end at the token count 7, got 0 … 5"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), c_dec.view()); },
                 {kVarlen, "cu_seqlens_k", "must start at 0 and end at the token count 7"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v_short.view(), out.view(), cq.view(), ck.view()); },
                 {kVarlen, "k, v: token counts differ", "v f32[6, 1, 4]"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k_d.view(), v.view(), out.view(), cq.view(), ck.view()); },
                 {kVarlen, "k: head dim D differs from q's", "k f32[7, 1, 2]"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k_h.view(), v_h.view(), out.view(), cq.view(), ck.view()); },
                 {kVarlen, "query heads H = 2 must be a multiple of key/value heads Hkv = 3"});
  expect_rejects([&] { qkv::attention_varlen(q64.view(), k.view(), v.view(), out.view(), cq.view(), ck.view()); },
                 {kVarlen, "k: dtype f32 differs from q's f64"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out_bad.view(), cq.view(), ck.view()); },
                 {kVarlen, "out: expected [Tq, H, Dv] = [5, 2, 4], got [5, 2, 3]"});
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), cq.view(), ck.view(), {}, lse_bad.view()); },
                 {kVarlen, "lse: expected [H, Tq] = [2, 5], got [5, 2]"});
  Buffer c_dec_q(DType::i64, {3});
  const std::int64_t decq[3] = {0, 4, 5};
  for (int i = 0; i < 3; ++i) c_dec_q.ptr<std::int64_t>()[i] = decq[i];
  Buffer ck_dec(DType::i64, {3});
  const std::int64_t deck[3] = {0, 8, 7};
  for (int i = 0; i < 3; ++i) ck_dec.ptr<std::int64_t>()[i] = deck[i];
  expect_rejects([&] { qkv::attention_varlen(q.view(), k.view(), v.view(), out.view(), c_dec_q.view(), ck_dec.view()); },
                 {kVarlen, "cu_seqlens_k: must be non-decreasing, but entry 2 < entry 1"});
}

}  // namespace
