// Internal: the training loop behind `qkv train` — corpus → tokens → batches → forward/backward →
// clipping → AdamW, with evaluation, a progress bar, checkpoints that resume bit for bit, Ctrl-C,
// and the loss curve (CSV + PNG).
//
// Files in the output folder (each written to a temporary name unique to the process and the
// write, then renamed; a failed write removes its temporary):
//   checkpoint.safetensors  weights (nanoGPT names), AdamW moments, step, RNG state; metadata: the
//                           model and optimiser configuration, the tokenizer, the corpus fingerprint
//   model.safetensors + model.json   the weights alone with qkv's model config (for `qkv generate`)
//   tokenizer.json          the tokenizer (chars or BPE merges)
//   loss.csv, loss.png      the loss curve
//   .qkv-train.lock         held (flock) by the run writing the folder, holding its pid: a second
//                           run on the same folder is refused, naming the first one's pid. It is
//                           never deleted (deleting a lock file another process has open races).
//
// SIGINT, SIGTERM and SIGHUP stop the run after the current step with everything saved
// (TrainSummary::signal says which came); `qkv train` then exits 128 + the signal's number.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "train/adamw.hpp"
#include "train/gpt.hpp"

namespace qkv::train {

struct TrainOptions {
  std::string data_path;             // UTF-8 text corpus
  std::string out_dir;
  GptConfig model;                   // vocab is taken from the tokenizer
  std::string tokenizer = "chars";   // "chars" | "bpe"
  std::int64_t bpe_vocab = 512;      // bpe: vocabulary size to learn
  std::int64_t batch = 12;           // B sequences of model.context tokens per micro-batch
  std::int64_t accum = 1;            // micro-batches per optimiser step (gradient accumulation)
  std::int64_t steps = 2000;         // optimiser steps in all (a resumed run continues to this)
  std::int64_t eval_interval = 250;  // validation every so many steps (and at the end)
  std::int64_t eval_batches = 20;    // batches per validation estimate
  std::int64_t checkpoint_interval = 500;  // steps between checkpoints; 0: none by count
  double checkpoint_interval_s = 0;        // > 0: also checkpoint once so many seconds passed since the last save
  std::uint64_t seed = 1337;
  double val_fraction = 0.1;         // the last 10% of the tokens validate
  AdamWConfig opt;
  bool resume = false;               // continue from out_dir/checkpoint.safetensors
  // resume: the options the caller set, by their `qkv train` flag names without "--" ("layers",
  // "d-model", "batch", "lr", ...). The model and the run's fixed settings come from the checkpoint:
  // one not in `given` takes the checkpoint's value, one given with another value is an error
  // naming the flag. The schedule (steps, lr, min-lr, warmup, decay-steps, evaluation,
  // checkpoint interval, time limit) may change. nullopt: every option counts as given.
  std::optional<std::set<std::string>> given;
  bool progress = true;              // progress bar on stderr
  double time_limit_s = 0;           // > 0: stop once this invocation has run so long (wall time,
                                     // evaluations included), after at least one step: validate,
                                     // save everything, return; continue with resume
};

struct LossRow {
  std::int64_t step = 0;    // the row describes optimiser step `step` (0-based)
  double lr = 0, train_loss = 0, val_loss = 0, grad_norm = 0, tokens_per_s = 0, elapsed_s = 0;
  bool has_train = false, has_val = false;  // val_loss: measured before step `step` (after `step` updates)
};

struct TrainSummary {
  std::int64_t step = 0;       // optimiser steps done
  double val_loss = 0;         // last validation loss
  double steps_per_s = 0;      // training steps per second of this invocation (evaluation excluded)
  bool interrupted = false;    // stopped by a signal (a checkpoint was saved)
  int signal = 0;              // that signal: SIGINT, SIGTERM or SIGHUP
  bool time_limited = false;   // stopped by time_limit_s before `steps` (validated and saved)
};

TrainSummary train(const TrainOptions& o);

// Throws std::invalid_argument naming every bad option with the value given ("--lr: must be a
// finite number > 0, got nan; --clip: ..."), in one line; train() calls it first.
void check_options(const TrainOptions& o);

// The GPT-2 style nanoGPT configuration as qkv's model config JSON (written as model.json).
std::string model_config_json(const GptConfig& c);

}  // namespace qkv::train
