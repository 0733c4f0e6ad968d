// Tokenizers, bad input, bit-exact resume and a short training run of qkv::train.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "core/output_file.hpp"
#include "model/safetensors.hpp"
#include "model/text_tokenizer.hpp"
#include "model/trainable.hpp"
#include "qkv/model.hpp"
#include "train/trainer.hpp"
#include "support/temp_path.hpp"

namespace {

namespace fs = std::filesystem;
using qkv::detail::TextTokenizer;

std::string shakespeare() {
  std::ifstream f(std::string(QKV_SOURCE_DIR) + "/data/tinyshakespeare/input.txt", std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("qkv_train_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// The message of the error of type E that f throws (a bad argument unless E says otherwise), or
// "(no error)".
template <class E = std::invalid_argument, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}

// nanoGPT's shakespeare_char has 65 characters: "\n", " ", "!", "$", "&", "'", ",", "-", ".", "3",
// ":", ";", "?", A–Z, a–z.
TEST(Tokenizer, CharsOfShakespeare) {
  const std::string text = shakespeare();
  const auto t = TextTokenizer::learn_chars(text);
  EXPECT_EQ(t.vocab_size(), 65);
  EXPECT_EQ(t.token_text(0), "\n");
  EXPECT_EQ(t.token_text(13), "A");
  const auto ids = t.encode(text.substr(0, 1000));
  EXPECT_EQ(t.decode(ids), text.substr(0, 1000));
  const auto back = TextTokenizer::from_json(t.to_json());
  EXPECT_EQ(back.encode("First Citizen"), t.encode("First Citizen"));
}

TEST(Tokenizer, CharsAreUnicodeCharacters) {
  const auto t = TextTokenizer::learn_chars("héé€");
  EXPECT_EQ(t.vocab_size(), 3);  // h, é, €
  EXPECT_EQ(t.encode("€hé"), (std::vector<std::int32_t>{2, 0, 1}));
  EXPECT_NE(error_of([&] { t.encode("x"); }).find("not in the 3-character vocabulary"), std::string::npos);
}

// Hand-worked: in "aaab aaab" the words are "aaab", " aaab" (counted once each). Pairs: (a,a) ×4,
// (a,b) ×2, (' ',a) ×1, so the first merge is a+a → 256; then "aa" "a" "b": (256,a) ×2 and
// (a,b) ×2 tie, and the smaller pair of ids (97, 98) wins → 257 = "ab".
TEST(Tokenizer, BpeMergesByHand) {
  const auto t = TextTokenizer::learn_bpe("aaab aaab", 258);
  ASSERT_EQ(t.vocab_size(), 258);
  EXPECT_EQ(t.token_text(256), "aa");
  EXPECT_EQ(t.token_text(257), "ab");
  EXPECT_EQ(t.encode("aaab"), (std::vector<std::int32_t>{256, 257}));
}

// On Shakespeare a 512-token BPE round-trips any text (bytes underneath) and compresses: 256 merges
// of English reach about 2 bytes per token (GPT-2's 50,000 reach about 4); 1.8 is a loose floor.
TEST(Tokenizer, BpeOnShakespeare) {
  const std::string text = shakespeare().substr(0, 200000);
  const auto t = TextTokenizer::learn_bpe(text, 512);
  EXPECT_EQ(t.vocab_size(), 512);
  const auto ids = t.encode(text);
  EXPECT_EQ(t.decode(ids), text);
  const double bytes_per_token = static_cast<double>(text.size()) / static_cast<double>(ids.size());
  std::printf("BPE 512: %.2f bytes per token\n", bytes_per_token);
  EXPECT_GT(bytes_per_token, 1.8);
  const std::string odd = "Zebra! ümlaut \x01\t end";
  EXPECT_EQ(t.decode(t.encode(odd)), odd);
  EXPECT_EQ(TextTokenizer::from_json(t.to_json()).encode(text.substr(0, 5000)), t.encode(text.substr(0, 5000)));
}

TEST(Tokenizer, RejectsBinaryAndEmpty) {
  EXPECT_NE(error_of([] { TextTokenizer::learn_chars(""); }).find("the file is empty"), std::string::npos);
  EXPECT_NE(error_of([] { TextTokenizer::learn_chars(std::string("ab\0c", 4)); }).find("a NUL byte at offset 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { TextTokenizer::learn_bpe("ok \xff\xfe", 300); }).find("invalid byte 0xFF at offset 3"),
            std::string::npos);
}

qkv::train::TrainOptions small_run(const std::string& data, const std::string& out) {
  qkv::train::TrainOptions o;
  o.data_path = data, o.out_dir = out;
  o.model.layers = 2, o.model.heads = 2, o.model.embd = 32, o.model.context = 16;
  o.batch = 4, o.accum = 2, o.steps = 6, o.eval_interval = 3, o.eval_batches = 2, o.checkpoint_interval = 100;
  o.opt.warmup = 2, o.opt.decay_steps = 6;
  return o;
}

TEST(Train, BadInputIsRejectedAndNothingOverwritten) {
  const std::string dir = temp_dir("bad");
  write(dir + "/empty.txt", "");
  write(dir + "/binary.bin", std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10));
  write(dir + "/short.txt", "To be, or not to be: that is the question.\n");
  auto o = small_run(dir + "/empty.txt", dir + "/out");
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("the file is empty"), std::string::npos);
  o.data_path = dir + "/binary.bin";
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("is it a binary file?"), std::string::npos);
  o.data_path = dir + "/short.txt";
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("--context: 16 tokens is longer than the corpus allows"),
            std::string::npos);
  o.data_path = dir + "/missing.txt";
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("--data '" + dir + "/missing.txt': no such file"), std::string::npos);

  // A finished run, then the same folder without --resume, and with a different model.
  write(dir + "/corpus.txt", shakespeare().substr(0, 20000));
  o = small_run(dir + "/corpus.txt", dir + "/run");
  o.steps = 2;
  qkv::train::train(o);
  const auto before = fs::last_write_time(dir + "/run/checkpoint.safetensors");
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("already holds checkpoint.safetensors"), std::string::npos);
  o.resume = true;
  o.model.embd = 64;
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("--d-model 64 (the checkpoint has 32)"), std::string::npos);
  o.model.embd = 32;
  o.data_path = dir + "/short.txt";
  EXPECT_NE(error_of([&] { qkv::train::train(o); }).find("trained on another corpus"), std::string::npos);
  EXPECT_EQ(fs::last_write_time(dir + "/run/checkpoint.safetensors"), before);
  for (const auto& e : fs::directory_iterator(dir + "/run"))
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  fs::remove_all(dir);
}

