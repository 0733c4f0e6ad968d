#include "train/trainer.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/output_file.hpp"
#include "model/hf_layout.hpp"
#include "model/input_file.hpp"
#include "model/safetensors.hpp"
#include "model/text_tokenizer.hpp"
#include "model/trainable.hpp"
#include "train/plot.hpp"
#include "train/rng.hpp"
#include "qkv/types.hpp"

namespace qkv::train {
using detail::check_text, detail::read_safetensors, detail::st_copy_f32, detail::st_f32, detail::st_get_i64,
    detail::st_get_u64, detail::st_i64, detail::st_u64, detail::StFile, detail::TextTokenizer, detail::write_safetensors;
namespace {

constexpr const char* kFn = "qkv::train";

// Every file a run writes goes through the one atomic writer, its errors naming qkv::train.
void write_file_atomic(const std::string& path, std::string_view bytes) { detail::write_file_atomic(path, bytes, kFn); }
// 2: parameters under Weights::tensors()' names, the model as qkv's model JSON (1: nanoGPT's GPT-2 only).
constexpr const char* kFormat = "qkv-train-checkpoint-2";
// Streams derived from the seed: batches, initial weights, validation batches (the same fixed
// batches at every evaluation, so the curve compares like with like; bench/train_gpt_torch.py
// draws the same ones).
constexpr std::uint64_t kInitStream = 0x1A17'0000'0000'0001ull;
constexpr std::uint64_t kEvalStream = 0x5EED'E7A1ull;

// The output folder, locked for this run: flock on out/.qkv-train.lock, which holds the pid. A
// second run on the folder is refused naming the first one's pid. Creating and writing the lock
// file is also the check that the folder is writable, before any training.
class OutLock {
 public:
  explicit OutLock(const std::string& dir) {
    const std::string path = dir + "/.qkv-train.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_io(kFn, "--out '" + dir + "': cannot write in the folder: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      const long pid = n > 0 ? std::strtol(buf, nullptr, 10) : 0;
      ::close(fd_);
      fail(kFn, "--out '" + dir + "': another qkv train" + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "") +
                    " is writing to this folder (it holds " + path +
                    "); wait for it to finish or choose another --out");
    }
    const std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      const int e = errno;
      ::close(fd_);
      fail_io(kFn, "--out '" + dir + "': cannot write in the folder: " + std::strerror(e));
    }
  }
  ~OutLock() { ::close(fd_); }  // closing releases the lock
  OutLock(const OutLock&) = delete;
  OutLock& operator=(const OutLock&) = delete;

 private:
  int fd_ = -1;
};

// FNV-1a over the corpus bytes: a resumed run must see the same text.
std::string fingerprint(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%zu bytes, fnv1a %016llx", text.size(), static_cast<unsigned long long>(h));
  return buf;
}

nlohmann::json run_json(const TrainOptions& o) {
  return {{"tokenizer", o.tokenizer}, {"bpe_vocab", o.tokenizer == "bpe" ? o.bpe_vocab : 0},
          {"context", o.model.context},
          {"batch", o.batch},         {"accum", o.accum},
          {"seed", o.seed},           {"val_fraction", o.val_fraction},
          {"lr", o.opt.lr},           {"min_lr", o.opt.min_lr},
          {"warmup", o.opt.warmup},   {"decay_steps", o.opt.decay_steps},
          {"beta1", o.opt.beta1},     {"beta2", o.opt.beta2},
          {"eps", o.opt.eps},         {"weight_decay", o.opt.weight_decay},
          {"clip", o.opt.clip}};
}

}  // namespace

void check_options(const TrainOptions& o) {
  std::vector<std::string> bad;
  auto num = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return std::string(buf);
  };
  auto positive = [&](const char* flag, std::int64_t v) {
    if (v < 1) bad.push_back(std::string(flag) + ": must be >= 1, got " + std::to_string(v));
  };
  auto real = [&](const char* flag, double v, double lo, bool lo_open, double hi, bool hi_open, const char* range) {
    const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) bad.push_back(std::string(flag) + ": must be " + range + ", got " + num(v));
  };
  constexpr double inf = std::numeric_limits<double>::infinity();
  positive("--batch", o.batch);
  positive("--accum", o.accum);
  positive("--steps", o.steps);
  positive("--eval-interval", o.eval_interval);
  positive("--eval-batches", o.eval_batches);
  if (o.checkpoint_interval < 0 || (o.checkpoint_interval == 0 && !(o.checkpoint_interval_s > 0)))
    bad.push_back("--checkpoint-interval: must be >= 1 step or a positive number of minutes, got " +
                  std::to_string(o.checkpoint_interval) + " steps");
  if (!(o.checkpoint_interval_s >= 0) || !std::isfinite(o.checkpoint_interval_s))
    bad.push_back("--checkpoint-interval: must be a finite number of minutes >= 0, got " + num(o.checkpoint_interval_s / 60));
  if (o.tokenizer.empty() && o.init.empty())
    bad.push_back("--tokenizer: must be chars, bpe or a tokenizer file (with --init), got ''");
  real("--val-fraction", o.val_fraction, 0, true, 1, true, "in (0, 1)");
  real("--lr", o.opt.lr, 0, true, inf, true, "a finite number > 0");
  real("--min-lr", o.opt.min_lr, 0, false, inf, true, "a finite number >= 0");
  if (o.opt.warmup < 0) bad.push_back("--warmup: must be >= 0 steps, got " + std::to_string(o.opt.warmup));
  if (o.opt.decay_steps < 0) bad.push_back("--decay-steps: must be >= 0, got " + std::to_string(o.opt.decay_steps));
  real("--beta1", o.opt.beta1, 0, false, 1, true, "in [0, 1)");
  real("--beta2", o.opt.beta2, 0, false, 1, true, "in [0, 1)");
  real("eps", o.opt.eps, 0, true, inf, true, "a finite number > 0");
  real("--weight-decay", o.opt.weight_decay, 0, false, inf, true, "a finite number >= 0");
  real("--clip", o.opt.clip, 0, false, inf, true, "a finite number >= 0 (0: off)");
  if (!(o.time_limit_s >= 0) || std::isnan(o.time_limit_s))
    bad.push_back("--time-limit: must be >= 0 minutes, got " + num(o.time_limit_s / 60));
  if (bad.empty()) return;
  std::string all;
  for (const auto& b : bad) all += (all.empty() ? "" : "; ") + b;
  fail(kFn, all);
}

