// qkv train — train a model (qkv::Config: GPT-2 or Llama style, or a BERT encoder) on a text file
// (src/train/trainer.hpp).
//
//   qkv train --data data/tinyshakespeare/input.txt --out runs/shakespeare
//   qkv train --data data/tinyshakespeare/input.txt --out runs/llama --arch llama --kv-heads 2
//   qkv train --data corpus.txt --out runs/custom --model-config model.json   (qkv's model JSON or an HF config.json)
//   qkv train --data corpus.txt --out runs/bpe --tokenizer bpe --bpe-vocab 512 --config model.json
//   qkv train --data corpus.txt --out runs/bpe --resume          (after Ctrl-C, or to train further)
//   qkv train --data corpus.txt --out runs/bert --arch bert --tokenizer BERT_FOLDER   (masked-LM)
//   qkv train --data corpus.txt --out runs/ft --init SENTENCE_TRANSFORMERS_FOLDER    (fine-tune an encoder)
//
// The defaults are nanoGPT's small CPU configuration for character-level Shakespeare. --config
// reads a JSON object whose keys are the long option names with '-' as '_' (e.g. {"layers": 6,
// "d_model": 384, "context": 256, "lr": 1e-3}); options given on the command line win over it.
// The library's train() runs the loop; this file prints its banner, progress bar and messages and
// turns SIGINT, SIGTERM and SIGHUP into its stop flag.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/input_file.hpp"
#include "model/json_depth.hpp"
#include "qkv/runtime.hpp"
#include "qkv/types.hpp"
#include "train/trainer.hpp"

