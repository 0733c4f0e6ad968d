// qkv/model.hpp — a decoder-only transformer configured by data, its weights, the llama2.c
// tokenizer, a KV cache, and generation.
//
// One model covers the GPT-2 and Llama families (the seeds' picture): token embedding (+ learned
// positions or rotary or none) → n_layers pre-norm blocks on a residual stream x [S, C]:
//
//   x += W_O · attention(rope(W_Q · norm1(x)), rope(W_K · norm1(x)), W_V · norm1(x))   (H query heads,
//                                                                                        Hkv kv heads)
//   x += MLP(norm2(x))      gelu: W2 · gelu(W1 · h + b1) + b2      swiglu: W2 · (silu(W1 · h) ⊙ W3 · h)
//
// → final norm → logits = W_cls · x (W_cls = token embedding when tied) → softmax over the vocabulary;
// the next token is predicted from the last position's vector.
//
// Dimension letters: C = dim (d_model), Hd = hidden_dim, L = n_layers, H = n_heads, Hkv = n_kv_heads,
// D = head_dim = C / H, V = vocab_size, P = seq_len (the context), S = positions in one call.
// Every matrix is stored [out, in] row-major (torch.nn.Linear's layout, y = x · Wᵀ).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/mha.hpp"     // MhaConfig: a Config's attention block
#include "qkv/params.hpp"  // PosEncoding, MlpKind, NormKind, ModelShape (the parameter counts)
#include "qkv/types.hpp"

namespace qkv {


struct Config {
  std::int64_t dim = 0;         // C
  std::int64_t hidden_dim = 0;  // Hd, the MLP's inner width
  std::int64_t n_layers = 0;    // L
  std::int64_t n_heads = 0;     // H
  std::int64_t n_kv_heads = 0;  // Hkv, H % Hkv == 0
  std::int64_t vocab_size = 0;  // V
  std::int64_t seq_len = 0;     // P, the longest context (and the rows of a learned position table)
  PosEncoding pos = PosEncoding::rotary;
  NormKind norm = NormKind::rmsnorm;
  MlpKind mlp = MlpKind::swiglu;
  bool tied_embeddings = true;  // the classifier reuses the token embedding
  bool bias = false;            // biases on every projection (and LayerNorm), GPT-2 style
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Encoders (BERT; qkv::Encoder in qkv/encoder.hpp runs them, qkv::Model refuses them):
  bool causal = true;               // false: every position attends to every position of its text
  bool post_norm = false;           // true: x = norm1(x + attn(x)), x = norm2(x + MLP(x)) and the
                                    // embedding is normed first; no final norm (BERT)
  std::int64_t type_vocab_size = 0; // > 0: token-type embeddings [type_vocab_size, C] added to the input
  bool mlm_head = false;            // true (encoders): BertForMaskedLM's head, the masked-LM objective
                                    // training uses: logits = LN(gelu(x · W_mᵀ + b_m)) · W_clsᵀ + b_out
                                    // (W_m [C, C], a LayerNorm with bias, b_out = output.bias [V])

  std::int64_t head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
  // Throws (naming `function`) if any field is out of range or inconsistent.
  void validate(std::string_view function) const;

  // The one GPT-2 preset: 12 layers, 12 heads, C 768, Hd 3072, P 1024, V 50257, learned positions,
  // LayerNorm, tanh GELU, biases, tied unembedding. (`qkv params --preset gpt2` and the other GPT
  // sizes there are this config at other widths.)
  static Config gpt2_small();

