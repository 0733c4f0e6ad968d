// Internal: the training loop behind `qkv train` — corpus → tokens → batches → forward/backward →
// clipping → AdamW, with evaluation, checkpoints that resume bit for bit, a stop flag, and the loss
// curve (CSV + PNG). It prints nothing: the caller sees the run through TrainHooks (qkv train's
// progress bar, its messages and its signal handling live in src/cli/cmd_train.cpp).
//
// Files in the output folder (each written to a temporary name unique to the process and the
// write, then renamed; a failed write removes its temporary):
//   checkpoint.safetensors  weights (Weights::tensors() names), AdamW moments, step, RNG state;
//                           metadata: the model config (qkv's model JSON), the run's settings, the
//                           tokenizer, the corpus fingerprint
//   model.safetensors + model.json   the weights alone with qkv's model config (what `qkv generate
//                           --model OUT`, `qkv inspect` and qkv.Model.load read)
//   tokenizer.json          the tokenizer (chars or BPE merges)
//   loss.csv, loss.png      the loss curve
//   .qkv-train.lock         held (flock) by the run writing the folder, holding its pid: a second
//                           run on the same folder is refused, naming the first one's pid. It is
//                           never deleted (deleting a lock file another process has open races).
//
// A nonzero TrainHooks::stop stops the run after the current step with everything saved
// (TrainSummary::stop holds the value); `qkv train` stores the number of a SIGINT, SIGTERM or
// SIGHUP there and then exits 128 + that number.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "qkv/model.hpp"
#include "train/adamw.hpp"
#include "train/rng.hpp"

