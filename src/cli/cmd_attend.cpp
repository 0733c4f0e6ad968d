// qkv attend — one multi-head attention block on a sentence, one token per word, with random
// embeddings and random weights; prints each head's attention pattern as a grid the way the seeds
// draw it (keys down the left, queries across the top, each column summing to 1).
//
//   qkv attend --prompt "a fluffy blue creature roamed the verdant forest" --heads 2
//   echo "a fluffy blue creature" | qkv attend --prompt - --json   (the sentence from stdin; the
//                                        tokens and every head's pattern as one JSON document)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cli/commands.hpp"
#include "cli/io.hpp"
#include "qkv/mha.hpp"
#include "qkv/types.hpp"

namespace qkv::cli {
namespace {

struct AttendArgs {
  std::string text = "a fluffy blue creature roamed the verdant forest";
  std::int64_t d_model = 16, heads = 1, d_head = 8;
  std::uint64_t seed = 0;
  bool causal = true;
  bool full = false;  // print the whole grid, however many tokens
  bool json = false;
};

// A grid of T tokens is T lines of 9·T characters per head: 64 tokens ≈ 37 kB, 5000 ≈ 225 MB.
// Beyond this many tokens the grid shows the first kGridTokens keys and queries unless --full.
constexpr std::int64_t kGridTokens = 64;

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> w;
  for (std::string s; in >> s;) w.push_back(s);
  return w;
}

// The UTF-8 character at s[i]: its byte length (1 for a byte that starts no valid sequence) and
// its code point (U+FFFD for such a byte).
std::size_t next_char(std::string_view s, std::size_t i, std::uint32_t* cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    *cp = 0xFFFD;
    return 1;
  }
  std::uint32_t v = len == 1 ? c : c & (0x7Fu >> len);
  for (std::size_t k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *cp = 0xFFFD;
      return 1;
    }
    v = (v << 6) | (b & 0x3Fu);
  }
  *cp = v;
  return len;
}

// Columns a terminal gives a code point: 0 for combining marks and zero-width characters, 2 for
// East Asian wide and fullwidth ones (CJK, Hangul, kana, fullwidth forms, emoji), 1 otherwise.
int char_width(std::uint32_t cp) {
  auto in = [cp](std::uint32_t lo, std::uint32_t hi) { return cp >= lo && cp <= hi; };
  if (in(0x0300, 0x036F) || in(0x0483, 0x0489) || in(0x0591, 0x05BD) || in(0x0610, 0x061A) || in(0x064B, 0x065F) ||
      in(0x1AB0, 0x1AFF) || in(0x1DC0, 0x1DFF) || in(0x200B, 0x200F) || in(0x20D0, 0x20FF) ||
      in(0xFE00, 0xFE0F) || in(0xFE20, 0xFE2F) || cp == 0xFEFF)
    return 0;
  if (in(0x1100, 0x115F) || in(0x2E80, 0x303E) || in(0x3041, 0x33FF) || in(0x3400, 0x4DBF) || in(0x4E00, 0x9FFF) ||
      in(0xA000, 0xA4CF) || in(0xAC00, 0xD7A3) || in(0xF900, 0xFAFF) || in(0xFE30, 0xFE4F) || in(0xFF00, 0xFF60) ||
      in(0xFFE0, 0xFFE6) || in(0x1F300, 0x1F64F) || in(0x1F900, 0x1F9FF) || in(0x20000, 0x3FFFD))
    return 2;
  return 1;
}

std::size_t display_width(std::string_view s) {
  std::size_t w = 0;
  std::uint32_t cp = 0;
  for (std::size_t i = 0; i < s.size();) {
    i += next_char(s, i, &cp);
    w += static_cast<std::size_t>(char_width(cp));
  }
  return w;
}

// A label `width` terminal columns wide: padded with spaces, or cut between characters (never
// inside one) to at most width − 1 columns and marked with '~'.
std::string cell(const std::string& s, std::size_t width, bool right) {
  std::size_t w = display_width(s);
  std::string text = s;
  if (w > width) {
    text.clear();
    w = 0;
    std::uint32_t cp = 0;
    for (std::size_t i = 0; i < s.size();) {
      const std::size_t n = next_char(s, i, &cp);
      const auto cw = static_cast<std::size_t>(char_width(cp));
      if (w + cw > width - 1) break;
      text.append(s, i, n);
      w += cw;
      i += n;
    }
    text += '~';
    ++w;
  }
  const std::string pad(width - w, ' ');
  return right ? pad + text : text + pad;
}

