// qkv generate — run a language model on a prompt and stream the text, as llama2.c's `run` does.
//
//   qkv generate --prompt "Once upon a time" --steps 256 --temperature 0.8 --top-p 0.9 --seed 7
//   qkv generate --model M.safetensors --config M.json --tokenizer T.bin --temperature 0
//   qkv generate --model runs/shakespeare/model.safetensors --prompt "ROMEO:"   (what qkv train wrote:
//                                        model.json and tokenizer.json beside it are found)
//   qkv generate --batch-file prompts.txt   (one prompt a line, advanced together: one output a line,
//                                        in order, each what --prompt would print for that line)
//   qkv generate --weights bf16 ...     (projection matrices held and read as bf16: ModelOptions)
//   qkv generate --weights bf16 --gemm-inputs bf16 ...   (also the prefill's GEMM inputs, attention
//                                        and KV cache in bf16: the fastest prefill, as torch's bf16)
//   qkv generate --dtype bf16 ...        (the same two at once: what embed --dtype bf16 means)
//   qkv generate --batch-file prompts.txt --kv-dtype bf16   (each sequence's KV cache in bf16: half
//                                        the bytes a batched step reads; texts as --kv-dtype bf16 alone)
//   qkv generate --kv-dtype int8 ...     (int8 rows with an f32 scale each, llama.cpp's q8_0 cache:
//                                        about a quarter of f32's bytes)
//
//   echo "Once upon a time" | qkv generate --prompt - --json   (the prompt from stdin; one JSON
//                                        document: text, tokens, pieces, timings, settings)
//
// stdout carries the text alone (the prompt, then the continuation, then one newline, exactly as
// llama2.c prints them), or with --json the JSON document alone; speeds go to stderr. --steps
// counts every position including BOS and the prompt's tokens.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "qkv/model.hpp"

