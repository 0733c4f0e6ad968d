// Max absolute error of a SIMD layer's softcap (score_mod.hpp: c2 · tanh(x / c2) from the kernels'
// exp2 and rcp), as a fraction of the cap c2, against std::tanh in f64; the sweep covers
// x / c2 ∈ [−40, 40] in steps of 2^-12 (tanh is ±1 in f32 beyond ±9), ±0, subnormal and tiny
// scores, ±FLT_MAX, for caps c2 from 0.5 to 1e4. special_ok: +∞ → c2 exactly, −∞ → −∞ (masked
// stays masked), NaN → NaN. The kernels and the flash backward's derivative call softcap_row.
#pragma once

#include <cfloat>
#include <cmath>
#include <initializer_list>

#include "kernels/cpu/score_mod.hpp"

namespace qkv_test {

template <class S>
double softcap_max_abs_error(bool* special_ok) {
  double worst = 0.0;
  *special_ok = true;
  float x[S::L], y[S::L];
  const auto check = [&](float c2, int n) {
    for (int i = 0; i < S::L; ++i) y[i] = x[i];
    qkv::kernels::cpu::softcap_row<S>(y, 0, S::L, c2);
    for (int i = 0; i < n; ++i) {
      const double want = c2 * std::tanh(static_cast<double>(x[i]) / c2);
      worst = std::fmax(worst, std::fabs(y[i] - want) / c2);
    }
  };
  for (const float c2 : {0.5f, 2.0f, 4.328085f, 43.28085f, 72.13475f, 1.0e4f}) {
    for (double u = -40.0; u <= 40.0; u += S::L / 4096.0) {
      for (int i = 0; i < S::L; ++i) x[i] = static_cast<float>((u + i / 4096.0) * c2);
      check(c2, S::L);
    }
    const float edge[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-40f, -1e-40f, FLT_MIN, -FLT_MIN,
                          FLT_MAX, -FLT_MAX, 1e-3f * c2, -1e-3f * c2, 8.0f * c2, -8.0f * c2, 30.0f * c2, -30.0f * c2};
    static_assert(sizeof edge / sizeof edge[0] == 16);
    for (int e0 = 0; e0 < 16; e0 += S::L) {
      for (int i = 0; i < S::L; ++i) x[i] = edge[e0 + i];
      check(c2, S::L);
    }
    for (int i = 0; i < S::L; ++i) x[i] = i % 3 == 0 ? INFINITY : i % 3 == 1 ? -INFINITY : NAN;
    for (int i = 0; i < S::L; ++i) y[i] = x[i];
    qkv::kernels::cpu::softcap_row<S>(y, 0, S::L, c2);
    for (int i = 0; i < S::L; ++i)
      *special_ok = *special_ok && (i % 3 == 0 ? y[i] == c2 : i % 3 == 1 ? y[i] == -INFINITY : std::isnan(y[i]));
  }
  return worst;
}

}  // namespace qkv_test
