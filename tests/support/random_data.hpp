// Deterministic random test data, shared by the kernel and block suites. Every generator is seeded
// explicitly (std::mt19937), so a failing case reproduces from its seed; values meant for a
// low-precision kernel are rounded to its dtype first, so the f64 reference sees exactly the inputs
// the kernel sees and any difference is the kernel's own error.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "qkv/runtime.hpp"
#include "qkv/types.hpp"

namespace qkv::testing {

// x rounded to what dtype t holds (f64: unchanged).
inline double round_to(DType t, double x) {
  if (t == DType::f32) return static_cast<float>(x);
  if (t == DType::bf16) return qkv::bf16_to_f32(qkv::f32_to_bf16(static_cast<float>(x)));
  return x;
}

// n draws of N(0, sigma²) as float, from std::mt19937(seed).
inline std::vector<float> randn(std::size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// x resized to n values scale · dist(rng), each rounded to dtype t (row-major logical order).
template <class Dist>
void fill_rounded(std::vector<double>& x, std::int64_t n, DType t, double scale, std::mt19937& rng, Dist& dist) {
  x.resize(static_cast<std::size_t>(n));
  for (double& e : x) e = round_to(t, scale * dist(rng));
}

// A contiguous tensor of dtype t holding N(0, sigma²) values rounded to t, and its exact f64 twin,
// drawn from `rng` or from its own std::mt19937(seed).
struct RoundedTensor {
  Buffer buf, f64;
  RoundedTensor(DType t, const std::vector<std::int64_t>& shape, std::mt19937& rng, double sigma)
      : buf(t, shape), f64(DType::f64, shape) {
    fill(t, rng, sigma);
  }
  RoundedTensor(DType t, const std::vector<std::int64_t>& shape, unsigned seed, double sigma)
      : buf(t, shape), f64(DType::f64, shape) {
    std::mt19937 rng(seed);
    fill(t, rng, sigma);
  }

 private:
  void fill(DType t, std::mt19937& rng, double sigma) {
    std::normal_distribution<double> nd(0.0, sigma);
    for (std::int64_t e = 0; e < buf.numel(); ++e) {
      const double x = round_to(t, nd(rng));
      buf.view().store(e, x);
      f64.ptr<double>()[e] = x;
    }
  }
};

// The instruction sets this CPU runs, lowest first (each test runs every kernel on each of them;
// avx512_vnni, whose only kernel of its own is the int8 KV-cache decode, shows that everything else
// runs avx512's code there). with_bf16 = false leaves out avx512_bf16, for code with no path of its
// own there.
inline std::vector<Isa> isas(bool with_bf16 = true) {
  std::vector<Isa> r;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_vnni, Isa::avx512_bf16})
    if (i <= qkv::cpu_isa() && (with_bf16 || i != Isa::avx512_bf16)) r.push_back(i);
  return r;
}

// Restores the process-wide ISA (qkv::set_isa) when a test that changed it ends.
struct IsaGuard {
  Isa saved = qkv::active_isa();
  ~IsaGuard() { qkv::set_isa(saved); }
};

}  // namespace qkv::testing
