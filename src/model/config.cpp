// Config: validation, presets and the JSON form.
#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "model/hf_layout.hpp"
#include "model/input_file.hpp"
#include "model/json_depth.hpp"
#include "qkv/model.hpp"

namespace qkv {
namespace {

void check_range(std::string_view fn, const char* name, std::int64_t v, std::int64_t hi) {
  if (v < 1 || v > hi)
    fail(fn, std::string(name) + ": must be in [1, " + std::to_string(hi) + "], got " + std::to_string(v));
}

const char* pos_name(PosEncoding p) {
  return p == PosEncoding::none ? "none" : p == PosEncoding::learned ? "learned" : "rotary";
}
const char* norm_name(NormKind n) { return n == NormKind::layernorm ? "layernorm" : "rmsnorm"; }
const char* mlp_name(MlpKind m) { return m == MlpKind::gelu ? "gelu" : m == MlpKind::swiglu ? "swiglu" : "gelu_exact"; }

}  // namespace

void Config::validate(std::string_view fn) const {
  // Bounds far above any model this library runs on a CPU, low enough that products of two of
  // them cannot overflow 64 bits.
  check_range(fn, "dim", dim, 1 << 16);
  check_range(fn, "hidden_dim", hidden_dim, 1 << 18);
  check_range(fn, "n_layers", n_layers, 1 << 10);
  check_range(fn, "n_heads", n_heads, dim);
  check_range(fn, "n_kv_heads", n_kv_heads, n_heads);
  check_range(fn, "vocab_size", vocab_size, 1 << 22);
  check_range(fn, "seq_len", seq_len, 1 << 20);
  if (dim % n_heads != 0)
    fail(fn, "dim: must be a multiple of n_heads, got dim " + std::to_string(dim) + ", n_heads " +
                 std::to_string(n_heads));
  if (n_heads % n_kv_heads != 0)
    fail(fn, "n_kv_heads: n_heads must be a multiple of it, got n_heads " + std::to_string(n_heads) +
                 ", n_kv_heads " + std::to_string(n_kv_heads));
  if (pos == PosEncoding::rotary && head_dim() % 2 != 0)
    fail(fn, "pos: rotary embedding needs an even head_dim, got " + std::to_string(head_dim()));
  if (!(norm_eps > 0.0f) || !std::isfinite(norm_eps))
    fail(fn, "norm_eps: must be a positive finite number, got " + std::to_string(norm_eps));
  if (type_vocab_size < 0 || type_vocab_size > (1 << 16))
    fail(fn, "type_vocab_size: must be in [0, 65536], got " + std::to_string(type_vocab_size));
  if (mlm_head && causal)
    fail(fn, "mlm_head: the masked-LM head belongs to a bidirectional encoder (causal: false), got causal: true");
  if (mlm_head && mlp == MlpKind::swiglu)
    fail(fn, "mlm_head: the masked-LM head's transform uses the model's GELU, got mlp: swiglu");
  if (!(rope_theta > 1.0f) || !std::isfinite(rope_theta))
    fail(fn, "rope_theta: must be a finite number > 1, got " + std::to_string(rope_theta));
}

Config Config::gpt2_small() {
  Config c;
  c.dim = 768;
  c.hidden_dim = 3072;
  c.n_layers = 12;
  c.n_heads = 12;
  c.n_kv_heads = 12;
  c.vocab_size = 50257;
  c.seq_len = 1024;
  c.pos = PosEncoding::learned;
  c.norm = NormKind::layernorm;
  c.mlp = MlpKind::gelu;
  c.tied_embeddings = true;
  c.bias = true;
  return c;
}

MhaConfig Config::attention() const {
  MhaConfig a;
  a.d_model = a.d_source = dim;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.d_head = a.d_value = head_dim();
  a.bias = bias;
  return a;
}

ModelShape Config::shape(std::string name) const {
  ModelShape s;
  s.name = std::move(name);
  s.d_model = dim;
  s.n_heads = n_heads;
  s.n_kv_heads = n_kv_heads == n_heads ? 0 : n_kv_heads;
  s.d_head = head_dim();
  s.n_layers = n_layers;
  s.attn_bias = s.mlp_bias = s.norm_bias = bias;  // Config::bias covers LayerNorm too
  s.d_ff = hidden_dim;
  s.mlp = mlp;
  s.vocab = vocab_size;
  s.context = seq_len;
  s.positions = pos;
  s.norm = norm;
  s.tied_embeddings = tied_embeddings;
  return s;
}

Config config_from_json(std::string_view text, std::string_view source) {
  const char* fn = "qkv::config_from_json";
  const std::string where(source);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end(), detail::json_depth_limit(fn, where));
  } catch (const nlohmann::json::exception& e) {
    fail_format(fn, where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail_format(fn, where + ": expected a JSON object, got " + std::string(j.type_name()));
  if (j.contains("model_type")) {  // a Hugging Face config.json
    const Config c = detail::hf_config(j, where);
    c.validate(std::string(fn) + " (" + where + ")");
    return c;
  }
  Config c;
  auto get_int = [&](const char* key, std::int64_t* out) {
    if (!j.contains(key)) fail_format(fn, where + ": missing required key \"" + key + "\"");
    const auto& v = j[key];
    if (!v.is_number_integer()) fail_format(fn, where + ": \"" + key + "\" must be an integer, got " + v.dump());
    *out = v.get<std::int64_t>();
  };
  auto get_enum = [&](const char* key, std::initializer_list<const char*> names) -> int {
    const auto& v = j[key];
    if (!v.is_string()) fail_format(fn, where + ": \"" + key + "\" must be a string, got " + v.dump());
    int i = 0;
    for (const char* n : names) {
      if (v.get<std::string>() == n) return i;
      ++i;
    }
    std::string all;
    for (const char* n : names) all += std::string(all.empty() ? "" : ", ") + n;
    fail_format(fn, where + ": \"" + key + "\" must be one of " + all + ", got " + v.dump());
  };
  auto get_float = [&](const char* key, float* out) {
    const auto& v = j[key];
    if (!v.is_number()) fail_format(fn, where + ": \"" + key + "\" must be a number, got " + v.dump());
    *out = v.get<float>();
  };
  auto get_bool = [&](const char* key, bool* out) {
    const auto& v = j[key];
    if (!v.is_boolean()) fail_format(fn, where + ": \"" + key + "\" must be true or false, got " + v.dump());
    *out = v.get<bool>();
  };
  get_int("dim", &c.dim);
  get_int("hidden_dim", &c.hidden_dim);
  get_int("n_layers", &c.n_layers);
  get_int("n_heads", &c.n_heads);
  get_int("n_kv_heads", &c.n_kv_heads);
  get_int("vocab_size", &c.vocab_size);
  get_int("seq_len", &c.seq_len);
  // Every field that shapes the model is required: a missing one would silently take a default
  // (RMSNorm, rotary, SwiGLU...) and run a different model on the same weights. rope_theta is
  // required with rotary positions only.
  for (const char* key : {"pos", "norm", "mlp", "tied_embeddings", "bias", "norm_eps"})
    if (!j.contains(key)) fail_format(fn, where + ": missing required key \"" + key + "\"");
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "dim" || k == "hidden_dim" || k == "n_layers" || k == "n_heads" || k == "n_kv_heads" ||
        k == "vocab_size" || k == "seq_len")
      continue;
    if (k == "pos") c.pos = static_cast<PosEncoding>(get_enum("pos", {"none", "learned", "rotary"}));
    else if (k == "norm") c.norm = static_cast<NormKind>(get_enum("norm", {"layernorm", "rmsnorm"}));
    else if (k == "mlp") c.mlp = static_cast<MlpKind>(get_enum("mlp", {"gelu", "swiglu", "gelu_exact"}));
    else if (k == "tied_embeddings") get_bool("tied_embeddings", &c.tied_embeddings);
    else if (k == "bias") get_bool("bias", &c.bias);
    else if (k == "norm_eps") get_float("norm_eps", &c.norm_eps);
    else if (k == "rope_theta") get_float("rope_theta", &c.rope_theta);
    else if (k == "causal") get_bool("causal", &c.causal);
    else if (k == "post_norm") get_bool("post_norm", &c.post_norm);
    else if (k == "type_vocab_size") get_int("type_vocab_size", &c.type_vocab_size);
    else if (k == "mlm_head") get_bool("mlm_head", &c.mlm_head);
    else fail_format(fn, where + ": unknown key \"" + k + "\"");
  }
  if (c.pos == PosEncoding::rotary && !j.contains("rope_theta"))
    fail_format(fn, where + ": missing required key \"rope_theta\" (pos is \"rotary\")");
  c.validate(std::string(fn) + " (" + where + ")");
  return c;
}

