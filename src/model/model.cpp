// The forward pass of the whole transformer, one sequence at a time, reading like the diagram:
//
//   x = embed(tokens)                                         x [S, C]
//   for each layer l:
//     xb = norm1(x)                                           xb [S, C]
//     q = xb·W_Qᵀ, k = xb·W_Kᵀ, v = xb·W_Vᵀ                   q [S, H·D], k, v [S, Hkv·D]
//     rotary(q, k) at positions pos0 … pos0 + S − 1
//     cache[l] ← k, v at those positions                      cache.k[l] [Hkv, capacity, D]
//     att = attention(q, cache.k[l][:, :pos0+S], cache.v…)    att [S, H·D]  (causal, bottom-right)
//     x += att·W_Oᵀ                                           (+ b_O)
//     xb = norm2(x);  x += MLP(xb)
//   logits = norm_f(x)·W_clsᵀ                                 logits [S or 1, V]
//
// q, k, v and att stay in [S, heads·D] rows: qkv::attention reads them through strided views
// ([1, H, S, D] with strides (·, D, H·D, 1)), so nothing is transposed or copied for it.
// The attention half of a layer (norm output → q, k, v → rotary → cache → attention → W_O) is
// blocks::attention_block, which block() and block_gemm_bf16() call with their projections as its
// backend; the decoding step keeps its own per-KV-head stage (decode.cpp).
// This file: construction, projections, one layer (block), forward and forward_batch; the rest of
// Model is in model_bf16.cpp, decode.cpp and trace.cpp (model_impl.hpp lists them).
#include <algorithm>
#include <cmath>
#include <string>

#include "blocks/activation.hpp"
#include "blocks/dense.hpp"
#include "blocks/embedding.hpp"
#include "blocks/linear.hpp"
#include "blocks/norm.hpp"
#include "core/parallel.hpp"
#include "model/model_impl.hpp"
#include "qkv/attention.hpp"
#include "qkv/memory.hpp"
#include "qkv/model.hpp"

namespace qkv {

using model_detail::CallThreads;
using model_detail::kDecodeSharedFlops;
using model_detail::kPrefillSharedFlops;
using model_detail::norm;

KvCache::KvCache(const Config& c, std::int64_t cap, DType dtype) {
  c.validate("qkv::KvCache");
  if (cap < 0 || cap > c.seq_len)
    fail("qkv::KvCache", "capacity: must be in [0, seq_len = " + std::to_string(c.seq_len) + "], got " +
                             std::to_string(cap));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::i8)
    fail("qkv::KvCache", std::string("dtype: must be f32, bf16 or i8, got ") + dtype_name(dtype));
  capacity = cap == 0 ? c.seq_len : cap;
  const bool i8 = dtype == DType::i8;
  // Sized by the config (seq_len): refused, not killed, when it cannot fit. An i8 row of D bytes
  // carries one f32 scale.
  const std::uint64_t one = bytes_of({c.n_layers, c.n_kv_heads, capacity, c.head_dim() + (i8 ? 4 : 0)}, dtype_size(dtype));
  check_memory("qkv::KvCache", std::string("k and v [n_layers, n_kv_heads, capacity, head_dim] = [") +
                                   std::to_string(c.n_layers) + ", " + std::to_string(c.n_kv_heads) + ", " +
                                   std::to_string(capacity) + ", " + std::to_string(c.head_dim()) + "] each" +
                                   (i8 ? " (and their f32 scales)" : ""),
               one > UINT64_MAX / 2 ? UINT64_MAX : 2 * one);
  k = Buffer(dtype, {c.n_layers, c.n_kv_heads, capacity, c.head_dim()});
  v = Buffer(dtype, {c.n_layers, c.n_kv_heads, capacity, c.head_dim()});
  if (i8) {
    k_scale = Buffer(DType::f32, {c.n_layers, c.n_kv_heads, capacity});
    v_scale = Buffer(DType::f32, {c.n_layers, c.n_kv_heads, capacity});
  }
}

