// qkv params — parameter scorekeeping for a transformer configuration (include/qkv/params.hpp).
//
//   qkv params --preset gpt3
//   qkv params --d-model 4096 --heads 32 --kv-heads 8 --layers 32
//   qkv params --preset gpt2 --layers 24          (a preset with some sizes changed)
//   qkv params --preset gpt3 --json               (the same counts as one JSON document)
//   qkv params --config runs/bert                 (a model's config.json: every tensor qkv train trains)
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "model/trainable.hpp"
#include "qkv/model.hpp"
#include "qkv/params.hpp"
#include "qkv/types.hpp"

namespace qkv::cli {
namespace {

struct ParamsArgs {
  std::string preset;
  std::string config;  // a qkv or Hugging Face config.json, or a folder holding one
  // -1: not given on the command line (keep the preset's value).
  std::int64_t d_model = -1, d_source = -1, d_head = -1, d_value = -1, heads = -1, kv_heads = -1, layers = -1,
               d_ff = -1, vocab = -1, context = -1;
  std::string mlp, norm, positions;
  int bias = -1;  // --bias / --no-bias
  int tied = -1;  // --tied / --untied
  bool json = false;
};

constexpr const char* kFn = "qkv params";

ModelShape shape_from(const ParamsArgs& a) {
  ModelShape s;
  if (!a.preset.empty()) {
    s = model_preset(a.preset);
  } else {
    s.name = "custom";
    if (a.d_model < 0 || a.heads < 0)
      fail(kFn, "without --preset, --d-model and --heads are required");
  }
  const bool width_changed = a.d_model >= 0 || a.heads >= 0;
  if (a.d_model >= 0) s.d_model = a.d_model;
  if (a.heads >= 0) s.n_heads = a.heads;
  if (a.d_head >= 0) {
    s.d_head = a.d_head;
  } else if (width_changed || s.d_head == 0) {
    // The usual convention d_head = d_model / heads, when it divides.
    if (s.n_heads <= 0 || s.d_model % s.n_heads != 0) {
      std::ostringstream m;
      m << "--d-head: not given and d_model " << s.d_model << " is not a multiple of heads " << s.n_heads;
      fail(kFn, m.str());
    }
    s.d_head = s.d_model / s.n_heads;
  }
  if (a.d_source >= 0) s.d_source = a.d_source;
  if (a.d_value >= 0) s.d_value = a.d_value;
  if (a.kv_heads >= 0) s.n_kv_heads = a.kv_heads;
  if (a.layers >= 0) s.n_layers = a.layers;
  if (a.d_ff >= 0) s.d_ff = a.d_ff;
  if (a.vocab >= 0) s.vocab = a.vocab;
  if (a.context >= 0) s.context = a.context;
  if (!a.mlp.empty()) s.mlp = a.mlp == "swiglu" ? MlpKind::swiglu : MlpKind::gelu;
  if (!a.norm.empty()) s.norm = a.norm == "rmsnorm" ? NormKind::rmsnorm : NormKind::layernorm;
  if (!a.positions.empty()) s.positions = a.positions == "rotary" ? PosEncoding::rotary : PosEncoding::learned;
  if (a.bias >= 0) s.attn_bias = s.mlp_bias = s.norm_bias = a.bias != 0;
  if (a.tied >= 0) s.tied_embeddings = a.tied != 0;
  if (!a.preset.empty() && (width_changed || a.layers >= 0 || a.kv_heads >= 0 || a.d_ff >= 0 || a.vocab >= 0 ||
                            a.context >= 0 || a.d_source >= 0 || a.d_value >= 0))
    s.name += " (modified)";
  return s;
}

// One line "  label ........ 1,234,567  note".
void row(std::ostream& os, const std::string& label, std::int64_t n, const std::string& note = "") {
  std::string l = "  " + label;
  if (l.size() < 34) l.append(34 - l.size(), ' ');
  std::string num = with_commas(n);
  if (num.size() < 20) num.insert(0, 20 - num.size(), ' ');
  os << l << num << (note.empty() ? "" : "   " + note) << "\n";
}

// "[4096 x 12288]": a tensor's shape as both listings print it.
std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? " x " : "") + std::to_string(shape[i]);
  return s + "]";
}

