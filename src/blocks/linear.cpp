#include "blocks/linear.hpp"

#include <cassert>

#include <oneapi/dnnl/dnnl.h>

#include "blocks/onednn_call.hpp"

namespace qkv::blocks {
namespace {

// oneDNN's sgemm is row-major: C[M,N] = alpha · op(A)[M,K] · op(B)[K,N] + beta · C.
void sgemm(char ta, char tb, std::int64_t M, std::int64_t N, std::int64_t K, const float* A, std::int64_t lda,
           const float* B, std::int64_t ldb, float beta, float* C, std::int64_t ldc) {
  if (M == 0 || N == 0) return;
  const OneDnnCall call;  // fork() safety: onednn_call.hpp
  [[maybe_unused]] const dnnl_status_t st = dnnl_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
  assert(st == dnnl_success);
}

}  // namespace

void linear_forward(const float* x, const float* W, const float* b, float* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, float beta) {
  if (b) {
    for (std::int64_t n = 0; n < N; ++n)
      // beta = 0 never reads y (as in BLAS): it may hold anything, NaN included.
      for (std::int64_t o = 0; o < out; ++o) y[n * out + o] = (beta == 0.0f ? 0.0f : beta * y[n * out + o]) + b[o];
    beta = 1.0f;
  }
  sgemm('N', 'T', N, out, in, x, in, W, in, beta, y, out);
}

void linear_backward(const float* x, const float* W, const float* dy, float* dx, float* dW, float* db,
                     std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx) {
  if (dx) sgemm('N', 'N', N, in, out, dy, out, W, in, accumulate_dx ? 1.0f : 0.0f, dx, in);
  if (dW) sgemm('T', 'N', out, in, N, dy, out, x, in, 1.0f, dW, in);
  if (db)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < out; ++o) db[o] += dy[n * out + o];
}

void linear_forward(const double* x, const double* W, const double* b, double* y, std::int64_t N, std::int64_t in,
                    std::int64_t out, double beta) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < out; ++o) {
      double s = b ? b[o] : 0.0;
      for (std::int64_t i = 0; i < in; ++i) s += x[n * in + i] * W[o * in + i];
      y[n * out + o] = (beta == 0.0 ? 0.0 : beta * y[n * out + o]) + s;
    }
}

void linear_backward(const double* x, const double* W, const double* dy, double* dx, double* dW, double* db,
                     std::int64_t N, std::int64_t in, std::int64_t out, bool accumulate_dx) {
  // In the forward pass this was y = x·Wᵀ + b, so now dx = dy·W, dW += dyᵀ·x, db += Σ_n dy.
  if (dx)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < in; ++i) {
        double s = 0;
        for (std::int64_t o = 0; o < out; ++o) s += dy[n * out + o] * W[o * in + i];
        dx[n * in + i] = accumulate_dx ? dx[n * in + i] + s : s;
      }
  for (std::int64_t o = 0; o < out; ++o)
    for (std::int64_t n = 0; n < N; ++n) {
      const double d = dy[n * out + o];
      if (db) db[o] += d;
      if (dW)
        for (std::int64_t i = 0; i < in; ++i) dW[o * in + i] += d * x[n * in + i];
    }
}

void head_delta_forward(float* out, const float* att, const float* wo, std::int64_t S, std::int64_t H,
                        std::int64_t Dv, std::int64_t C, float* sum) {
  for (std::int64_t s = 0; s < S; ++s)
    for (std::int64_t o = 0; o < C; ++o) {
      double total = 0;
      for (std::int64_t h = 0; h < H; ++h) {
        const float* wrow = wo + o * H * Dv + h * Dv;
        const float* a = att + (s * H + h) * Dv;
        double acc = 0;
        for (std::int64_t d = 0; d < Dv; ++d) acc += static_cast<double>(wrow[d]) * a[d];
        out[(h * S + s) * C + o] = static_cast<float>(acc);
        total += acc;
      }
      if (sum) sum[s * C + o] = static_cast<float>(total);
    }
}

}  // namespace qkv::blocks