void mlm_batch(const std::vector<std::int32_t>& data, Rng& rng, std::int64_t B, std::int64_t T, const Tokenizer& tok,
               std::int32_t mask_id, std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
  const auto span = static_cast<std::uint64_t>(static_cast<std::int64_t>(data.size()) - (T - 2) + 1);
  const auto V = static_cast<std::uint64_t>(tok.vocab_size());
  for (std::int64_t b = 0; b < B; ++b) {
    const auto i = static_cast<std::size_t>(rng.below(span));
    std::int32_t* xb = x.data() + b * T;
    std::int32_t* yb = y.data() + b * T;
    xb[0] = tok.bos_id(), xb[T - 1] = tok.eos_id();
    for (std::int64_t t = 1; t < T - 1; ++t) xb[t] = data[i + static_cast<std::size_t>(t - 1)];
    std::int64_t chosen = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      const bool pick = t > 0 && t < T - 1 && rng.uniform() < 0.15;
      yb[t] = pick ? xb[t] : kIgnoreTarget;
      chosen += pick ? 1 : 0;
    }
    if (chosen == 0) {
      const auto t = static_cast<std::int64_t>(1 + rng.below(static_cast<std::uint64_t>(T - 2)));
      yb[t] = xb[t];
    }
    for (std::int64_t t = 1; t < T - 1; ++t) {
      if (yb[t] == kIgnoreTarget) continue;
      const double u = rng.uniform();
      if (u < 0.8) xb[t] = mask_id;
      else if (u < 0.9) xb[t] = static_cast<std::int32_t>(rng.below(V));
    }
  }
}

namespace {

// --resume: the checkpoint's "model" and "run" metadata against the options. Schedule fields may
// differ (the options win, and the changes are listed on stderr); any other field takes the
// checkpoint's value unless the caller gave it (TrainOptions::given), and one given with another
// value is an error naming the flag and both values.
struct ResumeField {
  const char* key;   // in the checkpoint's JSON
  const char* flag;  // qkv train's flag, without "--"
  bool schedule;
};
constexpr ResumeField kResumeFields[] = {
    {"tokenizer", "tokenizer", false},  {"context", "context", false},
    {"bpe_vocab", "bpe-vocab", false},  {"batch", "batch", false},     {"accum", "accum", false},
    {"seed", "seed", false},            {"val_fraction", "val-fraction", false},
    {"beta1", "beta1", false},          {"beta2", "beta2", false},     {"eps", "eps", false},
    {"weight_decay", "weight-decay", false}, {"clip", "clip", false},
    {"lr", "lr", true},                 {"min_lr", "min-lr", true},    {"warmup", "warmup", true},
    {"decay_steps", "decay-steps", true}};

void set_field(TrainOptions& o, const std::string& key, const nlohmann::json& v) {
  if (key == "tokenizer") o.tokenizer = v.get<std::string>();
  else if (key == "context") o.model.context = v.get<std::int64_t>();
  else if (key == "bpe_vocab") { if (v.get<std::int64_t>() > 0) o.bpe_vocab = v.get<std::int64_t>(); }
  else if (key == "batch") o.batch = v.get<std::int64_t>();
  else if (key == "accum") o.accum = v.get<std::int64_t>();
  else if (key == "seed") o.seed = v.get<std::uint64_t>();
  else if (key == "val_fraction") o.val_fraction = v.get<double>();
  else if (key == "beta1") o.opt.beta1 = v.get<double>();
  else if (key == "beta2") o.opt.beta2 = v.get<double>();
  else if (key == "eps") o.opt.eps = v.get<double>();
  else if (key == "weight_decay") o.opt.weight_decay = v.get<double>();
  else if (key == "clip") o.opt.clip = v.get<double>();
  else fail(kFn, "internal: no resume field " + key);
}

// One batch of B windows, each at an offset i drawn uniformly from [0, len − T):
// x[b] = data[i, i+T), y[b] = data[i+1, i+T+1) (every position's next token).
void sample_batch(const std::vector<std::int32_t>& data, Rng& rng, std::int64_t B, std::int64_t T,
                  std::vector<std::int32_t>& x, std::vector<std::int32_t>& y) {
  const auto span = static_cast<std::uint64_t>(static_cast<std::int64_t>(data.size()) - T);
  for (std::int64_t b = 0; b < B; ++b) {
    const auto i = static_cast<std::size_t>(rng.below(span));
    for (std::int64_t t = 0; t < T; ++t) {
      x[static_cast<std::size_t>(b * T + t)] = data[i + static_cast<std::size_t>(t)];
      y[static_cast<std::size_t>(b * T + t)] = data[i + static_cast<std::size_t>(t) + 1];
    }
  }
}

// The tokenizer of a run: learned from the corpus (chars, bpe; TextTokenizer) or a model's own read
// from a file (--tokenizer FILE, with --init or --arch bert): qkv train's tokenizer.json, a llama2.c
// tokenizer.bin, with which each non-empty line of the corpus is one text (BOS, then its tokens), as
// llama2.c's pretokenised stories are, or BERT's WordPiece (a Hugging Face tokenizer.json whose model
// is "WordPiece", or a vocab.txt), with which each non-empty line's tokens follow the last line's
// (an encoder's sequences are framed [CLS] … [SEP] by mlm_batch).
class RunTokenizer {
 public:
  static RunTokenizer learn(const TrainOptions& o, const std::string& corpus) {
    RunTokenizer t;
    t.text_ = o.tokenizer == "bpe" ? TextTokenizer::learn_bpe(corpus, o.bpe_vocab) : TextTokenizer::learn_chars(corpus);
    return t;
  }
  // vocab: the model's vocabulary (a llama2.c tokenizer.bin does not store its size); 0 for a new
  // encoder, whose vocabulary is the WordPiece tokenizer's. A folder stands for the tokenizer in it.
  static RunTokenizer from_file(const std::string& given, std::int64_t vocab) {
    RunTokenizer t;
    std::string path = given;
    if (std::filesystem::is_directory(given)) {
      path = detail::tokenizer_beside(given, kFn, "--tokenizer");
      if (path.empty() && std::filesystem::is_regular_file(given + "/vocab.txt")) path = given + "/vocab.txt";
      if (path.empty()) fail(kFn, "--tokenizer '" + given + "': the folder holds no tokenizer.json, vocab.txt or tokenizer.bin");
    }
    const std::string bytes = detail::read_input_file(path, kFn, "--tokenizer", std::size_t{1} << 28);
    const auto first = bytes.find_first_not_of(" \t\r\n");
    const bool json = first != std::string::npos && bytes[first] == '{';
    const auto j = json ? nlohmann::json::parse(bytes, nullptr, false) : nlohmann::json();
    const bool wordpiece = path.ends_with(".txt") || (j.is_object() && j.contains("model") && j["model"].is_object() &&
                                                      j["model"].value("type", "") == "WordPiece");
    if (json && !wordpiece && !(j.is_object() && j.contains("model"))) {
      t.text_ = TextTokenizer::from_json(bytes);
    } else {
      t.file_ = true;
      t.path_ = std::filesystem::absolute(path).string();
      t.bytes_ = bytes;
      t.file_tok_ = wordpiece ? Tokenizer::load_wordpiece(path) : Tokenizer::load(path, vocab);
      if (t.file_tok_.format() != Tokenizer::Format::llama2c && t.file_tok_.format() != Tokenizer::Format::wordpiece)
        fail(kFn, "--tokenizer '" + path + "': qkv train reads qkv train's tokenizer.json, a llama2.c tokenizer.bin "
                                           "or a WordPiece tokenizer.json / vocab.txt");
    }
    if (vocab > 0 && t.vocab_size() != vocab)
      fail(kFn, "--tokenizer '" + path + "': " + std::to_string(t.vocab_size()) +
                    " tokens, but the model's vocabulary has " + std::to_string(vocab) +
                    " (a model trains with its own tokenizer)");
    return t;
  }
  // A checkpoint's "tokenizer" metadata: TextTokenizer JSON, or {"file": path, "vocab", "fnv1a"}
  // ("llama2c" instead of "file" in checkpoints of earlier versions).
  static RunTokenizer from_metadata(const std::string& text) {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object() && (j.contains("file") || j.contains("llama2c"))) {
      RunTokenizer t = from_file(j[j.contains("file") ? "file" : "llama2c"].get<std::string>(), j["vocab"].get<std::int64_t>());
      if (fingerprint(t.bytes_) != j["fnv1a"].get<std::string>())
        fail(kFn, "--resume: the tokenizer file '" + t.path_ + "' changed since the checkpoint was written");
      return t;
    }
    RunTokenizer t;
    t.text_ = TextTokenizer::from_json(text);
    return t;
  }
  std::string metadata() const {
    if (!file_) return text_.to_json();
    return nlohmann::json{{"file", path_}, {"vocab", vocab_size()}, {"fnv1a", fingerprint(bytes_)}}.dump();
  }
  bool wordpiece() const { return file_ && file_tok_.format() == Tokenizer::Format::wordpiece; }
  const Tokenizer& file_tokenizer() const { return file_tok_; }
  std::int64_t vocab_size() const { return file_ ? file_tok_.vocab_size() : text_.vocab_size(); }
  std::vector<std::int32_t> encode(const std::string& corpus) const {
    if (!file_) return text_.encode(corpus);
    const bool bos = !wordpiece();
    std::vector<std::int32_t> ids;
    std::size_t at = 0;
    while (at < corpus.size()) {
      std::size_t end = corpus.find('\n', at);
      if (end == std::string::npos) end = corpus.size();
      const std::string_view line(corpus.data() + at, end - at);
      if (!line.empty())
        for (int id : file_tok_.encode(line, /*add_bos=*/bos, /*add_eos=*/false)) ids.push_back(id);
      at = end + 1;
    }
    return ids;
  }
  // Beside the model: tokenizer.json (TextTokenizer), the llama2.c file as tokenizer.bin, the
  // WordPiece file under its own name (tokenizer.json or vocab.txt) with the tokenizer_config.json
  // that was beside it (its lower-casing and accent settings).
  void write(const std::string& dir) const {
    namespace fs = std::filesystem;
    if (!file_) {
      write_file_atomic(dir + "/tokenizer.json", text_.to_json() + "\n");
    } else if (!wordpiece()) {
      write_file_atomic(dir + "/tokenizer.bin", bytes_);
    } else {
      write_file_atomic(dir + "/" + (path_.ends_with(".txt") ? "vocab.txt" : "tokenizer.json"), bytes_);
      const fs::path cfg = fs::path(path_).parent_path() / "tokenizer_config.json";
      if (fs::is_regular_file(cfg))
        write_file_atomic(dir + "/tokenizer_config.json", detail::read_input_file(cfg.string(), kFn, "--tokenizer"));
    }
  }