namespace qkv::cli {
namespace {

constexpr const char* kFn = "qkv generate";

struct GenerateArgs {
  std::string model;      // default: io.hpp's default_model (QKV_MODEL, else the stories260K shipped with qkv)
  std::string tokenizer;  // default: tokenizer.json or tokenizer.bin beside --model, else the shipped tok512.bin
  std::string config;
  std::string prompt;
  std::int64_t steps = 256;
  float temperature = 1.0f;
  float top_p = 0.9f;
  int top_k = 0;
  std::int64_t seed = -1;  // -1: from the clock, as llama2.c does
  std::string weights = "f32";
  std::string gemm_inputs = "f32";
  std::string dtype;  // "", f32 or bf16: both of the above at once, as embed --dtype
  std::string kv_dtype;  // "", f32, bf16 or int8 ("": the model's choice, Model::new_cache)
  bool json = false;
  std::string batch_file;  // one prompt a line, run by generate_batch
};

// --tokenizer when not given: the one beside the model (tokenizer_beside), else the tok512.bin of
// the stories260K shipped with qkv.
std::string default_tokenizer(const std::string& model) {
  const std::string beside = detail::tokenizer_beside(model, kFn, "--tokenizer");
  if (!beside.empty()) return beside;
  return (std::filesystem::path(shipped_model_dir(kFn, "give --tokenizer")) / "tok512.bin").string();
}

void run(GenerateArgs a) {
  read_if_stdin(kFn, "--prompt", a.prompt);
  if (a.model.empty()) a.model = default_model(kFn);
  check_input(kFn, "--model", a.model, /*allow_folder=*/true);
  const std::string tok_path = a.tokenizer.empty() ? default_tokenizer(a.model) : a.tokenizer;
  check_input(kFn, "--tokenizer", tok_path);
  if (!a.config.empty()) check_input(kFn, "--config", a.config);
  if (!a.dtype.empty()) a.weights = a.gemm_inputs = a.dtype;
  ModelOptions mo;
  mo.weights = a.weights == "bf16" ? DType::bf16 : DType::f32;
  mo.gemm_inputs = a.gemm_inputs == "bf16" ? DType::bf16 : DType::f32;
  if (mo.gemm_inputs == DType::bf16 && mo.weights != DType::bf16)
    fail(kFn, "--gemm-inputs bf16: needs --weights bf16 (got --weights " + a.weights + ")");
  Model model(load_weights(a.model, a.config), mo);
  const Tokenizer tok = Tokenizer::load(tok_path, model.config().vocab_size);
  GenerateOptions opt;
  opt.steps = a.steps;
  opt.sampling.temperature = a.temperature;
  opt.sampling.top_p = a.top_p;
  opt.sampling.top_k = a.top_k;
  opt.sampling.seed = a.seed >= 0 ? static_cast<std::uint64_t>(a.seed)
                                  : static_cast<std::uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  if (opt.sampling.seed == 0) fail(kFn, "--seed: must be non-zero");
  if (!a.kv_dtype.empty())
    opt.kv_dtype = a.kv_dtype == "bf16" ? DType::bf16 : a.kv_dtype == "int8" ? DType::i8 : DType::f32;
  if (!a.batch_file.empty()) {
    const std::vector<std::string> prompts = read_lines(kFn, "--batch-file", a.batch_file);
    if (prompts.empty()) fail(kFn, "--batch-file " + a.batch_file + ": no prompts (one a line)");
    GenerateStats st;
    const std::vector<std::string> texts = generate_batch(model, tok, prompts, opt, &st);
    for (const std::string& t : texts) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fputc('\n', stdout);
    }
    std::fflush(stdout);
    // Decoding steps: every sampled token but each sequence's first (from its prefill).
    const std::int64_t decoded = std::max<std::int64_t>(0, st.generated - static_cast<std::int64_t>(prompts.size()));
    std::fprintf(stderr, "%zu prompts, %lld tokens, prefill %.1f tok/s; generated %lld tokens, decode %.1f tok/s; seed %llu\n",
                 prompts.size(), static_cast<long long>(st.prompt_tokens),
                 st.prefill_seconds > 0 ? static_cast<double>(st.prompt_tokens) / st.prefill_seconds : 0.0,
                 static_cast<long long>(st.generated),
                 st.decode_seconds > 0 ? static_cast<double>(decoded) / st.decode_seconds : 0.0,
                 static_cast<unsigned long long>(opt.sampling.seed));
    return;
  }
  bool emitted = false;
  std::string text;  // with --json: the text, printed in the document instead of streamed
  GenerateStats st;
  try {
    st = generate(model, tok, a.prompt, opt, [&](std::string_view piece) {
      if (a.json) {
        text += piece;
        return;
      }
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
      emitted = true;
    });
  } catch (...) {
    if (emitted) std::fputc('\n', stdout);  // the text so far ends its line; the error follows on stderr
    std::fflush(stdout);
    throw;
  }
  // The first sampled token comes from the prefill's logits: decode forwards = generated − 1.
  const std::int64_t decoded = st.generated > 0 ? st.generated - 1 : 0;
  const double prefill_rate = st.prefill_seconds > 0 ? static_cast<double>(st.prompt_tokens) / st.prefill_seconds : 0.0;
  const double decode_rate = st.decode_seconds > 0 ? static_cast<double>(decoded) / st.decode_seconds : 0.0;
  if (a.json) {
    print_json({{"text", text},
                {"tokens", st.tokens},
                {"pieces", st.pieces},
                {"prompt_tokens", st.prompt_tokens},
                {"generated", st.generated},
                {"timings",
                 {{"prefill_seconds", st.prefill_seconds},
                  {"decode_seconds", st.decode_seconds},
                  {"prefill_tokens_per_second", prefill_rate},
                  {"decode_tokens_per_second", decode_rate}}},
                {"settings",
                 {{"model", a.model},
                  {"tokenizer", tok_path},
                  {"config", a.config},
                  {"prompt", a.prompt},
                  {"steps", a.steps},
                  {"temperature", json_number(a.temperature)},
                  {"top_p", json_number(a.top_p)},
                  {"top_k", a.top_k},
                  {"seed", opt.sampling.seed},
                  {"weights", a.weights},
                  {"gemm_inputs", a.gemm_inputs},
                  {"kv_dtype", a.kv_dtype.empty() ? a.gemm_inputs : a.kv_dtype}}}});
  } else {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  std::fprintf(stderr, "prompt %lld tokens, prefill %.1f tok/s; generated %lld tokens, decode %.1f tok/s; seed %llu\n",
               static_cast<long long>(st.prompt_tokens), prefill_rate, static_cast<long long>(st.generated),
               decode_rate, static_cast<unsigned long long>(opt.sampling.seed));
}

}  // namespace

void add_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "generate text from a prompt with a language model (llama2.c's run)");
  sub->add_option("--model", a->model,
                  "weights: llama2.c checkpoint (.bin) or .safetensors (default: $QKV_MODEL, else the stories260K "
                  "installed with qkv)");
  sub->add_option("--tokenizer", a->tokenizer,
                  "llama2.c tokenizer.bin, qkv train's tokenizer.json, a Hugging Face BPE tokenizer.json or GPT-2's "
                  "vocab.json (told apart by content); default: tokenizer.json, tokenizer.bin or vocab.json beside "
                  "--model, else stories260K's tok512.bin");
  sub->add_option("--config", a->config,
                  "config JSON for .safetensors (default: beside the file, then config.json in its folder)");
  auto* prompt = sub->add_option("--prompt,-i", a->prompt,
                                 "the text to continue; - reads it from stdin (default: empty, the story starts from BOS)");
  auto* batch = sub->add_option("--batch-file", a->batch_file,
                                 "one prompt a line ('-': stdin), generated together (each step reads the weights once "
                                 "for all); prints one output a line, in order");
  sub->add_option("--steps,-n", a->steps, "positions in all, counting BOS and the prompt (0: the whole context)")
      ->capture_default_str()
      ->check(at_least(0));
  sub->add_option("--temperature,-t", a->temperature, "0 is greedy")->capture_default_str()->check(CLI::Range(0.0f, 100.0f));
  sub->add_option("--top-p,-p", a->top_p, "nucleus sampling mass (0 or 1 disables it)")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 1.0f));
  sub->add_option("--top-k", a->top_k, "keep the k most likely tokens (0 disables it)")->capture_default_str()->check(at_least(0));
  sub->add_option("--seed,-s", a->seed, "random seed (default: the clock)")->check(at_least(1));
  sub->add_option("--weights", a->weights,
                  "f32 (exact) or bf16 (projection matrices rounded to bf16 once at load: half the bytes per token)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_option("--gemm-inputs", a->gemm_inputs,
                  "f32, or bf16 (with --weights bf16: the prefill rounds each projection's input rows to bf16 and "
                  "keeps the KV cache and attention in bf16; fastest prefill, logits within bf16 rounding)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  // --dtype means what embed --dtype means: weights and GEMM inputs together.
  sub->add_option("--dtype", a->dtype, "f32, or bf16: --weights bf16 --gemm-inputs bf16 together (as embed --dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->excludes("--weights")
      ->excludes("--gemm-inputs");
  sub->add_option("--kv-dtype", a->kv_dtype,
                  "the KV cache's dtype: f32, bf16 (keys and values rounded as they are stored: half the bytes a "
                  "batched step reads per sequence) or int8 (each row quantised to int8 with an f32 scale, as "
                  "llama.cpp's q8_0 cache: about a quarter of the bytes); texts may differ from f32's. Default: bf16 "
                  "with --gemm-inputs bf16, else f32")
      ->check(CLI::IsMember({"f32", "bf16", "int8"}));
  auto* json = sub->add_flag("--json", a->json,
                             "print one JSON document instead of the text: text, tokens, pieces, timings and the settings used");
  batch->excludes(prompt);
  batch->excludes(json);
  sub->callback([a] { run(*a); });
}

}  // namespace qkv::cli