  // This model as the narrower APIs see it, derived here rather than written again:
  // attention(): one layer's attention block as qkv::MultiHeadAttention's config (d_model = C,
  // H, Hkv, d_head = d_value = D, bias), every default resolved; shape(name): the parameter
  // scorekeeping of qkv::count_params (n_kv_heads 0 when it equals n_heads, i.e. plain multi-head).
  MhaConfig attention() const;
  ModelShape shape(std::string name) const;
};

// Config <-> JSON text. The keys are the field names above; "pos" is "none" | "learned" |
// "rotary", "norm" is "layernorm" | "rmsnorm", "mlp" is "gelu" | "swiglu" | "gelu_exact". Unknown keys and
// missing keys are errors naming the source and the key: every key is required except rope_theta,
// which only a rotary model needs (no architecture is ever guessed). config_from_json also reads a
// Hugging Face config.json (one with "model_type": "gpt2" or "llama"); settings qkv does not implement (rope
// scaling, biases in Llama, another activation) are errors naming the key. "causal", "post_norm" and
// "type_vocab_size" and "mlm_head" (encoders) may be left out, meaning true, false, 0 and false (a decoder),
// and config_to_json writes them only when they differ from those. A Hugging Face config.json with
// "model_type": "bert" is an encoder (bidirectional, learned positions, token types, post-LayerNorm,
// GELU, biases), with mlm_head true when its "architectures" name BertForMaskedLM.
Config config_from_json(std::string_view json, std::string_view source = "config");
Config load_config(const std::string& path);
std::string config_to_json(const Config& c, bool indent = true);

// One block's parameters. Pointers to f32, shapes in brackets; null where the config has none
// (biases unless config.bias, LayerNorm bias with RMSNorm, w3 unless SwiGLU).
struct LayerWeights {
  float* norm1_w = nullptr;  // [C]
  float* norm1_b = nullptr;  // [C]
  float* wq = nullptr;       // [H·D, C]
  float* bq = nullptr;       // [H·D]
  float* wk = nullptr;       // [Hkv·D, C]
  float* bk = nullptr;       // [Hkv·D]
  float* wv = nullptr;       // [Hkv·D, C]
  float* bv = nullptr;       // [Hkv·D]
  float* wo = nullptr;       // [C, H·D]  (the seeds' stapled value-up matrices, one column block per head)
  float* bo = nullptr;       // [C]
  float* norm2_w = nullptr;  // [C]
  float* norm2_b = nullptr;  // [C]
  float* w1 = nullptr;       // [Hd, C]
  float* b1 = nullptr;       // [Hd]
  float* w2 = nullptr;       // [C, Hd]
  float* b2 = nullptr;       // [C]
  float* w3 = nullptr;       // [Hd, C]   (SwiGLU's up projection)
};

// A parameter with its canonical name (the safetensors key) and shape.
struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  float* data = nullptr;
};

// All parameters of a model. The memory is owned by `storage` (an allocated arena, or a private
// copy-on-write memory map of the file they came from), so pointers stay valid while any copy of
// the Weights lives, and writing through them never touches the file.
struct Weights {
  Config config;
  float* wte = nullptr;     // [V, C]
  float* wpe = nullptr;     // [P, C]  (learned positions only)
  float* wtt = nullptr;     // [type_vocab_size, C]  (token types only)
  float* norme_w = nullptr; // [C]   (post_norm only: the embedding's norm)
  float* norme_b = nullptr; // [C]
  std::vector<LayerWeights> layers;
  float* normf_w = nullptr; // [C]   (not with post_norm)
  float* normf_b = nullptr; // [C]   (LayerNorm with bias only)
  float* mlm_w = nullptr;      // [C, C]  (mlm_head only: the head's dense transform)
  float* mlm_b = nullptr;      // [C]
  float* mlm_norm_w = nullptr; // [C]     (its LayerNorm)
  float* mlm_norm_b = nullptr; // [C]
  float* wcls = nullptr;    // [V, C]  (== wte when tied)
  float* out_b = nullptr;   // [V]     (mlm_head only: the bias of the logits)
  std::shared_ptr<void> storage;

  // Every distinct parameter, in a fixed order, named as in safetensors files:
  //   tok_embeddings.weight, pos_embeddings.weight, type_embeddings.weight,
  //   embedding_norm.{weight,bias}, layers.{l}.attention_norm.{weight,bias},
  //   layers.{l}.attention.{wq,wk,wv,wo}.{weight,bias}, layers.{l}.ffn_norm.{weight,bias},
  //   layers.{l}.feed_forward.{w1,w2,w3}.{weight,bias}, norm.{weight,bias},
  //   mlm_head.{dense,norm}.{weight,bias} (mlm_head), output.weight (untied), output.bias (mlm_head).
  std::vector<NamedTensor> tensors() const;
  std::int64_t num_params() const;

  // Zero-filled parameters for `config` in one owned, 64-byte aligned arena.
  static Weights allocate(const Config& config);
  // Weights drawn N(0, std²) from a seeded generator; norms' weights 1, biases 0.
  static Weights random(const Config& config, std::uint64_t seed, float std = 0.02f);
};

