#include "blocks/norm.hpp"

#include <cmath>

#include "core/per_isa.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks {
namespace {

// LayerNorm of rows [0, N), the two sums and the output loop in SIMD lanes of the ISA it is
// compiled for (QKV_PER_ISA; S = double: plain loops): a serial f32 sum waits one add latency per
// element, and so the baseline build's LayerNorm took ≈ 4% of a GPT-2-small prefill.
template <class S>
[[gnu::always_inline]] inline void layernorm_fwd_body(S* out, S* mean, S* rstd, const S* x, const S* w, const S* b,
                                                      std::int64_t N, std::int64_t C, S eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S* o = out + n * C;
    S m = 0;
#pragma omp simd reduction(+ : m)
    for (std::int64_t c = 0; c < C; ++c) m += xr[c];
    m /= static_cast<S>(C);
    S v = 0;
#pragma omp simd reduction(+ : v)
    for (std::int64_t c = 0; c < C; ++c) v += (xr[c] - m) * (xr[c] - m);
    v /= static_cast<S>(C);
    const S r = S(1) / std::sqrt(v + eps);
    // Two loops, not `b ? b[c] : 0` in one: that vectorises into a masked load from b, and a masked
    // load from a null b (all lanes off) costs a fault-suppression assist per vector on Zen 4.
    if (b) {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * r * w[c] + b[c];
    } else {
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * r * w[c] + S(0);  // −0 becomes +0, as with a zero bias
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

template <class S>
[[gnu::always_inline]] inline void layernorm_bwd_body(S* dx, S* dw, S* db, const S* dout, const S* x, const S* w,
                                                      const S* mean, const S* rstd, std::int64_t N, std::int64_t C) {
  // In the forward pass this was out = x̂ ⊙ w + b with x̂ = (x − mean) · rstd, so now
  //   dx̂ = dout ⊙ w,   dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ⊙ x̂)),
  // the two means being the paths through mean and rstd, which every x[c] of the row feeds;
  //   dw = Σ_n dout ⊙ x̂,  db = Σ_n dout, summed over the rows in order (reproducible sums).
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    const S* dn = dout + n * C;
    const S mn = mean[n], rs = rstd[n];
    S sum_d = 0, sum_dn = 0;
#pragma omp simd reduction(+ : sum_d, sum_dn)
    for (std::int64_t c = 0; c < C; ++c) {
      const S d = dn[c] * w[c];
      sum_d += d;
      sum_dn += d * ((xn[c] - mn) * rs);
    }
    sum_d /= static_cast<S>(C);
    sum_dn /= static_cast<S>(C);
    S* dxn = dx + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const S norm = (xn[c] - mn) * rs;
      dxn[c] += (dn[c] * w[c] - sum_d - norm * sum_dn) * rs;
      dw[c] += dn[c] * norm;
    }
    if (db)
#pragma omp simd
      for (std::int64_t c = 0; c < C; ++c) db[c] += dn[c];
  }
}

QKV_PER_ISA(ln_fwd, layernorm_fwd_body<float>,
            (float* out, float* mean, float* rstd, const float* x, const float* w, const float* b, std::int64_t N,
             std::int64_t C, float eps),
            (out, mean, rstd, x, w, b, N, C, eps))
QKV_PER_ISA(ln_bwd, layernorm_bwd_body<float>,
            (float* dx, float* dw, float* db, const float* d, const float* x, const float* w, const float* m,
             const float* r, std::int64_t N, std::int64_t C),
            (dx, dw, db, d, x, w, m, r, N, C))

template <class S>
void rmsnorm_fwd(S* out, S* rstd, const S* x, const S* w, std::int64_t N, std::int64_t C, S eps) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xr = x + n * C;
    S* o = out + n * C;
    S ss = 0;
    for (std::int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    const S r = S(1) / std::sqrt(ss / static_cast<S>(C) + eps);
    for (std::int64_t c = 0; c < C; ++c) o[c] = w[c] * (r * xr[c]);
    if (rstd) rstd[n] = r;
  }
}

template <class S>
void rmsnorm_bwd(S* dx, S* dw, const S* dout, const S* x, const S* w, const S* rstd, std::int64_t N, std::int64_t C) {
  // In the forward pass this was out = x̂ ⊙ w with x̂ = x · rstd, rstd = (mean(x²) + eps)^(−½), so now
  //   dx̂ = dout ⊙ w,  dx = rstd · (dx̂ − x̂ · mean(dx̂ ⊙ x̂))  (the second term: the path through rstd),
  //   dw = Σ_n dout ⊙ x̂.
  for (std::int64_t n = 0; n < N; ++n) {
    const S* xn = x + n * C;
    const S* dn = dout + n * C;
    const S rs = rstd[n];
    S sum = 0;
#pragma omp simd reduction(+ : sum)
    for (std::int64_t c = 0; c < C; ++c) sum += dn[c] * w[c] * xn[c] * rs;
    sum /= static_cast<S>(C);
    S* dxn = dx + n * C;
#pragma omp simd
    for (std::int64_t c = 0; c < C; ++c) {
      const S xh = xn[c] * rs;
      dxn[c] += (dn[c] * w[c] - xh * sum) * rs;
      dw[c] += dn[c] * xh;
    }
  }
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                       std::int64_t N, std::int64_t C, float eps) {
  const Isa isa = active_isa();
  const auto f = isa >= Isa::avx512 ? ln_fwd_avx512 : isa >= Isa::avx2 ? ln_fwd_avx2 : ln_fwd_base;
  f(out, mean, rstd, x, w, b, N, C, eps);
}
void layernorm_forward(double* out, double* mean, double* rstd, const double* x, const double* w, const double* b,
                       std::int64_t N, std::int64_t C, double eps) {
  layernorm_fwd_body(out, mean, rstd, x, w, b, N, C, eps);
}
void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C) {
  const Isa isa = active_isa();
  const auto f = isa >= Isa::avx512 ? ln_bwd_avx512 : isa >= Isa::avx2 ? ln_bwd_avx2 : ln_bwd_base;
  f(dx, dw, db, dout, x, w, mean, rstd, N, C);
}
void layernorm_backward(double* dx, double* dw, double* db, const double* dout, const double* x, const double* w,
                        const double* mean, const double* rstd, std::int64_t N, std::int64_t C) {
  layernorm_bwd_body(dx, dw, db, dout, x, w, mean, rstd, N, C);
}

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, std::int64_t N, std::int64_t C,
                     float eps) {
  rmsnorm_fwd(out, rstd, x, w, N, C, eps);
}
void rmsnorm_forward(double* out, double* rstd, const double* x, const double* w, std::int64_t N, std::int64_t C,
                     double eps) {
  rmsnorm_fwd(out, rstd, x, w, N, C, eps);
}
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                      std::int64_t N, std::int64_t C) {
  rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C);
}
void rmsnorm_backward(double* dx, double* dw, const double* dout, const double* x, const double* w,
                      const double* rstd, std::int64_t N, std::int64_t C) {
  rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C);
}

}  // namespace qkv::blocks
