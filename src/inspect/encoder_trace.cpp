// One text through an encoder, recorded for the inspector (see encoder_trace.hpp).
#include "inspect/encoder_trace.hpp"

#include <cmath>
#include <cstring>

#include "qkv/attention.hpp"

namespace qkv::inspect {

std::vector<LayerTrace> trace_encoder(Encoder& e, const std::vector<int>& tokens, std::vector<float>& hidden) {
  const Config& c = e.config();
  const std::int64_t S = static_cast<std::int64_t>(tokens.size()), C = c.dim, H = c.n_heads, D = c.head_dim();
  if (S < 1) fail("qkv::inspect::trace_encoder", "tokens: need at least one token (got 0)");
  std::vector<LayerTrace> layers(static_cast<std::size_t>(c.n_layers));
  const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(S)};
  hidden.assign(static_cast<std::size_t>(S * C), 0.0f);
  Buffer out(DType::f32, {S, C});  // the attention's output again (discarded: the pattern is what we want)
  e.forward(tokens, cu, hidden.data(), [&](std::int64_t l, const float* qkv, const float* att) {
    LayerTrace& t = layers[static_cast<std::size_t>(l)];
    // qkv [S, 3C]: q, k, v as [1, H, S, D] views with row stride 3C.
    const auto view = [&](const float* p) {
      return View::strided(const_cast<float*>(p), DType::f32, {1, H, S, D}, {S * 3 * C, D, 3 * C, 1});
    };
    t.pattern = Buffer(DType::f32, {H, S, S});
    AttentionOptions opt;
    opt.causal = false;
    attention(view(qkv), view(qkv + C), view(qkv + 2 * C),
              View::strided(out.data(), DType::f32, {1, H, S, D}, {S * C, D, C, 1}), opt, std::nullopt,
              View::contiguous(t.pattern.data(), DType::f32, {1, H, S, S}));
    t.scores = Buffer(DType::f32, {H, S, S});
    t.q = Buffer(DType::f32, {H, S, D});
    t.k = Buffer(DType::f32, {H, S, D});
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < S; ++i) {
        std::memcpy(t.q.ptr<float>() + (h * S + i) * D, qkv + i * 3 * C + h * D, sizeof(float) * static_cast<std::size_t>(D));
        std::memcpy(t.k.ptr<float>() + (h * S + i) * D, qkv + i * 3 * C + C + h * D, sizeof(float) * static_cast<std::size_t>(D));
        for (std::int64_t j = 0; j < S; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += double{qkv[i * 3 * C + h * D + d]} * qkv[j * 3 * C + C + h * D + d];
          t.scores.ptr<float>()[(h * S + i) * S + j] = static_cast<float>(scale * dot);
        }
      }
    }
    // Δe_h = W_O[:, h·D:(h+1)·D] · att_h (W_O [C, C] row-major), in f64; block_delta their sum.
    const float* wo = e.weights().layers[static_cast<std::size_t>(l)].wo;
    t.head_delta = Buffer(DType::f32, {H, S, C});
    t.block_delta = Buffer(DType::f32, {S, C});
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t o = 0; o < C; ++o) {
        double sum = 0;
        for (std::int64_t h = 0; h < H; ++h) {
          double acc = 0;
          for (std::int64_t d = 0; d < D; ++d) acc += double{wo[o * C + h * D + d]} * att[s * C + h * D + d];
          t.head_delta.ptr<float>()[(h * S + s) * C + o] = static_cast<float>(acc);
          sum += acc;
        }
        t.block_delta.ptr<float>()[s * C + o] = static_cast<float>(sum);
      }
    }
  });
  return layers;
}

}  // namespace qkv::inspect
