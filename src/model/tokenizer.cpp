// The tokenizer module: every tokenizer qkv reads, told apart by content (Tokenizer::load).
//
//   llama2.c's tokenizer.bin (binary):
//     int32 max_token_length
//     vocab_size × { f32 score, int32 length, length bytes }       (vocab_size comes from the model)
//   Every length is checked against the bytes that remain and against max_token_length, and the
//   file must end exactly after the last token.
//   qkv train's tokenizer.json: {"kind": "chars" | "bpe", ...}, learned and encoded by
//   text_tokenizer.hpp.
//   BERT's WordPiece: a Hugging Face tokenizer.json ({"model": {"type": "WordPiece", ...}, ...}) or
//   a vocab.txt, read by Tokenizer::load_wordpiece (at the end of this file).
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <filesystem>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "model/input_file.hpp"
#include "model/json_depth.hpp"
#include "model/text_tokenizer.hpp"
#include "model/unicode.hpp"
#include "qkv/model.hpp"

namespace qkv {

namespace {

constexpr const char* kFormats =
    "Tokenizer::load reads a llama2.c tokenizer.bin (binary), qkv train's tokenizer.json ({\"kind\": \"chars\" "
    "or \"bpe\"}) or a Hugging Face WordPiece tokenizer.json ({\"model\": {\"type\": \"WordPiece\"}})";

bool starts_like_json(const std::string& bytes) {
  const auto first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string::npos && bytes[first] == '{';
}

}  // namespace

Tokenizer Tokenizer::load(const std::string& path, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  if (vocab_size < 3 || vocab_size > (1 << 22))
    fail(fn, "vocab_size: must be in [3, 4194304] (BOS is 1, EOS is 2), got " + std::to_string(vocab_size));
  const std::string bytes = detail::read_input_file(path, fn, "path", std::size_t{1} << 30);
  // The format by content: JSON starts with '{' (after blanks), and its keys say whose it is; a
  // llama2.c file starts with its int32 max_token_length, whose low byte is '{' only for lengths
  // 123, 379, ..., and then the JSON parse fails and says it was read as JSON.
  if (!starts_like_json(bytes)) return load_llama2c(path, bytes, vocab_size);
  const auto j = nlohmann::json::parse(bytes, detail::json_depth_limit(fn, "file '" + path + "'"), false);
  if (!j.is_discarded() && j.is_object() && j.contains("model") && !j.contains("kind")) {
    Tokenizer t = load_wordpiece(path);
    if (t.vocab_size() != vocab_size)
      fail(fn, "file '" + path + "' (read as a Hugging Face WordPiece tokenizer.json: it has \"model\"): " +
                   std::to_string(t.vocab_size()) + " tokens, but the model's vocabulary has " +
                   std::to_string(vocab_size) + ": the tokenizer belongs to another model");
    return t;
  }
  return load_qkv_json(path, bytes, vocab_size);
}

Tokenizer Tokenizer::load_qkv_json(const std::string& path, const std::string& bytes, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  const std::string where = "file '" + path + "' (read as qkv train's tokenizer.json: it starts with '{')";
  detail::TextTokenizer tt;
  try {
    tt = detail::TextTokenizer::from_json(bytes);
  } catch (const FormatError& e) {
    fail_format(fn, where + ": " + e.what() + "; " + kFormats);
  }
  if (tt.vocab_size() != vocab_size)
    fail(fn, where + ": " + std::to_string(tt.vocab_size()) + " tokens, but the model's vocabulary has " +
                 std::to_string(vocab_size) + ": the tokenizer belongs to another model");
  Tokenizer t;
  t.format_ = Format::qkv_json;
  t.bos_id_ = t.eos_id_ = -1;
  for (std::int64_t i = 0; i < vocab_size; ++i) t.vocab_.push_back(tt.token_text(static_cast<std::int32_t>(i)));
  t.scores_.assign(static_cast<std::size_t>(vocab_size), 0.0f);
  t.text_ = std::make_shared<const detail::TextTokenizer>(std::move(tt));  // encodes; no lookups
  return t;
}

Tokenizer Tokenizer::load_llama2c(const std::string& path, const std::string& bytes, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  const std::string where = "file '" + path + "' (read as a llama2.c tokenizer.bin, binary)";
  std::size_t at = 0;
  auto read_i32 = [&](const char* what, std::int64_t index) {
    if (bytes.size() - at < 4)
      fail_format(fn, where + ": truncated at byte " + std::to_string(at) + " reading the " + what +
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
    fail_format(fn, where + ": impossible max_token_length " + std::to_string(t.max_token_length_) + " (expected 1..65536); " +
                 kFormats);
  t.vocab_.reserve(static_cast<std::size_t>(vocab_size));
  t.scores_.reserve(static_cast<std::size_t>(vocab_size));
  for (std::int64_t i = 0; i < vocab_size; ++i) {
    const std::int32_t s = read_i32("score", i);
    float score;
    std::memcpy(&score, &s, 4);
    if (!std::isfinite(score))
      fail_format(fn, where + ": token " + std::to_string(i) + " has a non-finite score " + std::to_string(score));
    const std::int32_t len = read_i32("length", i);
    if (len < 0 || len > t.max_token_length_)
      fail_format(fn, where + ": token " + std::to_string(i) + " has impossible length " + std::to_string(len) +
                   " (max_token_length " + std::to_string(t.max_token_length_) + ")");
    if (bytes.size() - at < static_cast<std::size_t>(len))
      fail_format(fn, where + ": truncated in token " + std::to_string(i) + ": its length " + std::to_string(len) +
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
  if (format_ == Format::wordpiece) return encode_wordpiece(text, add_bos, add_eos);
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
  if (format_ != Format::llama2c) return p;  // qkv_json, wordpiece: the piece as stored
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


// ---------------------------------------------------------------------------------------------
// BERT's WordPiece, as Hugging Face tokenizers runs it (normalizers/bert.rs, pre_tokenizers/bert.rs,
// models/wordpiece): the text is split at added tokens ([CLS], [SEP], ... written in the text);
// every other part is normalised code point by code point, split into words, and each word into
// vocabulary pieces. The Unicode properties come from unicode_tables.cpp (tools/make_unicode_tables.py).
// ---------------------------------------------------------------------------------------------
struct Tokenizer::WordPiece {
  bool clean_text = true, chinese = true, strip_accents = true, lowercase = true;
  std::int64_t max_chars = 100;  // words with more code points are [UNK]
  std::string prefix = "##";     // marks a piece that continues a word
  std::unordered_map<std::string, int> ids;
  int unk = -1;
  std::vector<std::pair<std::string, int>> added;  // matched in the raw text, longest first
};

namespace {

namespace uc = detail::unicode;
const char* const kWp = "qkv::Tokenizer::load_wordpiece";

template <class T>
const T* find_code(std::span<const T> table, char32_t c) {
  auto it = std::upper_bound(table.begin(), table.end(), c, [](char32_t v, const T& e) {
    if constexpr (requires { e.lo; }) return v < e.lo;
    else return v < e.cp;
  });
  if (it == table.begin()) return nullptr;
  --it;
  if constexpr (requires { it->hi; }) return c <= it->hi ? &*it : nullptr;
  else return it->cp == c ? &*it : nullptr;
}

bool is_other(char32_t c) { return find_code(uc::kTables.other, c) != nullptr; }
bool is_mark_nonspacing(char32_t c) { return find_code(uc::kTables.nonspacing_mark, c) != nullptr; }
int combining_class(char32_t c) {
  const auto* e = find_code(uc::kTables.combining_class, c);
  return e ? e->ccc : 0;
}
// Rust's char::is_whitespace (the White_Space property), which both BERT stages use.
bool is_whitespace(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}
// ASCII punctuation (which includes $ + < = > ^ ` | ~, symbols in Unicode) or Unicode P*.
bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  return find_code(uc::kTables.punctuation, c) != nullptr;
}
// The CJK Unified Ideograph blocks BERT spaces out (Hangul, kana and CJK punctuation are not in them).
bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void append_map(std::span<const uc::CodeMap> table, const char32_t* pool, char32_t c, std::u32string& out) {
  if (const auto* e = find_code(table, c)) out.append(pool + e->offset, e->length);
  else out.push_back(c);
}

// NFD: each code point's full canonical decomposition (Hangul syllables by the Unicode algorithm:
// L V [T] jamo), then every run of marks with a non-zero combining class sorted stably by class.
std::u32string nfd(const std::u32string& s) {
  std::u32string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xAC00 && c <= 0xD7A3) {
      const char32_t i = c - 0xAC00;
      out.push_back(0x1100 + i / 588);
      out.push_back(0x1161 + (i % 588) / 28);
      if (i % 28) out.push_back(0x11A7 + i % 28);
    } else {
      append_map(uc::kTables.decomposition, uc::kTables.decomposition_pool, c, out);
    }
  }
  for (std::size_t i = 0; i < out.size();) {
    std::size_t j = i;
    while (j < out.size() && combining_class(out[j]) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j),
                       [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j + 1;
  }
  return out;
}

// UTF-8 → code points; an invalid sequence (bad lead or continuation byte, overlong form,
// surrogate, > U+10FFFF, truncated) is an error naming its byte offset in `text`.
std::u32string utf8_decode(std::string_view text, std::size_t base) {
  std::u32string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    char32_t c = 0;
    const int n = uc::utf8_next(text, i, &c);
    if (n == 0) fail("qkv::Tokenizer::encode", "text: invalid UTF-8 at byte " + std::to_string(base + i));
    out.push_back(c);
    i += static_cast<std::size_t>(n);
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

int vocab_id(const std::unordered_map<std::string, int>& ids, const std::string& token, const std::string& where) {
  auto it = ids.find(token);
  if (it == ids.end()) fail_format(kWp, where + ": the vocabulary has no token \"" + token + "\"");
  return it->second;
}

}  // namespace

Tokenizer Tokenizer::load_wordpiece(const std::string& path) {
  const std::string bytes = detail::read_input_file(path, kWp, "path", std::size_t{1} << 30);
  auto wp = std::make_shared<WordPiece>();
  Tokenizer t;
  t.format_ = Format::wordpiece;
  if (bytes.find('\0') != std::string::npos)
    fail(kWp, "file '" + path + "': binary (it holds NUL bytes), so neither a WordPiece tokenizer.json nor a vocab.txt; "
                                "a llama2.c tokenizer.bin is read by Tokenizer::load");
  if (starts_like_json(bytes)) {
    const std::string where = "file '" + path + "' (read as a Hugging Face tokenizer.json: it starts with '{')";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(bytes, detail::json_depth_limit(kWp, where), true, false);
    } catch (const nlohmann::json::exception& e) {
      fail_format(kWp, where + ": not valid JSON (" + e.what() + ")");
    }
    if (j.is_object() && j.contains("kind") && !j.contains("model"))
      fail(kWp, where + ": it is qkv train's tokenizer.json (\"kind\": " + j["kind"].dump().substr(0, 40) +
                    "), not WordPiece; expected {\"model\": {\"type\": \"WordPiece\"}}");
    try {
      const auto& model = j.at("model");
      if (model.at("type") != "WordPiece")
        fail(kWp, where + ": \"model\".\"type\" is " + model.at("type").dump() + "; qkv reads WordPiece");
      wp->prefix = model.value("continuing_subword_prefix", std::string("##"));
      wp->max_chars = model.value("max_input_chars_per_word", std::int64_t{100});
      for (const auto& [token, id] : model.at("vocab").items()) wp->ids.emplace(token, id.get<int>());
      wp->unk = vocab_id(wp->ids, model.at("unk_token").get<std::string>(), where);
      const auto& norm = j.at("normalizer");
      if (!norm.is_object() || norm.at("type") != "BertNormalizer")
        fail(kWp, where + ": \"normalizer\" is " + norm.dump() + "; qkv implements BertNormalizer");
      wp->clean_text = norm.at("clean_text").get<bool>();
      wp->chinese = norm.at("handle_chinese_chars").get<bool>();
      wp->lowercase = norm.at("lowercase").get<bool>();
      wp->strip_accents = norm.at("strip_accents").is_null() ? wp->lowercase : norm.at("strip_accents").get<bool>();
      const auto& pre = j.at("pre_tokenizer");
      if (!pre.is_object() || pre.at("type") != "BertPreTokenizer")
        fail(kWp, where + ": \"pre_tokenizer\" is " + pre.dump() + "; qkv implements BertPreTokenizer");
      // [CLS] and [SEP]: BertProcessing names them; TemplateProcessing's single template must be
      // [special, $A, special].
      const auto& post = j.at("post_processor");
      std::string cls = "[CLS]", sep = "[SEP]";
      if (post.is_object() && post.at("type") == "BertProcessing") {
        cls = post.at("cls").at(0).get<std::string>();
        sep = post.at("sep").at(0).get<std::string>();
      } else if (post.is_object() && post.at("type") == "TemplateProcessing" && post.at("single").size() == 3 &&
                 post.at("single")[0].contains("SpecialToken") && post.at("single")[1].contains("Sequence") &&
                 post.at("single")[2].contains("SpecialToken")) {
        cls = post.at("single")[0].at("SpecialToken").at("id").get<std::string>();
        sep = post.at("single")[2].at("SpecialToken").at("id").get<std::string>();
      } else {
        fail(kWp, where + ": \"post_processor\" is " + post.dump() +
                      "; qkv implements BertProcessing and TemplateProcessing [CLS] $A [SEP]");
      }
      t.bos_id_ = vocab_id(wp->ids, cls, where);
      t.eos_id_ = vocab_id(wp->ids, sep, where);
      for (const auto& a : j.at("added_tokens")) {
        if (a.at("normalized").get<bool>() || a.at("lstrip").get<bool>() || a.at("rstrip").get<bool>() ||
            a.at("single_word").get<bool>())
          fail(kWp, where + ": added token " + a.dump() +
                        ": qkv matches added tokens as written (normalized, lstrip, rstrip, single_word false)");
        wp->added.emplace_back(a.at("content").get<std::string>(), a.at("id").get<int>());
      }
    } catch (const nlohmann::json::exception& e) {
      fail_format(kWp, where + ": " + e.what());
    }
  } else {
    // vocab.txt: token i on line i. Settings from tokenizer_config.json beside it (BertTokenizer's
    // do_lower_case, strip_accents, tokenize_chinese_chars), BERT-uncased's when it is absent.
    const std::string where = "file '" + path + "' (read as a vocab.txt: one token per line)";
    std::size_t at = 0;
    for (int id = 0; at < bytes.size(); ++id) {
      std::size_t end = bytes.find('\n', at);
      if (end == std::string::npos) end = bytes.size();
      std::string token = bytes.substr(at, end - at);
      if (!token.empty() && token.back() == '\r') token.pop_back();
      wp->ids.emplace(std::move(token), id);
      at = end + 1;
    }
    const std::string cfg = (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
    if (std::filesystem::exists(cfg)) {
      const std::string cwhere = "file '" + cfg + "'";
      try {
        const auto j = nlohmann::json::parse(detail::read_input_file(cfg, kWp, "tokenizer_config.json", 1 << 20));
        wp->lowercase = j.value("do_lower_case", true);
        wp->strip_accents = !j.contains("strip_accents") || j.at("strip_accents").is_null()
                                ? wp->lowercase
                                : j.at("strip_accents").get<bool>();
        wp->chinese = j.value("tokenize_chinese_chars", true);
        if (!j.value("do_basic_tokenize", true))
          fail(kWp, cwhere + ": \"do_basic_tokenize\" false is not supported (qkv runs BERT's basic tokenisation)");
      } catch (const nlohmann::json::exception& e) {
        fail_format(kWp, cwhere + ": " + e.what());
      }
    }
    wp->unk = vocab_id(wp->ids, "[UNK]", where);
    t.bos_id_ = vocab_id(wp->ids, "[CLS]", where);
    t.eos_id_ = vocab_id(wp->ids, "[SEP]", where);
    for (const char* s : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"})
      if (auto it = wp->ids.find(s); it != wp->ids.end()) wp->added.emplace_back(s, it->second);
  }
  // Ids must be 0 … V − 1, each once: the vocabulary is then a list.
  std::vector<std::string> vocab(wp->ids.size());
  std::vector<bool> seen(wp->ids.size());
  for (const auto& [token, id] : wp->ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= vocab.size() || seen[static_cast<std::size_t>(id)])
      fail_format(kWp, "file '" + path + "': token \"" + token + "\" has id " + std::to_string(id) +
                    ", but the ids of a vocabulary of " + std::to_string(vocab.size()) +
                    " tokens must be 0 … V − 1, each once");
    seen[static_cast<std::size_t>(id)] = true;
    vocab[static_cast<std::size_t>(id)] = token;
  }
  for (const auto& [content, id] : wp->added)
    if (content.empty() || id < 0 || static_cast<std::size_t>(id) >= vocab.size())
      fail_format(kWp, "file '" + path + "': added token \"" + content + "\" (id " + std::to_string(id) +
                    ") is empty or outside the vocabulary");
  // Leftmost-longest matching: at each position the longest added token wins.
  std::stable_sort(wp->added.begin(), wp->added.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  t.vocab_ = std::move(vocab);
  t.scores_.assign(t.vocab_.size(), 0.0f);
  t.wp_ = std::move(wp);
  return t;
}

std::vector<int> Tokenizer::encode_wordpiece(std::string_view text, bool add_bos, bool add_eos) const {
  const WordPiece& wp = *wp_;
  std::vector<int> out;
  if (add_bos) out.push_back(bos_id_);
  std::string word;  // one word's bytes, then its candidate pieces
  // A word (code points) → pieces: the longest vocabulary prefix, then the longest "##" piece from
  // where it ended, and so on; a word with a missing piece, or too long, is one [UNK].
  auto wordpiece = [&](std::span<const char32_t> w) {
    if (static_cast<std::int64_t>(w.size()) > wp.max_chars) {
      out.push_back(wp.unk);
      return;
    }
    const std::size_t first = out.size();
    for (std::size_t start = 0; start < w.size();) {
      int id = -1;
      std::size_t end = w.size();
      for (; end > start; --end) {
        word = start > 0 ? wp.prefix : std::string();
        for (std::size_t k = start; k < end; ++k) utf8_append(word, w[k]);
        if (auto it = wp.ids.find(word); it != wp.ids.end()) {
          id = it->second;
          break;
        }
      }
      if (id < 0) {
        out.resize(first);
        out.push_back(wp.unk);
        return;
      }
      out.push_back(id);
      start = end;
    }
  };
  // One part of the text between added tokens: normalise, then split into words.
  auto part = [&](std::string_view raw, std::size_t base) {
    const std::u32string in = utf8_decode(raw, base);
    std::u32string s;
    s.reserve(in.size());
    for (char32_t c : in) {
      if (wp.clean_text) {
        if (c == 0 || c == 0xFFFD || (c != '\t' && c != '\n' && c != '\r' && is_other(c))) continue;
        if (is_whitespace(c)) c = ' ';
      }
      if (wp.chinese && is_chinese(c)) {
        s += U' ';
        s += c;
        s += U' ';
      } else {
        s += c;
      }
    }
    if (wp.strip_accents) {
      std::u32string d = nfd(s);
      s.clear();
      for (char32_t c : d)
        if (!is_mark_nonspacing(c)) s += c;
    }
    if (wp.lowercase) {
      std::u32string l;
      l.reserve(s.size());
      for (char32_t c : s) append_map(uc::kTables.lowercase, uc::kTables.lowercase_pool, c, l);
      s = std::move(l);
    }
    std::size_t w0 = 0;  // start of the current word
    auto flush = [&](std::size_t end) {
      if (end > w0) wordpiece(std::span<const char32_t>(s.data() + w0, end - w0));
    };
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (is_whitespace(s[i])) {
        flush(i);
        w0 = i + 1;
      } else if (is_punctuation(s[i])) {
        flush(i);
        wordpiece(std::span<const char32_t>(s.data() + i, 1));
        w0 = i + 1;
      }
    }
    flush(s.size());
  };
  std::size_t from = 0;
  for (std::size_t i = 0; i < text.size();) {
    const auto hit = std::find_if(wp.added.begin(), wp.added.end(),
                                  [&](const auto& a) { return text.substr(i, a.first.size()) == a.first; });
    if (hit == wp.added.end()) {
      ++i;
      continue;
    }
    part(text.substr(from, i - from), from);
    out.push_back(hit->second);
    i += hit->first.size();
    from = i;
  }
  part(text.substr(from), from);
  if (add_eos) out.push_back(eos_id_);
  return out;
}

}  // namespace qkv
