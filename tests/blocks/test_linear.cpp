// linear_forward / linear_backward (oneDNN sgemm) against the f64 loops of the reference twin
// and against finite-free closed forms.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "blocks/linear.hpp"
#include "support/fork_testing.hpp"
#include "support/random_data.hpp"

namespace {

using qkv::testing::randn;

// The f64 twin of linear_forward on the same (widened) inputs: y [N, out].
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& W, const std::vector<float>& b,
                              std::int64_t N, std::int64_t in, std::int64_t out) {
  const std::vector<double> xd(x.begin(), x.end()), Wd(W.begin(), W.end()), bd(b.begin(), b.end());
  std::vector<double> y(static_cast<std::size_t>(N * out));
  qkv::blocks::linear_forward(xd.data(), Wd.data(), bd.data(), y.data(), N, in, out);
  return y;
}

// Odd sizes on purpose: sgemm edge tiles. f32 dot products of length `in` with N(0,1) entries
// carry a rounding error of about √in · 2^-24 · |terms|; 1e-4 absolute is > 10× that for in ≤ 67.
TEST(Linear, ForwardMatchesReference) {
  const std::int64_t N = 7, in = 67, out = 13;
  auto x = randn(N * in, 1), W = randn(out * in, 2), b = randn(out, 3);
  std::vector<float> y(N * out);
  qkv::blocks::linear_forward(x.data(), W.data(), b.data(), y.data(), N, in, out);
  const auto r = reference(x, W, b, N, in, out);
  double err = 0;
  for (std::size_t i = 0; i < y.size(); ++i) err = std::max(err, std::abs(double(y[i]) - r[i]));
  std::printf("max |y - ref| = %.3g\n", err);
  EXPECT_LT(err, 1e-4);
}

// With beta = 0 the output's previous contents are never read: a y full of NaN (uninitialised
// memory from a caller) gives the same result as above. Same tolerance as above.
TEST(Linear, ForwardWithBiasIgnoresWhatYHeld) {
  const std::int64_t N = 5, in = 9, out = 4;
  auto x = randn(N * in, 4), W = randn(out * in, 5), b = randn(out, 6);
  std::vector<float> y(N * out, std::nanf(""));
  qkv::blocks::linear_forward(x.data(), W.data(), b.data(), y.data(), N, in, out);
  const auto r = reference(x, W, b, N, in, out);
  double err = 0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    ASSERT_TRUE(std::isfinite(y[i])) << "y[" << i << "] kept the NaN it held";
    err = std::max(err, std::abs(double(y[i]) - r[i]));
  }
  std::printf("max |y - ref| = %.3g\n", err);
  EXPECT_LT(err, 1e-4);
}

// dx = dy·W, dW = dyᵀ·x, db = Σ dy, each checked element by element against f64 sums.
TEST(Linear, BackwardMatchesClosedForm) {
  const std::int64_t N = 5, in = 9, out = 11;
  auto x = randn(N * in, 4), W = randn(out * in, 5), dy = randn(N * out, 6);
  std::vector<float> dx(N * in), dW(out * in), db(out);
  qkv::blocks::linear_backward(x.data(), W.data(), dy.data(), dx.data(), dW.data(), db.data(), N, in, out);
  double err = 0;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (std::int64_t o = 0; o < out; ++o) s += double(dy[n * out + o]) * W[o * in + i];
      err = std::max(err, std::abs(s - dx[n * in + i]));
    }
  for (std::int64_t o = 0; o < out; ++o) {
    double sb = 0;
    for (std::int64_t n = 0; n < N; ++n) sb += dy[n * out + o];
    err = std::max(err, std::abs(sb - db[o]));
    for (std::int64_t i = 0; i < in; ++i) {
      double s = 0;
      for (std::int64_t n = 0; n < N; ++n) s += double(dy[n * out + o]) * x[n * in + i];
      err = std::max(err, std::abs(s - dW[o * in + i]));
    }
  }
  std::printf("max gradient error = %.3g\n", err);
  EXPECT_LT(err, 1e-4);  // sums of ≤ 11 products of N(0,1) in f32: error ~1e-6
  // The f64 twin on the same inputs: the same sums, in f64 (its rounding ~1e-15, f32's ~1e-6).
  const std::vector<double> xd(x.begin(), x.end()), Wd(W.begin(), W.end()), dyd(dy.begin(), dy.end());
  std::vector<double> dxd(N * in), dWd(out * in), dbd(out);
  qkv::blocks::linear_backward(xd.data(), Wd.data(), dyd.data(), dxd.data(), dWd.data(), dbd.data(), N, in, out);
  double e64 = 0;
  for (std::size_t i = 0; i < dx.size(); ++i) e64 = std::max(e64, std::abs(dxd[i] - dx[i]));
  for (std::size_t i = 0; i < dW.size(); ++i) e64 = std::max(e64, std::abs(dWd[i] - dW[i]));
  for (std::size_t i = 0; i < db.size(); ++i) e64 = std::max(e64, std::abs(dbd[i] - db[i]));
  std::printf("f32 vs f64 twin: max gradient difference = %.3g\n", e64);
  EXPECT_LT(e64, 1e-4);
}

// fork() while another thread runs oneDNN's sgemm: oneDNN 2.6 takes a process-wide mutex in every
// sgemm call (blocks/onednn_call.hpp), and a child forked while another thread held it hung in its
// own first sgemm. The busy thread's GEMMs are tiny, so that a good share of its time is spent
// inside that mutex: without OneDnnCall a child hung within the first 25 forks in each of three
// runs. Same tolerance as ForwardMatchesReference.
TEST(Linear, ForkedChildRunsSgemmWhileAnotherThreadDoes) {
  const auto xs = randn(4 * 8, 11), Ws = randn(8 * 8, 12);
  std::vector<float> ys(4 * 8);
  auto busy = [&](long k) {
    qkv::blocks::linear_forward(xs.data(), Ws.data(), nullptr, ys.data(), 1 + k % 4, 1 + (k / 4) % 8, 1 + (k / 32) % 8);
  };
  auto child = [] {
    const std::int64_t N = 7, in = 67, out = 13;
    const auto x = randn(N * in, 1), W = randn(out * in, 2), b = randn(out, 3);
    std::vector<float> y(N * out);
    qkv::blocks::linear_forward(x.data(), W.data(), b.data(), y.data(), N, in, out);
    const auto r = reference(x, W, b, N, in, out);
    for (std::size_t i = 0; i < y.size(); ++i)
      if (!(std::abs(double(y[i]) - r[i]) < 1e-4)) return false;
    return true;
  };
  EXPECT_EQ(qkv::testing::fork_while_busy(busy, child, 200), "");
}

}  // namespace