void print(std::ostream& os, const ModelShape& s, const ParamCounts& c) {
  const std::int64_t d_src = s.d_source ? s.d_source : s.d_model;
  const std::int64_t hkv = s.n_kv_heads ? s.n_kv_heads : s.n_heads;
  const std::int64_t dv = s.d_value ? s.d_value : s.d_head;
  const auto dims = [](std::int64_t r, std::int64_t col) { return shape_str({r, col}); };
  os << "configuration " << s.name << ": d_model " << s.d_model;
  if (d_src != s.d_model) os << ", d_source " << d_src;
  os << ", d_head " << s.d_head;
  if (dv != s.d_head) os << ", d_value " << dv;
  os << ", heads " << s.n_heads << ", kv_heads " << hkv << ", layers " << s.n_layers;
  if (s.d_ff) os << ", d_ff " << s.d_ff << (s.mlp == MlpKind::swiglu ? " (SwiGLU)" : " (GELU)");
  if (s.vocab) os << ", vocab " << s.vocab;
  if (s.context) os << ", context " << s.context;
  os << "\n\n";

  const AttentionCounts& a = c.attention;
  if (hkv == s.n_heads) {
    os << "per head\n";
  } else {
    os << "per head (key and value-down are shared by " << s.n_heads / hkv
       << " query heads: counted per kv head)\n";
  }
  row(os, "query      W_Q " + dims(s.d_head, s.d_model), a.query);
  row(os, "key        W_K " + dims(s.d_head, d_src), a.key);
  row(os, "value-down W_V " + dims(dv, d_src), a.value_down);
  row(os, "value-up   W_O " + dims(s.d_model, dv), a.value_up, "(this head's columns of W_O)");
  row(os, "total", a.per_head);
  os << "\nper attention block (" << s.n_heads << " heads";
  if (hkv != s.n_heads) os << ", " << hkv << " kv heads";
  os << ")\n";
  row(os, "weights", a.block_weights);
  if (a.block_biases) {
    row(os, "biases", a.block_biases);
    row(os, "total", a.block);
  }
  os << "\nall attention blocks (" << s.n_layers << " layers)\n";
  row(os, "weights", a.all_weights);
  if (a.block_biases) row(os, "total", a.all);

  if (!c.model) {
    os << "\nwhole model: unknown (give --hidden-dim and --vocab to count MLPs and embeddings)\n";
    return;
  }
  const ModelCounts& m = *c.model;
  os << "\nwhole model\n";
  row(os, "token embedding " + dims(s.vocab, s.d_model), m.token_embedding);
  if (s.positions == PosEncoding::learned) {
    row(os, "positions " + dims(s.context, s.d_model), m.positions);
  } else {
    row(os, s.positions == PosEncoding::rotary ? "positions (rotary)" : "positions (none)", 0,
        s.positions == PosEncoding::rotary ? "(computed, not learned)" : "");
  }
  row(os, "attention, " + std::to_string(s.n_layers) + " blocks", a.all);
  row(os, "MLP, " + std::to_string(s.n_layers) + " layers", m.mlp_per_layer * s.n_layers);
  row(os, std::string(s.norm == NormKind::rmsnorm ? "RMSNorm" : "LayerNorm") + ", " +
              std::to_string(2 * s.n_layers + 1) + " norms",
      m.norms_per_layer * s.n_layers + m.final_norm);
  if (s.tied_embeddings) {
    row(os, "unembedding", 0, "(tied to the token embedding)");
  } else {
    row(os, "unembedding " + dims(s.vocab, s.d_model), m.unembedding);
  }
  std::ostringstream approx;
  approx.precision(4);
  const double t = static_cast<double>(m.total);
  if (t >= 1e9) {
    approx << "(about " << t / 1e9 << " billion)";
  } else if (t >= 1e6) {
    approx << "(about " << t / 1e6 << " million)";
  } else if (t >= 1e3) {
    approx << "(about " << t / 1e3 << " thousand)";
  }
  row(os, "total", m.total, approx.str());
  const double share = static_cast<double>(a.all) / t * 100.0;
  std::ostringstream sh;
  sh.precision(3);
  sh << "attention is " << share << "% of the model";
  os << "  " << sh.str() << "\n";
}

