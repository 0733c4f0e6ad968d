// Hugging Face GPT-2 and Llama checkpoints as qkv models (hf_layout.hpp).
#include "model/hf_layout.hpp"

#include <algorithm>
#include <cassert>

namespace qkv::detail {
namespace {

constexpr const char* kFn = "qkv::config_from_json";

// The JSON value of `key`, or null when absent.
const nlohmann::json& at(const nlohmann::json& j, const char* key) {
  static const nlohmann::json null;
  auto it = j.find(key);
  return it == j.end() ? null : *it;
}

std::int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = at(j, key);
  if (v.is_null()) fail_format(kFn, where + ": missing required key \"" + key + "\"");
  if (!v.is_number_integer()) fail_format(kFn, where + ": \"" + key + "\" must be an integer, got " + v.dump());
  return v.get<std::int64_t>();
}

std::int64_t get_int_or(const nlohmann::json& j, const char* key, std::int64_t dflt, const std::string& where) {
  return at(j, key).is_null() ? dflt : get_int(j, key, where);
}

float get_float_or(const nlohmann::json& j, const char* key, float dflt, const std::string& where) {
  const auto& v = at(j, key);
  if (v.is_null()) return dflt;
  if (!v.is_number()) fail_format(kFn, where + ": \"" + key + "\" must be a number, got " + v.dump());
  return v.get<float>();
}

bool get_bool_or(const nlohmann::json& j, const char* key, bool dflt, const std::string& where) {
  const auto& v = at(j, key);
  if (v.is_null()) return dflt;
  if (!v.is_boolean()) fail_format(kFn, where + ": \"" + key + "\" must be true or false, got " + v.dump());
  return v.get<bool>();
}

std::string get_string_or(const nlohmann::json& j, const char* key, const char* dflt, const std::string& where) {
  const auto& v = at(j, key);
  if (v.is_null()) return dflt;
  if (!v.is_string()) fail_format(kFn, where + ": \"" + key + "\" must be a string, got " + v.dump());
  return v.get<std::string>();
}

// A key whose non-default value changes the arithmetic in a way qkv does not implement.
void require(bool ok, const std::string& where, const char* key, const nlohmann::json& j, const char* supported) {
  if (!ok)
    fail(kFn, where + ": \"" + key + "\" = " + at(j, key).dump() + " is not supported (qkv runs " + supported + ")");
}

Config gpt2_config(const nlohmann::json& j, const std::string& where) {
  Config c;
  c.dim = get_int(j, "n_embd", where);
  c.n_heads = get_int(j, "n_head", where);
  c.n_kv_heads = c.n_heads;
  c.n_layers = get_int(j, "n_layer", where);
  c.vocab_size = get_int(j, "vocab_size", where);
  c.seq_len = get_int(j, "n_positions", where);
  c.hidden_dim = get_int_or(j, "n_inner", 4 * c.dim, where);
  c.pos = PosEncoding::learned;
  c.norm = NormKind::layernorm;
  c.bias = true;
  c.norm_eps = get_float_or(j, "layer_norm_epsilon", 1e-5f, where);
  c.tied_embeddings = get_bool_or(j, "tie_word_embeddings", true, where);
  const std::string act = get_string_or(j, "activation_function", "gelu_new", where);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.mlp = MlpKind::gelu;  // the tanh form
  else if (act == "gelu") c.mlp = MlpKind::gelu_exact;                         // erf
  else require(false, where, "activation_function", j, "gelu_new, gelu_pytorch_tanh or gelu");
  require(get_bool_or(j, "scale_attn_weights", true, where), where, "scale_attn_weights", j,
          "scores scaled by 1/sqrt(head_dim)");
  require(!get_bool_or(j, "scale_attn_by_inverse_layer_idx", false, where), where, "scale_attn_by_inverse_layer_idx",
          j, "the same scale in every layer");
  require(!get_bool_or(j, "add_cross_attention", false, where), where, "add_cross_attention", j,
          "decoder-only GPT-2");
  return c;
}

Config llama_config(const nlohmann::json& j, const std::string& where) {
  Config c;
  c.dim = get_int(j, "hidden_size", where);
  c.hidden_dim = get_int(j, "intermediate_size", where);
  c.n_heads = get_int(j, "num_attention_heads", where);
  c.n_kv_heads = get_int_or(j, "num_key_value_heads", c.n_heads, where);
  c.n_layers = get_int(j, "num_hidden_layers", where);
  c.vocab_size = get_int(j, "vocab_size", where);
  c.seq_len = get_int(j, "max_position_embeddings", where);
  c.pos = PosEncoding::rotary;
  c.norm = NormKind::rmsnorm;
  c.mlp = MlpKind::swiglu;
  c.bias = false;
  c.norm_eps = get_float_or(j, "rms_norm_eps", 1e-6f, where);
  c.tied_embeddings = get_bool_or(j, "tie_word_embeddings", false, where);
  // rope_theta sits at the top level (transformers < 5) or in rope_parameters (≥ 5).
  c.rope_theta = get_float_or(j, "rope_theta", 10000.0f, where);
  const auto& rp = at(j, "rope_parameters");
  if (!rp.is_null()) {
    if (!rp.is_object()) fail_format(kFn, where + ": \"rope_parameters\" must be an object, got " + rp.dump());
    c.rope_theta = get_float_or(rp, "rope_theta", c.rope_theta, where + " rope_parameters");
    require(get_string_or(rp, "rope_type", "default", where) == "default", where, "rope_parameters", j,
            "the default rotary embedding, rope_type \"default\"");
  }
  require(at(j, "rope_scaling").is_null(), where, "rope_scaling", j, "rotary embedding without scaling");
  require(get_string_or(j, "hidden_act", "silu", where) == "silu", where, "hidden_act", j, "SwiGLU with silu");
  require(!get_bool_or(j, "attention_bias", false, where), where, "attention_bias", j, "projections without bias");
  require(!get_bool_or(j, "mlp_bias", false, where), where, "mlp_bias", j, "projections without bias");
  if (!at(j, "head_dim").is_null() && c.n_heads > 0 && get_int(j, "head_dim", where) * c.n_heads != c.dim)
    require(false, where, "head_dim", j, "head_dim = hidden_size / num_attention_heads");
  return c;
}

// BERT (BertModel): post-LayerNorm blocks, bidirectional attention, learned absolute positions and
// token types, GELU (erf) MLP, biases everywhere; the embedding is LayerNormed.
Config bert_config(const nlohmann::json& j, const std::string& where) {
  Config c;
  c.dim = get_int(j, "hidden_size", where);
  c.hidden_dim = get_int(j, "intermediate_size", where);
  c.n_heads = get_int(j, "num_attention_heads", where);
  c.n_kv_heads = c.n_heads;
  c.n_layers = get_int(j, "num_hidden_layers", where);
  c.vocab_size = get_int(j, "vocab_size", where);
  c.seq_len = get_int(j, "max_position_embeddings", where);
  c.type_vocab_size = get_int_or(j, "type_vocab_size", 2, where);
  c.pos = PosEncoding::learned;
  c.norm = NormKind::layernorm;
  c.bias = true;
  c.causal = false;
  c.post_norm = true;
  // BertForMaskedLM carries the masked-LM head (cls.predictions); BertModel has no classifier, and
  // wcls = wte is then never read.
  const auto& arch = at(j, "architectures");
  c.mlm_head = arch.is_array() && std::find(arch.begin(), arch.end(), "BertForMaskedLM") != arch.end();
  c.tied_embeddings = !c.mlm_head || get_bool_or(j, "tie_word_embeddings", true, where);
  c.norm_eps = get_float_or(j, "layer_norm_eps", 1e-12f, where);
  const std::string act = get_string_or(j, "hidden_act", "gelu", where);
  if (act == "gelu") c.mlp = MlpKind::gelu_exact;
  else if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.mlp = MlpKind::gelu;
  else require(false, where, "hidden_act", j, "gelu, gelu_new or gelu_pytorch_tanh");
  require(get_string_or(j, "position_embedding_type", "absolute", where) == "absolute", where,
          "position_embedding_type", j, "absolute learned positions");
  require(!get_bool_or(j, "is_decoder", false, where), where, "is_decoder", j, "BERT as an encoder");
  require(!get_bool_or(j, "add_cross_attention", false, where), where, "add_cross_attention", j, "BERT as an encoder");
  return c;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

Config hf_config(const nlohmann::json& j, const std::string& where) {
  const std::string type = get_string_or(j, "model_type", "", where);
  if (type == "gpt2") return gpt2_config(j, where);
  if (type == "llama") return llama_config(j, where);
  if (type == "bert") return bert_config(j, where);
  fail(kFn, where + ": Hugging Face \"model_type\" \"" + type + "\" is not supported (qkv reads gpt2, llama and bert)");
}

FileLayout detect_layout(const std::function<bool(const std::string&)>& has_tensor) {
  if (has_tensor("tok_embeddings.weight")) return {Layout::qkv, ""};
  if (has_tensor("transformer.wte.weight")) return {Layout::hf_gpt2, "transformer."};
  if (has_tensor("wte.weight")) return {Layout::hf_gpt2, ""};
  if (has_tensor("model.embed_tokens.weight")) return {Layout::hf_llama, "model."};
  if (has_tensor("embeddings.word_embeddings.weight")) return {Layout::hf_bert, ""};
  if (has_tensor("bert.embeddings.word_embeddings.weight")) return {Layout::hf_bert, "bert."};
  // Nothing recognised: report the missing tensors under qkv's own names.
  return {Layout::qkv, ""};
}

namespace {

// BERT stores [out, in] like qkv: every tensor is copied. The post-norm block's norms are the
// LayerNorms after the attention (attention.output.LayerNorm → attention_norm) and after the MLP
// (output.LayerNorm → ffn_norm).
Source bert_source(const std::string& P, const std::string& name, const std::vector<std::int64_t>& shape) {
  using Op = Source::Op;
  const std::string e = P + "embeddings.";
  if (name == "tok_embeddings.weight") return {e + "word_embeddings.weight", shape, Op::copy, 0};
  if (name == "pos_embeddings.weight") return {e + "position_embeddings.weight", shape, Op::copy, 0};
  if (name == "type_embeddings.weight") return {e + "token_type_embeddings.weight", shape, Op::copy, 0};
  if (name == "embedding_norm.weight") return {e + "LayerNorm.weight", shape, Op::copy, 0};
  if (name == "embedding_norm.bias") return {e + "LayerNorm.bias", shape, Op::copy, 0};
  // The masked-LM head sits beside the encoder (cls., not under the prefix).
  if (name == "mlm_head.dense.weight") return {"cls.predictions.transform.dense.weight", shape, Op::copy, 0};
  if (name == "mlm_head.dense.bias") return {"cls.predictions.transform.dense.bias", shape, Op::copy, 0};
  if (name == "mlm_head.norm.weight") return {"cls.predictions.transform.LayerNorm.weight", shape, Op::copy, 0};
  if (name == "mlm_head.norm.bias") return {"cls.predictions.transform.LayerNorm.bias", shape, Op::copy, 0};
  if (name == "output.weight") return {"cls.predictions.decoder.weight", shape, Op::copy, 0};
  if (name == "output.bias") return {"cls.predictions.bias", shape, Op::copy, 0};
  if (name.rfind("layers.", 0) != 0) return {name, shape, Op::copy, 0};
  const std::size_t dot = name.find('.', 7);
  const std::string h = P + "encoder.layer." + name.substr(7, dot - 7) + ".", rest = name.substr(dot + 1);
  static const std::pair<const char*, const char*> kNames[] = {
      {"attention.wq.", "attention.self.query."},   {"attention.wk.", "attention.self.key."},
      {"attention.wv.", "attention.self.value."},   {"attention.wo.", "attention.output.dense."},
      {"attention_norm.", "attention.output.LayerNorm."}, {"feed_forward.w1.", "intermediate.dense."},
      {"feed_forward.w2.", "output.dense."},        {"ffn_norm.", "output.LayerNorm."}};
  for (const auto& [qkv_name, hf] : kNames)
    if (rest.rfind(qkv_name, 0) == 0) return {h + hf + rest.substr(std::string(qkv_name).size()), shape, Op::copy, 0};
  return {name, shape, Op::copy, 0};
}

}  // namespace

Source source_of(const FileLayout& f, const Config& c, const std::string& name,
                 const std::vector<std::int64_t>& shape) {
  using Op = Source::Op;
  if (f.layout == Layout::qkv) return {name, shape, Op::copy, 0};
  const std::int64_t C = c.dim;
  const std::string& P = f.prefix;
  const auto transposed = [&](std::string t) { return Source{std::move(t), {shape[1], shape[0]}, Op::transpose, 0}; };
  if (f.layout == Layout::hf_bert) return bert_source(P, name, shape);
  if (name == "tok_embeddings.weight") return {P + (f.layout == Layout::hf_gpt2 ? "wte.weight" : "embed_tokens.weight"),
                                               shape, Op::copy, 0};
  if (name == "pos_embeddings.weight") return {P + "wpe.weight", shape, Op::copy, 0};
  if (name == "norm.weight") return {P + (f.layout == Layout::hf_gpt2 ? "ln_f.weight" : "norm.weight"), shape, Op::copy, 0};
  if (name == "norm.bias") return {P + "ln_f.bias", shape, Op::copy, 0};
  if (name == "output.weight") return {"lm_head.weight", shape, Op::copy, 0};
  // "layers.<l>.<rest>"
  assert(name.rfind("layers.", 0) == 0);
  const std::size_t dot = name.find('.', 7);
  const std::string l = name.substr(7, dot - 7), rest = name.substr(dot + 1);
  if (f.layout == Layout::hf_gpt2) {
    const std::string h = P + "h." + l + ".";
    if (rest == "attention_norm.weight") return {h + "ln_1.weight", shape, Op::copy, 0};
    if (rest == "attention_norm.bias") return {h + "ln_1.bias", shape, Op::copy, 0};
    if (rest == "ffn_norm.weight") return {h + "ln_2.weight", shape, Op::copy, 0};
    if (rest == "ffn_norm.bias") return {h + "ln_2.bias", shape, Op::copy, 0};
    const std::int64_t part = rest.rfind("attention.wq", 0) == 0 ? 0 : rest.rfind("attention.wk", 0) == 0 ? 1 : 2;
    if (rest == "attention.wq.weight" || rest == "attention.wk.weight" || rest == "attention.wv.weight")
      return {h + "attn.c_attn.weight", {C, 3 * C}, Op::transpose, part * C};
    if (rest == "attention.wq.bias" || rest == "attention.wk.bias" || rest == "attention.wv.bias")
      return {h + "attn.c_attn.bias", {3 * C}, Op::slice, part * C};
    if (rest == "attention.wo.weight") return transposed(h + "attn.c_proj.weight");
    if (rest == "attention.wo.bias") return {h + "attn.c_proj.bias", shape, Op::copy, 0};
    if (rest == "feed_forward.w1.weight") return transposed(h + "mlp.c_fc.weight");
    if (rest == "feed_forward.w1.bias") return {h + "mlp.c_fc.bias", shape, Op::copy, 0};
    if (rest == "feed_forward.w2.weight") return transposed(h + "mlp.c_proj.weight");
    if (rest == "feed_forward.w2.bias") return {h + "mlp.c_proj.bias", shape, Op::copy, 0};
  } else {
    const std::string h = P + "layers." + l + ".";
    if (rest == "attention_norm.weight") return {h + "input_layernorm.weight", shape, Op::copy, 0};
    if (rest == "ffn_norm.weight") return {h + "post_attention_layernorm.weight", shape, Op::copy, 0};
    if (rest == "attention.wq.weight") return {h + "self_attn.q_proj.weight", shape, Op::rope_rows, c.head_dim()};
    if (rest == "attention.wk.weight") return {h + "self_attn.k_proj.weight", shape, Op::rope_rows, c.head_dim()};
    if (rest == "attention.wv.weight") return {h + "self_attn.v_proj.weight", shape, Op::copy, 0};
    if (rest == "attention.wo.weight") return {h + "self_attn.o_proj.weight", shape, Op::copy, 0};
    if (rest == "feed_forward.w1.weight") return {h + "mlp.gate_proj.weight", shape, Op::copy, 0};
    if (rest == "feed_forward.w2.weight") return {h + "mlp.down_proj.weight", shape, Op::copy, 0};
    if (rest == "feed_forward.w3.weight") return {h + "mlp.up_proj.weight", shape, Op::copy, 0};
  }
  // A parameter the HF architecture does not have (the config was not built from an HF config):
  // reported by the loader as missing under this name.
  return {name, shape, Op::copy, 0};
}

bool ignorable(const FileLayout& f, const Config& c, const std::string& tensor) {
  if (f.layout == Layout::qkv) return false;
  if (c.tied_embeddings && tensor == "lm_head.weight") return true;
  if (f.layout == Layout::hf_bert)
    return tensor == f.prefix + "embeddings.position_ids" || tensor.rfind(f.prefix + "pooler.", 0) == 0 ||
           (!c.mlm_head && tensor.rfind("cls.", 0) == 0) ||  // a head the config does not read
           tensor == "cls.predictions.decoder.bias" ||        // older transformers: a copy of cls.predictions.bias
           (c.tied_embeddings && tensor == "cls.predictions.decoder.weight");
  if (f.layout == Layout::hf_gpt2)
    return tensor.rfind(f.prefix + "h.", 0) == 0 && (ends_with(tensor, ".attn.bias") || ends_with(tensor, ".attn.masked_bias"));
  return tensor.rfind(f.prefix + "layers.", 0) == 0 && ends_with(tensor, ".self_attn.rotary_emb.inv_freq");
}

void rearrange(const Source& s, const std::vector<std::int64_t>& shape, const float* src, float* dst) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  switch (s.op) {
    case Source::Op::copy:
    case Source::Op::slice:
      std::copy(src + s.offset, src + s.offset + n, dst);
      return;
    case Source::Op::transpose: {
      const std::int64_t rows = shape[0], cols = shape[1], stride = s.shape[1];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < cols; ++k) dst[r * cols + k] = src[k * stride + s.offset + r];
      return;
    }
    case Source::Op::rope_rows: {
      // shape = [heads·D, C], D = s.offset, even (Config::validate checks it for rotary models).
      const std::int64_t cols = shape[1], D = s.offset, half = D / 2;
      assert(D > 0 && D % 2 == 0 && shape[0] % D == 0);
      for (std::int64_t h0 = 0; h0 < shape[0]; h0 += D)
        for (std::int64_t j = 0; j < half; ++j)
          for (std::int64_t t = 0; t < 2; ++t)
            std::copy_n(src + (h0 + t * half + j) * cols, cols, dst + (h0 + 2 * j + t) * cols);
      return;
    }
  }
}