namespace qkv::cli {
namespace {

constexpr const char* kFn = "qkv train";

struct Binding {
  CLI::Option* opt;
  std::function<void(const nlohmann::json&)> from_json;  // throws on a value of the wrong type
};

template <class T>
std::function<void(const nlohmann::json&)> setter(T* dst, const std::string& key) {
  return [dst, key](const nlohmann::json& v) {
    const bool ok = std::is_same_v<T, bool> ? v.is_boolean()
                    : std::is_integral_v<T> ? v.is_number_integer()
                    : std::is_floating_point_v<T> ? v.is_number()
                                                  : v.is_string();
    if (!ok) fail(kFn, "--config: \"" + key + "\" has the wrong type: " + v.dump());
    *dst = v.get<T>();
  };
}

std::atomic<int> g_stop_signal{0};  // the signal that asked the run to stop, 0 while none did: train()'s stop flag
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// For the lifetime of a training run (from its first step): SIGINT (Ctrl-C), SIGTERM (timeout,
// systemd, docker stop, Slurm) and SIGHUP (a closed terminal) stop the run after the current step
// with everything saved; SIGXFSZ (a file size limit, `ulimit -f`) is ignored so that a write past
// the limit fails with EFBIG, is reported and its temporary removed, instead of killing the process
// mid-write. The old handlers come back at the end.
struct SignalGuard {
  static constexpr int kStop[3] = {SIGINT, SIGTERM, SIGHUP};
  using Handler = void (*)(int);
  Handler old[3], old_xfsz;
  SignalGuard() {
    g_stop_signal = 0;
    for (int i = 0; i < 3; ++i) old[i] = std::signal(kStop[i], on_stop_signal);
    old_xfsz = std::signal(SIGXFSZ, SIG_IGN);
  }
  ~SignalGuard() {
    for (int i = 0; i < 3; ++i) std::signal(kStop[i], old[i]);
    std::signal(SIGXFSZ, old_xfsz);
  }
  SignalGuard(const SignalGuard&) = delete;
  SignalGuard& operator=(const SignalGuard&) = delete;
};

const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal"; }

// "1:04" or "1:02:03"; "?" for a time not known.
std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

// train() with qkv train's output on stderr: the banner, the progress bar (redrawn on a terminal,
// every 50 steps and at the end otherwise; none with `progress` false), and how the run stopped.
train::TrainSummary run_train(const train::TrainOptions& o, bool progress) {
  const bool tty = isatty(2) != 0;
  std::optional<SignalGuard> guard;
  train::TrainHooks hooks;
  hooks.stop = &g_stop_signal;
  hooks.on_start = [&](const train::TrainStart& s) {
    guard.emplace();  // from here on SIGINT/SIGTERM/SIGHUP stop after the current step and save
    for (const std::string& c : s.schedule_changes)
      std::fprintf(stderr, "qkv train: resuming with a changed schedule: %s\n", c.c_str());
    if (!s.note.empty()) std::fprintf(stderr, "qkv train: %s\n", s.note.c_str());
    std::fprintf(stderr, "qkv train: %lld parameters, vocab %lld (%s), %lld train / %lld val tokens, %d threads%s\n",
                 static_cast<long long>(s.params), static_cast<long long>(s.vocab), s.tokenizer.c_str(),
                 static_cast<long long>(s.train_tokens), static_cast<long long>(s.val_tokens), qkv::num_threads(),
                 s.resumed ? (", resuming at step " + std::to_string(s.first_step)).c_str() : "");
  };
  hooks.on_step = [&](const train::TrainProgress& p) {
    if (!progress || !(tty || p.step % 50 == 0 || p.step == p.steps)) return;
    const int width = 24;
    const auto filled =
        static_cast<int>(static_cast<double>(width) * static_cast<double>(p.step) / static_cast<double>(p.steps));
    const std::string bar = std::string(static_cast<std::size_t>(filled), '#') +
                            std::string(static_cast<std::size_t>(width - filled), '.');
    char val[32] = "-";
    if (std::isfinite(p.val_loss)) std::snprintf(val, sizeof val, "%.4f", p.val_loss);
    double left = static_cast<double>(p.steps - p.step) / p.steps_per_s;  // at this speed; --time-limit caps it
    if (o.time_limit_s > 0) left = std::max(0.0, std::min(left, o.time_limit_s - p.wall_s));
    std::fprintf(stderr, "%sstep %lld/%lld [%s] loss %.4f val %s | %.0f tok/s | %s left%s", tty ? "\r\033[K" : "",
                 static_cast<long long>(p.step), static_cast<long long>(p.steps), bar.c_str(), p.loss, val,
                 p.tokens_per_s, format_duration(left).c_str(), tty ? "" : "\n");
    std::fflush(stderr);
  };
  const train::TrainSummary r = train::train(o, hooks);
  if (r.interrupted) {
    std::fprintf(stderr, "%sinterrupted by %s: checkpoint saved at step %lld in %s; continue with --resume\n",
                 tty ? "\n" : "", signal_name(r.stop), static_cast<long long>(r.step), o.out_dir.c_str());
  } else {
    if (tty && progress) std::fprintf(stderr, "\n");
    if (r.time_limited)
      std::fprintf(stderr, "time limit of %s reached: checkpoint saved at step %lld in %s; continue with --resume\n",
                   format_duration(o.time_limit_s).c_str(), static_cast<long long>(r.step), o.out_dir.c_str());
  }
  return r;
}

// --checkpoint-interval: "500" (steps) or "10m" / "2.5m" (minutes of wall time).
void parse_checkpoint_interval(const std::string& text, train::TrainOptions& o) {
  const std::string bad = "--checkpoint-interval: expected a number of steps >= 1 or of minutes > 0 such as 10m, got '" + text + "'";
  char* end = nullptr;
  if (!text.empty() && text.back() == 'm') {
    const std::string num = text.substr(0, text.size() - 1);
    const double minutes = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0' || !std::isfinite(minutes) || !(minutes > 0)) fail(kFn, bad);
    o.checkpoint_interval = 0;
    o.checkpoint_interval_s = 60 * minutes;
    return;
  }
  const long long steps = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || steps < 1) fail(kFn, bad);
  o.checkpoint_interval = steps;
  o.checkpoint_interval_s = 0;
}

}  // namespace

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a GPT-2 or Llama style model (character-level or byte-level BPE) or a BERT encoder (masked-LM, WordPiece) on a text file");
  cmd->footer("Ctrl-C (SIGINT), SIGTERM and SIGHUP stop after the current step, save everything and exit 130, 143 "
              "and 129 (128 + the signal); continue with --resume. One run at a time may write an --out folder.");
  auto o = std::make_shared<train::TrainOptions>();
  auto config_path = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  auto bindings = std::make_shared<std::map<std::string, Binding>>();
  auto bind = [&](const std::string& name, auto* dst, const std::string& help) {
    CLI::Option* opt = cmd->add_option("--" + name, *dst, help)->capture_default_str();
    std::string key = name;
    for (char& c : key)
      if (c == '-') c = '_';
    (*bindings)[key] = {opt, setter(dst, key)};
    return opt;
  };
  cmd->add_option("--data", o->data_path, "UTF-8 text corpus")->required();
  cmd->add_option("--out", o->out_dir, "output folder: checkpoint, model, tokenizer, loss.csv, loss.png")->required();
  cmd->add_option("--config", *config_path, "JSON file with any of the options below (flags win)");
  bind("arch", &o->model.arch,
       "gpt2 (learned positions, LayerNorm, GELU) | llama (rotary, RMSNorm, SwiGLU, GQA with --kv-heads) | bert "
       "(BertForMaskedLM: a bidirectional encoder trained on masked tokens; --tokenizer a WordPiece tokenizer)")
      ->check(CLI::IsMember({"gpt2", "llama", "bert"}));
  bind("model-config", &o->model.config_path,
       "model JSON (qkv's model.json or a Hugging Face config.json; vocab_size = the tokenizer's) instead of --arch "
       "and the sizes");
  bind("layers", &o->model.layers, "transformer blocks")->check(at_least(1));
  bind("heads", &o->model.heads, "attention heads")->check(at_least(1));
  bind("kv-heads", &o->model.kv_heads, "key/value heads (llama: divides --heads; 0: = heads)")->check(at_least(0));
  bind("d-model", &o->model.embd, "embedding width (a multiple of heads)")->check(at_least(1));
  bind("hidden-dim", &o->model.hidden_dim, "MLP width (0: 4·d-model for gpt2, llama2.c's ⅔ of it for llama)")
      ->check(at_least(0));
  bind("context", &o->model.context, "context length in tokens")->check(at_least(1));
  (*bindings)["bias"] = {cmd->add_flag("--bias", o->model.bias, "biases in linear layers and LayerNorms"),
                         setter(&o->model.bias, "bias")};
  bind("tokenizer", &o->tokenizer,
       "chars | bpe (learned from the corpus) | a tokenizer file, the --init model's own (default with --init: the one "
       "beside it)")
      ->type_name("TEXT:{chars,bpe} or FILE");  // the two choices are what shell completion offers
  bind("init", &o->init, "fine-tune this model (llama2.c .bin, .safetensors or a model folder) instead of a new one");
  bind("bpe-vocab", &o->bpe_vocab, "BPE vocabulary size (256 bytes + merges)");
  bind("batch", &o->batch, "sequences per micro-batch")->check(at_least(1));
  bind("accum", &o->accum, "micro-batches per step (gradient accumulation)")->check(at_least(1));
  bind("steps", &o->steps, "optimiser steps")->check(at_least(1));
  bind("lr", &o->opt.lr, "peak learning rate");
  bind("min-lr", &o->opt.min_lr, "learning rate at the end of the cosine decay");
  bind("warmup", &o->opt.warmup, "linear warmup steps");
  auto* decay_opt = bind("decay-steps", &o->opt.decay_steps, "steps of cosine decay (default: --steps; give it to extend a run with --resume)");
  bind("beta1", &o->opt.beta1, "AdamW beta1");
  bind("beta2", &o->opt.beta2, "AdamW beta2");
  bind("weight-decay", &o->opt.weight_decay, "decoupled weight decay on matrices and embeddings");
  bind("clip", &o->opt.clip, "max gradient norm (0: off)");
  bind("eval-interval", &o->eval_interval, "validate every so many steps")->check(at_least(1));
  bind("eval-batches", &o->eval_batches, "batches per validation estimate")->check(at_least(1));
  auto checkpoint_every = std::make_shared<std::string>("500");
  bind("checkpoint-interval", checkpoint_every.get(),
       "checkpoint every so many steps (500), or minutes with an 'm' (10m: every 10 minutes of wall time)");
  (*bindings)["checkpoint_interval"].from_json = [checkpoint_every](const nlohmann::json& v) {
    if (v.is_number_integer()) *checkpoint_every = std::to_string(v.get<std::int64_t>());
    else if (v.is_string()) *checkpoint_every = v.get<std::string>();
    else fail(kFn, "--config: \"checkpoint_interval\" must be a number of steps or a string such as \"10m\", got " + v.dump());
  };
  bind("seed", &o->seed, "seed of initialisation and batches");
  bind("val-fraction", &o->val_fraction, "share of the tokens (at the end) kept for validation");
  auto time_limit_min = std::make_shared<double>(0);
  bind("time-limit", time_limit_min.get(),
       "stop after so many minutes of wall time (0: none): validate, save, exit; continue with --resume");
  cmd->add_flag("--resume", o->resume,
                "continue from the checkpoint in --out: the model and run settings come from it (a flag given with "
                "another value is an error), the schedule (--steps, --lr, --warmup, ...) may change");
  cmd->add_flag("--quiet", *quiet, "no progress bar");

  cmd->callback([o, config_path, quiet, bindings, decay_opt, time_limit_min, checkpoint_every] {
    bool decay_in_config = false;
    std::set<std::string> given;  // flags set on the command line or in --config (for --resume)
    for (const auto& [key, b] : *bindings)
      if (b.opt->count() > 0) given.insert(b.opt->get_name().substr(2));
    if (!config_path->empty()) {
      const std::string text = detail::read_input_file(*config_path, kFn, "--config", std::size_t{1} << 20);
      const auto j = nlohmann::json::parse(
          text, qkv::detail::json_depth_limit(kFn, "--config '" + *config_path + "'"), false);
      if (j.is_discarded() || !j.is_object()) fail(kFn, "--config '" + *config_path + "': not a JSON object");
      for (auto it = j.begin(); it != j.end(); ++it) {
        const auto b = bindings->find(it.key());
        if (b == bindings->end()) fail(kFn, "--config '" + *config_path + "': unknown key \"" + it.key() + "\"");
        if (b->second.opt->count() == 0) b->second.from_json(it.value());
        given.insert(b->second.opt->get_name().substr(2));
        decay_in_config = decay_in_config || it.key() == "decay_steps";
      }
    }
    if (given.count("model-config"))
      for (const char* f : {"arch", "layers", "heads", "kv-heads", "d-model", "hidden-dim", "context", "bias"})
        if (given.count(f))
          throw CLI::ValidationError("--" + std::string(f) + ": not with --model-config, whose file sets the model");
    if (given.count("init")) {
      for (const char* f : {"arch", "model-config", "layers", "heads", "kv-heads", "d-model", "hidden-dim", "bias"})
        if (given.count(f))
          throw CLI::ValidationError("--" + std::string(f) + ": not with --init, whose model is fine-tuned as it is");
      if (!given.count("tokenizer")) o->tokenizer.clear();  // the one beside the model
    }
    if (decay_opt->count() == 0 && !decay_in_config)  // nanoGPT: lr_decay_iters = max_iters
      o->opt.decay_steps = o->steps;
    if (!(*time_limit_min >= 0))
      throw CLI::ValidationError("--time-limit: must be >= 0 minutes (got " + std::to_string(*time_limit_min) + ")");
    o->time_limit_s = 60 * *time_limit_min;
    try {  // bad values are usage errors (exit 2), named with the value given
      parse_checkpoint_interval(*checkpoint_every, *o);
      train::check_options(*o);
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError(e.what());
    }
    if (o->resume) o->given = given;
    const train::TrainSummary r = run_train(*o, !*quiet);
    if (r.interrupted) exit_status() = 128 + r.stop;  // 130 SIGINT, 143 SIGTERM, 129 SIGHUP
    std::printf("%s at step %lld: validation loss %.4f, %.2f steps/s\n", r.interrupted ? "stopped" : r.time_limited ? "time limit reached" : "done",
                static_cast<long long>(r.step), r.val_loss, r.steps_per_s);
  });
}

}  // namespace qkv::cli