// The configuration and every count print() shows, as one JSON document ("model" is null when the
// shape does not say enough for a whole-model total).
nlohmann::json to_json(const ModelShape& s, const ParamCounts& c) {
  const AttentionCounts& a = c.attention;
  nlohmann::json doc = {
      {"configuration",
       {{"name", s.name},
        {"d_model", s.d_model},
        {"d_source", s.d_source ? s.d_source : s.d_model},
        {"d_head", s.d_head},
        {"d_value", s.d_value ? s.d_value : s.d_head},
        {"heads", s.n_heads},
        {"kv_heads", s.n_kv_heads ? s.n_kv_heads : s.n_heads},
        {"layers", s.n_layers},
        {"d_ff", s.d_ff},
        {"vocab", s.vocab},
        {"context", s.context},
        {"mlp", s.mlp == MlpKind::swiglu ? "swiglu" : "gelu"},
        {"norm", s.norm == NormKind::rmsnorm ? "rmsnorm" : "layernorm"},
        {"positions", s.positions == PosEncoding::learned ? "learned" : s.positions == PosEncoding::rotary ? "rotary" : "none"},
        {"attention_bias", s.attn_bias},
        {"mlp_bias", s.mlp_bias},
        {"norm_bias", s.norm_bias},
        {"tied", s.tied_embeddings}}},
      {"per_head", {{"query", a.query}, {"key", a.key}, {"value_down", a.value_down}, {"value_up", a.value_up},
                    {"total", a.per_head}}},
      {"per_block", {{"weights", a.block_weights}, {"biases", a.block_biases}, {"total", a.block}}},
      {"all_blocks", {{"weights", a.all_weights}, {"total", a.all}}},
      {"model", nullptr}};
  if (c.model) {
    const ModelCounts& m = *c.model;
    doc["model"] = {{"token_embedding", m.token_embedding},
                    {"positions", m.positions},
                    {"attention", a.all},
                    {"mlp", m.mlp_per_layer * s.n_layers},
                    {"norms", m.norms_per_layer * s.n_layers + m.final_norm},
                    {"unembedding", m.unembedding},
                    {"total", m.total}};
  }
  return doc;
}

// --config: the model's tensors as qkv::param_layout lists them (the flat array qkv train trains),
// each name of layer 0 standing for all L layers ("layers.0." → "each layer: ").
struct LayoutCounts {
  std::vector<ParamInfo> per_layer, other;  // per_layer: layer 0's tensors; other: the rest
  std::int64_t layer_total = 0, total = 0;
};

LayoutCounts layout_counts(const Config& c) {
  LayoutCounts out;
  for (ParamInfo& p : param_layout(c)) {
    out.total += p.numel;
    if (p.name.rfind("layers.", 0) != 0) {
      out.other.push_back(std::move(p));
    } else if (p.name.rfind("layers.0.", 0) == 0) {
      p.name.erase(0, 9);
      out.layer_total += p.numel;
      out.per_layer.push_back(std::move(p));
    }
  }
  return out;
}

Config config_of(const std::string& path) {
  check_input(kFn, "--config", path, /*allow_folder=*/true);
  const std::filesystem::path file = std::filesystem::is_directory(path) ? std::filesystem::path(path) / "config.json"
                                                                         : std::filesystem::path(path);
  if (!std::filesystem::exists(file)) fail(kFn, "--config '" + path + "': a folder without config.json");
  return load_config(file.string());
}

void print_layout(std::ostream& os, const std::string& source, const Config& c, const LayoutCounts& n) {
  os << "configuration " << source << ": " << (c.causal ? "decoder" : "encoder") << ", d_model " << c.dim << ", heads "
     << c.n_heads << ", kv_heads " << c.n_kv_heads << ", layers " << c.n_layers << ", hidden_dim " << c.hidden_dim
     << ", vocab " << c.vocab_size << ", context " << c.seq_len << "\n\neach of the " << c.n_layers << " layers\n";
  for (const ParamInfo& p : n.per_layer) row(os, p.name + " " + shape_str(p.shape), p.numel);
  row(os, "total", n.layer_total);
  os << "\nwhole model\n";
  for (const ParamInfo& p : n.other) row(os, p.name + " " + shape_str(p.shape), p.numel);
  row(os, std::to_string(c.n_layers) + " layers", n.layer_total * c.n_layers);
  row(os, "total", n.total, c.tied_embeddings ? "(the unembedding is tied to the token embedding)" : "");
}