void unarrange(const Source& s, const std::vector<std::int64_t>& shape, const float* src, float* dst) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  switch (s.op) {
    case Source::Op::copy:
      std::copy(src, src + n, dst);
      return;
    case Source::Op::rope_rows: {
      // rearrange's copy with source and destination rows swapped.
      const std::int64_t cols = shape[1], D = s.offset, half = D / 2;
      assert(D > 0 && D % 2 == 0 && shape[0] % D == 0);
      for (std::int64_t h0 = 0; h0 < shape[0]; h0 += D)
        for (std::int64_t j = 0; j < half; ++j)
          for (std::int64_t t = 0; t < 2; ++t)
            std::copy_n(src + (h0 + 2 * j + t) * cols, cols, dst + (h0 + t * half + j) * cols);
      return;
    }
    case Source::Op::slice:  // this parameter's elements of a fused 1-D tensor
      std::copy(src, src + n, dst + s.offset);
      return;
    case Source::Op::transpose: {  // this parameter's columns of a Conv1D [in, out] tensor
      const std::int64_t rows = shape[0], cols = shape[1], stride = s.shape[1];
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < cols; ++k) dst[k * stride + s.offset + r] = src[r * cols + k];
      return;
    }
  }
}

nlohmann::json hf_gpt2_config(const Config& c) {
  constexpr const char* fn = "qkv::detail::hf_gpt2_config";
  if (c.pos != PosEncoding::learned || c.norm != NormKind::layernorm ||
      (c.mlp != MlpKind::gelu && c.mlp != MlpKind::gelu_exact) || !c.bias || c.n_kv_heads != c.n_heads ||
      !c.causal || c.post_norm || c.type_vocab_size > 0)
    fail(fn, "config: a GPT2LMHeadModel has learned positions, LayerNorm, a GELU MLP, biases and as many kv heads as "
             "heads, got " + config_to_json(c, false));
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"n_embd", c.dim},
          {"n_inner", c.hidden_dim},
          {"n_head", c.n_heads},
          {"n_layer", c.n_layers},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.seq_len},
          {"n_ctx", c.seq_len},
          {"layer_norm_epsilon", c.norm_eps},
          {"activation_function", c.mlp == MlpKind::gelu ? "gelu_new" : "gelu"},
          {"tie_word_embeddings", c.tied_embeddings},
          {"scale_attn_weights", true},
          {"torch_dtype", "float32"}};
}

