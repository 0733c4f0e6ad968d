// forward_trace and forward_ablated: the whole sequence from position 0 on an f32 cache of its own,
// every layer's attention recorded (LayerTrace) and chosen heads knocked out. See model_impl.hpp.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "blocks/embedding.hpp"
#include "blocks/linear.hpp"
#include "blocks/norm.hpp"
#include "core/parallel.hpp"
#include "model/layer_trace.hpp"
#include "model/model_impl.hpp"
#include "qkv/memory.hpp"

namespace qkv {

using model_detail::CallThreads;
using model_detail::kPrefillSharedFlops;
using model_detail::norm;

namespace model_detail {

blocks::AttentionBlockTaps layer_trace_taps(LayerTrace& t, std::int64_t S, std::int64_t H, std::int64_t Hkv,
                                            std::int64_t D, std::int64_t C, const float* wo) {
  t.pattern = Buffer(DType::f32, {H, S, S});
  t.scores = Buffer(DType::f32, {H, S, S});
  t.q = Buffer(DType::f32, {H, S, D});
  t.k = Buffer(DType::f32, {Hkv, S, D});
  t.head_delta = Buffer(DType::f32, {H, S, C});
  t.block_delta = Buffer(DType::f32, {S, C});
  blocks::AttentionBlockTaps taps;
  taps.pattern = View::contiguous(t.pattern.data(), DType::f32, {1, H, S, S});
  taps.head_delta = t.head_delta.ptr<float>();
  taps.block_delta = t.block_delta.ptr<float>();
  taps.wo = wo;
  return taps;
}

void record_scores(LayerTrace& t, const float* q, std::int64_t ld_q, const float* k, std::int64_t k_pos,
                   std::int64_t k_head, bool causal) {
  const std::int64_t H = t.q.shape()[0], S = t.q.shape()[1], D = t.q.shape()[2], Hkv = t.k.shape()[0];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  float* sc = t.scores.ptr<float>();
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < S; ++i)
      for (std::int64_t j = 0; j < S; ++j) {
        float& out = sc[(h * S + i) * S + j];
        if (causal && j > i) {
          out = -std::numeric_limits<float>::infinity();
          continue;
        }
        const float* qi = q + i * ld_q + h * D;
        const float* kj = k + j * k_pos + (h / (H / Hkv)) * k_head;
        double dot = 0;
        for (std::int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
        out = static_cast<float>(scale * dot);
      }
  const auto row = sizeof(float) * static_cast<std::size_t>(D);
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t h = 0; h < H; ++h) std::memcpy(t.q.ptr<float>() + (h * S + s) * D, q + s * ld_q + h * D, row);
    for (std::int64_t g = 0; g < Hkv; ++g) std::memcpy(t.k.ptr<float>() + (g * S + s) * D, k + s * k_pos + g * k_head, row);
  }
}

}  // namespace model_detail

// Layer l's attention block with everything a trace records; the att it leaves is what the block
// goes on with (after the heads in ablate_ are knocked out).
blocks::AttentionBlockTaps Model::Impl::trace_taps(int l, std::int64_t S, const KvCache& cache, LayerTrace& trace) {
  const Config& c = w_.config;
  const std::int64_t C = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim();
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  blocks::AttentionBlockTaps taps = model_detail::layer_trace_taps(trace, S, H, Hkv, D, C, L.wo);
  taps.before_out = [this, l, S, H, Hkv, D, &cache, &trace](const float* q, float* att) {
    ablate_heads(l, att, S);
    // forward_trace runs on an f32 cache of its own: the keys after rotary, k [Hkv, cap, D]; q
    // [S, H·D] after rotary.
    const std::int64_t cap = cache.capacity;
    model_detail::record_scores(trace, q, H * D, cache.k.ptr<float>() + l * Hkv * cap * D, D, cap * D, true);
  };
  return taps;
}