// Where the loaders put f32 weights (both formats, one rule): read into anonymous memory on
// transparent huge pages when the kernel offers them to a region that asks (its THP setting is
// "always" or "madvise"), which decodes a model streamed from memory ≈ 20 % faster than 4 KiB
// pages; otherwise used in place in the file's private mapping. QKV_WEIGHT_PLACEMENT=copied or
// in_place overrides the rule (any other value throws std::invalid_argument).
//
// llama2.c's checkpoint (the "legacy" version-0 export, see data/models/stories260K/README.md):
// header of 7 int32 then f32 arrays. The file size must equal what the header implies.
Weights load_llama2c(const std::string& path);
// A safetensors file (memory-mapped) with its config JSON. Tensors may be F32, BF16 or F16;
// names and shapes must be exactly those Weights::tensors() lists for the config, or those of a
// Hugging Face checkpoint of the same model: GPT2LMHeadModel / GPT2Model (Conv1D weights, fused
// c_attn) or LlamaForCausalLM (q/k rows in HF's rotate-half order), rearranged exactly at load.
// Sharded checkpoints (model.safetensors.index.json) are not read.
Weights load_safetensors(const std::string& path, const Config& config);
Weights load_safetensors(const std::string& path, const std::string& config_path);
// Picks the format by extension: *.safetensors (config from config_path, or, when empty, the
// file beside it with .json instead of .safetensors, else config.json in its folder), else llama2.c.
// A folder stands for the model.safetensors in it (a Hugging Face `save_pretrained` folder).
Weights load_weights(const std::string& path, const std::string& config_path = "");
// Writes every tensor as F32 (to a temporary name, then renamed), and the config as metadata.
void save_safetensors(const Weights& w, const std::string& path);

// ---------------------------------------------------------------------------------------------
// Tokenizer: llama2.c's tokenizer.bin (sentencepiece BPE exported with scores), the
// tokenizer.json `qkv train` writes (characters or byte-level BPE, src/model/text_tokenizer.hpp), or
// BERT's WordPiece (a Hugging Face tokenizer.json or a vocab.txt, for encoders), or Hugging Face BPE
// (GPT-2's byte-level BPE, Llama's SentencePiece-style BPE with byte fallback).
// ---------------------------------------------------------------------------------------------
namespace detail {
class TextTokenizer;
}

class Tokenizer {
 public:
  // llama2.c's special ids (bos_id() and eos_id() of a llama2.c tokenizer).
  static constexpr int bos = 1;
  static constexpr int eos = 2;
  enum class Format : std::uint8_t { llama2c, qkv_json, wordpiece, hf_bpe };

  // Reads `path` (a file, or a model folder: the tokenizer in it, as detail::tokenizer_beside
  // finds it) for a vocabulary of `vocab_size` tokens. The format is told by the content: a file
  // whose first non-blank byte is '{' is a Hugging Face tokenizer.json if it has "model" (its
  // "model"."type" "WordPiece": load_wordpiece; "BPE": Hugging Face BPE), GPT-2's vocab.json if it
  // maps tokens to integer ids and is named vocab.json or has merges.txt beside it (merges.txt is
  // read from beside it), else qkv train's tokenizer.json
  // ("kind"); a file starting "#version" is GPT-2's merges.txt (vocab.json beside it); anything
  // else a llama2.c binary. Every length is checked against the file, and an error says which
  // format the file was read as and which formats load reads.
  //
  // Hugging Face BPE (the "BPE" model of Hugging Face tokenizers, without dropout or subword
  // affixes) in one of two styles:
  //   byte-level (GPT-2): pre_tokenizer "ByteLevel" (GPT-2's word split, the bytes spelled in its
  //     256-character alphabet), or vocab.json + merges.txt;
  //   metaspace (Llama 1/2): spaces as "▁", written by the normalizer Sequence [Prepend "▁",
  //     Replace " " → "▁"] or the pre_tokenizer "Metaspace"; characters missing from the
  //     vocabulary as byte tokens <0xXX> when "byte_fallback" is set.
  // Added tokens are matched in the raw text first (leftmost, longest). BOS is the special token
  // that the post_processor's template puts first (none for GPT-2); EOS is tokenizer_config.json's
  // "eos_token" when that file is beside the tokenizer, else the template's last special token,
  // else GPT-2's "<|endoftext|>" for vocab.json. Settings qkv does not implement are errors
  // naming the file, the field and its value.
  static Tokenizer load(const std::string& path, std::int64_t vocab_size);
  // BERT's WordPiece, as Hugging Face tokenizers' BertNormalizer + BertPreTokenizer + WordPiece
  // compute it, from `path`: a tokenizer.json (told by its leading '{'; model "WordPiece",
  // normalizer "BertNormalizer", pre_tokenizer "BertPreTokenizer", [CLS]/[SEP] from its post
  // processor; added tokens are matched in the raw text first) or a vocab.txt (one token per line,
  // id = line; lower-casing, accent stripping and CJK splitting from tokenizer_config.json beside
  // it when there is one, else BERT-uncased's settings; [PAD] [UNK] [CLS] [SEP] [MASK] are matched
  // in the raw text). Settings qkv does not implement are errors naming the key.
  static Tokenizer load_wordpiece(const std::string& path);