// Issue #16, defect 11: --resume takes the model and the run's fixed settings from the checkpoint
// when they are not given, lets the schedule change, and names a given flag that differs with both
// values in one short message (before: two 400-character JSON dumps, for a changed --steps too).
TEST(Train, ResumeTakesTheCheckpointsSettingsAndTheScheduleMayChange) {
  const std::string dir = temp_dir("resume_flags");
  write(dir + "/corpus.txt", shakespeare().substr(0, 20000));
  auto o = small_run(dir + "/corpus.txt", dir + "/run");
  o.steps = 2;
  qkv::train::train(o);
  // Only the schedule given (as `qkv train --resume --steps 4 --lr 5e-4`): the model is the
  // checkpoint's although these options hold the defaults (6 layers, d_model 384, ...).
  qkv::train::TrainOptions r;
  r.data_path = o.data_path, r.out_dir = o.out_dir, r.resume = true;
  r.steps = 4, r.opt.decay_steps = 4, r.opt.lr = 5e-4, r.eval_batches = 1;
  r.given = std::set<std::string>{"steps", "lr", "eval-batches"};
  EXPECT_EQ(qkv::train::train(r).step, 4);
  // A model flag and a run flag given with other values: both named with both values.
  r.steps = 6, r.opt.decay_steps = 6;
  r.model.layers = 3, r.batch = 5;
  r.given = std::set<std::string>{"steps", "layers", "batch"};
  const std::string m = error_of([&] { qkv::train::train(r); });
  std::printf("refused: %s\n", m.c_str());
  EXPECT_NE(m.find("--layers 3 (the checkpoint has 2), --batch 5 (the checkpoint has 4)"), std::string::npos) << m;
  EXPECT_LT(m.size(), 300u);
  fs::remove_all(dir);
}