 private:
  bool file_ = false;  // a model's own tokenizer file (llama2.c or WordPiece)
  TextTokenizer text_;
  std::string path_, bytes_;  // file: the file (absolute path) and its bytes
  Tokenizer file_tok_;
};

// --init without --tokenizer: the tokenizer beside (or, for a folder, in) the model.
std::string tokenizer_beside(const std::string& model) {
  std::string found = detail::tokenizer_beside(model, kFn, "--tokenizer");
  if (found.empty())
    fail(kFn, "--tokenizer: not given, and no tokenizer.json, tokenizer.bin or tok*.bin beside --init '" + model + "'");
  return found;
}

// nanoGPT's initialisation, for every architecture: matrices and embeddings N(0, 0.02), the two
// residual projections of each layer (W_O, W2) N(0, 0.02/√(2L)), biases 0, norm gains 1. Drawn in
// layout order, matrix by matrix (for the gpt2 preset: nanoGPT's order of draws).
void init_params(Trainable<float>& m, Rng& rng) {
  const double resid_std = 0.02 / std::sqrt(2.0 * static_cast<double>(m.config().n_layers));
  for (const auto& p : m.layout()) {
    float* w = m.params.data() + p.offset;
    const bool is_bias = p.name.ends_with(".bias");
    const bool is_gain = p.shape.size() == 1 && !is_bias;
    const double std =
        p.name.ends_with("attention.wo.weight") || p.name.ends_with("feed_forward.w2.weight") ? resid_std : 0.02;
    for (std::int64_t i = 0; i < p.numel; ++i)
      w[i] = is_bias ? 0.0f : is_gain ? 1.0f : static_cast<float>(std * rng.normal());
  }
}

std::string csv_text(const std::vector<LossRow>& rows) {
  std::ostringstream s;
  s << "step,lr,train_loss,val_loss,grad_norm,tokens_per_s,elapsed_s\n";
  char buf[256];
  for (const auto& r : rows) {
    std::snprintf(buf, sizeof buf, "%lld,%.6g,", static_cast<long long>(r.step), r.lr);
    s << buf;
    if (r.has_train) {
      std::snprintf(buf, sizeof buf, "%.6f", r.train_loss);
      s << buf;
    }
    s << ',';
    if (r.has_val) {
      std::snprintf(buf, sizeof buf, "%.6f", r.val_loss);
      s << buf;
    }
    std::snprintf(buf, sizeof buf, ",%.6g,%.1f,%.3f\n", r.grad_norm, r.tokens_per_s, r.elapsed_s);
    s << buf;
  }
  return s.str();
}