nlohmann::json hf_llama_config(const Config& c) {
  constexpr const char* fn = "qkv::detail::hf_llama_config";
  if (c.pos != PosEncoding::rotary || c.norm != NormKind::rmsnorm || c.mlp != MlpKind::swiglu || c.bias ||
      !c.causal || c.post_norm || c.type_vocab_size > 0)
    fail(fn, "config: a LlamaForCausalLM is rotary, RMSNorm, SwiGLU, without biases, got " + config_to_json(c, false));
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"num_hidden_layers", c.n_layers},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"tie_word_embeddings", c.tied_embeddings},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"torch_dtype", "float32"}};
}

nlohmann::json hf_bert_config(const Config& c) {
  constexpr const char* fn = "qkv::detail::hf_bert_config";
  if (c.causal || !c.post_norm || c.pos != PosEncoding::learned || c.norm != NormKind::layernorm ||
      c.mlp == MlpKind::swiglu || !c.bias || c.n_kv_heads != c.n_heads || c.type_vocab_size < 1)
    fail(fn, "config: a BERT encoder is bidirectional and post-norm with learned positions, token types, LayerNorm, "
             "a GELU MLP, biases and as many kv heads as heads, got " + config_to_json(c, false));
  return {{"architectures", {c.mlm_head ? "BertForMaskedLM" : "BertModel"}},
          {"model_type", "bert"},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_attention_heads", c.n_heads},
          {"num_hidden_layers", c.n_layers},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.seq_len},
          {"type_vocab_size", c.type_vocab_size},
          {"layer_norm_eps", c.norm_eps},
          {"hidden_act", c.mlp == MlpKind::gelu ? "gelu_new" : "gelu"},
          {"position_embedding_type", "absolute"},
          {"tie_word_embeddings", c.tied_embeddings},
          {"pad_token_id", 0},
          {"torch_dtype", "float32"}};
}

}  // namespace qkv::detail