namespace model_detail {

blocks::KvSlot layer_slot(const KvCache& cache, std::int64_t l) {
  const std::int64_t Hkv = cache.k.shape()[1], D = cache.k.shape()[3], cap = cache.capacity;
  const std::int64_t at = l * Hkv * cap * D * static_cast<std::int64_t>(dtype_size(cache.k.dtype()));  // bytes
  blocks::KvSlot slot{static_cast<char*>(cache.k.data()) + at, static_cast<char*>(cache.v.data()) + at,
                      cache.k.dtype(), cap, cache.len};
  if (cache.k.dtype() == DType::i8) {
    slot.k_scale = cache.k_scale.ptr<float>() + l * Hkv * cap;
    slot.v_scale = cache.v_scale.ptr<float>() + l * Hkv * cap;
  }
  return slot;
}

}  // namespace model_detail

Model::Model(Weights w, ModelOptions options) : impl_(std::make_unique<Impl>(std::move(w), options)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
const ModelOptions& Model::options() const { return impl_->opt_; }
const Config& Model::config() const { return impl_->w_.config; }
const Weights& Model::weights() const { return impl_->w_; }

KvCache Model::new_cache(std::int64_t capacity) const {
  return KvCache(impl_->w_.config, capacity, impl_->opt_.gemm_inputs == DType::bf16 ? DType::bf16 : DType::f32);
}

void Model::forward(std::span<const int> tokens, KvCache& cache, float* logits, bool all_logits) {
  impl_->forward(tokens, cache, logits, all_logits);
}

void Model::forward_batch(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits) {
  impl_->forward_batch(tokens, caches, logits);
}

void Model::forward_trace(const std::vector<int>& tokens, Trace& trace, std::span<const HeadAblation> ablate) {
  impl_->forward_trace(tokens, trace, ablate);
}

void Model::forward_ablated(const std::vector<int>& tokens, std::span<const HeadAblation> ablate, float* logits) {
  impl_->forward_from_start("qkv::Model::forward_ablated", tokens, nullptr, ablate, logits);
}

Model::Impl::Impl(Weights w, ModelOptions options) : w_(std::move(w)), opt_(options) {
  w_.config.validate("qkv::Model");
  if (!w_.config.causal || w_.config.post_norm)
    fail("qkv::Model", "w: an encoder's config (causal false or post_norm true): qkv::Encoder runs it");
  if (!w_.wte || !w_.wcls || !w_.normf_w || static_cast<std::int64_t>(w_.layers.size()) != w_.config.n_layers)
    fail("qkv::Model", "w: weights are incomplete for their config (use a loader or Weights::allocate)");
  if (opt_.weights != DType::f32 && opt_.weights != DType::bf16)
    fail("qkv::Model", std::string("options.weights: must be f32 or bf16, got ") + dtype_name(opt_.weights));
  if (opt_.gemm_inputs != DType::f32 && opt_.gemm_inputs != DType::bf16)
    fail("qkv::Model", std::string("options.gemm_inputs: must be f32 or bf16, got ") + dtype_name(opt_.gemm_inputs));
  if (opt_.gemm_inputs == DType::bf16 && opt_.weights != DType::bf16)
    fail("qkv::Model", std::string("options.gemm_inputs: bf16 needs options.weights = bf16, got weights = ") +
                           dtype_name(opt_.weights));
  if (opt_.num_threads < 0)
    fail("qkv::Model", "options.num_threads: must be ≥ 0 (0: the library default), got " +
                           std::to_string(opt_.num_threads));
  params_ = w_.num_params();
  make_bf16_weights();
}

void Model::Impl::project(const float* x, const float* W, const std::uint16_t* Wb, const float* b, float* y,
                    std::int64_t S, std::int64_t in, std::int64_t out, float beta) {
  const int threads = max_threads();
  if (S <= blocks::kGemvMaxRows) {
    if (Wb) blocks::gemv_bf16(x, Wb, b, y, S, in, out, beta, threads, active_isa());
    else blocks::gemv_f32(x, W, b, y, S, in, out, beta, threads, active_isa());
    return;
  }
  if (Wb && opt_.gemm_inputs == DType::bf16) {
    blocks::gemm_bf16(x, Wb, b, y, S, in, out, beta, threads, active_isa());
    return;
  }
  if (Wb) {
    // Prefill with bf16 weights: widen this matrix (exactly) and run the f32 GEMM; the widening
    // streams in·out·6 bytes, small beside the GEMM's 2·S·in·out FLOPs at S > 4.
    blocks::bf16_to_f32(wide_.ptr<float>(), Wb, in * out, threads);
    W = wide_.ptr<float>();
  }
  if (b) {
    // The bias goes into y first, rows shared over the threads (linear_forward's own loop runs
    // on one), then sgemm adds x·Wᵀ to it.
    parallel_for(S, threads, [&](std::int64_t s) {
      float* row = y + s * out;
      for (std::int64_t o = 0; o < out; ++o) row[o] = (beta == 0.0f ? 0.0f : row[o]) + b[o];
    });
    b = nullptr;
    beta = 1.0f;
  }
  blocks::linear_forward(x, W, b, y, S, in, out, beta);
}

void Model::Impl::project_qkv(int l, const float* xb, float* q, float* k, float* v, std::int64_t S) {
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16 Lb = layer_bf16(l);
  const std::int64_t C = c.dim, D = c.head_dim(), HD = c.n_heads * D, KD = c.n_kv_heads * D;
  if (S > blocks::kGemvMaxRows) {
    project(xb, L.wq, Lb.wq, L.bq, q, S, C, HD);
    project(xb, L.wk, Lb.wk, L.bk, k, S, C, KD);
    project(xb, L.wv, Lb.wv, L.bv, v, S, C, KD);
    return;
  }
  const int threads = max_threads();
  if (Lb.wq) {
    const blocks::GemvOut outs[3] = {{Lb.wq, L.bq, q, HD}, {Lb.wk, L.bk, k, KD}, {Lb.wv, L.bv, v, KD}};
    blocks::gemv_bf16_multi(xb, outs, S, C, 0.0f, threads, active_isa());
  } else {
    const blocks::GemvOut outs[3] = {{L.wq, L.bq, q, HD}, {L.wk, L.bk, k, KD}, {L.wv, L.bv, v, KD}};
    blocks::gemv_f32_multi(xb, outs, S, C, 0.0f, threads, active_isa());
  }
}

void Model::Impl::reserve(std::int64_t S) {
  if (S <= rows_) return;
  const Config& c = w_.config;
  const std::int64_t D = c.head_dim();
  // Work rows for S tokens (the buffers below, f32 and bf16, with their widths summed).
  const std::int64_t f32_width = 2 * c.dim + 2 * c.n_heads * D + 2 * c.n_kv_heads * D + 2 * c.hidden_dim +
                                 (c.n_heads + 2 * c.n_kv_heads) * D;
  const std::int64_t bf16_width = 2 * c.n_heads * D + std::max(c.dim, c.n_heads * D) + c.hidden_dim;
  check_memory("qkv::Model::forward", "work buffers for " + std::to_string(S) + " tokens",
               bytes_of({S, f32_width}, 4) + bytes_of({S, bf16_width}, 2));
  x_ = Buffer(DType::f32, {S, c.dim});
  xb_ = Buffer(DType::f32, {S, c.dim});
  q_ = Buffer(DType::f32, {S, c.n_heads * D});
  att_ = Buffer(DType::f32, {S, c.n_heads * D});
  k_ = Buffer(DType::f32, {S, c.n_kv_heads * D});
  v_ = Buffer(DType::f32, {S, c.n_kv_heads * D});
  hb_ = Buffer(DType::f32, {S, c.hidden_dim});
  hb2_ = Buffer(DType::f32, {S, c.hidden_dim});
  qb_ = Buffer(DType::bf16, {S, c.n_heads * D});
  ob_ = Buffer(DType::bf16, {S, c.n_heads * D});
  if (opt_.gemm_inputs == DType::bf16) {
    qkv_ = Buffer(DType::f32, {S, (c.n_heads + 2 * c.n_kv_heads) * D});
    xbb_ = Buffer(DType::bf16, {S, std::max(c.dim, c.n_heads * D)});
    hbb_ = Buffer(DType::bf16, {S, c.hidden_dim});
  }
  rows_ = S;
}

void Model::Impl::check_tokens(const char* fn, std::span<const int> tokens, std::int64_t start) const {
  const Config& c = w_.config;
  const auto S = static_cast<std::int64_t>(tokens.size());
  if (S == 0) fail(fn, "tokens: must not be empty");
  if (start + S > c.seq_len)
    fail(fn, "tokens: positions " + std::to_string(start) + " … " + std::to_string(start + S - 1) +
                 " exceed the model's context of seq_len = " + std::to_string(c.seq_len));
  for (std::int64_t i = 0; i < S; ++i)
    if (tokens[static_cast<std::size_t>(i)] < 0 || tokens[static_cast<std::size_t>(i)] >= c.vocab_size)
      fail(fn, "tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[static_cast<std::size_t>(i)]) +
                   " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
}

namespace model_detail {

void norm(const Config& c, float* out, const float* x, const float* w, const float* b, std::int64_t N,
          std::uint16_t* out_bf16) {
  constexpr std::int64_t kRows = 16;
  const Isa isa = active_isa();
  parallel_for((N + kRows - 1) / kRows, max_threads(), [&](std::int64_t k) {
    const std::int64_t r0 = k * kRows, n = std::min(kRows, N - r0);
    if (c.norm == NormKind::rmsnorm)
      blocks::rmsnorm_forward(out + r0 * c.dim, nullptr, x + r0 * c.dim, w, n, c.dim, c.norm_eps);
    else
      blocks::layernorm_forward(out + r0 * c.dim, nullptr, nullptr, x + r0 * c.dim, w, b, n, c.dim, c.norm_eps);
    if (out_bf16) blocks::f32_to_bf16(out_bf16 + r0 * c.dim, out + r0 * c.dim, n * c.dim, isa);
  });
}

}  // namespace model_detail

// block()'s projections: xb_ → q_, k_, v_ by project_qkv, att_ → x by project (f32 or bf16
// weights; GEMV kernels for ≤ 4 rows, GEMMs above).
struct Model::Impl::LayerProjections final : blocks::AttentionProjections {
  Impl& m;
  int l;
  std::int64_t S;
  LayerProjections(Impl& impl, int layer, std::int64_t rows) : m(impl), l(layer), S(rows) {}
  blocks::QkvRows qkv(DType) override {
    const std::int64_t HD = m.w_.config.n_heads * m.w_.config.head_dim(), KD = m.w_.config.n_kv_heads * m.w_.config.head_dim();
    m.project_qkv(l, m.xb_.ptr<float>(), m.q_.ptr<float>(), m.k_.ptr<float>(), m.v_.ptr<float>(), S);
    return {m.q_.data(), m.k_.data(), m.v_.data(), HD, KD, KD, DType::f32};
  }
  void* att() override { return m.att_.data(); }
  DType att_dtype() const override { return DType::f32; }
  void out(std::int64_t n, float* y, float beta) override {
    const Config& c = m.w_.config;
    const LayerWeights& L = m.w_.layers[static_cast<std::size_t>(l)];
    m.project(m.att_.ptr<float>(), L.wo, m.layer_bf16(l).wo, L.bo, y, n, c.n_heads * c.head_dim(), c.dim, beta);
  }
};

void Model::Impl::attention_block(int l, std::int64_t S, std::int64_t r0, KvCache& cache,
                                  blocks::AttentionProjections& proj, blocks::AttentionBlockTaps taps) {
  const Config& c = w_.config;
  blocks::KvSlot slot = model_detail::layer_slot(cache, l);
  blocks::AttentionBlockCall call;
  call.S = S;
  call.r0 = r0;
  call.shape = c.attention();
  call.cache = &slot;
  call.rope_theta = c.pos == PosEncoding::rotary ? c.rope_theta : 0.0f;
  call.opt.num_threads = max_threads();
  call.opt.causal = true;
  // The S queries are the last S positions: each sees the keys up to its own position.
  call.opt.align = Align::bottom_right;
  call.y = x_.ptr<float>() + r0 * c.dim;  // residual: x += att·W_Oᵀ + b_O
  call.beta = 1.0f;
  call.taps = std::move(taps);
  call.scratch = {qb_.ptr<std::uint16_t>(), proj.att_dtype() == DType::f32 ? ob_.data() : att_.data()};
  blocks::attention_block(proj, call);
}

// One pre-norm block on x_ [S, C] for positions cache.len … cache.len + S − 1. Keys and values
// of all S rows go to the cache; the block's output x is computed for rows r0 … S − 1 only (the
// last layer of a call that wants only the last position's logits: r0 = S − 1; a trace: r0 = 0).
void Model::Impl::block(int l, std::int64_t S, std::int64_t r0, KvCache& cache, LayerTrace* trace) {
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16 Lb = layer_bf16(l);
  const std::int64_t C = c.dim, Hd = c.hidden_dim;
  float *x = x_.ptr<float>(), *xb = xb_.ptr<float>(), *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();

  // ---- attention: x += W_O · attention(q, k, v)
  norm(c, xb, x, L.norm1_w, L.norm1_b, S);
  LayerProjections proj(*this, l, S);
  blocks::AttentionBlockTaps taps;
  if (trace) taps = trace_taps(l, S, cache, *trace);
  else if (!ablate_.empty()) taps.before_out = [this, l, S](const float*, float* att) { ablate_heads(l, att, S); };
  attention_block(l, S, r0, cache, proj, std::move(taps));
  const std::int64_t n = S - r0;
  float* xo = x + r0 * C;  // the rows of x this block updates

  // ---- MLP: x += W2 · act(W1 · norm2(x))
  norm(c, xb, xo, L.norm2_w, L.norm2_b, n);
  project(xb, L.w1, Lb.w1, L.b1, hb, n, C, Hd);
  if (c.mlp == MlpKind::swiglu) {
    project(xb, L.w3, Lb.w3, nullptr, hb2, n, C, Hd);
    blocks::swiglu_forward(hb, hb, hb2, n * Hd);
  } else if (c.mlp == MlpKind::gelu_exact) {
    blocks::gelu_exact_forward(hb, hb, n * Hd);
  } else {
    blocks::gelu_fast(hb, hb, n * Hd, max_threads(), active_isa());
  }
  project(hb, L.w2, Lb.w2, L.b2, xo, n, Hd, C, 1.0f);  // residual: x += hb·W2ᵀ + b2
}

void Model::Impl::check_cache(const char* fn, const KvCache& cache, std::int64_t S) const {
  const Config& c = w_.config;
  if (cache.k.numel() == 0 || cache.k.shape()[0] != c.n_layers || cache.k.shape()[1] != c.n_kv_heads ||
      cache.k.shape()[3] != c.head_dim())
    fail(fn, "cache: not made for this model's config (construct it as KvCache(model.config()))");
  const DType dt = cache.k.dtype();
  if ((dt != DType::f32 && dt != DType::bf16 && dt != DType::i8) || cache.v.dtype() != dt ||
      cache.v.shape() != cache.k.shape())
    fail(fn, std::string("cache: k and v must be f32, bf16 or i8 of one dtype and shape, got k ") + dtype_name(dt) +
                 " " + cache.k.view().shape_str() + ", v " + dtype_name(cache.v.dtype()) + " " + cache.v.view().shape_str());
  const std::vector<std::int64_t> scales = {cache.k.shape()[0], cache.k.shape()[1], cache.k.shape()[2]};
  if (dt == DType::i8 && (cache.k_scale.dtype() != DType::f32 || cache.k_scale.shape() != scales ||
                          cache.v_scale.dtype() != DType::f32 || cache.v_scale.shape() != scales))
  {
    auto dims = [](const std::vector<std::int64_t>& shape) {
      std::string r = "[";
      for (std::size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
      return r + "]";
    };
    fail(fn, "cache: an i8 cache needs f32 k_scale and v_scale [n_layers, n_kv_heads, capacity] = " + dims(scales) +
                 ", got k_scale " + dtype_name(cache.k_scale.dtype()) + " " + dims(cache.k_scale.shape()) + ", v_scale " +
                 dtype_name(cache.v_scale.dtype()) + " " + dims(cache.v_scale.shape()));
  }
  if (cache.len + S > cache.capacity)
    fail(fn, "cache: " + std::to_string(cache.len) + " positions held + " + std::to_string(S) +
                 " new exceed its capacity " + std::to_string(cache.capacity));
}

void Model::Impl::forward_batch(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits) {
  const char* fn = "qkv::Model::forward_batch";
  const auto B = static_cast<std::int64_t>(tokens.size());
  if (B == 0) fail(fn, "tokens: must not be empty");
  if (caches.size() != tokens.size())
    fail(fn, "caches: one per token, got " + std::to_string(caches.size()) + " caches for " + std::to_string(B) +
                 " tokens");
  for (std::size_t b = 0; b < caches.size(); ++b) {
    const std::string at = "caches[" + std::to_string(b) + "]";
    if (!caches[b]) fail(fn, at + ": null");
    check_cache((std::string(fn) + ", " + at).c_str(), *caches[b], 1);
    if (caches[b]->k.dtype() != caches[0]->k.dtype())
      fail(fn, at + ": every cache must have one dtype, got " + dtype_name(caches[b]->k.dtype()) + " and " +
                   dtype_name(caches[0]->k.dtype()));
    for (std::size_t a = 0; a < b; ++a)
      if (caches[a] == caches[b]) fail(fn, at + ": the same cache as caches[" + std::to_string(a) + "]");
    check_tokens(fn, tokens.subspan(b, 1), caches[b]->len);
  }
  if (!logits) fail(fn, "logits: null output pointer");
  const CallThreads threads(opt_.num_threads, 2.0 * static_cast<double>(B) * static_cast<double>(params_),
                            kDecodeSharedFlops);
  decode(tokens, caches, logits, threads.n);
}

void Model::Impl::forward(std::span<const int> tokens, KvCache& cache, float* logits, bool all_logits) {
  const char* fn = "qkv::Model::forward";
  const Config& c = w_.config;
  check_cache(fn, cache, static_cast<std::int64_t>(tokens.size()));
  check_tokens(fn, tokens, cache.len);
  if (!logits) fail(fn, "logits: null output pointer");
  const auto S = static_cast<std::int64_t>(tokens.size());
  const CallThreads threads(opt_.num_threads, 2.0 * static_cast<double>(S) * static_cast<double>(params_),
                            S == 1 ? kDecodeSharedFlops : kPrefillSharedFlops);
  reserve(S);
  if (S == 1) {
    KvCache* one = &cache;
    decode(tokens, std::span<KvCache* const>(&one, 1), logits, threads.n);
    return;
  }
  blocks::embedding_forward(x_.ptr<float>(), tokens.data(), w_.wte, w_.wpe, S, c.dim, cache.len);
  // Only the rows whose logits are wanted go on past the last layer's attention (every layer's
  // keys and values are kept for all rows), and through the final norm and the classifier.
  const std::int64_t first = all_logits ? 0 : S - 1, n = S - first;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::int64_t r0 = l == c.n_layers - 1 ? first : 0;
    if (opt_.gemm_inputs == DType::bf16 && S > blocks::kGemvMaxRows) block_gemm_bf16(l, S, r0, cache);
    else block(l, S, r0, cache, nullptr);
  }
  cache.len += S;
  float* xf = xb_.ptr<float>();
  norm(c, xf, x_.ptr<float>() + first * c.dim, w_.normf_w, w_.normf_b, n);
  project(xf, w_.wcls, wcls_bf16_, nullptr, logits, n, c.dim, c.vocab_size);
}

}  // namespace qkv
