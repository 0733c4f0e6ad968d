#include "blocks/rope.hpp"

#include <cmath>
#include <vector>

namespace qkv::blocks {
namespace {

template <class S>
void angles(S* cs, std::int64_t hs, std::int64_t pos, S theta) {
  for (std::int64_t i = 0; i < hs; i += 2) {
    const S freq = S(1) / std::pow(theta, static_cast<S>(i) / static_cast<S>(hs));
    const S angle = static_cast<S>(pos) * freq;
    cs[i] = std::cos(angle), cs[i + 1] = std::sin(angle);
  }
}

// sign = 1: the rotation R(angle); −1: its transpose R(−angle).
template <class S>
void turn(S* x, std::int64_t nh, std::int64_t hs, const S* cs, S sign) {
  for (std::int64_t h = 0; h < nh; ++h)
    for (std::int64_t i = 0; i < hs; i += 2) {
      S* p = x + h * hs + i;
      const S c = cs[i], s = sign * cs[i + 1];
      const S a = p[0], b = p[1];
      p[0] = a * c - b * s;
      p[1] = a * s + b * c;
    }
}

}  // namespace

void rope_angles(float* cs, std::int64_t hs, std::int64_t pos, float theta) { angles(cs, hs, pos, theta); }
void rope_angles(double* cs, std::int64_t hs, std::int64_t pos, double theta) { angles(cs, hs, pos, theta); }
void rope_apply(float* x, std::int64_t nh, std::int64_t hs, const float* cs) { turn(x, nh, hs, cs, 1.0f); }
void rope_apply(double* x, std::int64_t nh, std::int64_t hs, const double* cs) { turn(x, nh, hs, cs, 1.0); }
void rope_apply_backward(float* dx, std::int64_t nh, std::int64_t hs, const float* cs) { turn(dx, nh, hs, cs, -1.0f); }
void rope_apply_backward(double* dx, std::int64_t nh, std::int64_t hs, const double* cs) { turn(dx, nh, hs, cs, -1.0); }

void rope_forward(float* x, std::int64_t N, std::int64_t nh, std::int64_t hs, std::int64_t pos0, float theta) {
  std::vector<float> cs(static_cast<std::size_t>(hs));
  for (std::int64_t n = 0; n < N; ++n) {
    angles(cs.data(), hs, pos0 + n, theta);
    turn(x + n * nh * hs, nh, hs, cs.data(), 1.0f);
  }
}

}  // namespace qkv::blocks
