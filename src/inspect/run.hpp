// inspect/run.hpp — one inspection of a model on a prompt, as `qkv inspect` and the Python module's
// qkv.inspect both run it (in process): load the model, tokenize, trace one forward pass, and build
// the Report with attribution, logit lens and, when asked or cheap enough, the ablation table.
//
// Models: a llama2.c checkpoint, a .safetensors with its config, a Hugging Face GPT-2/Llama folder,
// what `qkv train` wrote, or a sentence-transformers folder (an encoder: bidirectional patterns, the
// prompt's first line traced, the other lines' pooled embeddings compared with it; no next-token
// head, so no attribution, lens or ablation).
#pragma once

#include <string>
#include <vector>

#include "inspect/report.hpp"
#include "qkv/model.hpp"

namespace qkv::inspect {

// How errors name the caller and its arguments: the CLI's flags, or the Python function's keywords.
struct ArgNames {
  const char *fn, *model, *tokenizer, *config, *prompt, *tokens, *ablate;
};
inline constexpr ArgNames kCliArgs{"qkv inspect", "--model", "--tokenizer", "--config", "--prompt", "--tokens", "--ablate"};
inline constexpr ArgNames kPythonArgs{"qkv.inspect", "model", "tokenizer", "config", "text", "tokens", "ablate"};

enum class AblationTableMode { automatic, on, off };

// The single-head ablation table reruns the model 2·L·H times, ≈ 2·params·S FLOP each; `automatic`
// computes it when that is at most this many FLOP: stories260K (80 reruns of 0.5 MFLOP a token) up
// to 240 tokens. Its 512-token table took 76 s on two busy cores, its 31-token one 1 s.
inline constexpr double kAblationTableBudget = 1e10;

struct Request {
  std::string model;      // a file or folder (see above); must exist
  std::string tokenizer;  // "": the one beside the model (detail::tokenizer_beside)
  std::string config;     // a .safetensors model's config JSON; "": the one beside it
  std::string prompt;     // the text (an encoder: one text per line); ignored when tokens are given
  std::vector<int> tokens;            // token ids instead of the text (shown as #id); not for encoders
  std::vector<HeadAblation> ablate;   // heads knocked out of the run the report shows
  AblationTableMode ablation_table = AblationTableMode::automatic;
  ArgNames names = kCliArgs;
};

// Throws std::invalid_argument "[names.fn] <argument>: …" for a bad request (missing file, empty or
// too long prompt, ablation of an encoder, an id or head out of range).
Report run(const Request& request);

// "L.H" (zero ablation) or "L.H:zero" / "L.H:mean"; the range is checked by the model. An error
// names `names.fn`, `names.ablate` and the text.
HeadAblation parse_ablation(const std::string& text, const ArgNames& names);

}  // namespace qkv::inspect