  // llama2.c: [BOS] [dummy " " if text is non-empty] per-UTF-8-character tokens (or their
  // byte-fallback tokens <0xXX> = 3 + byte), then repeatedly the adjacent pair whose concatenation
  // is a token with the highest score is merged. [EOS] if asked.
  // qkv_json: the trained tokenizer's encoding; it has no BOS or EOS, so add_bos/add_eos do nothing.
  // hf_bpe: the text split at added tokens; each other part split into words (byte-level: GPT-2's
  // regex; metaspace: after "▁" replaces spaces and is prepended) and each word merged by BPE,
  // lowest merge rank first; BOS first (add_bos) and EOS last (add_eos) where the tokenizer has them.
  // wordpiece: text split at added tokens, each other part cleaned (control characters removed,
  // whitespace → ' '), CJK characters spaced, accents stripped (NFD, then marks Mn removed) and
  // lower-cased as configured, split at whitespace and punctuation, each word → the longest
  // vocabulary prefix, then "##"-pieces, greedily ([UNK] for the whole word if a piece is missing,
  // or if it has more than 100 characters); [CLS] first (add_bos) and [SEP] last (add_eos).
  // Invalid UTF-8 is an error naming the byte offset.
  std::vector<int> encode(std::string_view text, bool add_bos, bool add_eos) const;
  // The text of `token` following `prev`. llama2.c and metaspace hf_bpe: a token after BOS drops
  // its leading space (metaspace: when a "▁" is prepended); byte tokens <0xXX> become the byte
  // itself. qkv_json, wordpiece, byte-level hf_bpe: the token's bytes.
  std::string_view decode(int prev, int token) const;
  // Whether generate prints a piece: every piece but an empty one, one starting with NUL, or a
  // lone control byte other than whitespace. A lone byte ≥ 0x80 (part of a UTF-8 character split
  // into byte tokens) is printed.
  static bool printable(std::string_view piece);

  Format format() const { return format_; }
  // The begin/end-of-text ids ([CLS] and [SEP] for wordpiece), or -1 where the tokenizer has none (qkv_json).
  int bos_id() const { return bos_id_; }
  int eos_id() const { return eos_id_; }
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(vocab_.size()); }
  const std::string& piece(int id) const { return vocab_[static_cast<std::size_t>(id)]; }
  float score(int id) const { return scores_[static_cast<std::size_t>(id)]; }

 private:
  Format format_ = Format::llama2c;
  int bos_id_ = bos, eos_id_ = eos;
  std::vector<std::string> vocab_;  // each token's piece (byte-level hf_bpe: its bytes; metaspace: "▁" as " ", <0xXX> kept)
  std::vector<float> scores_;  // llama2c only (qkv_json, wordpiece, hf_bpe: zeros)
  std::vector<int> sorted_;  // llama2c: token ids ordered by piece, for lookups (first id wins on duplicates)
  int max_token_length_ = 0;
  std::shared_ptr<const detail::TextTokenizer> text_;  // qkv_json: the trained tokenizer that encodes
  struct WordPiece;  // wordpiece: settings, vocabulary and added tokens (tokenizer.cpp)
  std::shared_ptr<const WordPiece> wp_;
  std::vector<int> encode_wordpiece(std::string_view text, bool add_bos, bool add_eos) const;
  struct Bpe;  // hf_bpe: style, vocabulary, merges and added tokens (tokenizer.cpp)
  std::shared_ptr<const Bpe> bpe_;
  std::vector<int> encode_bpe(std::string_view text, bool add_bos, bool add_eos) const;
  // gpt2_files: `path` is GPT-2's vocab.json or merges.txt (`bytes` its content), else a tokenizer.json.
  static Tokenizer load_hf_bpe(const std::string& path, const std::string& bytes, bool gpt2_files);
  int lookup(std::string_view s) const;
  static Tokenizer load_llama2c(const std::string& path, const std::string& bytes, std::int64_t vocab_size);
  static Tokenizer load_qkv_json(const std::string& path, const std::string& bytes, std::int64_t vocab_size);
};