// Issue #16, defect 8: a folder another run holds (flock on .qkv-train.lock, pid inside) is
// refused naming the folder and the pid; temporaries have names of their own, so a stale
// "<file>.tmp" (here a folder, which nothing can open for writing) does not stop a write.
TEST(Train, LockedFolderIsRefusedAndTemporariesAreUnique) {
  const std::string dir = temp_dir("lock");
  write(dir + "/corpus.txt", shakespeare().substr(0, 20000));
  fs::create_directories(dir + "/run");
  const int fd = ::open((dir + "/run/.qkv-train.lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string pid = std::to_string(::getpid()) + "\n";
  ASSERT_EQ(::write(fd, pid.data(), pid.size()), static_cast<ssize_t>(pid.size()));
  auto o = small_run(dir + "/corpus.txt", dir + "/run");
  o.steps = 1;
  const std::string m = error_of([&] { qkv::train::train(o); });
  EXPECT_NE(m.find("--out '" + dir + "/run': another qkv train (pid " + std::to_string(::getpid()) + ") is writing"),
            std::string::npos) << m;
  ::close(fd);  // released: the run goes ahead
  fs::create_directories(dir + "/run/tokenizer.json.tmp");
  EXPECT_EQ(qkv::train::train(o).step, 1);
  EXPECT_TRUE(fs::is_regular_file(dir + "/run/tokenizer.json"));
  fs::remove_all(dir);
}

// Issue #16, defect 19: a write that fails part way (a file size limit, as a full disk) throws
// naming the file and errno's text, and leaves no temporary behind.
TEST(Train, FailedWriteRemovesItsTemporary) {
  const std::string dir = temp_dir("full");
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a signal
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string m =
      error_of<qkv::IoError>([&] { qkv::detail::write_file_atomic(dir + "/big.bin", std::string(10000, 'x'), "test"); });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  std::printf("refused: %s\n", m.c_str());
  EXPECT_NE(m.find(dir + "/big.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("File too large"), std::string::npos) << m;
  EXPECT_TRUE(fs::is_empty(dir)) << "a temporary was left in " << dir;
  fs::remove_all(dir);
}

// 6 steps straight, and 3 steps + resume to 6: weights, AdamW moments and RNG state are the same
// bytes (the run is deterministic: fixed reduction orders, the same threads, the same batches).
TEST(Train, ResumeIsBitExact) {
  const std::string dir = temp_dir("resume");
  write(dir + "/corpus.txt", shakespeare().substr(0, 50000));
  auto a = small_run(dir + "/corpus.txt", dir + "/straight");
  qkv::train::train(a);
  auto b = small_run(dir + "/corpus.txt", dir + "/resumed");
  b.steps = 3;
  qkv::train::train(b);
  b.steps = 6;
  b.resume = true;
  const auto r = qkv::train::train(b);
  EXPECT_EQ(r.step, 6);
  const auto fa = qkv::detail::read_safetensors(dir + "/straight/checkpoint.safetensors");
  const auto fb = qkv::detail::read_safetensors(dir + "/resumed/checkpoint.safetensors");
  ASSERT_EQ(fa.tensors.size(), fb.tensors.size());
  int differing = 0;
  for (const auto& [name, t] : fa.tensors) differing += fb.tensors.at(name).bytes != t.bytes;
  std::printf("%zu tensors compared byte for byte, %d differ\n", fa.tensors.size(), differing);
  EXPECT_EQ(differing, 0);
  fs::remove_all(dir);
}

// The hooks: on_start sees the run's sizes, on_step every step with its loss, and a stop flag set
// during step 2 stops the run there with everything saved; resuming it to step 6 ends byte for byte
// where an uninterrupted run does (the stop is a checkpoint like any other).
TEST(Train, HooksReportEachStepAndTheStopFlagStopsWithEverythingSaved) {
  const std::string dir = temp_dir("hooks");
  write(dir + "/corpus.txt", shakespeare().substr(0, 50000));
  auto a = small_run(dir + "/corpus.txt", dir + "/straight");
  qkv::train::train(a);
  auto b = small_run(dir + "/corpus.txt", dir + "/stopped");
  std::atomic<int> stop{0};
  qkv::train::TrainStart start;
  std::vector<qkv::train::TrainProgress> seen;
  qkv::train::TrainHooks hooks;
  hooks.on_start = [&](const qkv::train::TrainStart& s) { start = s; };
  hooks.on_step = [&](const qkv::train::TrainProgress& p) {
    seen.push_back(p);
    if (p.step == 2) stop = 7;
  };
  hooks.stop = &stop;
  const auto r = qkv::train::train(b, hooks);
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.stop, 7);
  EXPECT_EQ(r.step, 2);
  // 50,000 one-byte characters, 90 % to train: 45,000 / 5,000 tokens (chars); P from the layout.
  EXPECT_EQ(start.train_tokens, 45000);
  EXPECT_EQ(start.val_tokens, 5000);
  EXPECT_EQ(start.params, qkv::param_count(qkv::train::model_config(b.model, start.vocab)));
  EXPECT_FALSE(start.resumed);
  ASSERT_EQ(seen.size(), 2u);
  // loss.csv (written at the stop) holds the same training losses the hook saw, and the stop's
  // checkpoint is at step 2.
  std::ifstream csv(dir + "/stopped/loss.csv");
  std::string line;
  std::getline(csv, line);
  ASSERT_EQ(line.rfind("step,lr,train_loss,", 0), 0u) << line;
  std::vector<double> csv_loss;
  while (std::getline(csv, line)) {
    std::stringstream ss(line);
    std::string step, lr, loss;
    std::getline(ss, step, ','), std::getline(ss, lr, ','), std::getline(ss, loss, ',');
    if (!loss.empty()) csv_loss.push_back(std::stod(loss));
  }
  ASSERT_EQ(csv_loss.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(seen[i].step, static_cast<std::int64_t>(i) + 1);
    EXPECT_EQ(seen[i].steps, 6);
    EXPECT_NEAR(seen[i].loss, csv_loss[i], 1e-6);  // the CSV prints 6 decimals
  }
  const auto fs2 = qkv::detail::read_safetensors(dir + "/stopped/checkpoint.safetensors");
  EXPECT_EQ(qkv::detail::st_get_i64(fs2, "train.step", 1, "test")[0], 2);
  b.resume = true;
  EXPECT_EQ(qkv::train::train(b).step, 6);
  const auto fa = qkv::detail::read_safetensors(dir + "/straight/checkpoint.safetensors");
  const auto fb = qkv::detail::read_safetensors(dir + "/stopped/checkpoint.safetensors");
  int differing = 0;
  for (const auto& [name, t] : fa.tensors) differing += fb.tensors.at(name).bytes != t.bytes;
  EXPECT_EQ(differing, 0);
  fs::remove_all(dir);
}

// 60 steps of a small character model on Shakespeare must beat the unigram entropy of the training
// text (≈ 3.31 nats, computed here): below it the model has learned more than letter frequencies.
TEST(Train, ShortRunBeatsUnigramEntropy) {
  const std::string text = shakespeare();
  const std::string dir = temp_dir("smoke");
  const std::size_t n_train = static_cast<std::size_t>(static_cast<double>(text.size()) * 0.9);
  std::map<char, double> count;
  for (std::size_t i = 0; i < n_train; ++i) count[text[i]] += 1;
  double entropy = 0;
  for (auto [c, k] : count) entropy -= k / static_cast<double>(n_train) * std::log(k / static_cast<double>(n_train));
  auto o = small_run(std::string(QKV_SOURCE_DIR) + "/data/tinyshakespeare/input.txt", dir + "/run");
  o.steps = 60, o.accum = 1, o.batch = 16, o.eval_interval = 60, o.eval_batches = 4;
  o.opt.lr = 1e-2, o.opt.warmup = 5, o.opt.decay_steps = 60;
  const auto r = qkv::train::train(o);
  std::printf("unigram entropy %.4f, validation loss after 60 steps %.4f\n", entropy, r.val_loss);
  EXPECT_LT(r.val_loss, entropy);
  for (const char* f : {"checkpoint.safetensors", "model.safetensors", "model.json", "tokenizer.json", "loss.csv", "loss.png"})
    EXPECT_TRUE(fs::exists(dir + "/run/" + f)) << f;
  fs::remove_all(dir);
}

// Issue #24, bad input: resuming with another architecture, --init with a tokenizer that is not the
// model's, a model config naming a feature training does not implement: one clear error each, and
// nothing in the folder is overwritten.
TEST(Train, ArchitectureMismatchesAreRefused) {
  const std::string dir = temp_dir("arch");
  write(dir + "/corpus.txt", shakespeare().substr(0, 20000));
  auto o = small_run(dir + "/corpus.txt", dir + "/run");
  o.steps = 2;
  qkv::train::train(o);
  const auto before = fs::last_write_time(dir + "/run/checkpoint.safetensors");
  qkv::train::TrainOptions r = o;
  r.resume = true, r.steps = 4, r.opt.decay_steps = 4;
  r.model.arch = "llama";
  r.given = std::set<std::string>{"steps", "arch"};
  std::string m = error_of([&] { qkv::train::train(r); });
  EXPECT_NE(m.find("--arch llama (the checkpoint has gpt2)"), std::string::npos) << m;

  // stories260K (vocabulary 512) with the 58-character tokenizer the run above learned.
  auto f = small_run(dir + "/corpus.txt", dir + "/finetune");
  f.init = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin";
  f.tokenizer = dir + "/run/tokenizer.json";
  m = error_of([&] { qkv::train::train(f); });
  EXPECT_NE(m.find("58 tokens, but the model's vocabulary has 512"), std::string::npos) << m;
  f.tokenizer = "chars";
  m = error_of([&] { qkv::train::train(f); });
  EXPECT_NE(m.find("--tokenizer chars: --init's model"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(dir + "/finetune/checkpoint.safetensors"));
  // No --tokenizer and none beside the model (the finder that generate and inspect use too).
  fs::create_directories(dir + "/bare");
  fs::copy_file(f.init, dir + "/bare/model.bin");
  f.init = dir + "/bare/model.bin";
  f.tokenizer.clear();
  m = error_of([&] { qkv::train::train(f); });
  EXPECT_NE(m.find("--tokenizer: not given, and no tokenizer.json, tokenizer.bin or tok*.bin beside --init"),
            std::string::npos)
      << m;
  // Two candidates: which one is meant cannot be told.
  write(dir + "/bare/tok512.bin", "x");
  write(dir + "/bare/tok4096.bin", "x");
  m = error_of([&] { qkv::train::train(f); });
  EXPECT_NE(m.find("holds several tok*.bin"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(dir + "/finetune/checkpoint.safetensors"));

  // A BertModel config (bidirectional, post-norm, token types, but no masked-LM head: no objective)
  // for a new model.
  write(dir + "/bert.json", R"({"model_type": "bert", "hidden_size": 16, "intermediate_size": 32,
      "num_attention_heads": 2, "num_hidden_layers": 1, "vocab_size": 58, "max_position_embeddings": 16})");
  auto b = small_run(dir + "/corpus.txt", dir + "/bert");
  b.model.config_path = dir + "/bert.json";
  m = error_of([&] { qkv::train::train(b); });
  EXPECT_NE(m.find("mlm_head: a bidirectional encoder (causal: false) trains with the masked-LM objective"),
            std::string::npos)
      << m;
  EXPECT_EQ(fs::last_write_time(dir + "/run/checkpoint.safetensors"), before);
  fs::remove_all(dir);
}

// --init fine-tunes stories260K with its own llama2.c tokenizer (found beside it): the loss falls
// from the model's own on the corpus, and the result is a model folder with tokenizer.bin.
TEST(Train, InitFineTunesStories260K) {
  const std::string dir = temp_dir("init");
  write(dir + "/corpus.txt", shakespeare().substr(0, 40000));
  auto o = small_run(dir + "/corpus.txt", dir + "/run");
  o.init = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin";
  o.tokenizer.clear();
  o.steps = 12, o.eval_interval = 12, o.opt.decay_steps = 12, o.opt.lr = 2e-3, o.opt.warmup = 1;
  const auto r = qkv::train::train(o);
  std::ifstream csv(dir + "/run/loss.csv");
  std::string line, cell;
  std::getline(csv, line);
  std::getline(csv, line);  // step,lr,train_loss,val_loss,...: step 0's validation is before any update
  std::stringstream cells(line);
  for (int i = 0; i < 4; ++i) std::getline(cells, cell, ',');
  const double before = std::stod(cell);
  std::printf("stories260K on Shakespeare lines: validation loss %.4f before, %.4f after 12 steps\n", before,
              r.val_loss);
  EXPECT_LT(r.val_loss, before - 0.1);  // 12 AdamW steps at 2e-3 move a 260K model measurably toward the text
  EXPECT_TRUE(fs::exists(dir + "/run/tokenizer.bin"));
  const qkv::Weights w = qkv::load_weights(dir + "/run");
  EXPECT_EQ(w.config.vocab_size, 512);
  EXPECT_EQ(w.config.n_kv_heads, 4);
  fs::remove_all(dir);
}

}  // namespace

// BERT's masking (qkv::train::mlm_batch) against its definition, by counting over 20 batches of
// 64 × 32 (≈ 5,800 chosen positions): [CLS] first and [SEP] last, never chosen; every sequence predicts
// at least one position; 15 % of the other positions chosen; of those, [MASK] 80 % + 10 %/V (a random
// draw of [MASK] itself), kept 10 % + 10 %/V, another id 10 %·(V − 2)/V. The bounds, 0.01 and 0.02,
// are ≥ 4 standard deviations of these binomial counts (0.0018 and ≤ 0.0053). A seed fixes the batch.
TEST(Train, MaskedLmBatchesFollowBert) {
  const std::string vocab = qkv::testing::temp_path("mlm_vocab.txt");
  std::ofstream(vocab) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\nsat\n##s\non\nmat\n.\n";
  const qkv::Tokenizer tok = qkv::Tokenizer::load_wordpiece(vocab);
  const std::int32_t mask = 4, V = 12;
  ASSERT_EQ(tok.encode("[MASK]", false, false), std::vector<int>{mask});
  std::vector<std::int32_t> data(5000);
  qkv::train::Rng drng(7);
  for (auto& d : data) d = static_cast<std::int32_t>(5 + drng.below(7));
  const std::int64_t B = 64, T = 32;
  std::vector<std::int32_t> x(B * T), y(B * T), x2(B * T), y2(B * T);
  qkv::train::Rng rng(1), rng2(1), other(2);
  double inner = 0, chosen = 0, masked = 0, kept = 0, changed = 0;
  for (int batch = 0; batch < 20; ++batch) {
    qkv::train::mlm_batch(data, rng, B, T, tok, mask, x, y);
    qkv::train::mlm_batch(data, rng2, B, T, tok, mask, x2, y2);
    ASSERT_EQ(x, x2);
    ASSERT_EQ(y, y2);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int32_t* xb = x.data() + b * T;
      const std::int32_t* yb = y.data() + b * T;
      ASSERT_EQ(xb[0], tok.bos_id());
      ASSERT_EQ(xb[T - 1], tok.eos_id());
      ASSERT_EQ(yb[0], qkv::kIgnoreTarget);
      ASSERT_EQ(yb[T - 1], qkv::kIgnoreTarget);
      int predicted = 0;
      for (std::int64_t t = 1; t < T - 1; ++t) {
        inner += 1;
        if (yb[t] == qkv::kIgnoreTarget) {
          ASSERT_GE(xb[t], 5);  // unchosen: the corpus' own token
          continue;
        }
        ++predicted, chosen += 1;
        ASSERT_GE(yb[t], 5);  // the target is the original token
        if (xb[t] == mask) masked += 1;
        else if (xb[t] == yb[t]) kept += 1;
        else changed += 1;
      }
      ASSERT_GE(predicted, 1);
    }
  }
  std::printf("chosen %.4f of %g; of those [MASK] %.4f, kept %.4f, another id %.4f\n", chosen / inner, inner,
              masked / chosen, kept / chosen, changed / chosen);
  EXPECT_NEAR(chosen / inner, 0.15, 0.01);
  EXPECT_NEAR(masked / chosen, 0.8 + 0.1 / V, 0.02);
  EXPECT_NEAR(kept / chosen, 0.1 + 0.1 / V, 0.02);
  EXPECT_NEAR(changed / chosen, 0.1 * (V - 2) / V, 0.02);
  qkv::train::mlm_batch(data, other, B, T, tok, mask, x2, y2);
  EXPECT_NE(y, y2);  // another seed, another batch
}