// Rows of an earlier loss.csv before `step` (a resumed run continues the curve).
std::vector<LossRow> read_csv_before(const std::string& path, std::int64_t step) {
  std::vector<LossRow> rows;
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return rows;
  while (std::getline(f, line)) {
    std::vector<std::string> cells;
    std::stringstream ls(line);
    std::string cell;
    while (std::getline(ls, cell, ',')) cells.push_back(cell);
    if (cells.size() < 7) continue;
    LossRow r;
    try {
      r.step = std::stoll(cells[0]);
      if (r.step >= step) break;
      r.lr = std::stod(cells[1]);
      if ((r.has_train = !cells[2].empty())) r.train_loss = std::stod(cells[2]);
      if ((r.has_val = !cells[3].empty())) r.val_loss = std::stod(cells[3]);
      r.grad_norm = std::stod(cells[4]);
      r.tokens_per_s = std::stod(cells[5]);
      r.elapsed_s = std::stod(cells[6]);
    } catch (const std::exception&) {
      fail_format(kFn, "--resume: '" + path + "' holds a line that is not a loss row: '" + line + "'");
    }
    rows.push_back(r);
  }
  return rows;
}

// Everything the run needs to continue, as one safetensors file.
struct State {
  std::int64_t step = 0;
  double elapsed_s = 0;
};

void save_checkpoint(const std::string& path, const TrainOptions& o, const Trainable<float>& m,
                     const std::vector<float>& adam_m, const std::vector<float>& adam_v, const Rng& rng,
                     const State& st, const RunTokenizer& tok, const std::string& corpus_id) {
  StFile f;
  for (const auto& p : m.layout()) f.tensors[p.name] = st_f32(m.params.data() + p.offset, p.shape);
  const auto P = static_cast<std::int64_t>(m.params.size());
  f.tensors["optimizer.m"] = st_f32(adam_m.data(), {P});
  f.tensors["optimizer.v"] = st_f32(adam_v.data(), {P});
  const auto& s = rng.state();
  f.tensors["train.rng"] = st_u64({s[0], s[1], s[2], s[3]});
  f.tensors["train.step"] = st_i64({st.step});
  f.metadata["format"] = kFormat;
  f.metadata["model"] = config_to_json(m.config(), false);
  f.metadata["run"] = run_json(o).dump();
  f.metadata["tokenizer"] = tok.metadata();
  f.metadata["corpus"] = corpus_id;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", st.elapsed_s);
  f.metadata["elapsed_s"] = buf;
  write_safetensors(path, f);
}

// The sentence-transformers modules of an encoder's folder (what qkv embed and sentence-transformers
// read): those of --init's folder when it has modules.json (its pooling and normalisation kept),
// else a Transformer at the root, then mean pooling; sentence_bert_config.json likewise (else
// max_seq_length = seq_len).
void write_sentence_modules(const std::string& dir, const Config& c, const std::string& init) {
  namespace fs = std::filesystem;
  const fs::path from = fs::is_directory(init) ? fs::path(init) : fs::path();
  if (!from.empty() && fs::is_regular_file(from / "modules.json")) {
    const std::string text = detail::read_input_file((from / "modules.json").string(), kFn, "--init");
    write_file_atomic(dir + "/modules.json", text);
    if (fs::is_regular_file(from / "sentence_bert_config.json"))
      write_file_atomic(dir + "/sentence_bert_config.json",
                        detail::read_input_file((from / "sentence_bert_config.json").string(), kFn, "--init"));
    const auto modules = nlohmann::json::parse(text, nullptr, false);
    if (!modules.is_array()) fail_format(kFn, "--init '" + init + "': modules.json is not a JSON array");
    for (const auto& m : modules) {
      const std::string path = m.is_object() ? m.value("path", "") : "";
      if (path.empty() || path == "." || path.find("..") != std::string::npos) continue;
      fs::create_directories(dir + "/" + path);
      if (fs::is_regular_file(from / path / "config.json"))
        write_file_atomic(dir + "/" + path + "/config.json",
                          detail::read_input_file((from / path / "config.json").string(), kFn, "--init"));
    }
    return;
  }
  const nlohmann::json modules = nlohmann::json::array(
      {{{"idx", 0}, {"name", "0"}, {"path", ""}, {"type", "sentence_transformers.models.Transformer"}},
       {{"idx", 1}, {"name", "1"}, {"path", "1_Pooling"}, {"type", "sentence_transformers.models.Pooling"}}});
  write_file_atomic(dir + "/modules.json", modules.dump(2) + "\n");
  fs::create_directories(dir + "/1_Pooling");
  write_file_atomic(dir + "/1_Pooling/config.json",
                    nlohmann::json{{"word_embedding_dimension", c.dim}, {"pooling_mode_cls_token", false},
                                   {"pooling_mode_mean_tokens", true}, {"pooling_mode_max_tokens", false}}
                            .dump(2) + "\n");
  write_file_atomic(dir + "/sentence_bert_config.json",
                    nlohmann::json{{"max_seq_length", c.seq_len}, {"do_lower_case", false}}.dump(2) + "\n");
}

// The weights alone with model.json (qkv's config) beside them: what qkv::load_weights, `qkv
// generate --model`, `qkv inspect --model` and qkv.Model.load read. A Llama (rotary, RMSNorm, SwiGLU,
// no biases) is written as a Hugging Face LlamaForCausalLM folder and a GPT-2 (learned positions,
// LayerNorm, GELU, H = Hkv) as a GPT2LMHeadModel folder — model.safetensors under HF's names (Llama:
// q/k rows in HF's rotate-half order; GPT-2: Conv1D [in, out] weights, W_Q/W_K/W_V fused in c_attn)
// and config.json — which transformers loads as well. HF's GPT-2 always has biases: a GPT-2 trained
// without them is written with zero biases (the same function), and its model.json says bias: true,
// so that qkv reads the folder as transformers does. An encoder is written as a BertForMaskedLM
// (bert.* and cls.predictions.*) with the sentence-transformers modules beside it, a folder that
// `qkv embed` (qkv::Encoder::load) and transformers' BertForMaskedLM and BertModel load. Any other
// model is written under qkv's names.
void export_model(const std::string& dir, const Trainable<float>& m, const std::string& init) {
  const Config& c = m.config();
  const Weights w = m.to_weights();
  const bool bert = !c.causal && c.pos == PosEncoding::learned && c.norm == NormKind::layernorm &&
                    c.mlp != MlpKind::swiglu && c.bias && c.n_kv_heads == c.n_heads && c.type_vocab_size > 0;
  const bool llama = c.causal && c.pos == PosEncoding::rotary && c.norm == NormKind::rmsnorm && c.mlp == MlpKind::swiglu && !c.bias;
  const bool gpt2 = c.causal && c.pos == PosEncoding::learned && c.norm == NormKind::layernorm &&
                    (c.mlp == MlpKind::gelu || c.mlp == MlpKind::gelu_exact) && c.n_kv_heads == c.n_heads;
  if (!llama && !gpt2 && !bert) {
    save_safetensors(w, dir + "/model.safetensors");
    write_file_atomic(dir + "/model.json", config_to_json(c) + "\n");
    return;
  }
  Config out = c;
  out.bias = out.bias || gpt2;
  const detail::FileLayout hf = bert    ? detail::FileLayout{detail::Layout::hf_bert, "bert."}
                                : llama ? detail::FileLayout{detail::Layout::hf_llama, "model."}
                                        : detail::FileLayout{detail::Layout::hf_gpt2, "transformer."};
  // Every tensor of the HF model zero-filled (a bias the trained model has not stays zero), then
  // each trained parameter written into its place.
  std::map<std::string, std::vector<float>> stored;
  std::map<std::string, std::vector<std::int64_t>> shapes;
  for (const ParamInfo& p : param_layout(out)) {
    const detail::Source src = detail::source_of(hf, out, p.name, p.shape);
    if (shapes.count(src.tensor)) continue;
    std::int64_t n = 1;
    for (auto d : src.shape) n *= d;
    stored[src.tensor].assign(static_cast<std::size_t>(n), 0.0f);
    shapes[src.tensor] = src.shape;
  }
  for (const auto& t : w.tensors()) {
    const detail::Source src = detail::source_of(hf, out, t.name, t.shape);
    detail::unarrange(src, t.shape, t.data, stored.at(src.tensor).data());
  }
  StFile f;
  f.metadata["format"] = "pt";
  for (const auto& [name, v] : stored) f.tensors[name] = st_f32(v.data(), shapes[name]);
  write_safetensors(dir + "/model.safetensors", f);
  const nlohmann::json hf_config = bert    ? detail::hf_bert_config(out)
                                   : llama ? detail::hf_llama_config(out)
                                           : detail::hf_gpt2_config(out);
  write_file_atomic(dir + "/config.json", hf_config.dump(2) + "\n");
  write_file_atomic(dir + "/model.json", config_to_json(out) + "\n");
  if (bert) write_sentence_modules(dir, out, init);
}

