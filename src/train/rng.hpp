// Internal: the random numbers of training — xoshiro256** seeded by splitmix64.
//
// Written out here (not <random>) for two reasons: the state is four integers that a checkpoint
// stores and restores exactly, and the stream is the same on every platform, so the PyTorch twin
// (bench/train_gpt_torch.py) draws the very same batches.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace qkv::train {

class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) {
    std::uint64_t z = seed;
    for (auto& s : s_) {  // splitmix64
      z += 0x9E3779B97F4A7C15ull;
      std::uint64_t x = z;
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      s = x ^ (x >> 31);
    }
  }

  std::uint64_t next() {
    const std::uint64_t r = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }

  // Uniform in [0, n), n ≥ 1. The modulo bias is below n / 2^64 (negligible for corpus offsets).
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  // Uniform in (0, 1]: 53 random bits.
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }
  // Standard normal by Box–Muller (one value per call; the partner is dropped for simplicity).
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  const std::array<std::uint64_t, 4>& state() const { return s_; }
  void set_state(const std::array<std::uint64_t, 4>& s) { s_ = s; }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::array<std::uint64_t, 4> s_{};
};

}  // namespace qkv::train