nlohmann::json layout_json(const std::string& source, const Config& c, const LayoutCounts& n) {
  const auto list = [](const std::vector<ParamInfo>& ps) {
    nlohmann::json a = nlohmann::json::array();
    for (const ParamInfo& p : ps) a.push_back({{"name", p.name}, {"shape", p.shape}, {"count", p.numel}});
    return a;
  };
  return {{"source", source},
          {"configuration", nlohmann::json::parse(config_to_json(c, false))},
          {"per_layer", list(n.per_layer)},
          {"layer_total", n.layer_total},
          {"other", list(n.other)},
          {"total", n.total}};
}

}  // namespace

void add_params(CLI::App& app) {
  auto args = std::make_shared<ParamsArgs>();
  CLI::App* cmd = app.add_subcommand("params", "count the parameters of attention heads, blocks and whole models");
  std::string names;
  for (const std::string& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  auto* preset = cmd->add_option("--preset", args->preset, "a named configuration: " + names);
  cmd->add_option("--config", args->config,
                  "a model's config.json (qkv's or Hugging Face's: GPT-2, Llama, BERT) or a folder holding one, as "
                  "qkv train writes it: lists every tensor it trains")
      ->excludes(preset);
  cmd->add_option("--d-model", args->d_model, "width of the embeddings")->check(at_least(1));
  cmd->add_option("--d-source", args->d_source, "width of the key/value input (cross-attention); default d_model")
      ->check(at_least(1));
  cmd->add_option("--d-head", args->d_head, "query/key size of one head; default d_model / heads")
      ->check(at_least(1));
  cmd->add_option("--d-value", args->d_value, "value size of one head; default d_head")->check(at_least(1));
  cmd->add_option("--heads", args->heads, "query heads per block")->check(at_least(1));
  cmd->add_option("--kv-heads", args->kv_heads, "key/value heads per block (grouped-query attention)")
      ->check(at_least(1));
  cmd->add_option("--layers", args->layers, "number of blocks")->check(at_least(1));
  cmd->add_option("--hidden-dim,--d-ff", args->d_ff,
                  "MLP hidden width, as qkv train names it (--d-ff: the GPT-3 paper's name); needed, with --vocab, "
                  "for a model total")
      ->check(at_least(1));
  cmd->add_option("--vocab", args->vocab, "vocabulary size")->check(at_least(1));
  cmd->add_option("--context", args->context, "positions of the learned position table")
      ->check(at_least(0));
  cmd->add_option("--mlp", args->mlp, "MLP kind")->check(CLI::IsMember({"gelu", "swiglu"}));
  cmd->add_option("--norm", args->norm, "norm kind")->check(CLI::IsMember({"layernorm", "rmsnorm"}));
  cmd->add_option("--positions", args->positions, "position encoding")->check(CLI::IsMember({"learned", "rotary"}));
  add_flag_pair(cmd, "--bias", "--no-bias", [args](bool on) { args->bias = on ? 1 : 0; },
                "biases on the projections, the MLP and LayerNorm (nanoGPT's bias flag)");
  add_flag_pair(cmd, "--tied", "--untied", [args](bool on) { args->tied = on ? 1 : 0; },
                "unembedding tied to the token embedding");
  cmd->add_flag("--json", args->json, "print the counts as one JSON document");
  cmd->callback([args, cmd] {
    if (!args->config.empty()) {
      for (const CLI::Option* o : cmd->get_options())
        if (o->count() > 0 && o->get_name() != "--config" && o->get_name() != "--json" && o->get_name() != "--help")
          fail(kFn, "--config: the configuration comes from the file; " + o->get_name() + " cannot change it");
      const Config c = config_of(args->config);
      const LayoutCounts n = layout_counts(c);
      if (args->json) {
        print_json(layout_json(args->config, c, n));
      } else {
        print_layout(std::cout, args->config, c, n);
      }
      return;
    }
    const ModelShape s = shape_from(*args);
    const ParamCounts c = count_params(s);
    if (args->json) {
      print_json(to_json(s, c));
    } else {
      print(std::cout, s, c);
    }
  });
}

}  // namespace qkv::cli