// The model flags the caller gave (all of them when o.given is nullopt) that describe another model
// than the checkpoint's `saved`, as "--flag value (the checkpoint has value)".
std::vector<std::string> model_flag_errors(const TrainOptions& o, const Config& saved) {
  auto given = [&](const char* flag) { return !o.given || o.given->count(flag) > 0; };
  std::vector<std::string> errors;
  auto check = [&](const char* flag, const nlohmann::json& want, const nlohmann::json& was) {
    if (given(flag) && want != was)
      errors.push_back("--" + std::string(flag) + " " + (want.is_string() ? want.get<std::string>() : want.dump()) +
                       " (the checkpoint has " + (was.is_string() ? was.get<std::string>() : was.dump()) + ")");
  };
  const ModelFlags& f = o.model;
  if (!f.config_path.empty()) {
    if (given("model-config") &&
        config_to_json(model_config(f, saved.vocab_size), false) != config_to_json(saved, false))
      errors.push_back("--model-config " + f.config_path + " (another model than the checkpoint's " + arch_of(saved) +
                       " model)");
    return errors;
  }
  check("arch", f.arch, arch_of(saved));
  check("layers", f.layers, saved.n_layers);
  check("heads", f.heads, saved.n_heads);
  check("kv-heads", f.kv_heads > 0 ? f.kv_heads : f.heads, saved.n_kv_heads);
  check("d-model", f.embd, saved.dim);
  if (f.hidden_dim > 0) check("hidden-dim", f.hidden_dim, saved.hidden_dim);
  check("bias", f.bias, saved.bias);
  return errors;
}

// Applies the checkpoint's run fields to `o` as described at ResumeField (the model is the
// checkpoint's, `saved`); returns the schedule changes as "name old -> new" for the log.
std::vector<std::string> reconcile_resume(TrainOptions& o, const Config& saved, const std::string& run_text) {
  const auto have_run = nlohmann::json::parse(run_text, nullptr, false);
  if (!have_run.is_object()) fail_format(kFn, "--resume: the checkpoint's \"run\" metadata is not a JSON object");
  std::vector<std::string> errors = model_flag_errors(o, saved), changes;
  for (const ResumeField& f : kResumeFields) {
    if (!have_run.contains(f.key)) fail_format(kFn, std::string("--resume: the checkpoint's metadata has no \"") + f.key + "\"");
    const nlohmann::json want = run_json(o)[f.key];
    const nlohmann::json& was = have_run[f.key];
    if (want == was) continue;
    if (f.schedule) {
      changes.push_back(std::string(f.flag) + " " + was.dump() + " -> " + want.dump());
    } else if (!o.given || o.given->count(f.flag)) {
      errors.push_back("--" + std::string(f.flag) + " " + want.dump() + " (the checkpoint has " + was.dump() + ")");
    } else {
      set_field(o, f.key, was);
    }
  }
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : ", ") + e;
    fail(kFn, "--resume: the checkpoint was trained with other settings, and these cannot change on resume: " + all +
                  "; leave these flags out to keep the checkpoint's values");
  }
  return changes;
}

}  // namespace