// ---------------------------------------------------------------------------------------------
// KV cache and the forward pass
// ---------------------------------------------------------------------------------------------
// Keys (after rotary) and values of every position seen so far.
//   k, v: f32, bf16 or i8 [L, Hkv, capacity, D]; positions [0, len) are filled.
//   k_scale, v_scale: f32 [L, Hkv, capacity], i8 only: key (l, h, p) = k_scale[l, h, p] · k[l, h, p, :]
// Model::forward takes every dtype in every mode. With a bf16 cache the cache holds half the
// bytes (keys and values rounded as they are stored); a call of several tokens runs the bf16 flash
// kernels (q and the output rounded to bf16 as well), a one-token step (and forward_batch) widens
// the cached rows and keeps q, the scores and the output in f32. An i8 cache (llama.cpp's
// --cache-type-k/v q8_0) holds a quarter of f32's bytes plus one f32 scale per row: each (layer,
// kv head, position) row is quantised as it is stored by qkv::kvcache_append (symmetric, scale =
// max|x| / 127), and every call attends through qkv::attention_kvcache, whose int8 contract and
// error bound (qkv/attention.hpp) apply per layer: q and the probabilities are quantised inside
// the kernel, the output is f32. A row with a NaN or ±inf (activations that overflow) is stored as
// zeros with NaN scales, so that the logits turn NaN as with an f32 cache. Model::new_cache() gives
// the dtype the model's options are fastest with.
struct KvCache {
  KvCache() = default;
  // capacity 0: the config's seq_len; dtype f32, bf16 or i8.
  KvCache(const Config& c, std::int64_t capacity = 0, DType dtype = DType::f32);
  Buffer k, v;
  Buffer k_scale, v_scale;  // i8 only (else empty)
  std::int64_t capacity = 0;
  std::int64_t len = 0;
  void clear() { len = 0; }
};

// What one forward_trace records per layer, for the inspector (S = tokens traced).
struct LayerTrace {
  Buffer scores;       // f32 [H, S, S]: scale · q_i · k_j for key j ≤ query i, −inf where masked
  Buffer pattern;      // f32 [H, S, S]: softmax of each row of scores (row i: query i over keys)
  Buffer head_delta;   // f32 [H, S, C]: each head's proposed change Δe_h = W_O[:, head h] · (P·V)_h
  Buffer block_delta;  // f32 [S, C]: Σ_h Δe_h (the attention block's update before its bias b_O)
  Buffer resid;        // f32 [S, C]: the residual stream x after the whole layer (attention and MLP)
  Buffer q;            // f32 [H, S, D]: queries after rotary (scores = scale · q_i · k_j)
  Buffer k;            // f32 [Hkv, S, D]: keys after rotary (query head h reads kv head h / (H / Hkv))
};
struct Trace {
  std::vector<LayerTrace> layers;
  Buffer embed;        // f32 [S, C]: the residual stream before layer 0 (token + learned positions)
  Buffer logits;       // f32 [S, V]
};

// Knocks one head out of a forward pass (the inspector's ablation): the head's output (P·V)_h,
// and with it Δe_h = W_O[:, head h] · (P·V)_h, is replaced at every position by zero (zero
// ablation) or by its mean over the positions of the call (mean ablation over this prompt).
// Every later layer then sees the changed residual stream.
struct HeadAblation {
  enum class Kind : std::uint8_t { zero, mean };
  int layer = 0, head = 0;  // 0 ≤ layer < n_layers, 0 ≤ head < n_heads
  Kind kind = Kind::zero;
};