void Model::Impl::ablate_heads(int l, float* att, std::int64_t S) const {
  const std::int64_t H = w_.config.n_heads, D = w_.config.head_dim();
  for (const HeadAblation& a : ablate_) {
    if (a.layer != l) continue;
    float* col = att + static_cast<std::int64_t>(a.head) * D;  // rows of H·D floats, head h's D columns
    std::vector<double> mean(static_cast<std::size_t>(D), 0.0);
    if (a.kind == HeadAblation::Kind::mean) {
      for (std::int64_t s = 0; s < S; ++s)
        for (std::int64_t d = 0; d < D; ++d) mean[static_cast<std::size_t>(d)] += col[s * H * D + d];
      for (double& m : mean) m /= static_cast<double>(S);
    }
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t d = 0; d < D; ++d) col[s * H * D + d] = static_cast<float>(mean[static_cast<std::size_t>(d)]);
  }
}

void Model::Impl::forward_from_start(const char* fn, const std::vector<int>& tokens, Trace* trace,
                               std::span<const HeadAblation> ablate, float* logits) {
  check_tokens(fn, tokens, 0);
  const Config& c = w_.config;
  for (const HeadAblation& a : ablate) {
    if (a.layer < 0 || a.layer >= c.n_layers || a.head < 0 || a.head >= c.n_heads) {
      fail(fn, "ablate: head (layer " + std::to_string(a.layer) + ", head " + std::to_string(a.head) +
                   ") is not in the model's " + std::to_string(c.n_layers) + " layers × " + std::to_string(c.n_heads) +
                   " heads");
    }
  }
  const auto S = static_cast<std::int64_t>(tokens.size());
  const CallThreads threads(opt_.num_threads, std::numeric_limits<double>::infinity(), kPrefillSharedFlops);
  KvCache cache(c, S);
  reserve(S);
  ablate_ = ablate;
  struct Reset {
    std::span<const HeadAblation>& a;
    ~Reset() { a = {}; }
  } reset{ablate_};
  blocks::embedding_forward(x_.ptr<float>(), tokens.data(), w_.wte, w_.wpe, S, c.dim, 0);
  const auto copy_x = [&](Buffer& to) {
    to = Buffer(DType::f32, {S, c.dim});
    std::memcpy(to.data(), x_.data(), sizeof(float) * static_cast<std::size_t>(S * c.dim));
  };
  if (trace) {
    trace->layers.clear();
    trace->layers.resize(static_cast<std::size_t>(c.n_layers));
    copy_x(trace->embed);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    LayerTrace* lt = trace ? &trace->layers[static_cast<std::size_t>(l)] : nullptr;
    block(l, S, 0, cache, lt);
    if (lt) copy_x(lt->resid);
  }
  norm(c, xb_.ptr<float>(), x_.ptr<float>(), w_.normf_w, w_.normf_b, S);
  project(xb_.ptr<float>(), w_.wcls, wcls_bf16_, nullptr, logits, S, c.dim, c.vocab_size);
}

void Model::Impl::forward_trace(const std::vector<int>& tokens, Trace& trace, std::span<const HeadAblation> ablate) {
  const char* fn = "qkv::Model::forward_trace";
  check_tokens(fn, tokens, 0);
  const Config& c = w_.config;
  const auto S = static_cast<std::int64_t>(tokens.size());
  // What the trace keeps: per layer scores and pattern [H, S, S], head_delta [H, S, C] and
  // block_delta [S, C], resid [S, C], q [H, S, D], k [Hkv, S, D]; then embed [S, C] and logits [S, V].
  check_memory(fn, "trace of " + std::to_string(S) + " tokens",
               c.n_layers * (2 * bytes_of({c.n_heads, S, S}, 4) + bytes_of({c.n_heads + 2, S, c.dim}, 4) +
                             bytes_of({c.n_heads + c.n_kv_heads, S, c.head_dim()}, 4)) +
                   bytes_of({S, c.dim}, 4) + bytes_of({S, c.vocab_size}, 4));
  trace.logits = Buffer(DType::f32, {S, c.vocab_size});
  forward_from_start(fn, tokens, &trace, ablate, trace.logits.ptr<float>());
}

}  // namespace qkv
