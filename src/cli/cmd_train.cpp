// qkv train — train a GPT-2 style model on a text file (src/train/trainer.hpp).
//
//   qkv train --data data/tinyshakespeare/input.txt --out runs/shakespeare
//   qkv train --data corpus.txt --out runs/bpe --tokenizer bpe --bpe-vocab 512 --config model.json
//   qkv train --data corpus.txt --out runs/bpe --resume          (after Ctrl-C, or to train further)
//
// The defaults are nanoGPT's small CPU configuration for character-level Shakespeare. --config
// reads a JSON object whose keys are the long option names with '-' as '_' (e.g. {"layers": 6,
// "d_model": 384, "context": 256, "lr": 1e-3}); options given on the command line win over it.
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.hpp"
#include "model/json_depth.hpp"
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

}  // namespace

void add_train(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a GPT-2 style model on a text file (character-level or byte-level BPE)");
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
  bind("layers", &o->model.layers, "transformer blocks")->check(at_least(1));
  bind("heads", &o->model.heads, "attention heads")->check(at_least(1));
  bind("d-model", &o->model.embd, "embedding width (a multiple of heads)")->check(at_least(1));
  bind("context", &o->model.context, "context length in tokens")->check(at_least(1));
  (*bindings)["bias"] = {cmd->add_flag("--bias", o->model.bias, "biases in linear layers and LayerNorms"),
                         setter(&o->model.bias, "bias")};
  bind("tokenizer", &o->tokenizer, "chars | bpe")->check(CLI::IsMember({"chars", "bpe"}));
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
  bind("checkpoint-interval", &o->checkpoint_interval, "checkpoint every so many steps")->check(at_least(1));
  bind("seed", &o->seed, "seed of initialisation and batches");
  bind("val-fraction", &o->val_fraction, "share of the tokens (at the end) kept for validation");
  auto time_limit_min = std::make_shared<double>(0);
  bind("time-limit", time_limit_min.get(),
       "stop after so many minutes of wall time (0: none): validate, save, exit; continue with --resume");
  cmd->add_flag("--resume", o->resume, "continue from the checkpoint in --out");
  cmd->add_flag("--quiet", *quiet, "no progress bar");

  cmd->callback([o, config_path, quiet, bindings, decay_opt, time_limit_min] {
    bool decay_in_config = false;
    if (!config_path->empty()) {
      std::ifstream f(*config_path, std::ios::binary);
      if (!f) fail(kFn, "--config '" + *config_path + "': cannot open the file");
      std::stringstream s;
      s << f.rdbuf();
      const auto j = nlohmann::json::parse(
          s.str(), qkv::detail::json_depth_limit(kFn, "--config '" + *config_path + "'"), false);
      if (j.is_discarded() || !j.is_object()) fail(kFn, "--config '" + *config_path + "': not a JSON object");
      for (auto it = j.begin(); it != j.end(); ++it) {
        const auto b = bindings->find(it.key());
        if (b == bindings->end()) fail(kFn, "--config '" + *config_path + "': unknown key \"" + it.key() + "\"");
        if (b->second.opt->count() == 0) b->second.from_json(it.value());
        decay_in_config = decay_in_config || it.key() == "decay_steps";
      }
    }
    if (decay_opt->count() == 0 && !decay_in_config)  // nanoGPT: lr_decay_iters = max_iters
      o->opt.decay_steps = o->steps;
    if (!(*time_limit_min >= 0)) fail(kFn, "--time-limit: must be >= 0 minutes (got " + std::to_string(*time_limit_min) + ")");
    o->time_limit_s = 60 * *time_limit_min;
    o->progress = !*quiet;
    const train::TrainSummary r = train::train(*o);
    std::printf("%s at step %lld: validation loss %.4f, %.2f steps/s\n", r.interrupted ? "stopped" : r.time_limited ? "time limit reached" : "done",
                static_cast<long long>(r.step), r.val_loss, r.steps_per_s);
  });
}

}  // namespace qkv::cli
