// Model's state and the functions that run it, shared by the files that implement it:
//   model.cpp       construction, projections, one layer (block), forward, forward_batch
//   model_bf16.cpp  the bf16 copies of the weights and the bf16-GEMM prefill layer (block_gemm_bf16)
//   decode.cpp      one token for each of B sequences in one parallel region (decode)
//   trace.cpp       forward_trace / forward_ablated: every layer recorded, heads knocked out; the
//                   recording of one layer that the encoder shares (layer_trace.hpp)
// Shapes: C = dim, H = n_heads, Hkv = n_kv_heads, D = head_dim, Hd = hidden_dim, V = vocab_size.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "blocks/attention_block.hpp"
#include "blocks/dense.hpp"
#include "core/parallel.hpp"
#include "qkv/attention.hpp"
#include "qkv/model.hpp"

namespace qkv {

struct Model::Impl {
  Impl(Weights w, ModelOptions options);

  Weights w_;
  ModelOptions opt_;
  std::int64_t params_ = 0;  // parameter count, to size the work of a call

  // Activations for up to `rows_` positions: x, xb [S, C]; q, att [S, H·D]; k, v [S, Hkv·D];
  // hb, hb2 [S, Hd]. gemm_inputs = bf16 only: qkv [S, (H + 2·Hkv)·D] (the fused projection's
  // output), xbb [S, max(C, H·D)] and hbb [S, Hd] bf16 (GEMM inputs); with a bf16 cache qkv's first
  // half holds the bf16 [S, (H + 2·Hkv)·D] instead. qb, ob [S, H·D] bf16: q and the attention's
  // output when the cache is bf16 and the path has f32 q (block()).
  Buffer x_, xb_, q_, k_, v_, att_, hb_, hb2_, qkv_, xbb_, hbb_, qb_, ob_;
  std::int64_t rows_ = 0;
  void reserve(std::int64_t S);

  // weights = bf16: every projection matrix rounded to bf16 in one arena (bf16_), with per-layer
  // pointers (null where the f32 matrix is null); wide_ is an f32 scratch as large as the largest
  // matrix, where a call with more rows than a GEMV takes widens one matrix for oneDNN's sgemm.
  struct LayerBf16 {
    const std::uint16_t *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const std::uint16_t *w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
  };
  // gemm_inputs = bf16: every layer's matrices ([W_Q; W_K; W_V], W_O, W1, W2, W3) also packed in
  // oneDNN's blocked layout for the prefill GEMMs; a second bf16 copy of them.
  struct PackedLayer {
    blocks::PackedBf16 wqkv, wo, w1, w2, w3;
  };
  Buffer bf16_, wide_;
  Buffer bqkv_;  // [n_layers, (H + 2·Hkv)·D]: b_Q, b_K, b_V concatenated (gemm_inputs = bf16, with biases)
  std::vector<LayerBf16> layers_bf16_;
  std::vector<PackedLayer> packed_;
  const std::uint16_t* wcls_bf16_ = nullptr;
  // Fills bf16_, layers_bf16_, wcls_bf16_ and wide_ (weights = bf16), packed_ and bqkv_
  // (gemm_inputs = bf16) (model_bf16.cpp).
  void make_bf16_weights();
  LayerBf16 layer_bf16(int l) const { return layers_bf16_.empty() ? LayerBf16{} : layers_bf16_[static_cast<std::size_t>(l)]; }

  // y [S, out] = beta·y + x [S, in] · Wᵀ + b, with W as f32 (Wb null) or bf16 (Wb): GEMV kernels for
  // S ≤ 4 rows (decoding), oneDNN's sgemm above (its bf16 matmul when gemm_inputs = bf16, and then
  // wide_ is not allocated).
  void project(const float* x, const float* W, const std::uint16_t* Wb, const float* b, float* y, std::int64_t S,
               std::int64_t in, std::int64_t out, float beta = 0.0f);
  // q, k, v [S, ·] = xb [S, C] · W_{Q,K,V}ᵀ + b of layer l: one fused GEMV for S ≤ 4 rows (the
  // threads meet once for the three matrices), three projections above.
  void project_qkv(int l, const float* xb, float* q, float* k, float* v, std::int64_t S);

  // The backends of blocks::attention_block: LayerProjections (block(): project_qkv and project,
  // f32 or bf16 weights, model.cpp) and GemmBf16Projections (block_gemm_bf16(): the fused W_Q/W_K/W_V
  // GEMM and W_O on bf16 inputs, model_bf16.cpp).
  struct LayerProjections;
  struct GemmBf16Projections;
  // Layer l's attention block on S rows (blocks::attention_block): q, k, v from proj, rotary at
  // positions cache.len …, keys and values appended to layer l's cache, the attention of rows
  // r0 … S − 1 (causal, bottom-right) and x_'s rows r0 … S − 1 += att·W_Oᵀ + b_O. Scratch: qb_
  // (q rounded for a bf16 cache) and, for an output in the other dtype than proj's, ob_ or att_.
  void attention_block(int l, std::int64_t S, std::int64_t r0, KvCache& cache, blocks::AttentionProjections& proj,
                       blocks::AttentionBlockTaps taps = {});

