// qkv/encoder.hpp — sentence embeddings with a BERT-family encoder (a sentence-transformers folder).
//
// The model is qkv's one Config with the encoder's settings (causal = false, post_norm = true,
// type_vocab_size > 0; config_from_json reads a Hugging Face "bert" config.json that way):
//
//   x = norm_e(wte[t] + wpe[position in its text] + wtt[0])        x [T, C]
//   for each layer:  x = norm1(x + W_O · attention(W_Q·x, W_K·x, W_V·x))   (bidirectional, per text)
//                    x = norm2(x + W2 · gelu(W1 · x + b1) + b2)
//   embedding of text b = pool(x rows of text b)     mean, CLS (its first row) or max; then L2-normalised
//                                                    when the folder's modules say Normalize
//
// Texts are packed, never padded: a batch of B texts of lengths S_b is one [T = Σ S_b, C] matrix,
// every projection is one GEMM over the T rows, and attention runs on cu_seqlens [B + 1]
// (qkv::attention_varlen). Each text is [CLS] tokens [SEP], cut to max_seq_length tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/model.hpp"

namespace qkv {

enum class Pooling : std::uint8_t { mean, cls, max };

// dtype f32: every GEMM and the attention in f32 (oneDNN's f32 matmul, qkv's f32 flash kernel).
// dtype bf16: the projection matrices rounded once to bf16 and each GEMM's input rows rounded to bf16
// (oneDNN's bf16 matmul, f32 accumulation); q, k, v leave their GEMM rounded to bf16 and the
// attention runs on them in bf16 (qkv's bf16 flash kernel: f32 accumulation and softmax, its output
// rounded to bf16, which W_O reads as it is); norms, GELU, pooling and the residual stream stay f32.
// num_threads 0: the library default (set_num_threads / QKV_NUM_THREADS).
struct EncoderOptions {
  DType dtype = DType::f32;
  int num_threads = 0;
};

class Encoder {
 public:
  // A sentence-transformers folder: modules.json (a Transformer module, then Pooling, then
  // optionally Normalize), the Transformer's config.json (model_type "bert"), model.safetensors,
  // tokenizer.json (or vocab.txt) and sentence_bert_config.json (max_seq_length), the Pooling
  // module's config.json (one of mean, CLS, max). A missing file, an unsupported module, pooling
  // mode or model type is an error naming it.
  static Encoder load(const std::string& dir, const EncoderOptions& options = {});
  Encoder(Weights w, Tokenizer tok, Pooling pooling, bool normalize, std::int64_t max_seq_length,
          const EncoderOptions& options = {});

  const Config& config() const { return w_.config; }
  const Tokenizer& tokenizer() const { return tok_; }
  Pooling pooling() const { return pooling_; }
  bool normalize() const { return normalize_; }
  std::int64_t max_seq_length() const { return max_len_; }
  std::int64_t dim() const { return w_.config.dim; }

  // [CLS] text's tokens [SEP], the text's tokens cut to max_seq_length − 2 (as transformers'
  // truncation=True, max_length=max_seq_length does for one text).
  std::vector<int> tokenize(std::string_view text) const;

  // out [N, C]: row i = the embedding of texts[i]. Texts are sorted by token count (longest first)
  // and run `batch` at a time, so each packed batch holds texts of similar lengths; rows go back
  // to input order. progress(done, N) is called after each batch when given.
  void embed(std::span<const std::string> texts, float* out, std::int64_t batch = 32,
             const std::function<void(std::int64_t, std::int64_t)>& progress = {});

  // The encoder on one packed batch: tokens [T], cu_seqlens [B + 1] (0 = cu[0] ≤ … ≤ cu[B] = T,
  // each text at most seq_len tokens) → hidden [T, C], the last layer's output.
  void forward(std::span<const int> tokens, std::span<const std::int32_t> cu_seqlens, float* hidden);
  // One text, tokens [S] (S ≥ 1, e.g. from tokenize), through forward with every layer's attention
  // recorded for the inspector as LayerTrace documents, except resid (left empty): scores and pattern
  // [H, S, S] (bidirectional: nothing masked), head_delta [H, S, C], block_delta [S, C] = Σ_h Δe_h,
  // q and k [H, S, D]. Also hidden [S, C]. An encoder of dtype bf16 refuses (the trace reads f32 q, k).
  std::vector<LayerTrace> forward_trace(std::span<const int> tokens, float* hidden);
  const Weights& weights() const { return w_; }

 private:
  Weights w_;
  Tokenizer tok_;
  Pooling pooling_;
  bool normalize_;
  std::int64_t max_len_;
  EncoderOptions opt_;
  // Per layer: the projection matrices packed for the GEMMs (encoder.cpp).
  struct PackedLayer;
  std::vector<std::shared_ptr<const PackedLayer>> layers_;
  // Every projection runs on blocks of kRows rows, one block per task of the thread pool with one
  // oneDNN thread each: a fixed M compiles each projection's primitive once (oneDNN compiles per
  // shape), the weights are read once per 128 rows, and 128 rows keep a block's MLP rows
  // ([128, Hd] f32, 768 KiB for Hd = 1536) within this machine's 1 MiB L2. A batch's T rows are
  // padded up to a multiple of kRows.
  static constexpr std::int64_t kRows = 128;
  // Work buffers for up to rows_ tokens (a multiple of kRows): x, h [Tp, C] f32; att [Tp, C] and
  // qkv [Tp, 3·C] in dtype; ff [Tp, Hd] f32 (bf16 bits in its first half when dtype = bf16);
  // xb [Tp, C] bf16 (the GEMMs' rounded inputs).
  Buffer x_, h_, qkv_, att_, ff_, xb_;
  std::int64_t rows_ = 0;
  void reserve(std::int64_t Tp);
  // forward, and with trace (one text, dtype f32) forward_trace's recording; fn names the caller.
  void run(const char* fn, std::span<const int> tokens, std::span<const std::int32_t> cu, float* hidden,
           std::vector<LayerTrace>* trace);
  void qkv_block(std::int64_t l, std::int64_t r0);
  void out_block(std::int64_t l, std::int64_t r0, float* y, float beta);
  void tail_block(std::int64_t l, std::int64_t r0, std::int64_t T, float* hidden);
  class Projections;  // the attention block's backend (encoder.cpp)
};

}  // namespace qkv
