// Parameter counts of attention blocks and whole models (see include/qkv/params.hpp).
#include "qkv/params.hpp"

#include <cctype>
#include <string>

#include "qkv/model.hpp"  // Config: every preset is a model configuration
#include "qkv/types.hpp"

namespace qkv {
namespace {

constexpr const char* kFn = "qkv::count_params";

// a·b and a+b, failing (naming what) instead of wrapping around.
std::int64_t mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(kFn, std::string(what) + ": count overflows 64 bits");
  return r;
}
std::int64_t add(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) fail(kFn, std::string(what) + ": count overflows 64 bits");
  return r;
}

void require_positive(std::int64_t v, const char* what) {
  if (v <= 0) fail(kFn, std::string(what) + ": must be > 0 (got " + std::to_string(v) + ")");
}
void require_non_negative(std::int64_t v, const char* what) {
  if (v < 0) fail(kFn, std::string(what) + ": must be ≥ 0 (got " + std::to_string(v) + ")");
}

}  // namespace

ParamCounts count_params(const ModelShape& s) {
  require_positive(s.d_model, "d_model");
  require_non_negative(s.d_source, "d_source");
  require_positive(s.n_heads, "n_heads");
  require_non_negative(s.n_kv_heads, "n_kv_heads");
  require_positive(s.d_head, "d_head");
  require_non_negative(s.d_value, "d_value");
  require_positive(s.n_layers, "n_layers");
  require_non_negative(s.d_ff, "d_ff");
  require_non_negative(s.vocab, "vocab");
  require_non_negative(s.context, "context");
  const std::int64_t d_src = s.d_source ? s.d_source : s.d_model;
  const std::int64_t hkv = s.n_kv_heads ? s.n_kv_heads : s.n_heads;
  const std::int64_t dv = s.d_value ? s.d_value : s.d_head;
  if (s.n_heads % hkv != 0)
    fail(kFn, "n_kv_heads: must divide n_heads (got n_heads " + std::to_string(s.n_heads) + ", n_kv_heads " +
                  std::to_string(hkv) + ")");

  ParamCounts c;
  AttentionCounts& a = c.attention;
  a.query = mul(s.d_head, s.d_model, "query");
  a.key = mul(s.d_head, d_src, "key");
  a.value_down = mul(dv, d_src, "value_down");
  a.value_up = mul(s.d_model, dv, "value_up");
  a.per_head = add(add(a.query, a.key, "per_head"), add(a.value_down, a.value_up, "per_head"), "per_head");
  a.block_weights = add(mul(s.n_heads, add(a.query, a.value_up, "block"), "block"),
                        mul(hkv, add(a.key, a.value_down, "block"), "block"), "block");
  if (s.attn_bias) {
    // b_Q [H·Dh], b_K [Hkv·Dh], b_V [Hkv·Dv], b_O [d_model]
    a.block_biases = add(add(mul(s.n_heads, s.d_head, "bias"), mul(hkv, s.d_head, "bias"), "bias"),
                         add(mul(hkv, dv, "bias"), s.d_model, "bias"), "bias");
  }
  a.block = add(a.block_weights, a.block_biases, "block");
  a.all_weights = mul(a.block_weights, s.n_layers, "all blocks");
  a.all = mul(a.block, s.n_layers, "all blocks");

  if (!s.knows_model()) return c;
  ModelCounts m;
  m.token_embedding = mul(s.vocab, s.d_model, "token_embedding");
  if (s.positions == PosEncoding::learned) m.positions = mul(s.context, s.d_model, "positions");
  // gelu: up [d_ff, d] (+ b [d_ff]), down [d, d_ff] (+ b [d]); swiglu: gate and up [d_ff, d], down [d, d_ff].
  const std::int64_t n_mats = s.mlp == MlpKind::swiglu ? 3 : 2;
  m.mlp_per_layer = mul(n_mats, mul(s.d_ff, s.d_model, "mlp"), "mlp");
  if (s.mlp_bias) m.mlp_per_layer = add(m.mlp_per_layer, add(mul(n_mats - 1, s.d_ff, "mlp"), s.d_model, "mlp"), "mlp");
  const std::int64_t one_norm = s.norm == NormKind::layernorm && s.norm_bias ? mul(2, s.d_model, "norm") : s.d_model;
  m.norms_per_layer = mul(2, one_norm, "norms");
  m.final_norm = one_norm;
  m.unembedding = s.tied_embeddings ? 0 : mul(s.vocab, s.d_model, "unembedding");
  m.per_layer = add(add(a.block, m.mlp_per_layer, "per_layer"), m.norms_per_layer, "per_layer");
  std::int64_t t = mul(m.per_layer, s.n_layers, "total");
  t = add(t, m.token_embedding, "total");
  t = add(t, m.positions, "total");
  t = add(t, m.final_norm, "total");
  m.total = add(t, m.unembedding, "total");
  c.model = m;
  return c;
}

namespace {

// The GPT family as published (Radford et al. 2019; Brown et al. 2020, table 2.1): GPT-2 small's
// architecture (Config::gpt2_small: d_ff = 4·d_model, GELU MLP, LayerNorm, learned positions,
// biases on every projection, tied unembedding, vocabulary 50,257) at other widths and depths.
ModelShape gpt(const char* name, std::int64_t d_model, std::int64_t n_heads, std::int64_t n_layers,
               std::int64_t context) {
  Config c = Config::gpt2_small();
  c.dim = d_model;
  c.hidden_dim = 4 * d_model;
  c.n_heads = c.n_kv_heads = n_heads;
  c.n_layers = n_layers;
  c.seq_len = context;
  return c.shape(name);
}

// llama2.c's stories260K (shared/data/README.md): dim 64, hidden 172 (SwiGLU), 5 layers, 8 query
// heads sharing 4 kv heads, head size 8, vocab 512, context 512, RMSNorm, rotary, tied classifier.
ModelShape stories260k() {
  Config c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.vocab_size = 512;
  c.seq_len = 512;
  c.pos = PosEncoding::rotary;
  c.norm = NormKind::rmsnorm;
  c.mlp = MlpKind::swiglu;
  c.tied_embeddings = true;
  return c.shape("stories260K");
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"gpt3", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "stories260K"};
}

ModelShape model_preset(std::string_view requested) {
  // Names match without regard to case ("stories260k" finds "stories260K").
  std::string name(requested);
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (name == "gpt3") return gpt("gpt3", 12288, 96, 96, 2048);
  if (name == "gpt2") return Config::gpt2_small().shape("gpt2");
  if (name == "gpt2-medium") return gpt("gpt2-medium", 1024, 16, 24, 1024);
  if (name == "gpt2-large") return gpt("gpt2-large", 1280, 20, 36, 1024);
  if (name == "gpt2-xl") return gpt("gpt2-xl", 1600, 25, 48, 1024);
  if (name == "stories260k") return stories260k();
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  fail("qkv::model_preset", "name: unknown preset '" + std::string(requested) + "' (known: " + names + ")");
}

std::string with_commas(std::int64_t n) {
  // Work on the magnitude as unsigned so that INT64_MIN prints too.
  const bool neg = n < 0;
  std::uint64_t u = neg ? ~static_cast<std::uint64_t>(n) + 1 : static_cast<std::uint64_t>(n);
  std::string digits = std::to_string(u);
  std::string out;
  const std::size_t len = digits.size();
  for (std::size_t i = 0; i < len; ++i) {
    if (i != 0 && (len - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return neg ? "-" + out : out;
}

}  // namespace qkv