Config load_config(const std::string& path) {
  // A config is a few hundred bytes; 1 MiB refuses a weights file given by mistake without reading it.
  const std::string text = detail::read_input_file(path, "qkv::load_config", "path", std::size_t{1} << 20);
  return config_from_json(text, "config '" + path + "'");
}

std::string config_to_json(const Config& c, bool indent) {
  nlohmann::ordered_json j;
  j["dim"] = c.dim;
  j["hidden_dim"] = c.hidden_dim;
  j["n_layers"] = c.n_layers;
  j["n_heads"] = c.n_heads;
  j["n_kv_heads"] = c.n_kv_heads;
  j["vocab_size"] = c.vocab_size;
  j["seq_len"] = c.seq_len;
  j["pos"] = pos_name(c.pos);
  j["norm"] = norm_name(c.norm);
  j["mlp"] = mlp_name(c.mlp);
  j["tied_embeddings"] = c.tied_embeddings;
  j["bias"] = c.bias;
  j["norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  // Encoder keys only where they differ from a decoder's, so a decoder's JSON stays as it was.
  if (!c.causal) j["causal"] = false;
  if (c.post_norm) j["post_norm"] = true;
  if (c.type_vocab_size > 0) j["type_vocab_size"] = c.type_vocab_size;
  if (c.mlm_head) j["mlm_head"] = true;
  return indent ? j.dump(2) : j.dump();
}

}  // namespace qkv