Config model_config(const ModelFlags& f, std::int64_t vocab) {
  Config c;
  if (!f.config_path.empty()) {
    c = load_config(f.config_path);
    check_trainable(c, std::string(kFn) + ": --model-config '" + f.config_path + "'");
    if (c.vocab_size != vocab)
      fail(kFn, "--model-config '" + f.config_path + "': vocab_size " + std::to_string(c.vocab_size) +
                    " is not the tokenizer's " + std::to_string(vocab) + " tokens");
    return c;
  }
  std::vector<std::string> bad;
  if (f.arch != "gpt2" && f.arch != "llama" && f.arch != "bert")
    bad.push_back("--arch: must be gpt2, llama or bert, got '" + f.arch + "'");
  auto positive = [&](const char* flag, std::int64_t v, std::int64_t lo) {
    if (v < lo) bad.push_back(std::string(flag) + ": must be >= " + std::to_string(lo) + ", got " + std::to_string(v));
  };
  positive("--layers", f.layers, 1);
  positive("--heads", f.heads, 1);
  positive("--kv-heads", f.kv_heads, 0);
  positive("--d-model", f.embd, 1);
  positive("--hidden-dim", f.hidden_dim, 0);
  positive("--context", f.context, 1);
  const std::int64_t kv = f.kv_heads > 0 ? f.kv_heads : f.heads;
  if (bad.empty() && f.embd % f.heads != 0)
    bad.push_back("--d-model, --heads: the width must be a multiple of heads, got " + std::to_string(f.embd) +
                  " and heads " + std::to_string(f.heads));
  if (bad.empty() && f.heads % kv != 0)
    bad.push_back("--kv-heads: must divide --heads " + std::to_string(f.heads) + ", got " + std::to_string(kv));
  if (bad.empty() && f.arch != "llama" && kv != f.heads)
    bad.push_back("--kv-heads: the " + f.arch + " preset has as many kv heads as heads; use --arch llama for GQA, got " +
                  std::to_string(kv) + " with --heads " + std::to_string(f.heads));
  if (bad.empty() && f.arch == "bert" && f.context < 3)
    bad.push_back("--context: a bert sequence is [CLS] tokens [SEP], at least 3 positions, got " +
                  std::to_string(f.context));
  if (bad.empty() && f.arch == "llama" && (f.embd / f.heads) % 2 != 0)
    bad.push_back("--d-model, --heads: rotary positions (--arch llama) need an even head dim, got " +
                  std::to_string(f.embd) + " / " + std::to_string(f.heads));
  if (!bad.empty()) {
    std::string all;
    for (const auto& e : bad) all += (all.empty() ? "" : "; ") + e;
    fail(kFn, all);
  }
  if (f.arch == "gpt2") {
    // The one GPT-2 preset (learned positions, LayerNorm, GELU MLP of 4·C, tied unembedding) at the
    // flags' sizes, with nanoGPT's exact GELU (nn.GELU(); GPT-2's own is the tanh form) and biases
    // only with --bias.
    c = Config::gpt2_small();
    c.mlp = MlpKind::gelu_exact;
    c.hidden_dim = f.hidden_dim > 0 ? f.hidden_dim : 4 * f.embd;
  } else if (f.arch == "bert") {
    // BERT (BertForMaskedLM): bidirectional, post-LayerNorm blocks, learned positions, two token
    // types, exact GELU MLP of 4·C, biases everywhere (BertModel always has them: --bias is implied),
    // eps 1e-12, the masked-LM head tied to the token embedding.
    c.pos = PosEncoding::learned, c.norm = NormKind::layernorm, c.mlp = MlpKind::gelu_exact;
    c.hidden_dim = f.hidden_dim > 0 ? f.hidden_dim : 4 * f.embd;
    c.causal = false, c.post_norm = true, c.type_vocab_size = 2, c.mlm_head = true, c.tied_embeddings = true;
  } else {
    // llama2.c's model.py: hidden = 4·dim, then ⅔ of it (SwiGLU's three matrices cost what two of
    // 4·dim would), rounded up to a multiple of 32.
    c.pos = PosEncoding::rotary, c.norm = NormKind::rmsnorm, c.mlp = MlpKind::swiglu, c.rope_theta = 10000.0f;
    c.hidden_dim = f.hidden_dim > 0 ? f.hidden_dim : (2 * 4 * f.embd / 3 + 31) / 32 * 32;
    c.tied_embeddings = true;
  }
  c.dim = f.embd, c.n_layers = f.layers, c.n_heads = f.heads, c.n_kv_heads = kv;
  c.vocab_size = vocab, c.seq_len = f.context, c.bias = f.bias || c.post_norm, c.norm_eps = c.post_norm ? 1e-12f : 1e-5f;
  check_trainable(c, kFn);
  return c;
}

std::string arch_of(const Config& c) {
  if (!c.causal)
    return c.post_norm && c.mlm_head && c.pos == PosEncoding::learned && c.norm == NormKind::layernorm &&
                   c.mlp == MlpKind::gelu_exact && c.bias && c.tied_embeddings && c.n_kv_heads == c.n_heads &&
                   c.type_vocab_size == 2
               ? "bert"
               : "custom";
  if (c.post_norm || c.type_vocab_size > 0) return "custom";
  if (c.pos == PosEncoding::learned && c.norm == NormKind::layernorm && c.mlp == MlpKind::gelu_exact &&
      c.tied_embeddings && c.n_kv_heads == c.n_heads)
    return "gpt2";
  if (c.pos == PosEncoding::rotary && c.norm == NormKind::rmsnorm && c.mlp == MlpKind::swiglu && c.tied_embeddings)
    return "llama";
  return "custom";
}

namespace {

// A run from its setup to its end: the options (reconciled with the checkpoint on --resume), the
// corpus split into tokens, the model with AdamW's moments, the batch stream, the loss rows, and the
// output folder, locked for as long as the run lives.
class Run {
 public:
  // The setup: reads and checks the corpus, locks the output folder, builds the tokenizer and the
  // model (new, --init's, or the checkpoint's with its optimiser state and batch stream).
  explicit Run(const TrainOptions& opts);

  TrainStart start() const;
  // The validation loss: the mean over eval_batches fixed batches drawn from the validation tokens.
  double evaluate();
  // Optimiser step st.step (accum micro-batches, clipping, AdamW), which it then counts. Fills
  // row's lr, train_loss and grad_norm; returns the step's time in seconds.
  double step(LossRow& row);
  // Checkpoint, model export, tokenizer, loss.csv and loss.png, each written atomically.
  void write_outputs() const;

  const TrainOptions& options() const { return o_; }
  const State& state() const { return st_; }
  std::int64_t tokens_per_step() const { return B_ * T_ * o_.accum; }
  std::vector<LossRow>& rows() { return rows_; }

 private:
  TrainOptions o_;
  std::string corpus_id_, ckpt_;
  std::optional<OutLock> lock_;
  RunTokenizer tok_;
  std::vector<std::string> schedule_changes_;
  std::vector<std::int32_t> train_ids_, val_ids_;
  std::int64_t B_ = 0, T_ = 0;
  std::optional<Trainable<float>> model_;
  std::vector<float> adam_m_, adam_v_;  // [P] AdamW's moments
  std::vector<DecayRange> decay_;
  Rng rng_;                             // the training batches' stream
  State st_;
  std::vector<LossRow> rows_;
  std::vector<std::int32_t> x_, y_;     // [B, T] one batch: tokens, targets (next tokens; an encoder's masked ones)
  bool encoder_ = false;                // masked-LM batches (mlm_batch) instead of next-token windows
  std::int32_t mask_id_ = -1;           // encoder: the tokenizer's [MASK]
  std::string note_;                    // TrainStart::note
  // One batch of `data` into x_, y_ drawn from rng: next-token windows, or an encoder's masked ones.
  void draw(const std::vector<std::int32_t>& data, Rng& rng);
};

void Run::draw(const std::vector<std::int32_t>& data, Rng& rng) {
  if (encoder_) mlm_batch(data, rng, B_, T_, tok_.file_tokenizer(), mask_id_, x_, y_);
  else sample_batch(data, rng, B_, T_, x_, y_);
}

Run::Run(const TrainOptions& opts) : o_(opts) {
  TrainOptions& o = o_;
  check_options(o);
  namespace fs = std::filesystem;
  const std::string corpus = detail::read_input_file(o.data_path, kFn, "--data");
  check_text(kFn, corpus);
  corpus_id_ = fingerprint(corpus);
  if (!o.resume && o.model.config_path.empty()) model_config(o.model, 1);  // bad flags fail before any work

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec || !fs::is_directory(o.out_dir))
    fail_io(kFn, "--out '" + o.out_dir + "': cannot create the folder" + (ec ? ": " + ec.message() : std::string()));
  lock_.emplace(o.out_dir);  // also the check that the folder can be written, before any work
  ckpt_ = o.out_dir + "/checkpoint.safetensors";
  const bool have_ckpt = fs::exists(ckpt_);
  if (have_ckpt && !o.resume)
    fail(kFn, "--out '" + o.out_dir + "': already holds checkpoint.safetensors; pass --resume to continue it or "
                                      "choose another folder (nothing was overwritten)");
  if (!have_ckpt && o.resume) fail(kFn, "--resume: no checkpoint.safetensors in '" + o.out_dir + "'");

