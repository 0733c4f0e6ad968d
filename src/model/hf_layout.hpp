// Internal: Hugging Face checkpoints (GPT2LMHeadModel / GPT2Model, LlamaForCausalLM) read as qkv
// models. Two parts: their config.json as a qkv Config, and, for each of qkv's parameters
// (detail::for_each_param's names and shapes), the stored tensor it comes from and how that
// tensor is rearranged into qkv's layout.
//
// Rearrangements, all exact (elements are only moved):
//   GPT-2 stores its projections as Conv1D weights [in, out] (y = x·W + b): qkv's [out, in] is the
//   transpose, and W_Q, W_K, W_V are the column blocks [0, C), [C, 2C), [2C, 3C) of the fused
//   attn.c_attn [C, 3C] (its bias likewise).
//   Llama (HF) rotates the halves (j, j + D/2) of each head, llama2.c and qkv the pairs (2j, 2j + 1):
//   qkv's row 2j + t of a head is HF's row t·D/2 + j of q_proj / k_proj (the inverse of the
//   permutation llama2.c's export applies).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/model.hpp"

namespace qkv::detail {

// Reads a Hugging Face config.json (its "model_type" is "gpt2", "llama" or "bert") as a qkv Config.
// Keys that change the arithmetic but that qkv does not implement (rope scaling, attention biases
// in Llama, cross-attention, per-layer attention scaling, another activation) are errors naming
// the key; keys that do not (dropout, token ids, dtype) are ignored.
Config hf_config(const nlohmann::json& j, const std::string& where);

enum class Layout { qkv, hf_gpt2, hf_llama, hf_bert };

// The naming scheme of a safetensors file, told by the token embedding's name; `prefix` is what
// precedes the HF names ("transformer." or "" for GPT-2, "model." for Llama, "bert." or "" for BERT).
struct FileLayout {
  Layout layout = Layout::qkv;
  std::string prefix;
};
FileLayout detect_layout(const std::function<bool(const std::string&)>& has_tensor);

// Where qkv's parameter `name` (shape `shape`) is stored, and how to read it.
struct Source {
  enum class Op {
    copy,       // the tensor as it is
    slice,      // 1-D: elements [offset, offset + numel)
    transpose,  // 2-D [in, out]: qkv's [r, k] = stored [k, offset + r]
    rope_rows,  // 2-D [heads·D, C], D = offset: qkv's row h·D + 2j + t = stored row h·D + t·D/2 + j
  };
  std::string tensor;
  std::vector<std::int64_t> shape;  // the shape the stored tensor must have
  Op op = Op::copy;
  std::int64_t offset = 0;  // slice, transpose: the first element / column taken; rope_rows: D
};
Source source_of(const FileLayout& f, const Config& c, const std::string& name, const std::vector<std::int64_t>& shape);

// Stored tensors that hold no parameter of the model and are skipped: GPT-2's attention-mask
// buffers (h.N.attn.bias, h.N.attn.masked_bias), Llama's rotary_emb.inv_freq, lm_head.weight
// when the embeddings are tied, BERT's embeddings.position_ids and pooler (the classification
// head's dense layer, which sentence embeddings do not use).
bool ignorable(const FileLayout& f, const Config& c, const std::string& tensor);

// dst (qkv's `shape`) ← src (the stored tensor, already f32, `s.shape`) as `s.op` says.
void rearrange(const Source& s, const std::vector<std::int64_t>& shape, const float* src, float* dst);

// Writing (what `qkv train` exports): the inverse of rearrange, stored (s.shape) ← qkv's tensor
// (`shape`). For slice and transpose only this parameter's part of the stored tensor is written (the
// fused c_attn of GPT-2 holds W_Q, W_K and W_V: one call each into the same dst).
void unarrange(const Source& s, const std::vector<std::int64_t>& shape, const float* src, float* dst);
// A Hugging Face config.json describing `c` as GPT2LMHeadModel (hf_config reads it back as `c`):
// activation "gelu_new" (tanh) or "gelu" (erf). Throws naming the config unless c is a GPT-2: learned
// positions, LayerNorm, GELU MLP, biases (HF's GPT-2 always has them), H = Hkv, causal pre-norm.
nlohmann::json hf_gpt2_config(const Config& c);
// A Hugging Face config.json describing `c` as LlamaForCausalLM (hf_config reads it back as `c`).
// Throws naming the field unless c is a Llama: rotary, RMSNorm, SwiGLU, no biases, causal pre-norm.
nlohmann::json hf_llama_config(const Config& c);

// A Hugging Face config.json describing `c` as BertForMaskedLM (with mlm_head) or BertModel (without);
// hf_config reads it back as `c`. Throws naming the config unless c is a BERT encoder: bidirectional,
// post-norm, learned positions, LayerNorm, GELU MLP, biases, H = Hkv, token types.
nlohmann::json hf_bert_config(const Config& c);

}  // namespace qkv::detail
