// A C++ user's first program against the installed package: one causal attention call on the seeds'
// smallest case (2 tokens, one head of dimension 2), checked against the formula written out by hand.
#include <cmath>
#include <cstdio>

#include "qkv/attention.hpp"

int main() {
  float q[4] = {1, 0, 0, 1};  // [B=1, H=1, Sq=2, D=2]
  float k[4] = {1, 0, 0, 1};  // [1, 1, Skv=2, 2]
  float v[4] = {1, 2, 3, 4};  // [1, 1, 2, Dv=2]
  float out[4] = {};
  qkv::AttentionOptions opt;
  opt.causal = true;
  const qkv::KernelInfo ran = qkv::attention(qkv::View::contiguous(q, qkv::DType::f32, {1, 1, 2, 2}),
                                             qkv::View::contiguous(k, qkv::DType::f32, {1, 1, 2, 2}),
                                             qkv::View::contiguous(v, qkv::DType::f32, {1, 1, 2, 2}),
                                             qkv::View::contiguous(out, qkv::DType::f32, {1, 1, 2, 2}), opt);
  // Query 0 sees key 0 only: out = v0. Query 1 scores (0, 1/√2) over keys 0 and 1.
  const double p1 = std::exp(1 / std::sqrt(2.0)) / (1 + std::exp(1 / std::sqrt(2.0)));
  const double want[4] = {1, 2, (1 - p1) * 1 + p1 * 3, (1 - p1) * 2 + p1 * 4};
  double err = 0;
  for (int i = 0; i < 4; ++i) err = std::fmax(err, std::fabs(out[i] - want[i]));
  std::printf("kernel %s, out = [[%.4f %.4f] [%.4f %.4f]], max error %.1e\n", ran.name, out[0], out[1], out[2],
              out[3], err);
  return err < 1e-6 ? 0 : 1;  // f32 storage of values of size ~3: a few ulp
}