  // Tokenizer: learned from the corpus, or the one a resumed run was trained with.
  StFile saved;
  Config cfg;  // the model: the flags' (vocab from the tokenizer), --init's, or the checkpoint's
  Weights init_weights;
  if (o.resume && !o.init.empty()) fail(kFn, "--init: not with --resume (the weights come from the checkpoint)");
  if (o.resume) {
    saved = read_safetensors(ckpt_);
    if (saved.metadata["format"] == "qkv-train-checkpoint-1")
      fail(kFn, "--resume: '" + ckpt_ + "' was written by an older qkv train (format qkv-train-checkpoint-1: a GPT-2 "
                                        "under nanoGPT's names), which this version cannot continue; start a new run");
    if (saved.metadata["format"] != kFormat)
      fail(kFn, "--resume: '" + ckpt_ + "' is not a qkv training checkpoint (format '" + saved.metadata["format"] +
                    "')");
    if (saved.metadata["corpus"] != corpus_id_)
      fail(kFn, "--data: the checkpoint was trained on another corpus (" + saved.metadata["corpus"] +
                    "), this one is " + corpus_id_);
    tok_ = RunTokenizer::from_metadata(saved.metadata["tokenizer"]);
    cfg = config_from_json(saved.metadata["model"], "--resume: the \"model\" metadata of '" + ckpt_ + "'");
    schedule_changes_ = reconcile_resume(o, cfg, saved.metadata["run"]);
  } else if (!o.init.empty()) {
    init_weights = load_weights(o.init);
    cfg = init_weights.config;
    if (!cfg.causal && !cfg.mlm_head) {  // a BertModel (a sentence-transformers folder): the objective's head is new
      cfg.mlm_head = true;
      note_ = "--init '" + o.init + "' has no masked-LM head: it is initialised (dense N(0, 0.02), LayerNorm 1 and 0, "
              "output bias 0)";
    }
    check_trainable(cfg, std::string(kFn) + ": --init '" + o.init + "'");
    if (o.tokenizer.empty()) o.tokenizer = tokenizer_beside(o.init);
    if (o.tokenizer == "chars" || o.tokenizer == "bpe")
      fail(kFn, "--tokenizer " + o.tokenizer + ": --init's model '" + o.init +
                    "' was trained with a tokenizer of its own; give that file (or leave --tokenizer out to use the one "
                    "beside the model)");
    tok_ = RunTokenizer::from_file(o.tokenizer, cfg.vocab_size);
    if (o.model.context > cfg.seq_len)
      fail(kFn, "--context: " + std::to_string(o.model.context) + " is longer than --init's model allows (seq_len " +
                    std::to_string(cfg.seq_len) + ")");
  } else {
    bool encoder = o.model.arch == "bert";
    if (!o.model.config_path.empty()) {  // a feature training does not implement fails before the tokenizer is read
      const Config mc = load_config(o.model.config_path);
      check_trainable(mc, std::string(kFn) + ": --model-config '" + o.model.config_path + "'");
      encoder = !mc.causal;
    }
    if (encoder) {
      if (o.tokenizer == "chars" || o.tokenizer == "bpe")
        fail(kFn, "--tokenizer " + o.tokenizer + ": an encoder (--arch bert) trains with a WordPiece tokenizer; give "
                                                 "a BERT folder or its tokenizer.json or vocab.txt");
      tok_ = RunTokenizer::from_file(o.tokenizer, 0);
    } else {
      if (o.tokenizer != "chars" && o.tokenizer != "bpe")
        fail(kFn, "--tokenizer '" + o.tokenizer + "': a tokenizer file is a model's own; use it with --init (a new "
                                                   "decoder learns chars or bpe from the corpus)");
      tok_ = RunTokenizer::learn(o, corpus);
    }
    cfg = model_config(o.model, tok_.vocab_size());
  }
  encoder_ = !cfg.causal;
  if (encoder_) {
    if (!tok_.wordpiece())
      fail(kFn, "--tokenizer '" + o.tokenizer + "': an encoder trains with a WordPiece tokenizer (a BERT folder's "
                                                 "tokenizer.json or vocab.txt)");
    const std::vector<int> mask = tok_.file_tokenizer().encode("[MASK]", false, false);
    if (mask.size() != 1)
      fail(kFn, "--tokenizer '" + o.tokenizer + "': the WordPiece vocabulary has no [MASK] token, which masked-LM "
                                                 "training needs");
    mask_id_ = mask[0];
  } else if (tok_.wordpiece()) {
    fail(kFn, "--tokenizer '" + o.tokenizer + "': a WordPiece tokenizer belongs to an encoder (--arch bert)");
  }

  const std::vector<std::int32_t> ids = tok_.encode(corpus);
  const auto n_all = static_cast<std::int64_t>(ids.size());
  const auto n_train = static_cast<std::int64_t>(static_cast<double>(n_all) * (1.0 - o.val_fraction));
  train_ids_.assign(ids.begin(), ids.begin() + n_train);
  val_ids_.assign(ids.begin() + n_train, ids.end());
  T_ = o.model.context, B_ = o.batch;
  if (static_cast<std::int64_t>(val_ids_.size()) <= T_ || n_train <= T_)
    fail(kFn, "--context: " + std::to_string(T_) + " tokens is longer than the corpus allows: " +
                  std::to_string(n_all) + " tokens give " + std::to_string(n_train) + " to train and " +
                  std::to_string(val_ids_.size()) + " to validate, each must exceed the context");

