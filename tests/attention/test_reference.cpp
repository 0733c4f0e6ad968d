// Hand-computed cases for the reference attention (the oracle the other tests trust).
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "qkv/attention.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

// One query, two keys, D = Dv = 1, scale 1: scores [0, ln 2] → p = [1/3, 2/3];
// v = [3, 6] → out = 3/3 + 12/3 = 5; lse = log(e^0 + e^{ln 2}) = log 3.
TEST(Reference, TwoKeysByHand) {
  for (DType t : {DType::f64, DType::f32}) {
    Buffer q(t, {1, 1, 1, 1}), k(t, {1, 1, 2, 1}), v(t, {1, 1, 2, 1}), out(t, {1, 1, 1, 1});
    Buffer lse(DType::f64, {1, 1, 1}), pat(DType::f64, {1, 1, 1, 2});
    q.view().store(0, 1.0);
    k.view().store(0, 0.0);
    k.view().store(1, std::log(2.0));
    v.view().store(0, 3.0);
    v.view().store(1, 6.0);
    qkv::AttentionOptions opt;
    opt.kernel = qkv::Kernel::reference;
    qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view(), pat.view());
    // f32 inputs round ln 2 to 24 bits: relative error ≤ 2^-24 per input, so 1e-6 is ample.
    const double tol = t == DType::f64 ? 1e-14 : 1e-6;
    EXPECT_NEAR(out.view().load(0), 5.0, tol);
    EXPECT_NEAR(lse.ptr<double>()[0], std::log(3.0), tol);
    EXPECT_NEAR(pat.ptr<double>()[0], 1.0 / 3.0, tol);
    EXPECT_NEAR(pat.ptr<double>()[1], 2.0 / 3.0, tol);
  }
}

// A fully masked row gives zeros and lse = −∞, never NaN.
TEST(Reference, FullyMaskedRowIsZero) {
  Buffer q(DType::f64, {1, 1, 2, 1}), k(DType::f64, {1, 1, 2, 1}), v(DType::f64, {1, 1, 2, 1}),
      out(DType::f64, {1, 1, 2, 1}), lse(DType::f64, {1, 1, 2});
  for (int i = 0; i < 2; ++i) {
    q.ptr<double>()[i] = 1.0;
    k.ptr<double>()[i] = 1.0;
    v.ptr<double>()[i] = 7.0;
  }
  Buffer kl(DType::i32, {1});  // zero valid keys
  qkv::AttentionOptions opt;
  opt.key_lengths = kl.view();
  qkv::attention(q.view(), k.view(), v.view(), out.view(), opt, lse.view());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(out.ptr<double>()[i], 0.0);
    EXPECT_EQ(lse.ptr<double>()[i], -std::numeric_limits<double>::infinity());
  }
}

}  // namespace
