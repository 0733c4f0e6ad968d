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
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "blocks/activation.hpp"
#include "blocks/dense.hpp"
#include "blocks/embedding.hpp"
#include "blocks/linear.hpp"
#include "blocks/norm.hpp"
#include "blocks/rope.hpp"
#include "core/parallel.hpp"
#include "qkv/attention.hpp"
#include "qkv/memory.hpp"
#include "qkv/model.hpp"

namespace qkv {

struct Model::PackedLayer {
  blocks::PackedBf16 wqkv, wo, w1, w2, w3;
};

KvCache::KvCache(const Config& c, std::int64_t cap, DType dtype) {
  c.validate("qkv::KvCache");
  if (cap < 0 || cap > c.seq_len)
    fail("qkv::KvCache", "capacity: must be in [0, seq_len = " + std::to_string(c.seq_len) + "], got " +
                             std::to_string(cap));
  if (dtype != DType::f32 && dtype != DType::bf16)
    fail("qkv::KvCache", std::string("dtype: must be f32 or bf16, got ") + dtype_name(dtype));
  capacity = cap == 0 ? c.seq_len : cap;
  // Sized by the config (seq_len): refused, not killed, when it cannot fit.
  const std::uint64_t one = bytes_of({c.n_layers, c.n_kv_heads, capacity, c.head_dim()}, dtype_size(dtype));
  check_memory("qkv::KvCache", "k and v [n_layers, n_kv_heads, capacity, head_dim] = [" + std::to_string(c.n_layers) +
                                   ", " + std::to_string(c.n_kv_heads) + ", " + std::to_string(capacity) + ", " +
                                   std::to_string(c.head_dim()) + "] each",
               one > UINT64_MAX / 2 ? UINT64_MAX : 2 * one);
  k = Buffer(dtype, {c.n_layers, c.n_kv_heads, capacity, c.head_dim()});
  v = Buffer(dtype, {c.n_layers, c.n_kv_heads, capacity, c.head_dim()});
}

KvCache Model::new_cache(std::int64_t capacity) const {
  return KvCache(w_.config, capacity, opt_.gemm_inputs == DType::bf16 ? DType::bf16 : DType::f32);
}

Model::Model(Weights w, ModelOptions options) : w_(std::move(w)), opt_(options) {
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
  if (opt_.weights == DType::bf16) {
    const Config& c = w_.config;
    const std::int64_t C = c.dim, D = c.head_dim(), Hd = c.hidden_dim;
    const std::int64_t per_layer = (c.n_heads + 2 * c.n_kv_heads) * D * C + C * c.n_heads * D +
                                   (c.mlp == MlpKind::swiglu ? 3 : 2) * Hd * C;
    check_memory("qkv::Model", "bf16 copy of the weights", bytes_of({c.n_layers * per_layer + c.vocab_size * C}, 2));
    bf16_ = Buffer(DType::bf16, {c.n_layers * per_layer + c.vocab_size * C});
    std::uint16_t* at = bf16_.ptr<std::uint16_t>();
    std::int64_t largest = 0;
    auto take = [&](const float* src, std::int64_t rows, std::int64_t cols) -> const std::uint16_t* {
      if (!src) return nullptr;
      blocks::f32_to_bf16(at, src, rows * cols);
      largest = std::max(largest, rows * cols);
      const std::uint16_t* p = at;
      at += rows * cols;
      return p;
    };
    for (const LayerWeights& L : w_.layers) {
      LayerBf16 b;
      b.wq = take(L.wq, c.n_heads * D, C);
      b.wk = take(L.wk, c.n_kv_heads * D, C);
      b.wv = take(L.wv, c.n_kv_heads * D, C);
      b.wo = take(L.wo, C, c.n_heads * D);
      b.w1 = take(L.w1, Hd, C);
      b.w2 = take(L.w2, C, Hd);
      b.w3 = take(L.w3, Hd, C);
      layers_bf16_.push_back(b);
    }
    wcls_bf16_ = take(w_.wcls, c.vocab_size, C);
    if (opt_.gemm_inputs == DType::f32) wide_ = Buffer(DType::f32, {largest});
  }
  if (opt_.gemm_inputs == DType::bf16) {
    // block_gemm_bf16 multiplies by [W_Q; W_K; W_V] in one GEMM: take() laid the three out one
    // after the other, which is that [(H + 2·Hkv)·D, C] matrix; its bias is the three concatenated
    // (zeros where one is missing), or none when all three are.
    const Config& c = w_.config;
    const std::int64_t HD = c.n_heads * c.head_dim(), KD = c.n_kv_heads * c.head_dim(), N3 = HD + 2 * KD;
    bool bias = false;
    for (const LayerWeights& L : w_.layers) bias = bias || L.bq || L.bk || L.bv;
    if (bias) bqkv_ = Buffer(DType::f32, {c.n_layers, N3});
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
      const LayerBf16& b = layers_bf16_[static_cast<std::size_t>(l)];
      if (b.wk != b.wq + HD * c.dim || b.wv != b.wk + KD * c.dim)
        fail("qkv::Model", "internal: W_Q, W_K, W_V of a layer are not adjacent in the bf16 arena");
      auto p = std::make_shared<PackedLayer>();
      p->wqkv = blocks::PackedBf16(b.wq, c.dim, N3);
      p->wo = blocks::PackedBf16(b.wo, HD, c.dim);
      p->w1 = blocks::PackedBf16(b.w1, c.dim, c.hidden_dim);
      p->w2 = blocks::PackedBf16(b.w2, c.hidden_dim, c.dim);
      if (b.w3) p->w3 = blocks::PackedBf16(b.w3, c.dim, c.hidden_dim);
      packed_.push_back(std::move(p));
      if (!bias) continue;
      float* row = bqkv_.ptr<float>() + l * N3;
      const std::pair<const float*, std::int64_t> parts[] = {{L.bq, HD}, {L.bk, KD}, {L.bv, KD}};
      for (const auto& [src, n] : parts) {
        if (src) std::copy_n(src, n, row);
        else std::fill_n(row, n, 0.0f);
        row += n;
      }
    }
  }
}

