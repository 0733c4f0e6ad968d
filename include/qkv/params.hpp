// qkv/params.hpp — parameter scorekeeping: how many numbers a transformer's attention (and, when
// the configuration knows them, its MLP, norms and embeddings) holds.
//
// Attention of one block, in the seeds' terms (3Blue1Brown, "Attention in transformers"):
//
//   matrix       per       shape                 count
//   query W_Q    q head    [d_head,  d_model]    d_head · d_model
//   key   W_K    kv head   [d_head,  d_source]   d_head · d_source
//   value-down   kv head   [d_value, d_source]   d_value · d_source     (W_V of one head)
//   value-up     q head    [d_model, d_value]    d_model · d_value      (its column block of W_O)
//
// With grouped-query attention (n_kv_heads < n_heads) a key/value head serves n_heads / n_kv_heads
// query heads, so the key and value-down matrices are counted once per kv head, not per query head.
// Biases (GPT-2/3 have them on every projection) are counted per block, not per head, because the
// output bias belongs to no head. GPT-3 175B: 6,291,456 per head, 603,979,776 weights per block,
// 57,982,058,496 in its 96 blocks — the figures of seed 004.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// gelu: GPT-2's tanh approximation; gelu_exact: ½x(1 + erf(x/√2)) (torch.nn.GELU(), nanoGPT, qkv train).
enum class MlpKind : std::uint8_t { gelu, swiglu, gelu_exact };  // 2 matrices (up, down) or 3 (gate, up, down)
enum class NormKind : std::uint8_t { layernorm, rmsnorm };   // weight + bias, or weight only
// Position information: none, a learned [context, d_model] table added to the embedding, or rotary
// (applied to queries and keys: no parameters). qkv::Config (qkv/model.hpp) uses the same enum.
enum class PosEncoding : std::uint8_t { none, learned, rotary };

struct ModelShape {
  std::string name;               // the preset's name, or "custom"
  std::int64_t d_model = 0;
  std::int64_t d_source = 0;      // width of the key/value input (cross-attention); 0 = d_model
  std::int64_t n_heads = 0;
  std::int64_t n_kv_heads = 0;    // 0 = n_heads
  std::int64_t d_head = 0;        // query/key dimension of one head
  std::int64_t d_value = 0;       // value dimension of one head; 0 = d_head
  std::int64_t n_layers = 1;
  bool attn_bias = false;         // biases on W_Q, W_K, W_V and W_O
  // The rest of the model; a model total is computed only when d_ff and vocab are both > 0.
  std::int64_t d_ff = 0;          // MLP hidden width
  MlpKind mlp = MlpKind::gelu;
  bool mlp_bias = false;
  std::int64_t vocab = 0;
  std::int64_t context = 0;       // positions of a learned position table
  PosEncoding positions = PosEncoding::learned;
  NormKind norm = NormKind::layernorm;
  bool norm_bias = true;          // LayerNorm's bias (GPT-2 has it; nanoGPT's bias=False models do not)
  bool tied_embeddings = true;    // the unembedding reuses the token embedding

  // True when the shape describes a whole model (MLP and embeddings known).
  bool knows_model() const { return d_ff > 0 && vocab > 0; }
};

// Counts (all in numbers of parameters). Every product is overflow-checked.
struct AttentionCounts {
  std::int64_t query = 0;        // one query head's W_Q
  std::int64_t key = 0;          // one kv head's W_K
  std::int64_t value_down = 0;   // one kv head's value-down
  std::int64_t value_up = 0;     // one query head's value-up
  std::int64_t per_head = 0;     // query + key + value_down + value_up (one head of plain multi-head attention)
  std::int64_t block_weights = 0;  // H·(query + value_up) + Hkv·(key + value_down)
  std::int64_t block_biases = 0;   // H·Dh + Hkv·Dh + Hkv·Dv + d_model when attn_bias
  std::int64_t block = 0;          // weights + biases
  std::int64_t all_weights = 0;    // block_weights · n_layers
  std::int64_t all = 0;            // block · n_layers
};

struct ModelCounts {
  std::int64_t token_embedding = 0;  // vocab · d_model
  std::int64_t positions = 0;        // context · d_model when learned, else 0
  std::int64_t mlp_per_layer = 0;    // weights and biases of one MLP
  std::int64_t norms_per_layer = 0;  // the two norms of one block
  std::int64_t final_norm = 0;
  std::int64_t unembedding = 0;      // 0 when tied
  std::int64_t per_layer = 0;        // attention block + MLP + norms
  std::int64_t total = 0;
};

struct ParamCounts {
  AttentionCounts attention;
  std::optional<ModelCounts> model;  // present when shape.knows_model()
};

// Throws std::invalid_argument ("[qkv::count_params] ...") for a non-positive size, n_heads not a
// multiple of n_kv_heads, or a count that overflows 64 bits.
ParamCounts count_params(const ModelShape& shape);

// Named configurations: gpt3 (175B), gpt2 (small, 124M), gpt2-medium, gpt2-large, gpt2-xl,
// stories260K (llama2.c). Throws std::invalid_argument listing the names for an unknown one.
ModelShape model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// 57982058496 → "57,982,058,496".
std::string with_commas(std::int64_t n);

}  // namespace qkv
