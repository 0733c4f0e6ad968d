#include "blocks/embedding.hpp"

namespace qkv::blocks {
namespace {

template <class S>
void forward(S* out, const int* tokens, const S* wte, const S* wpe, std::int64_t N, std::int64_t C,
             std::int64_t pos0) {
  for (std::int64_t n = 0; n < N; ++n) {
    const S* e = wte + static_cast<std::int64_t>(tokens[n]) * C;
    S* o = out + n * C;
    if (wpe) {
      const S* p = wpe + (pos0 + n) * C;
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      for (std::int64_t c = 0; c < C; ++c) o[c] = e[c];
    }
  }
}

template <class S>
void backward(S* dwte, S* dwpe, const S* dout, const int* tokens, std::int64_t N, std::int64_t C, std::int64_t pos0) {
  // In the forward pass row n was copied from wte[tokens[n]] (and wpe[pos0 + n]): its gradient goes
  // back to those rows.
  for (std::int64_t n = 0; n < N; ++n) {
    S* de = dwte + static_cast<std::int64_t>(tokens[n]) * C;
    const S* d = dout + n * C;
    for (std::int64_t c = 0; c < C; ++c) de[c] += d[c];
    if (dwpe) {
      S* dp = dwpe + (pos0 + n) * C;
      for (std::int64_t c = 0; c < C; ++c) dp[c] += d[c];
    }
  }
}

}  // namespace

void embedding_forward(float* out, const int* tokens, const float* wte, const float* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0) {
  forward(out, tokens, wte, wpe, N, C, pos0);
}
void embedding_forward(double* out, const int* tokens, const double* wte, const double* wpe, std::int64_t N,
                       std::int64_t C, std::int64_t pos0) {
  forward(out, tokens, wte, wpe, N, C, pos0);
}
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int* tokens, std::int64_t N,
                        std::int64_t C, std::int64_t pos0) {
  backward(dwte, dwpe, dout, tokens, N, C, pos0);
}
void embedding_backward(double* dwte, double* dwpe, const double* dout, const int* tokens, std::int64_t N,
                        std::int64_t C, std::int64_t pos0) {
  backward(dwte, dwpe, dout, tokens, N, C, pos0);
}

}  // namespace qkv::blocks