void run(AttendArgs a) {
  read_if_stdin("qkv attend", "--prompt", a.text);
  const std::vector<std::string> words = words_of(a.text);
  if (words.empty()) fail("qkv attend", "--prompt: no words in '" + a.text + "'");
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
  std::vector<double> delta_norm(static_cast<std::size_t>(T));
  for (std::int64_t t = 0; t < T; ++t) {
    double n2 = 0.0;
    for (std::int64_t c = 0; c < a.d_model; ++c) n2 += std::pow(delta.ptr<float>()[t * a.d_model + c], 2.0);
    delta_norm[static_cast<std::size_t>(t)] = std::sqrt(n2);
  }
  if (a.json) {
    // pattern[h][i][j]: how much query i attends to key j (each row sums to 1; 0 where masked).
    nlohmann::json heads = nlohmann::json::array();
    const double* p = pattern.ptr<double>();
    for (std::int64_t h = 0; h < a.heads; ++h) {
      nlohmann::json rows = nlohmann::json::array();
      for (std::int64_t i = 0; i < T; ++i) rows.push_back(std::vector<double>(p + (h * T + i) * T, p + (h * T + i + 1) * T));
      heads.push_back(std::move(rows));
    }
    print_json({{"tokens", words},
                {"d_model", a.d_model},
                {"heads", a.heads},
                {"d_head", a.d_head},
                {"seed", a.seed},
                {"causal", a.causal},
                {"pattern", std::move(heads)},
                {"delta_norm", delta_norm}});
    return;
  }

  std::printf("%lld tokens, d_model %lld, %lld head(s) of d_head %lld, random weights (seed %llu)%s\n",
              static_cast<long long>(T), static_cast<long long>(a.d_model), static_cast<long long>(a.heads),
              static_cast<long long>(a.d_head), static_cast<unsigned long long>(a.seed),
              a.causal ? ", causal mask" : "");
  constexpr std::size_t kLabel = 10, kCol = 9;
  const std::int64_t G = a.full ? T : std::min(T, kGridTokens);  // tokens shown in each grid
  for (std::int64_t h = 0; h < a.heads; ++h) {
    std::printf("\nhead %lld: attention pattern (row = key, column = query; each column sums to 1%s)\n",
                static_cast<long long>(h), a.causal ? "; '.' = masked" : "");
    std::string line = cell("", kLabel, false);
    for (std::int64_t i = 0; i < G; ++i) line += " " + cell(words[static_cast<std::size_t>(i)], kCol - 1, true);
    std::printf("%s\n", line.c_str());
    for (std::int64_t j = 0; j < G; ++j) {  // key j
      line = cell(words[static_cast<std::size_t>(j)], kLabel, false);
      for (std::int64_t i = 0; i < G; ++i) {  // query i
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
    if (G < T)
      std::printf("(grid cut to the first %lld of %lld tokens, keys and queries; --full prints all %lld x %lld)\n",
                  static_cast<long long>(G), static_cast<long long>(T), static_cast<long long>(T),
                  static_cast<long long>(T));
  }
  std::printf("\nsize of each token's change |Δe| (the block's output before the residual e + Δe):\n");
  for (std::int64_t t = 0; t < T; ++t)
    std::printf("  %s %.3f\n", cell(words[static_cast<std::size_t>(t)], kLabel, false).c_str(),
                delta_norm[static_cast<std::size_t>(t)]);
}

}  // namespace

void add_attend(CLI::App& app) {
  auto args = std::make_shared<AttendArgs>();
  CLI::App* cmd = app.add_subcommand("attend", "run one attention block on a sentence and print its attention pattern");
  // --prompt, as generate and inspect name the text they run; --text is its older name.
  cmd->add_option("--prompt,--text", args->text, "the sentence, one token per word; - reads it from stdin")
      ->capture_default_str();
  cmd->add_option("--d-model", args->d_model, "embedding width")->check(at_least(1))->capture_default_str();
  cmd->add_option("--heads", args->heads, "attention heads")->check(at_least(1))->capture_default_str();
  cmd->add_option("--d-head", args->d_head, "query/key/value size of each head")->check(at_least(1))->capture_default_str();
  cmd->add_option("--seed", args->seed, "seed of the random embeddings and weights")->capture_default_str();
  add_flag_pair(cmd, "--causal", "--no-causal", [args](bool on) { args->causal = on; },
                "mask later tokens (as GPT does); default on");
  cmd->add_flag("--full", args->full,
                "print the whole grid; without it a text of more than 64 words shows the first 64 (a grid of T "
                "words is about 9·T² characters)");
  cmd->add_flag("--json", args->json,
                "print one JSON document: the tokens, every head's full pattern (pattern[head][query][key]) and "
                "each token's |Δe|");
  cmd->callback([args] { run(*args); });
}

}  // namespace qkv::cli
