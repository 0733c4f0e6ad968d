// llama2.c's tokenizer file and its byte-pair encoding.
//
//   int32 max_token_length
//   vocab_size × { f32 score, int32 length, length bytes }       (vocab_size comes from the model)
//
// Every length is checked against the bytes that remain and against max_token_length, and the
// file must end exactly after the last token. Tokenizer::load also reads qkv train's
// tokenizer.json (told apart by content), encoding with src/train/tokenizer.hpp.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "model/input_file.hpp"
#include "qkv/model.hpp"
#include "train/tokenizer.hpp"

namespace qkv {

Tokenizer Tokenizer::load(const std::string& path, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  if (vocab_size < 3 || vocab_size > (1 << 22))
    fail(fn, "vocab_size: must be in [3, 4194304] (BOS is 1, EOS is 2), got " + std::to_string(vocab_size));
  const std::string bytes = detail::read_input_file(path, fn, "path", std::size_t{1} << 30);
  // The format by content: JSON starts with '{' (after blanks); a llama2.c file starts with its
  // int32 max_token_length, whose low byte is '{' only for lengths 123, 379, ... and then the
  // JSON parse fails and says it was read as JSON.
  const auto first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && bytes[first] == '{') return load_qkv_json(path, bytes, vocab_size);
  return load_llama2c(path, bytes, vocab_size);
}

Tokenizer Tokenizer::load_qkv_json(const std::string& path, const std::string& bytes, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  const std::string where = "file '" + path + "' (read as qkv train's tokenizer.json: it starts with '{')";
  train::TextTokenizer tt;
  try {
    tt = train::TextTokenizer::from_json(bytes);
  } catch (const std::invalid_argument& e) {
    fail(fn, where + ": " + e.what());
  }
  if (tt.vocab_size() != vocab_size)
    fail(fn, where + ": " + std::to_string(tt.vocab_size()) + " tokens, but the model's vocabulary has " +
                 std::to_string(vocab_size) + ": the tokenizer belongs to another model");
  Tokenizer t;
  t.format_ = Format::qkv_json;
  for (std::int64_t i = 0; i < vocab_size; ++i) t.vocab_.push_back(tt.token_text(static_cast<std::int32_t>(i)));
  t.scores_.assign(static_cast<std::size_t>(vocab_size), 0.0f);
  t.text_ = std::make_shared<const train::TextTokenizer>(std::move(tt));
  t.sorted_.resize(static_cast<std::size_t>(vocab_size));
  for (std::size_t i = 0; i < t.sorted_.size(); ++i) t.sorted_[i] = static_cast<int>(i);
  std::stable_sort(t.sorted_.begin(), t.sorted_.end(), [&t](int a, int b) { return t.piece(a) < t.piece(b); });
  return t;
}

Tokenizer Tokenizer::load_llama2c(const std::string& path, const std::string& bytes, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  const std::string where = "file '" + path + "' (read as a llama2.c tokenizer.bin, binary)";
  std::size_t at = 0;
  auto read_i32 = [&](const char* what, std::int64_t index) {
    if (bytes.size() - at < 4)
      fail(fn, where + ": truncated at byte " + std::to_string(at) + " reading the " + what +
                   (index >= 0 ? " of token " + std::to_string(index) : std::string()) + " (file is " +
                   std::to_string(bytes.size()) + " bytes, vocab_size " + std::to_string(vocab_size) + ")");
    std::int32_t v;
    std::memcpy(&v, bytes.data() + at, 4);
    at += 4;
    return v;
  };
  Tokenizer t;
  t.max_token_length_ = read_i32("max_token_length", -1);
  if (t.max_token_length_ < 1 || t.max_token_length_ > (1 << 16))
    fail(fn, where + ": impossible max_token_length " + std::to_string(t.max_token_length_) + " (expected 1..65536)");
  t.vocab_.reserve(static_cast<std::size_t>(vocab_size));
  t.scores_.reserve(static_cast<std::size_t>(vocab_size));
  for (std::int64_t i = 0; i < vocab_size; ++i) {
    const std::int32_t s = read_i32("score", i);
    float score;
    std::memcpy(&score, &s, 4);
    if (!std::isfinite(score))
      fail(fn, where + ": token " + std::to_string(i) + " has a non-finite score " + std::to_string(score));
    const std::int32_t len = read_i32("length", i);
    if (len < 0 || len > t.max_token_length_)
      fail(fn, where + ": token " + std::to_string(i) + " has impossible length " + std::to_string(len) +
                   " (max_token_length " + std::to_string(t.max_token_length_) + ")");
    if (bytes.size() - at < static_cast<std::size_t>(len))
      fail(fn, where + ": truncated in token " + std::to_string(i) + ": its length " + std::to_string(len) +
                   " runs past the end of the file (" + std::to_string(bytes.size() - at) + " bytes left)");
    t.vocab_.emplace_back(bytes.data() + at, static_cast<std::size_t>(len));
    t.scores_.push_back(score);
    at += static_cast<std::size_t>(len);
  }
  if (at != bytes.size())
    fail(fn, where + ": " + std::to_string(bytes.size() - at) + " bytes left after " + std::to_string(vocab_size) +
                 " tokens: the tokenizer does not match a vocabulary of that size");
  t.sorted_.resize(static_cast<std::size_t>(vocab_size));
  for (std::size_t i = 0; i < t.sorted_.size(); ++i) t.sorted_[i] = static_cast<int>(i);
  std::stable_sort(t.sorted_.begin(), t.sorted_.end(), [&t](int a, int b) { return t.piece(a) < t.piece(b); });
  return t;
}