// How the model computes. weights = f32 (the default, exact against the PyTorch oracle) or bf16:
// every projection matrix (W_Q, W_K, W_V, W_O, W1, W2, W3, the classifier) is rounded once, at
// construction, to bf16 (nearest even) and read as bf16 from then on, which halves the bytes a
// decoding step streams; activations, norms, embeddings and every accumulation stay f32. The f32
// weights stay held (the embedding and norms still use them).
// num_threads = 0 uses the library default (set_num_threads / QKV_NUM_THREADS) for calls large
// enough to share and one thread below ~100 MFLOP a call (stories260K); n > 0 uses n threads for
// every call. A one-token call (decoding) runs in a single parallel
// region (Model::decode, which forward_batch also runs); the logits are the same bit for bit.
//
// gemm_inputs = f32 (the default) or bf16, for calls of more than 4 rows (prefill), which run
// GEMMs: f32 multiplies the activations as they are (bf16 weights are widened to f32 exactly); bf16
// rounds each projection's input rows to bf16 (nearest even, ≤ 2^-9 relative) and runs a bf16 ×
// bf16 GEMM accumulating in f32 (oneDNN matmul, AVX-512 BF16: ≈ 2× the f32 GEMM here; CPUs without
// it multiply the same bf16 values widened to f32, at about the f32 GEMM's speed), a second
// rounding on top of the weights'. Needs weights = bf16. Outputs, norms, attention, the residual
// stream and decoding (≤ 4 rows: GEMV kernels) are unchanged. In this mode a prefill multiplies by
// W_Q, W_K, W_V in one GEMM, does bias, residual add, GELU and the rounding to bf16 in the GEMMs'
// epilogues, and reads each layer matrix from a copy packed once in oneDNN's blocked layout (a
// second bf16 copy of the layer matrices: ≈ 170 MB for GPT-2 small; f32, twice that, without BF16).
// With a bf16 KV cache (new_cache() gives one in this mode) the fused projection writes bf16 q, k,
// v (models without rotary; with rotary it writes f32 and the rotation rounds), the prefill's
// attention runs the bf16 flash kernel and writes bf16 rows straight into W_O's input.
struct ModelOptions {
  DType weights = DType::f32;      // f32 or bf16
  int num_threads = 0;             // ≥ 0
  DType gemm_inputs = DType::f32;  // f32 or bf16 (bf16 needs weights = bf16)
};

class Model {
 public:
  explicit Model(Weights w, ModelOptions options = {});
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  const ModelOptions& options() const;
  const Config& config() const;
  const Weights& weights() const;
  // An empty cache for this model: bf16 when options().gemm_inputs = bf16 (the mode whose prefill
  // is fastest with bf16 attention), else f32 (the exact path). capacity 0: the config's seq_len.
  KvCache new_cache(std::int64_t capacity = 0) const;

  // Runs `tokens` at positions cache.len … cache.len + S − 1 (appending their keys and values to
  // the cache) and writes logits: [V] for the last position, or [S, V] when all_logits.
  // Each query attends causally to the whole cache (qkv::attention, Align::bottom_right).
  // Without all_logits the last layer goes past its attention for the last position only.
  void forward(std::span<const int> tokens, KvCache& cache, float* logits, bool all_logits = false);

  // One token for each of B sequences, each with its own cache (B distinct caches of one dtype),
  // at its own position caches[b]->len (appended, len += 1): logits [B, V]. The step reads every
  // weight once for all B sequences. Sequence b's logits are the same bits as forward() of its token
  // alone gives (a one-token forward runs this path with B = 1).
  void forward_batch(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits);

  // The whole sequence from position 0, recording every layer (see LayerTrace), with the heads in
  // `ablate` knocked out (none by default).
  void forward_trace(const std::vector<int>& tokens, Trace& trace, std::span<const HeadAblation> ablate = {});
  // Logits [S, V] of the whole sequence from position 0 with the heads in `ablate` knocked out:
  // forward_trace's computation without the trace (an f32 cache of its own, f32 attention).
  void forward_ablated(const std::vector<int>& tokens, std::span<const HeadAblation> ablate, float* logits);

