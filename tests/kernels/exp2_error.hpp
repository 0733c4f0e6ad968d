// Max relative error of a SIMD layer's vector exp2 (src/kernels/cpu/simd_*.hpp) against std::exp2 in
// f64, over x ∈ [−126, 8] in steps of 2^-12 (x ≤ 8: scores never exceed the running max by more than
// kLazyRescale); zeros_ok: exact zeros below −126, and NaN kept NaN. Each exp2_<isa>.cpp instantiates
// it for its own layer and is compiled with that ISA's flags (tests/CMakeLists.txt).
#pragma once

#include <cmath>

namespace qkv_test {

template <class S>
double exp2_max_rel_error(bool* zeros_ok) {
  double worst = 0.0;
  float x[S::L], y[S::L];
  for (double base = -126.0; base <= 8.0; base += S::L / 4096.0) {
    for (int i = 0; i < S::L; ++i) x[i] = static_cast<float>(base + i / 4096.0);
    S::storeu(y, S::exp2(S::loadu(x)));
    for (int i = 0; i < S::L; ++i) {
      if (x[i] < -126.0f) continue;
      const double want = std::exp2(static_cast<double>(x[i]));
      worst = std::fmax(worst, std::fabs(y[i] - want) / want);
    }
  }
  for (int i = 0; i < S::L; ++i) x[i] = i % 2 ? -INFINITY : -126.5f - static_cast<float>(i);
  S::storeu(y, S::exp2(S::loadu(x)));
  *zeros_ok = true;
  for (int i = 0; i < S::L; ++i) *zeros_ok = *zeros_ok && y[i] == 0.0f;
  // NaN in, NaN out (the non-finite policy of qkv/attention.hpp rides on it; before, NaN gave 0).
  for (int i = 0; i < S::L; ++i) x[i] = i % 2 ? NAN : 0.5f;
  S::storeu(y, S::exp2(S::loadu(x)));
  for (int i = 0; i < S::L; ++i) *zeros_ok = *zeros_ok && (i % 2 ? std::isnan(y[i]) : !std::isnan(y[i]));
  return worst;
}

}  // namespace qkv_test