  Trainable<float>& model = model_.emplace(cfg, B_, T_);
  const auto P = static_cast<std::int64_t>(model.params.size());
  adam_m_.assign(static_cast<std::size_t>(P), 0.0f);
  adam_v_.assign(static_cast<std::size_t>(P), 0.0f);
  for (const auto& p : model.layout())
    if (p.decay) decay_.push_back({p.offset, p.offset + p.numel});
  rng_ = Rng(o.seed);
  if (o.resume) {
    for (const auto& p : model.layout()) st_copy_f32(saved, p.name, model.params.data() + p.offset, p.numel, "--resume");
    st_copy_f32(saved, "optimizer.m", adam_m_.data(), P, "--resume");
    st_copy_f32(saved, "optimizer.v", adam_v_.data(), P, "--resume");
    const auto s = st_get_u64(saved, "train.rng", 4, "--resume");
    rng_.set_state({s[0], s[1], s[2], s[3]});
    st_.step = st_get_i64(saved, "train.step", 1, "--resume")[0];
    st_.elapsed_s = std::strtod(saved.metadata["elapsed_s"].c_str(), nullptr);
    rows_ = read_csv_before(o.out_dir + "/loss.csv", st_.step);
    if (st_.step < 0 || st_.step > o.steps)
      fail(kFn, "--steps: the checkpoint is at step " + std::to_string(st_.step) + ", beyond --steps " +
                    std::to_string(o.steps));
  } else {
    if (!note_.empty()) {  // every tensor --init has, the head drawn as a new model's
      Rng init(o.seed ^ kInitStream);
      init_params(model, init);
      for (const auto& t : init_weights.tensors()) {
        const auto p = std::find_if(model.layout().begin(), model.layout().end(),
                                    [&](const ParamInfo& q) { return q.name == t.name; });
        std::copy_n(t.data, p->numel, model.params.data() + p->offset);
      }
    } else if (!o.init.empty()) {
      model.set_weights(init_weights, "--init");
    } else {
      Rng init(o.seed ^ kInitStream);
      init_params(model, init);
    }
  }
  x_.resize(static_cast<std::size_t>(B_ * T_));
  y_.resize(static_cast<std::size_t>(B_ * T_));
}

TrainStart Run::start() const {
  TrainStart s;
  s.params = static_cast<std::int64_t>(model_->params.size());
  s.vocab = model_->config().vocab_size;
  s.tokenizer = o_.tokenizer;
  s.train_tokens = static_cast<std::int64_t>(train_ids_.size());
  s.val_tokens = static_cast<std::int64_t>(val_ids_.size());
  s.first_step = st_.step;
  s.resumed = o_.resume;
  s.schedule_changes = schedule_changes_;
  s.note = note_;
  return s;
}

double Run::evaluate() {
  Rng er(o_.seed ^ kEvalStream);
  double sum = 0;
  for (std::int64_t i = 0; i < o_.eval_batches; ++i) {
    draw(val_ids_, er);
    sum += model_->forward(x_.data(), y_.data());
  }
  return sum / static_cast<double>(o_.eval_batches);
}

double Run::step(LossRow& row) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  Trainable<float>& model = *model_;
  const auto P = static_cast<std::int64_t>(model.params.size());
  row.lr = lr_at(o_.opt, st_.step);
  model.zero_grad();
  double loss = 0;
  for (std::int64_t micro = 0; micro < o_.accum; ++micro) {
    draw(train_ids_, rng_);
    loss += model.forward(x_.data(), y_.data()) / static_cast<double>(o_.accum);
    model.backward(1.0f / static_cast<float>(o_.accum));
  }
  row.grad_norm = clip_grad_norm(model.grads.data(), P, o_.opt.clip);
  adamw_step(model.params.data(), model.grads.data(), adam_m_.data(), adam_v_.data(), P, decay_, o_.opt, row.lr,
             st_.step + 1);
  const double dt = std::chrono::duration<double>(clock::now() - t0).count();
  st_.elapsed_s += dt;
  ++st_.step;
  row.has_train = true;
  row.train_loss = loss;
  return dt;
}

void Run::write_outputs() const {
  save_checkpoint(ckpt_, o_, *model_, adam_m_, adam_v_, rng_, st_, tok_, corpus_id_);
  export_model(o_.out_dir, *model_, o_.init);
  tok_.write(o_.out_dir);
  write_file_atomic(o_.out_dir + "/loss.csv", csv_text(rows_));
  write_file_atomic(o_.out_dir + "/loss.png", loss_curve_png(rows_));
}

}  // namespace

// The loop: validate every eval_interval steps and at the end, one optimiser step at a time,
// checkpoints by count or wall time; stops at `steps`, at the time limit (after at least one step)
// or when hooks.stop turns nonzero, writing everything each time.
TrainSummary train(const TrainOptions& opts, const TrainHooks& hooks) {
  Run run(opts);
  const TrainOptions& o = run.options();
  std::vector<LossRow>& rows = run.rows();
  if (hooks.on_start) hooks.on_start(run.start());
  using clock = std::chrono::steady_clock;
  const std::int64_t first_step = run.state().step;
  double train_seconds = 0, last_val = NAN;
  for (const auto& r : rows)
    if (r.has_val) last_val = r.val_loss;
  TrainSummary out;
  const auto started = clock::now();
  auto last_save = started;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  while (true) {
    const std::int64_t step = run.state().step;
    LossRow row;
    row.step = step;
    out.time_limited = o.time_limit_s > 0 && step > first_step && step < o.steps && since(started) >= o.time_limit_s;
    const bool last = step == o.steps || out.time_limited;
    if (step % o.eval_interval == 0 || last) {
      last_val = run.evaluate();
      row.has_val = true;
      row.val_loss = last_val;
    }
    if (last) {
      row.elapsed_s = run.state().elapsed_s;
      rows.push_back(row);
      break;
    }
    train_seconds += run.step(row);
    const std::int64_t done = run.state().step;
    const double sps = static_cast<double>(done - first_step) / train_seconds;
    row.tokens_per_s = sps * static_cast<double>(run.tokens_per_step());
    row.elapsed_s = run.state().elapsed_s;
    rows.push_back(row);
    if (!std::isfinite(row.train_loss))
      fail_nonfinite(kFn, "training diverged: the loss is " + std::to_string(row.train_loss) + " at step " +
                              std::to_string(row.step) + " (try a lower --lr)");
    if (hooks.on_step) hooks.on_step({done, o.steps, row.train_loss, last_val, row.tokens_per_s, sps, since(started)});
    if (const int stop = hooks.stop ? hooks.stop->load() : 0; stop != 0) {
      run.write_outputs();
      out.interrupted = true;
      out.stop = stop;
      break;
    }
    const bool by_count = o.checkpoint_interval > 0 && done % o.checkpoint_interval == 0;
    const bool by_time = o.checkpoint_interval_s > 0 && since(last_save) >= o.checkpoint_interval_s;
    if ((by_count || by_time) && done < o.steps) {
      run.write_outputs();
      last_save = clock::now();
    }
  }
  if (!out.interrupted) run.write_outputs();
  out.step = run.state().step;
  out.val_loss = last_val;
  out.steps_per_s = train_seconds > 0 ? static_cast<double>(out.step - first_step) / train_seconds : 0;
  return out;
}

}  // namespace qkv::train
