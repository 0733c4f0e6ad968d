// qkv attend — one multi-head attention block on a sentence, one token per word, with random
// embeddings and random weights; prints each head's attention pattern as a grid the way the seeds
// draw it (keys down the left, queries across the top, each column summing to 1).
//
//   qkv attend --text "a fluffy blue creature roamed the verdant forest" --heads 2
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.hpp"
#include "qkv/mha.hpp"
#include "qkv/types.hpp"

namespace qkv::cli {
namespace {

struct AttendArgs {
  std::string text = "a fluffy blue creature roamed the verdant forest";
  std::int64_t d_model = 16, heads = 1, d_head = 8;
  std::uint64_t seed = 0;
  bool causal = true;
};

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// A label of exactly `width` characters (cut with '~' when too long).
std::string cell(const std::string& s, std::size_t width, bool right) {
  if (s.size() > width) return s.substr(0, width - 1) + "~";
  const std::string pad(width - s.size(), ' ');
  return right ? pad + s : s + pad;
}

void run(const AttendArgs& a) {
  const std::vector<std::string> words = words_of(a.text);
  if (words.empty()) fail("qkv attend", "--text: no words in '" + a.text + "'");
  const auto T = static_cast<std::int64_t>(words.size());
  MultiHeadAttention block({.d_model = a.d_model, .n_heads = a.heads, .d_head = a.d_head});
  block.init_random(a.seed);

  // One random embedding per distinct word (the same word always gets the same vector).
  Buffer e(DType::f32, {1, T, a.d_model});
  for (std::int64_t t = 0; t < T; ++t) {
    std::uint64_t fnv = 14695981039346656037ull;  // FNV-1a of the word: the same on every platform
    for (unsigned char ch : words[static_cast<std::size_t>(t)]) fnv = (fnv ^ ch) * 1099511628211ull;
    std::mt19937_64 rng(fnv ^ a.seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (std::int64_t c = 0; c < a.d_model; ++c) e.ptr<float>()[t * a.d_model + c] = dist(rng);
  }
  Buffer delta(DType::f32, {1, T, a.d_model}), pattern(DType::f64, {1, a.heads, T, T});
  AttentionOptions opt;
  opt.causal = a.causal;
  block.forward(e.view(), std::nullopt, opt, delta.view(), std::nullopt, pattern.view());

  std::printf("%lld tokens, d_model %lld, %lld head(s) of d_head %lld, random weights (seed %llu)%s\n",
              static_cast<long long>(T), static_cast<long long>(a.d_model), static_cast<long long>(a.heads),
              static_cast<long long>(a.d_head), static_cast<unsigned long long>(a.seed),
              a.causal ? ", causal mask" : "");
  constexpr std::size_t kLabel = 10, kCol = 9;
  for (std::int64_t h = 0; h < a.heads; ++h) {
    std::printf("\nhead %lld: attention pattern (row = key, column = query; each column sums to 1%s)\n",
                static_cast<long long>(h), a.causal ? "; '.' = masked" : "");
    std::string line = cell("", kLabel, false);
    for (const std::string& w : words) line += " " + cell(w, kCol - 1, true);
    std::printf("%s\n", line.c_str());
    for (std::int64_t j = 0; j < T; ++j) {  // key j
      line = cell(words[static_cast<std::size_t>(j)], kLabel, false);
      for (std::int64_t i = 0; i < T; ++i) {  // query i
        char buf[32];
        if (a.causal && j > i) {
          std::snprintf(buf, sizeof buf, "%*s", static_cast<int>(kCol), ".");
        } else {
          std::snprintf(buf, sizeof buf, "%*.2f", static_cast<int>(kCol), pattern.ptr<double>()[(h * T + i) * T + j]);
        }
        line += buf;
      }
      std::printf("%s\n", line.c_str());
    }
  }
  std::printf("\nsize of each token's change |Δe| (the block's output before the residual e + Δe):\n");
  for (std::int64_t t = 0; t < T; ++t) {
    double n2 = 0.0;
    for (std::int64_t c = 0; c < a.d_model; ++c) n2 += std::pow(delta.ptr<float>()[t * a.d_model + c], 2.0);
    std::printf("  %s %.3f\n", cell(words[static_cast<std::size_t>(t)], kLabel, false).c_str(), std::sqrt(n2));
  }
}

}  // namespace

void add_attend(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* cmd = app.add_subcommand("attend", "run one attention block on a sentence and print its attention pattern");
  cmd->add_option("--text", args->text, "the sentence, one token per word")->capture_default_str();
  cmd->add_option("--d-model", args->d_model, "embedding width")->check(at_least(1))->capture_default_str();
  cmd->add_option("--heads", args->heads, "attention heads")->check(at_least(1))->capture_default_str();
  cmd->add_option("--d-head", args->d_head, "query/key/value size of each head")->check(at_least(1))->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of the random embeddings and weights")->capture_default_str();
  cmd->add_flag("--causal,!--no-causal", args->causal, "mask later tokens (as GPT does); default on");
  cmd->callback([args] { run(*args); });
}

}  // namespace qkv::cli
