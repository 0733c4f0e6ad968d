// Internal: the training loop behind `qkv train` — corpus → tokens → batches → forward/backward →
// clipping → AdamW, with evaluation, a progress bar, checkpoints that resume bit for bit, Ctrl-C,
// and the loss curve (CSV + PNG).
//
// Files in the output folder (each written to a temporary name, then renamed):
//   checkpoint.safetensors  weights (nanoGPT names), AdamW moments, step, RNG state; metadata: the
//                           model and optimiser configuration, the tokenizer, the corpus fingerprint
//   model.safetensors + model.json   the weights alone with qkv's model config (for `qkv generate`)
//   tokenizer.json          the tokenizer (chars or BPE merges)
//   loss.csv, loss.png      the loss curve
#pragma once

#include <cstdint>
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
  std::int64_t checkpoint_interval = 500;
  std::uint64_t seed = 1337;
  double val_fraction = 0.1;         // the last 10% of the tokens validate
  AdamWConfig opt;
  bool resume = false;               // continue from out_dir/checkpoint.safetensors
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
  bool interrupted = false;    // stopped by Ctrl-C (a checkpoint was saved)
  bool time_limited = false;   // stopped by time_limit_s before `steps` (validated and saved)
};

TrainSummary train(const TrainOptions& o);

// The GPT-2 style nanoGPT configuration as qkv's model config JSON (written as model.json).
std::string model_config_json(const GptConfig& c);

}  // namespace qkv::train
