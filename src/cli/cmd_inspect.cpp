// qkv inspect — one traced forward pass over a prompt, drawn head by head as the seeds draw
// attention (docs/inspect.md):
//
//   qkv inspect --model data/models/stories260K/stories260K.bin --prompt "a fluffy blue creature" --out DIR
//
// writes DIR/index.html (self-contained) and DIR/layer_<l>.png, or with --format json DIR/inspect.json,
// and prints the path of what it wrote. Models: llama2.c checkpoints with their tokenizer, what
// `qkv train` exports (model.safetensors + model.json + tokenizer.json), and Hugging Face GPT-2 /
// Llama folders with their tokenizer.json (or GPT-2's vocab.json + merges.txt).
#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "inspect/page.hpp"
#include "inspect/run.hpp"

namespace qkv::cli {
namespace {

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

void run(InspectArgs a) {
  if (a.prompt.empty() == a.tokens.empty()) {
    if (a.tokens.empty()) throw CLI::RequiredError("--prompt");
    throw CLI::ExcludesError("--prompt", "--tokens");
  }
  read_if_stdin(kFn, "--prompt", a.prompt);
  inspect::Request r;
  r.model = a.model.empty() ? default_model(kFn) : a.model;
  r.tokenizer = a.tokenizer;
  r.config = a.config;
  r.prompt = a.prompt;
  if (!a.tokens.empty()) r.tokens = parse_ids(a.tokens);
  for (const std::string& x : a.ablate) r.ablate.push_back(inspect::parse_ablation(x, inspect::kCliArgs));
  r.ablation_table = a.ablation_table == "on"    ? inspect::AblationTableMode::on
                     : a.ablation_table == "off" ? inspect::AblationTableMode::off
                                                 : inspect::AblationTableMode::automatic;
  const inspect::Report report = inspect::run(r);
  std::cout << (a.format == "json" ? inspect::write_json(report, a.out) : inspect::write_page(report, a.out)) << "\n";
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "draw every head's attention pattern for a prompt (HTML page, PNGs or JSON)");
  cmd->add_option("--model", args->model,
                  "weights: a llama2.c checkpoint (.bin) or .safetensors (default: $QKV_MODEL, else the stories260K "
                  "installed with qkv)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "tokenizer.json (qkv train's, or a Hugging Face BPE/WordPiece one), GPT-2's vocab.json or a llama2.c "
                  ".bin (told apart by content); default: the one beside the model");
  cmd->add_option("--config", args->config, "config JSON of a .safetensors model; default: the one beside it");
  cmd->add_option("--prompt", args->prompt,
                  "the text to run; - reads it from stdin (an encoder: one text per line, the first traced)");
  cmd->add_option("--tokens", args->tokens,
                  "token ids, comma-separated, instead of --prompt: for a model whose tokenizer qkv does not read "
                  "(or a folder without one); tokens show as #id");
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