int Tokenizer::lookup(std::string_view s) const {
  auto it = std::lower_bound(sorted_.begin(), sorted_.end(), s,
                             [this](int id, std::string_view key) { return std::string_view(piece(id)) < key; });
  return it != sorted_.end() && piece(*it) == s ? *it : -1;
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool add_eos) const {
  if (format_ == Format::qkv_json) {
    const std::vector<std::int32_t> ids = text_->encode(text);
    return {ids.begin(), ids.end()};
  }
  std::vector<int> tokens;
  tokens.reserve(text.size() + 3);
  if (add_bos) tokens.push_back(bos);
  // sentencepiece's add_dummy_prefix: a non-empty text starts with a space token.
  if (!text.empty()) {
    const int space = lookup(" ");
    if (space < 0) fail("qkv::Tokenizer::encode", "the vocabulary has no \" \" token for the dummy prefix");
    tokens.push_back(space);
  }
  // One token per UTF-8 character (a lead byte and its continuation bytes, at most 4), or the
  // byte-fallback tokens 3 + byte for a character the vocabulary lacks.
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t n = 1;
    while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    const int id = lookup(text.substr(i, n));
    if (id >= 0) {
      tokens.push_back(id);
    } else {
      for (std::size_t b = 0; b < n; ++b) {
        const int byte = static_cast<unsigned char>(text[i + b]);
        // A vocabulary too small to hold the 256 byte tokens (a file read for the wrong size):
        // refuse rather than index past it (found by fuzz/fuzz_tokenizer.cpp).
        if (byte + 3 >= vocab_size()) {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02X", byte);
          fail("qkv::Tokenizer::encode", std::string("text: byte ") + hex + " at offset " + std::to_string(i + b) +
                                             " has no token, and its byte-fallback token " +
                                             std::to_string(byte + 3) + " is outside the vocabulary of " +
                                             std::to_string(vocab_size()) + " tokens");
        }
        tokens.push_back(byte + 3);
      }
    }
    i += n;
  }
  // Merge the best-scoring adjacent pair until no pair forms a token; ties go to the leftmost pair.
  std::string pair;
  while (true) {
    float best = -1e10f;
    int best_id = -1;
    std::size_t best_at = 0;
    for (std::size_t k = 0; k + 1 < tokens.size(); ++k) {
      pair.assign(piece(tokens[k]));
      pair += piece(tokens[k + 1]);
      const int id = lookup(pair);
      if (id >= 0 && scores_[static_cast<std::size_t>(id)] > best) {
        best = scores_[static_cast<std::size_t>(id)];
        best_id = id;
        best_at = k;
      }
    }
    if (best_id < 0) break;
    tokens[best_at] = best_id;
    tokens.erase(tokens.begin() + static_cast<std::ptrdiff_t>(best_at) + 1);
  }
  if (add_eos) tokens.push_back(eos);
  return tokens;
}

namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The 256 single-byte strings byte-fallback tokens decode to.
const char* byte_piece(int b) {
  static const auto table = [] {
    std::array<char, 512> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<std::size_t>(2 * i)] = static_cast<char>(i);
    return t;
  }();
  return table.data() + 2 * b;
}

}  // namespace

std::string_view Tokenizer::decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size())
    fail("qkv::Tokenizer::decode", "token: must be in [0, " + std::to_string(vocab_size()) + "), got " +
                                       std::to_string(token));
  std::string_view p = piece(token);
  if (format_ == Format::qkv_json) return p;
  if (prev == bos && !p.empty() && p[0] == ' ') p.remove_prefix(1);
  // "<0xXX>" (llama2.c reads it with sscanf("<0x%02hhX>"): one or two hex digits after "<0x").
  if (p.size() >= 4 && p.substr(0, 3) == "<0x" && hex_digit(p[3]) >= 0) {
    int b = hex_digit(p[3]);
    if (p.size() >= 5 && hex_digit(p[4]) >= 0) b = 16 * b + hex_digit(p[4]);
    return {byte_piece(b), 1};
  }
  return p;
}

bool Tokenizer::printable(std::string_view piece) {
  if (piece.empty() || piece[0] == '\0') return false;
  if (piece.size() == 1) {
    // Only control bytes are dropped: a lone byte ≥ 0x80 is part of a UTF-8 character whose
    // bytes come as separate byte-fallback tokens, and dropping it would lose the character.
    const unsigned char c = static_cast<unsigned char>(piece[0]);
    return c >= 0x20 ? c != 0x7F : std::isspace(c) != 0;
  }
  return true;
}

}  // namespace qkv