namespace qkv::train {

// The model to train, as `qkv train`'s flags describe it; model_config() turns it into a qkv::Config.
//   gpt2   nanoGPT: learned positions, LayerNorm, exact GELU MLP of 4·d_model, tied unembedding
//   llama  llama2.c: rotary positions, RMSNorm, SwiGLU MLP of llama2.c's width (hidden_dim 0:
//          ⌈(8/3)·d_model / 32⌉·32), kv_heads ≤ heads (GQA), tied unembedding
//   bert   BertForMaskedLM: bidirectional, post-LayerNorm, learned positions, 2 token types, exact
//          GELU MLP of 4·d_model, biases, eps 1e-12, the masked-LM head tied to the token embedding;
//          trained on masked-LM batches (BERT's 15 % with 80/10/10) with a WordPiece tokenizer
// config_path (--model-config) instead names a model JSON (qkv's or a Hugging Face config.json)
// that fixes every setting; its vocab_size must be the tokenizer's.
struct ModelFlags {
  std::string arch = "gpt2";      // gpt2 | llama | bert
  std::string config_path;        // --model-config
  std::int64_t layers = 4;        // L
  std::int64_t heads = 4;         // H (head dim D = d_model / H)
  std::int64_t kv_heads = 0;      // Hkv; 0: = heads
  std::int64_t embd = 128;        // C (--d-model)
  std::int64_t hidden_dim = 0;    // Hd; 0: the preset's (4·C for gpt2, llama2.c's rule for llama)
  std::int64_t context = 64;      // T, the training sequence length (and a new model's seq_len; ≤ an
                                  // --init model's seq_len)
  bool bias = false;              // biases in the projections (and LayerNorms)
};

// The model `f` describes for a vocabulary of `vocab` tokens. Throws std::invalid_argument naming
// the flag (or the config file and key) for a value out of range or a feature training does not
// implement.
Config model_config(const ModelFlags& f, std::int64_t vocab);
// The preset a config is ("gpt2", "llama"), or "custom".
std::string arch_of(const Config& c);

struct TrainOptions {
  std::string data_path;             // UTF-8 text corpus
  std::string out_dir;
  ModelFlags model;                  // vocab is taken from the tokenizer
  std::string tokenizer = "chars";   // "chars" | "bpe" (learned from the corpus) | a tokenizer file: a
                                     // llama2.c tokenizer.bin (each corpus line is one text, BOS first)
                                     // or qkv train's tokenizer.json; copied into out_dir
  std::string init;                  // a model to fine-tune (llama2.c .bin, safetensors file or folder):
                                     // its config and weights replace the model flags; --tokenizer defaults
                                     // to the tokenizer beside it (tokenizer.json, tokenizer.bin, tok*.bin)
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
  bool interrupted = false;    // stopped by TrainHooks::stop (a checkpoint was saved)
  int stop = 0;                // the nonzero value TrainHooks::stop held (qkv train: the signal's number)
  bool time_limited = false;   // stopped by time_limit_s before `steps` (validated and saved)
};

// The run once it is set up, before its first step (TrainHooks::on_start).
struct TrainStart {
  std::int64_t params = 0;                     // trainable parameters P
  std::int64_t vocab = 0;                      // the tokenizer's vocabulary
  std::string tokenizer;                       // "chars" | "bpe" | the tokenizer file
  std::int64_t train_tokens = 0, val_tokens = 0;
  std::int64_t first_step = 0;                 // > 0: resumed at this step
  bool resumed = false;
  std::vector<std::string> schedule_changes;   // resume: "lr 0.001 -> 0.0005", one per changed schedule option
  std::string note;                            // what the setup did that the caller should say (an --init
                                               // encoder without the masked-LM head: the head was initialised)
};

// One optimiser step done (TrainHooks::on_step).
struct TrainProgress {
  std::int64_t step = 0;       // steps done (1-based: the step just finished is step - 1)
  std::int64_t steps = 0;      // TrainOptions::steps
  double loss = 0;             // this step's training loss
  double val_loss = 0;         // the last validation loss; NaN before the first validation
  double tokens_per_s = 0;     // training tokens per second of this invocation (evaluation excluded)
  double steps_per_s = 0;      // the same in optimiser steps
  double wall_s = 0;           // wall time since the first step of this invocation began (evaluations included)
};

// How a caller follows and stops a run; every member may be left empty. The callbacks run on the
// calling thread, between steps.
struct TrainHooks {
  std::function<void(const TrainStart&)> on_start;      // after the setup, before the first step
  std::function<void(const TrainProgress&)> on_step;    // after every optimiser step, before `stop` is read
  const std::atomic<int>* stop = nullptr;               // read after every step: nonzero stops the run there,
                                                        // with everything saved (writable from a signal handler)
};

// Errors (qkv/types.hpp): std::invalid_argument for a bad option or file argument; qkv::IoError
// when the output folder cannot be created or written; qkv::FormatError for a checkpoint or
// loss.csv whose content is corrupt; qkv::NonFiniteError when the loss becomes NaN or ±inf.
TrainSummary train(const TrainOptions& o, const TrainHooks& hooks = {});

// An encoder's batch, BERT's masked-LM data: B sequences [CLS] data[i, i+T−2) [SEP] into x [B, T],
// each at an offset i drawn uniformly from [0, len − (T − 2)] (len = data.size() ≥ T − 2, T ≥ 3);
// then each position but [CLS] and [SEP] is chosen with probability 15 % (and one uniformly among
// them when none was, so every sequence predicts something), and a chosen token becomes mask_id
// (80 %), a random id of [0, V) (10 %) or stays (10 %), as transformers'
// DataCollatorForLanguageModeling does; y [B, T] holds the chosen positions' original tokens and
// kIgnoreTarget (−100) elsewhere. Everything is drawn from rng: a seed fixes the batch.
void mlm_batch(const std::vector<std::int32_t>& data, Rng& rng, std::int64_t B, std::int64_t T, const Tokenizer& tok,
               std::int32_t mask_id, std::vector<std::int32_t>& x, std::vector<std::int32_t>& y);

// Throws std::invalid_argument naming every bad option with the value given ("--lr: must be a
// finite number > 0, got nan; --clip: ..."), in one line; train() calls it first.
void check_options(const TrainOptions& o);

}  // namespace qkv::train