void Model::project(const float* x, const float* W, const std::uint16_t* Wb, const float* b, float* y,
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

void Model::project_qkv(int l, const float* xb, float* q, float* k, float* v, std::int64_t S) {
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16 Lb = layers_bf16_.empty() ? LayerBf16{} : layers_bf16_[static_cast<std::size_t>(l)];
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

namespace {

// The threads of one forward call: ModelOptions::num_threads when set, else the library default,
// except that a call too small to share runs on one thread. A prefill runs ~40 parallel calls a
// layer (norms, GEMMs, attention): below ~100 MFLOP per call (stories260K prefills up to ~190
// tokens) one thread is faster here. A decoding step is one parallel call whose stages are handed
// out in chunks of ≈ 64 KiB of weights (Model::decode): it pays from ~8 MFLOP a step (the 6.1 M
// model's 12 MFLOP a token: ≈ 1 ms on one thread), not at stories260K's 0.5 MFLOP (≈ 3 µs a stage,
// the cost of a wake-up).
constexpr double kPrefillSharedFlops = 100e6, kDecodeSharedFlops = 8e6;
struct CallThreads {
  int n;
  ScopedThreads scope;  // max_threads() = n inside the call
  CallThreads(int requested, double flops, double shared_from)
      : n(requested > 0 ? requested : flops < shared_from ? 1 : max_threads()), scope(n) {}
};

}  // namespace

void Model::reserve(std::int64_t S) {
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

void Model::check_tokens(const char* fn, std::span<const int> tokens, std::int64_t start) const {
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

namespace {

// Rows are independent: chunks of 16 rows shared over the threads (one chunk when decoding).
// With out_bf16 the chunk's rows are also rounded to bf16 there, while they are in cache.
void norm(const Config& c, float* out, const float* x, const float* w, const float* b, std::int64_t N,
          std::uint16_t* out_bf16 = nullptr) {
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

}  // namespace

struct Model::AttentionViews {
  View q, k, v, out;
  AttentionOptions opt;
};

Model::AttentionViews Model::attention_views(int l, std::int64_t S, std::int64_t n, const KvCache& cache, void* q,
                                             std::int64_t ld_q, void* out) const {
  const Config& c = w_.config;
  const std::int64_t H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim(), cap = cache.capacity;
  const std::int64_t Skv = cache.len + S;
  const DType dt = cache.k.dtype();
  const std::int64_t at = l * Hkv * cap * D * static_cast<std::int64_t>(dtype_size(dt));  // layer l, in bytes
  AttentionViews av{View::strided(q, dt, {1, H, n, D}, {n * ld_q, D, ld_q, 1}),
                    View::strided(static_cast<char*>(cache.k.data()) + at, dt, {1, Hkv, Skv, D},
                                  {Hkv * cap * D, cap * D, D, 1}),
                    View::strided(static_cast<char*>(cache.v.data()) + at, dt, {1, Hkv, Skv, D},
                                  {Hkv * cap * D, cap * D, D, 1}),
                    View::strided(out, dt, {1, H, n, D}, {n * H * D, D, H * D, 1}), AttentionOptions{}};
  av.opt.num_threads = max_threads();
  av.opt.causal = true;
  // The n queries are the last n positions: each sees the keys up to its own position.
  av.opt.align = Align::bottom_right;
  return av;
}

Model::AttentionViews Model::prepare_attention(int l, std::int64_t S, std::int64_t r0, KvCache& cache, float* q,
                                               float* k, const float* v, std::int64_t ld_q, std::int64_t ld_kv,
                                               void* out) {
  const Config& c = w_.config;
  const std::int64_t H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim();
  const std::int64_t pos0 = cache.len, cap = cache.capacity;
  const int threads = S > blocks::kGemvMaxRows ? max_threads() : 1;
  const bool bf16 = cache.k.dtype() == DType::bf16;
  const Isa isa = active_isa();
  if (c.pos == PosEncoding::rotary)
    for (std::int64_t s = 0; s < S; ++s) {
      blocks::rope_forward(q + s * ld_q, 1, H, D, pos0 + s, c.rope_theta);
      blocks::rope_forward(k + s * ld_kv, 1, Hkv, D, pos0 + s, c.rope_theta);
    }
  // Append this call's keys and values: cache.k[l, h, pos0 + s, :] = k[s, h·D : (h+1)·D].
  const std::int64_t at = (l * Hkv * cap + pos0) * D;  // layer l, position pos0, in elements
  parallel_for(Hkv, threads, [&](std::int64_t h) {
    for (std::int64_t s = 0; s < S; ++s) {
      const std::int64_t dst = at + (h * cap + s) * D, src = s * ld_kv + h * D;
      if (bf16) {
        blocks::f32_to_bf16(cache.k.ptr<std::uint16_t>() + dst, k + src, D, isa);
        blocks::f32_to_bf16(cache.v.ptr<std::uint16_t>() + dst, v + src, D, isa);
      } else {
        std::memcpy(cache.k.ptr<float>() + dst, k + src, sizeof(float) * D);
        std::memcpy(cache.v.ptr<float>() + dst, v + src, sizeof(float) * D);
      }
    }
  });
  const std::int64_t n = S - r0;  // the queries asked for: rows r0 … S − 1
  if (!bf16) return attention_views(l, S, n, cache, q + r0 * ld_q, ld_q, out);
  std::uint16_t* qb = qb_.ptr<std::uint16_t>();
  parallel_for(n, threads, [&](std::int64_t s) { blocks::f32_to_bf16(qb + s * H * D, q + (r0 + s) * ld_q, H * D, isa); });
  return attention_views(l, S, n, cache, qb, H * D, out);
}

// One pre-norm block on x_ [S, C] for positions cache.len … cache.len + S − 1. Keys and values
// of all S rows go to the cache; the block's output x is computed for rows r0 … S − 1 only (the
// last layer of a call that wants only the last position's logits: r0 = S − 1; a trace: r0 = 0).
void Model::block(int l, std::int64_t S, std::int64_t r0, KvCache& cache, LayerTrace* trace) {
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16 Lb = layers_bf16_.empty() ? LayerBf16{} : layers_bf16_[static_cast<std::size_t>(l)];
  const std::int64_t C = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim(), Hd = c.hidden_dim;
  const std::int64_t cap = cache.capacity;
  float *x = x_.ptr<float>(), *xb = xb_.ptr<float>(), *q = q_.ptr<float>(), *k = k_.ptr<float>();
  float *v = v_.ptr<float>(), *att = att_.ptr<float>(), *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();

  // ---- attention: x += W_O · attention(q, k, v)
  norm(c, xb, x, L.norm1_w, L.norm1_b, S);
  project_qkv(l, xb, q, k, v, S);
  const bool bf16_kv = cache.k.dtype() == DType::bf16;
  const AttentionViews av = prepare_attention(l, S, r0, cache, q, k, v, H * D, Hkv * D, bf16_kv ? ob_.data() : att);
  const std::int64_t n = S - r0;
  float* xo = x + r0 * C;  // the rows of x this block updates
  const View &qv = av.q, &kv = av.k, &vv = av.v, &ov = av.out;
  const AttentionOptions& opt = av.opt;
  if (trace) {
    // forward_trace runs on an f32 cache of its own.
    const float* kc = cache.k.ptr<float>() + l * Hkv * cap * D;
    // scores [H, S, S] from the same q and k, in f64 like the reference; pattern from the kernel.
    trace->pattern = Buffer(DType::f32, {H, S, S});
    trace->scores = Buffer(DType::f32, {H, S, S});
    attention(qv, kv, vv, ov, opt, std::nullopt,
              View::contiguous(trace->pattern.data(), DType::f32, {1, H, S, S}));
    ablate_heads(l, att, S);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    float* sc = trace->scores.ptr<float>();
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t j = 0; j < S; ++j) {
          float& out = sc[(h * S + i) * S + j];
          if (j > i) {
            out = -std::numeric_limits<float>::infinity();
            continue;
          }
          const float* qi = q + (i * H + h) * D;
          const float* kj = kc + ((h / (H / Hkv)) * cap + j) * D;
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += static_cast<double>(qi[d]) * kj[d];
          out = static_cast<float>(scale * dot);
        }
    // The vectors the scores are made of, after rotary: q [H, S, D], k [Hkv, S, D].
    trace->q = Buffer(DType::f32, {H, S, D});
    trace->k = Buffer(DType::f32, {Hkv, S, D});
    for (std::int64_t s = 0; s < S; ++s) {
      for (std::int64_t h = 0; h < H; ++h)
        std::memcpy(trace->q.ptr<float>() + (h * S + s) * D, q + (s * H + h) * D, sizeof(float) * static_cast<std::size_t>(D));
      for (std::int64_t g = 0; g < Hkv; ++g)
        std::memcpy(trace->k.ptr<float>() + (g * S + s) * D, kc + (g * cap + s) * D, sizeof(float) * static_cast<std::size_t>(D));
    }
    // Δe_h = W_O[:, h·D:(h+1)·D] · att_h for every position: head_delta [H, S, C].
    trace->head_delta = Buffer(DType::f32, {H, S, C});
    trace->block_delta = Buffer(DType::f32, {S, C});
    blocks::head_delta_forward(trace->head_delta.ptr<float>(), att, L.wo, S, H, D, C);
    project(att, L.wo, Lb.wo, nullptr, trace->block_delta.ptr<float>(), S, H * D, C);
  } else {
    attention(qv, kv, vv, ov, opt);
    if (bf16_kv) blocks::bf16_to_f32(att, ob_.ptr<std::uint16_t>(), n * H * D, S > blocks::kGemvMaxRows ? opt.num_threads : 1);
    ablate_heads(l, att, S);
  }
  project(att, L.wo, Lb.wo, L.bo, xo, n, H * D, C, 1.0f);  // residual: x += att·W_Oᵀ + b_O

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

// block() for gemm_inputs = bf16 and S > 4 rows: the same layer with every GEMM input made bf16
// where it is produced, so nothing is converted on its own pass and the GEMMs do the rest in
// their epilogues (blocks::gemm_bf16_in):
//   xbb = bf16(norm1(x))                                  (in the norm's own loop)
//   qkv = xbb·[W_Q; W_K; W_V]ᵀ + [b_Q; b_K; b_V]         qkv [S, (H + 2·Hkv)·D] f32, one GEMM
//   att = attention(q, k, v)  (q, k, v: column blocks of qkv's rows)
//   x += bf16(att)·W_Oᵀ + b_O                             (sum epilogue)
// With a bf16 cache and no rotary the GEMM writes qkv in bf16 (rounding in its epilogue), its k, v
// rows are copied into the cache, and the bf16 attention reads q in place and writes bf16(att)
// straight into W_O's input rows; with rotary, qkv stays f32 and prepare_attention rotates and
// rounds. Either way no pass converts att.
//   xbb = bf16(norm2(x));  hbb = bf16(gelu(xbb·W1ᵀ + b1)) (bias, GELU, rounding in the epilogue)
//   x += hbb·W2ᵀ + b2
// Every GEMM sees the same bf16 inputs as block()'s per-projection rounding; only the GELU is
// oneDNN's (f32, same form) instead of gelu_fast. SwiGLU keeps two GEMMs and the gate in f32.
// After the attention's projection only rows r0 … S − 1 go on, as in block().
void Model::block_gemm_bf16(int l, std::int64_t S, std::int64_t r0, KvCache& cache) {
  using blocks::GemmAct;
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16& Lb = layers_bf16_[static_cast<std::size_t>(l)];
  const std::int64_t C = c.dim, D = c.head_dim(), Hd = c.hidden_dim;
  const std::int64_t HD = c.n_heads * D, KD = c.n_kv_heads * D, N3 = HD + 2 * KD;
  const int threads = max_threads();
  float *x = x_.ptr<float>(), *xb = xb_.ptr<float>(), *qkv = qkv_.ptr<float>(), *att = att_.ptr<float>();
  std::uint16_t *xbb = xbb_.ptr<std::uint16_t>(), *hbb = hbb_.ptr<std::uint16_t>();
  const float* bqkv = bqkv_.numel() > 0 ? bqkv_.ptr<float>() + l * N3 : nullptr;
  const PackedLayer& P = *packed_[static_cast<std::size_t>(l)];

  // ---- attention: x += W_O · attention(q, k, v)
  norm(c, xb, x, L.norm1_w, L.norm1_b, S, xbb);
  const std::int64_t n = S - r0;
  const bool bf16_kv = cache.k.dtype() == DType::bf16, bf16_qkv = bf16_kv && c.pos != PosEncoding::rotary;
  blocks::gemm_bf16_in(xbb, Lb.wq, bqkv, qkv, bf16_qkv ? DType::bf16 : DType::f32, S, C, N3, 0.0f, GemmAct::none,
                       &P.wqkv);
  if (bf16_qkv) {
    // qkvb [S, N3] bf16 in qkv_'s memory: cache.k[l, h, pos0 + s, :] = qkvb[s, HD + h·D …], v after it.
    std::uint16_t* qkvb = qkv_.ptr<std::uint16_t>();
    const std::int64_t Hkv = c.n_kv_heads, cap = cache.capacity, at = (l * Hkv * cap + cache.len) * D;
    std::uint16_t *kc = cache.k.ptr<std::uint16_t>() + at, *vc = cache.v.ptr<std::uint16_t>() + at;
    parallel_for(Hkv, threads, [&](std::int64_t h) {
      for (std::int64_t s = 0; s < S; ++s) {
        std::memcpy(kc + (h * cap + s) * D, qkvb + s * N3 + HD + h * D, sizeof(std::uint16_t) * D);
        std::memcpy(vc + (h * cap + s) * D, qkvb + s * N3 + HD + KD + h * D, sizeof(std::uint16_t) * D);
      }
    });
    const AttentionViews av = attention_views(l, S, n, cache, qkvb + r0 * N3, N3, xbb);
    attention(av.q, av.k, av.v, av.out, av.opt);
  } else {
    const AttentionViews av =
        prepare_attention(l, S, r0, cache, qkv, qkv + HD, qkv + HD + KD, N3, N3, bf16_kv ? xbb : static_cast<void*>(att));
    attention(av.q, av.k, av.v, av.out, av.opt);
    if (!bf16_kv) blocks::f32_to_bf16(xbb, att, n * HD, threads, active_isa());
  }
  float* xo = x + r0 * C;  // the rows of x this block updates
  blocks::gemm_bf16_in(xbb, Lb.wo, L.bo, xo, DType::f32, n, HD, C, 1.0f, GemmAct::none, &P.wo);

  // ---- MLP: x += W2 · act(W1 · norm2(x))
  norm(c, xb, xo, L.norm2_w, L.norm2_b, n, xbb);
  if (c.mlp == MlpKind::swiglu) {
    float *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();
    blocks::gemm_bf16_in(xbb, Lb.w1, L.b1, hb, DType::f32, n, C, Hd, 0.0f, GemmAct::none, &P.w1);
    blocks::gemm_bf16_in(xbb, Lb.w3, nullptr, hb2, DType::f32, n, C, Hd, 0.0f, GemmAct::none, &P.w3);
    blocks::swiglu_forward(hb, hb, hb2, n * Hd);
    blocks::f32_to_bf16(hbb, hb, n * Hd, threads, active_isa());
  } else {
    const GemmAct act = c.mlp == MlpKind::gelu_exact ? GemmAct::gelu_erf : GemmAct::gelu_tanh;
    blocks::gemm_bf16_in(xbb, Lb.w1, L.b1, hbb, DType::bf16, n, C, Hd, 0.0f, act, &P.w1);
  }
  blocks::gemm_bf16_in(hbb, Lb.w2, L.b2, xo, DType::f32, n, Hd, C, 1.0f, GemmAct::none, &P.w2);
}

void Model::check_cache(const char* fn, const KvCache& cache, std::int64_t S) const {
  const Config& c = w_.config;
  if (cache.k.numel() == 0 || cache.k.shape()[0] != c.n_layers || cache.k.shape()[1] != c.n_kv_heads ||
      cache.k.shape()[3] != c.head_dim())
    fail(fn, "cache: not made for this model's config (construct it as KvCache(model.config()))");
  if ((cache.k.dtype() != DType::f32 && cache.k.dtype() != DType::bf16) || cache.v.dtype() != cache.k.dtype() ||
      cache.v.shape() != cache.k.shape())
    fail(fn, std::string("cache: k and v must be f32 or bf16 of one dtype and shape, got k ") +
                 dtype_name(cache.k.dtype()) + " " + cache.k.view().shape_str() + ", v " + dtype_name(cache.v.dtype()) + " " +
                 cache.v.view().shape_str());
  if (cache.len + S > cache.capacity)
    fail(fn, "cache: " + std::to_string(cache.len) + " positions held + " + std::to_string(S) +
                 " new exceed its capacity " + std::to_string(cache.capacity));
}

void Model::forward_batch(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits) {
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

void Model::forward(std::span<const int> tokens, KvCache& cache, float* logits, bool all_logits) {
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

// The counters of one decoding step (Model::decode), kept between calls: step s hands out the
// chunks of segment g from next[s·T + g] and counts its finished units in done[s]. Each counter
// has its own cache line (threads bump them concurrently).
struct Model::DecodeSync {
  struct alignas(64) Next {
    std::atomic<std::int64_t> v{0};
  };
  struct alignas(64) Done {
    WaitWord v;
  };
  std::unique_ptr<Next[]> next;
  std::unique_ptr<Done[]> done;
  int steps = 0, threads = 0;
};

void Model::free_decode_sync(DecodeSync* s) { delete s; }

// Decoding: one token for each of B sequences (B = 1: Model::forward of one token), each with its
// own cache and position. A step reads every weight once for all B sequences (gemv_batch_rows: each
// weight row once, for the B rows of activations) in one parallel call (run_shared) whose threads
// go through the stages below in order; a stage starts once the one before it has finished all its
// units (done[s], a WaitWord: spin, then sleep):
//   A  per KV head (handed out from a counter): its rows of W_Q, W_K, W_V → q, k, v of its G query
//      heads, then for each sequence rotary at its position, k, v appended to its cache, and the
//      G heads' attention (attend_one; a bf16 cache: qkv::attention's bf16 kernel)
//   B  rows of x += att·W_Oᵀ + b_O
//   C  rows of hb = xb·W1ᵀ (+ W3) and the activation on them
//   D  rows of x += hb·W2ᵀ + b2
// then rows of the logits from norm_f(x). Stages A, C and the logits read the norm of x, which each
// thread computes into its own xb_t (C·B values, cheaper than another stage) once it has taken its
// first chunk of the stage: x cannot change then (the next writer of x waits for that chunk), and
// a thread that takes no chunk reads nothing. So a thread that wakes late or is preempted on a busy
// machine is not waited for: the others take its share, and it skips the stages already handed
// out (run_shared lets no thread join after the caller's part is done). Rows are handed out in
// chunks of ≈ 64 KiB of weights (see `share`). Every row's sum and every head's attention is
// computed by the same code whichever thread and whatever B, so the logits are the same bits on any
// number of threads and in any batch (tests/model/test_model.cpp). With one thread the caller runs
// the stages alone: no thread is woken, no counter waited on.
void Model::decode(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits, int T) {
  using i64 = std::int64_t;
  const Config& c = w_.config;
  const i64 B = static_cast<i64>(tokens.size());
  const i64 C = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim(), Hd = c.hidden_dim, V = c.vocab_size;
  const i64 G = H / Hkv, HD = H * D, KD = Hkv * D;
  const Isa isa = active_isa();
  const bool bf16 = !layers_bf16_.empty(), bf16_kv = caches[0]->k.dtype() == DType::bf16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  reserve(B);
  // Per thread: xb_t [B, C] (its norm output) and scores [P] (attend_one's scratch); then the rotary
  // angles of each sequence's position, cs [B, D] (blocks::rope_angles), computed once a step.
  const i64 per_thread = B * C + c.seq_len;
  if (decode_scratch_.numel() < T * per_thread + B * D) decode_scratch_ = Buffer(DType::f32, {T * per_thread + B * D});
  float* cs = decode_scratch_.ptr<float>() + T * per_thread;
  if (c.pos == PosEncoding::rotary)
    for (i64 b = 0; b < B; ++b) blocks::rope_angles(cs + b * D, D, caches[static_cast<std::size_t>(b)]->len, c.rope_theta);
  const int steps = 4 * static_cast<int>(c.n_layers) + 1;
  if (!decode_sync_ || decode_sync_->steps < steps || decode_sync_->threads < T) {
    decode_sync_.reset(new DecodeSync);
    decode_sync_->next = std::make_unique<DecodeSync::Next[]>(static_cast<std::size_t>(steps * T));
    decode_sync_->done = std::make_unique<DecodeSync::Done[]>(static_cast<std::size_t>(steps));
    decode_sync_->steps = steps;
    decode_sync_->threads = T;
  }
  DecodeSync::Next* next = decode_sync_->next.get();
  DecodeSync::Done* done = decode_sync_->done.get();
  for (int i = 0; i < steps * T; ++i) next[i].v.store(0, std::memory_order_relaxed);
  for (int s = 0; s < steps; ++s) done[s].v.store(0);  // no thread waits on them now: no wake-up
  for (i64 b = 0; b < B; ++b)
    blocks::embedding_forward(x_.ptr<float>() + b * C, &tokens[static_cast<std::size_t>(b)], w_.wte, w_.wpe, 1, C,
                              caches[static_cast<std::size_t>(b)]->len);
  float *x = x_.ptr<float>(), *q = q_.ptr<float>(), *k = k_.ptr<float>(), *v = v_.ptr<float>();
  float *att = att_.ptr<float>(), *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();
  // y [b·ldy + o] (+)= xin [b, :] · W[o, :] + bias[o], rows [r0, r1) of W, f32 or bf16 weights.
  auto gemv = [&](const float* W, const std::uint16_t* Wb, const float* bias, float* y, i64 ldy, const float* xin,
                  i64 in, float beta, i64 r0, i64 r1) {
    blocks::gemv_batch_rows(xin, bf16 ? nullptr : W, bf16 ? Wb : nullptr, bias, y, ldy, B, in, beta, isa, r0, r1);
  };
  auto norm_rows = [&](float* out, const float* w, const float* bias) {
    if (c.norm == NormKind::rmsnorm) blocks::rmsnorm_forward(out, nullptr, x, w, B, C, c.norm_eps);
    else blocks::layernorm_forward(out, nullptr, nullptr, x, w, bias, B, C, c.norm_eps);
  };
  // Rows per chunk of n rows with `in` columns: ≈ 64 KiB of weights, at least 8 rows; all n on one
  // thread (nothing to rebalance: each matrix is read as one stream, W1 and W3 one after the other).
  const i64 wbytes = bf16 ? 2 : 4;
  auto rows_per_chunk = [&](i64 in, i64 n) {
    return T == 1 ? std::max<i64>(n, 1) : std::max<i64>(8, (i64{64} << 10) / (in * wbytes));
  };
  // Units of each step: A kv heads, B rows of W_O, C rows of W1, D rows of W2; the last: logits.
  auto units = [&](int step) -> i64 {
    if (step == steps - 1) return V;
    const int stage = step % 4;
    return stage == 0 ? Hkv : stage == 2 ? Hd : C;
  };
  // Step `step`: its n units, [0, n), are cut into T contiguous segments, each with its counter:
  // thread t takes the chunks of segment t in order (one linear stream, as a static split would),
  // then helps with the other segments' remaining chunks. It first waits for the step before to
  // finish, and calls first() once before its first chunk (the norm of x, when the step reads it).
  auto share = [&](int t, int step, i64 n, i64 chunk, auto&& first, auto&& fn) {
    if (T > 1 && step > 0) {
      const auto need = static_cast<std::uint32_t>(units(step - 1));
      for (std::uint32_t d = done[step - 1].v.load(); d < need;) d = done[step - 1].v.wait_change(d);
    }
    bool started = false;
    for (int j = 0; j < T; ++j) {
      const int seg = (t + j) % T;
      const auto [a, b] = blocks::gemv_part_rows(n, seg, T);
      std::atomic<i64>& counter = next[step * T + seg].v;
      for (;;) {
        const i64 r0 = a + counter.fetch_add(1, std::memory_order_relaxed) * chunk;
        if (r0 >= b) break;
        if (!started) first();
        started = true;
        const i64 r1 = std::min(b, r0 + chunk);
        fn(r0, r1);
        if (T > 1) done[step].v.fetch_add(static_cast<std::uint32_t>(r1 - r0));
      }
    }
  };
  std::exception_ptr error;  // attention() validates its views; a throw must not leave a thread behind
  std::mutex error_mu;
  auto nothing = [] {};
  run_shared(T, [&](int t) {
    float* xb = decode_scratch_.ptr<float>() + t * per_thread;
    float* scores = xb + B * C;
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
      const LayerBf16 Lb = bf16 ? layers_bf16_[static_cast<std::size_t>(l)] : LayerBf16{};
      const int s0 = 4 * l;
      share(t, s0, Hkv, 1, [&] { norm_rows(xb, L.norm1_w, L.norm1_b); }, [&](i64 hk, i64) {
        const i64 h0 = hk * G;
        gemv(L.wq ? L.wq + h0 * D * C : nullptr, Lb.wq ? Lb.wq + h0 * D * C : nullptr, L.bq ? L.bq + h0 * D : nullptr,
             q + h0 * D, HD, xb, C, 0.0f, 0, G * D);
        gemv(L.wk ? L.wk + hk * D * C : nullptr, Lb.wk ? Lb.wk + hk * D * C : nullptr, L.bk ? L.bk + hk * D : nullptr,
             k + hk * D, KD, xb, C, 0.0f, 0, D);
        gemv(L.wv ? L.wv + hk * D * C : nullptr, Lb.wv ? Lb.wv + hk * D * C : nullptr, L.bv ? L.bv + hk * D : nullptr,
             v + hk * D, KD, xb, C, 0.0f, 0, D);
        for (i64 b = 0; b < B; ++b) {
          KvCache& cache = *caches[static_cast<std::size_t>(b)];
          const i64 pos = cache.len, cap = cache.capacity;
          float *qh = q + b * HD + h0 * D, *kh = k + b * KD + hk * D, *vh = v + b * KD + hk * D;
          if (c.pos == PosEncoding::rotary) {
            blocks::rope_apply(qh, G, D, cs + b * D);
            blocks::rope_apply(kh, 1, D, cs + b * D);
          }
          const i64 at = (l * Hkv + hk) * cap * D;  // this kv head's rows in the cache
          float* oh = att + b * HD + h0 * D;
          if (!bf16_kv) {
            float *kc = cache.k.ptr<float>() + at, *vc = cache.v.ptr<float>() + at;
            std::memcpy(kc + pos * D, kh, sizeof(float) * static_cast<std::size_t>(D));
            std::memcpy(vc + pos * D, vh, sizeof(float) * static_cast<std::size_t>(D));
            blocks::attend_one(qh, kc, vc, oh, scores, G, D, pos + 1, scale, isa);
            continue;
          }
          // A bf16 cache: k, v rounded into it; the bf16 decode kernel takes bf16 q, K, V and
          // writes bf16 rows, widened back into att.
          blocks::f32_to_bf16(cache.k.ptr<std::uint16_t>() + at + pos * D, kh, D, isa);
          blocks::f32_to_bf16(cache.v.ptr<std::uint16_t>() + at + pos * D, vh, D, isa);
          std::uint16_t *qb = qb_.ptr<std::uint16_t>() + b * HD + h0 * D, *ob = ob_.ptr<std::uint16_t>() + b * HD + h0 * D;
          blocks::f32_to_bf16(qb, qh, G * D, isa);
          AttentionOptions opt;
          opt.num_threads = 1;
          opt.causal = true;
          opt.align = Align::bottom_right;
          try {
            attention(View::strided(qb, DType::bf16, {1, G, 1, D}, {G * D, D, G * D, 1}),
                      View::strided(cache.k.ptr<std::uint16_t>() + at, DType::bf16, {1, 1, pos + 1, D},
                                    {cap * D, cap * D, D, 1}),
                      View::strided(cache.v.ptr<std::uint16_t>() + at, DType::bf16, {1, 1, pos + 1, D},
                                    {cap * D, cap * D, D, 1}),
                      View::strided(ob, DType::bf16, {1, G, 1, D}, {G * D, D, G * D, 1}), opt);
            blocks::bf16_to_f32(oh, ob, G * D, 1);
          } catch (...) {
            const std::lock_guard<std::mutex> lock(error_mu);
            error = std::current_exception();
          }
        }
      });
      share(t, s0 + 1, C, rows_per_chunk(HD, C), nothing, [&](i64 r0, i64 r1) {
        gemv(L.wo, Lb.wo, L.bo, x, C, att, HD, 1.0f, r0, r1);  // residual: x += att·W_Oᵀ + b_O
      });
      share(t, s0 + 2, Hd, rows_per_chunk(C, Hd), [&] { norm_rows(xb, L.norm2_w, L.norm2_b); }, [&](i64 r0, i64 r1) {
        gemv(L.w1, Lb.w1, L.b1, hb, Hd, xb, C, 0.0f, r0, r1);
        if (c.mlp == MlpKind::swiglu) gemv(L.w3, Lb.w3, nullptr, hb2, Hd, xb, C, 0.0f, r0, r1);
        for (i64 b = 0; b < B; ++b) {
          float* h = hb + b * Hd + r0;
          if (c.mlp == MlpKind::swiglu) blocks::swiglu_forward(h, h, hb2 + b * Hd + r0, r1 - r0);  // per ISA, exp_f32
          else if (c.mlp == MlpKind::gelu_exact) blocks::gelu_exact_forward(h, h, r1 - r0);
          else blocks::gelu_fast(h, h, r1 - r0, 1, isa);
        }
      });
      share(t, s0 + 3, C, rows_per_chunk(Hd, C), nothing, [&](i64 r0, i64 r1) {
        gemv(L.w2, Lb.w2, L.b2, x, C, hb, Hd, 1.0f, r0, r1);  // residual: x += hb·W2ᵀ + b2
      });
    }
    share(t, steps - 1, V, rows_per_chunk(C, V), [&] { norm_rows(xb, w_.normf_w, w_.normf_b); },
          [&](i64 r0, i64 r1) { gemv(w_.wcls, wcls_bf16_, nullptr, logits, V, xb, C, 0.0f, r0, r1); });
  });
  if (error) std::rethrow_exception(error);
  for (KvCache* cache : caches) cache->len += 1;
}

void Model::ablate_heads(int l, float* att, std::int64_t S) const {
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

void Model::forward_from_start(const char* fn, const std::vector<int>& tokens, Trace* trace,
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

void Model::forward_trace(const std::vector<int>& tokens, Trace& trace, std::span<const HeadAblation> ablate) {
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

void Model::forward_ablated(const std::vector<int>& tokens, std::span<const HeadAblation> ablate, float* logits) {
  forward_from_start("qkv::Model::forward_ablated", tokens, nullptr, ablate, logits);
}

}  // namespace qkv