  // One layer on x_ [S, C]; its output only for rows r0 … S − 1. With a trace (r0 = 0, an f32
  // cache), the layer's attention is recorded (trace_taps); heads in ablate_ are knocked out.
  void block(int l, std::int64_t S, std::int64_t r0, KvCache& cache, LayerTrace* trace);
  // block() for prefill with gemm_inputs = bf16: fused W_Q/W_K/W_V, GEMM epilogues (model_bf16.cpp).
  void block_gemm_bf16(int l, std::int64_t S, std::int64_t r0, KvCache& cache);

  // forward_trace / forward_ablated (trace.cpp). The heads that block() knocks out (set only for
  // the length of such a call, which runs every row: r0 = 0), and the knocking out on att [S, H·D].
  std::span<const HeadAblation> ablate_;
  void ablate_heads(int l, float* att, std::int64_t S) const;
  // The taps of layer l's attention block for a trace (S rows from position 0 on an f32 cache):
  // the pattern and per-head Δe written by the block; scores (f64, from q and the cached keys), q,
  // k and the whole-block Δe recorded by its before_out, after the heads in ablate_ are knocked out.
  blocks::AttentionBlockTaps trace_taps(int l, std::int64_t S, const KvCache& cache, LayerTrace& trace);
  // Layers from position 0 on a fresh f32 cache, then logits [S, V].
  void forward_from_start(const char* fn, const std::vector<int>& tokens, Trace* trace,
                          std::span<const HeadAblation> ablate, float* logits);

  // One token for each of B = tokens.size() sequences on `threads` threads in one parallel region
  // (decode.cpp): logits [B, V]; each cache's len += 1. decode_scratch_: per-thread norm rows and
  // attention scores; decode_sync_: the work counters of one step (kept: no allocation a token).
  struct DecodeSync;
  struct DecodeSyncDeleter {
    void operator()(DecodeSync* s) const;
  };
  void decode(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits, int threads);
  Buffer decode_scratch_;
  std::vector<blocks::KvSlot> decode_slots_;  // [n_layers, B]: each sequence's cache per layer (grows only)
  std::unique_ptr<DecodeSync, DecodeSyncDeleter> decode_sync_;

  // Model's calls, validated here (model.cpp, trace.cpp).
  void forward(std::span<const int> tokens, KvCache& cache, float* logits, bool all_logits);
  void forward_batch(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits);
  void forward_trace(const std::vector<int>& tokens, Trace& trace, std::span<const HeadAblation> ablate);

  // Throws (naming fn) unless cache is an f32, bf16 or i8 cache for this config with room for S more.
  void check_cache(const char* fn, const KvCache& cache, std::int64_t S) const;
  void check_tokens(const char* fn, std::span<const int> tokens, std::int64_t start) const;
};

namespace model_detail {

// Layer l of `cache` (0 ≤ l < n_layers) as the attention block reads and writes it: k, v [Hkv, cap,
// D] and, for an i8 cache, k_scale, v_scale [Hkv, cap]; len = cache.len.
blocks::KvSlot layer_slot(const KvCache& cache, std::int64_t l);

// out [N, C] = norm(x [N, C]) with the config's norm (RMSNorm or LayerNorm): rows in chunks of 16
// shared over the threads (one chunk when decoding). With out_bf16 the chunk's rows are also
// rounded to bf16 there, while they are in cache.
void norm(const Config& c, float* out, const float* x, const float* w, const float* b, std::int64_t N,
          std::uint16_t* out_bf16 = nullptr);

// The threads of one forward call: ModelOptions::num_threads when set, else the library default,
// except that a call too small to share runs on one thread. A prefill runs ~40 parallel calls a
// layer (norms, GEMMs, attention): below ~100 MFLOP per call (stories260K prefills up to ~190
// tokens) one thread is faster here. A decoding step is one parallel call whose stages are handed
// out in chunks of ≈ 64 KiB of weights (Impl::decode): it pays from ~8 MFLOP a step (the 6.1 M
// model's 12 MFLOP a token: ≈ 1 ms on one thread), not at stories260K's 0.5 MFLOP (≈ 3 µs a stage,
// the cost of a wake-up).
inline constexpr double kPrefillSharedFlops = 100e6, kDecodeSharedFlops = 8e6;
struct CallThreads {
  int n;
  ScopedThreads scope;  // max_threads() = n inside the call
  CallThreads(int requested, double flops, double shared_from)
      : n(requested > 0 ? requested : flops < shared_from ? 1 : max_threads()), scope(n) {}
};

}  // namespace model_detail
}  // namespace qkv