 private:
  // Work buffers, the bf16 copies of the weights and the decoding step's state (src/model/model_impl.hpp).
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Sampling and generation
// ---------------------------------------------------------------------------------------------
struct SamplerOptions {
  float temperature = 1.0f;  // 0: greedy (argmax)
  float top_p = 0.9f;        // nucleus; ≤ 0 or ≥ 1 disables it
  int top_k = 0;             // keep the k most likely tokens; 0 disables it
  std::uint64_t seed = 1;    // xorshift* state, as llama2.c; must be non-zero
};

// llama2.c's sampler (same generator, same order of operations), plus top-k.
class Sampler {
 public:
  Sampler(std::int64_t vocab_size, const SamplerOptions& opt);
  // Picks a token from logits [V]; the logits are overwritten (scaled, softmaxed). Throws if a
  // logit is NaN or ±inf, or overflows when divided by the temperature (no token can be chosen
  // from such a distribution).
  int sample(float* logits);
  float random_f32();

 private:
  std::int64_t V_;
  SamplerOptions opt_;
  std::uint64_t state_;
  std::vector<std::pair<float, int>> cand_;
};

struct GenerateOptions {
  std::int64_t steps = 256;  // positions in all, counting BOS and the prompt (≤ 0 or > P: P)
  SamplerOptions sampling;
  // Each sequence's KV cache dtype: f32, bf16 (keys and values rounded to bf16 as they are
  // stored: half the bytes, which a batched step reads once per sequence) or i8 (quantised per row
  // to int8 with an f32 scale: about a quarter of the bytes, see KvCache); the texts may then
  // differ from an f32 cache's. Unset: Model::new_cache()'s choice. Greedy texts of generate_batch
  // equal generate()'s with the same kv_dtype.
  std::optional<DType> kv_dtype;
};
// Throws std::invalid_argument "[fn] option: must be ..., got value" unless steps ≥ 0,
// temperature ∈ [0, 100] (not NaN), top_p ∈ [0, 1], top_k ≥ 0, seed ≥ 1 and kv_dtype (when set)
// is f32, bf16 or i8: the rules of
// `qkv generate`'s flags. generate() calls it first; Python's Model.generate calls it with its
// own name, so both faces give one message.
void validate_generate_options(const GenerateOptions& opt, std::string_view fn = "qkv::generate");
struct GenerateStats {
  std::int64_t prompt_tokens = 0;  // including BOS
  std::int64_t generated = 0;      // sampled tokens
  double prefill_seconds = 0, decode_seconds = 0;
  // Every position's token: the prompt's (BOS first), then each sampled one, including a BOS or
  // EOS that ended the text (prompt_tokens + generated in all). pieces[i] is the text token i
  // added to what `emit` received ("" for BOS, EOS and an unprintable piece).
  std::vector<int> tokens;
  std::vector<std::string> pieces;
};

// llama2.c's generation loop: emits the prompt's pieces, then each sampled token's piece, through
// `emit` as they come; stops at a sampled EOS (llama2.c: or BOS) or after `steps` positions. The caller prints the
// final newline llama2.c adds. The prompt is prefilled in one forward call, then each new token is
// one query against the cache. A tokenizer without BOS (qkv train's) starts from the prompt's
// first token, which is emitted too, or, for an empty prompt, from its "\n" token (nanoGPT's start).
// Throws qkv::NonFiniteError, naming the position, as soon as a position's logits hold a NaN or
// ±inf (weights that overflow float): the text so far has been emitted, nothing after it.
GenerateStats generate(Model& model, const Tokenizer& tok, std::string_view prompt, const GenerateOptions& opt,
                       const std::function<void(std::string_view)>& emit);

// Several prompts advanced in lockstep: each prompt is prefilled alone, then every sequence still
// going gets its next token from one Model::forward_batch step (the weights read once for all of
// them). Sequence i's text is exactly what generate(prompts[i]) emits with the same options (each
// sequence has its own sampler with opt's seed; its logits are the same bits as one at a time), in
// the order of `prompts`. stats (if not null): prompt tokens, sampled tokens and times, summed over
// the sequences (decode_seconds: the lockstep phase's wall time).
std::vector<std::string> generate_batch(Model& model, const Tokenizer& tok, std::span<const std::string> prompts,
                                        const GenerateOptions& opt, GenerateStats* stats = nullptr);

}  // namespace qkv
