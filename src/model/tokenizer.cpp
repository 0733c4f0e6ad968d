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
#include <queue>
#include <string>
#include <tuple>

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
    "or \"bpe\"}), a Hugging Face tokenizer.json ({\"model\": {\"type\": \"WordPiece\" or \"BPE\"}}) or GPT-2's "
    "vocab.json + merges.txt";

bool starts_like_json(const std::string& bytes) {
  const auto first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string::npos && bytes[first] == '{';
}

// Added tokens (special tokens written in the text) are matched first, at the leftmost position and
// longest first (`added` is sorted that way); the text between them goes to part(piece, offset)
// and each match's id to out. Shared by WordPiece and Hugging Face BPE.
template <class Part>
void split_added(std::string_view text, const std::vector<std::pair<std::string, int>>& added, std::vector<int>& out,
                 Part&& part) {
  std::size_t from = 0;
  for (std::size_t i = 0; i < text.size();) {
    const auto hit = std::find_if(added.begin(), added.end(),
                                  [&](const auto& a) { return text.substr(i, a.first.size()) == a.first; });
    if (hit == added.end()) {
      ++i;
      continue;
    }
    part(text.substr(from, i - from), from);
    out.push_back(hit->second);
    i += hit->first.size();
    from = i;
  }
  part(text.substr(from), from);
}

}  // namespace

// Hugging Face BPE's settings (the tokenizer's style decides how decode reads a piece).
struct Tokenizer::Bpe {
  enum class Style : std::uint8_t { byte_level, metaspace };
  // metaspace: when "▁" goes before a part: every part (the legacy normalizer Prepend), a part
  // not starting with "▁" (Metaspace "always"), only such a part at the text's start ("first").
  enum class Prepend : std::uint8_t { every_part, always, first, never };
  Style style = Style::byte_level;
  bool add_prefix_space = false;  // byte-level: " " before a part that does not start with one
  Prepend prepend = Prepend::never;
  bool split = false;  // metaspace: a word starts at each "▁" (Metaspace "split")
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;
  int unk = -1;
  std::unordered_map<std::string, int> ids;                       // pieces as the file spells them
  std::unordered_map<std::uint64_t, std::pair<int, int>> merges;  // (left, right) ids → (rank, merged id)
  std::array<int, 256> byte_ids{};  // byte-level: the id of each byte's character; metaspace: of <0xXX>; -1 if none
  std::vector<std::pair<std::string, int>> added;  // matched in the raw text, longest first
};

Tokenizer Tokenizer::load(const std::string& given, std::int64_t vocab_size) {
  const char* fn = "qkv::Tokenizer::load";
  if (vocab_size < 3 || vocab_size > (1 << 22))
    fail(fn, "vocab_size: must be in [3, 4194304] (BOS is 1, EOS is 2), got " + std::to_string(vocab_size));
  std::string path = given;
  if (std::filesystem::is_directory(given)) {
    path = detail::tokenizer_beside(given, fn, "path");
    if (path.empty())
      fail(fn, "path '" + given + "': is a directory without tokenizer.json, tokenizer.bin, vocab.json or tok*.bin");
  }
  const std::string bytes = detail::read_input_file(path, fn, "path", std::size_t{1} << 30);
  const auto checked = [&](Tokenizer t, const char* as) {
    if (t.vocab_size() != vocab_size)
      fail(fn, "file '" + path + "' (read as " + as + "): " + std::to_string(t.vocab_size()) +
                   " tokens, but the model's vocabulary has " + std::to_string(vocab_size) +
                   ": the tokenizer belongs to another model");
    return t;
  };
  // The format by content: JSON starts with '{' (after blanks), and its keys say whose it is; a
  // llama2.c file starts with its int32 max_token_length, whose low byte is '{' only for lengths
  // 123, 379, ..., and then the JSON parse fails and says it was read as JSON; '#' (GPT-2's
  // merges.txt) is the low byte of lengths 35, 291, ..., then followed by "version".
  if (std::string_view(bytes).starts_with("#version")) return checked(load_hf_bpe(path, bytes, true), "GPT-2's merges.txt");
  if (!starts_like_json(bytes)) return load_llama2c(path, bytes, vocab_size);
  const auto j = nlohmann::json::parse(bytes, detail::json_depth_limit(fn, "file '" + path + "'"), false);
  if (!j.is_discarded() && j.is_object() && j.contains("model") && !j.contains("kind")) {
    const auto& model = j.at("model");
    if (model.is_object() && model.contains("type") && model.at("type") == "BPE")
      return checked(load_hf_bpe(path, bytes, false), "a Hugging Face BPE tokenizer.json: \"model\".\"type\" is \"BPE\"");
    return checked(load_wordpiece(path), "a Hugging Face WordPiece tokenizer.json: it has \"model\"");
  }
  // GPT-2's vocab.json: a non-empty object of token → integer id, named vocab.json or with
  // merges.txt beside it (a model.json of integers is neither).
  const std::filesystem::path p(path);
  if (!j.is_discarded() && j.is_object() && !j.empty() && !j.contains("kind") &&
      std::all_of(j.begin(), j.end(), [](const auto& v) { return v.is_number_integer(); }) &&
      (p.filename() == "vocab.json" || std::filesystem::is_regular_file(p.parent_path() / "merges.txt")))
    return checked(load_hf_bpe(path, bytes, true), "GPT-2's vocab.json: an object of token → id");
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
  if (format_ == Format::hf_bpe) return encode_bpe(text, add_bos, add_eos);
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
  const bool metaspace = format_ == Format::hf_bpe && bpe_->style == Bpe::Style::metaspace;
  if (format_ != Format::llama2c && !metaspace) return p;  // qkv_json, wordpiece, byte-level: as stored
  const bool strip = !metaspace || bpe_->prepend != Bpe::Prepend::never;  // a "▁" was put before the text
  if (strip && prev == bos_id_ && !p.empty() && p[0] == ' ') p.remove_prefix(1);
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
        fail(kWp, where + ": \"model\".\"type\" is " + model.at("type").dump() +
                      "; load_wordpiece reads WordPiece (Tokenizer::load reads BPE too)");
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
  split_added(text, wp.added, out, part);
  if (add_eos) out.push_back(eos_id_);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Hugging Face BPE (Tokenizer::Bpe above), as Hugging Face tokenizers runs it (added_vocabulary.rs, pre_tokenizers/
// byte_level.rs and metaspace.rs, normalizers Prepend/Replace, models/bpe/word.rs): the text is
// split at added tokens; each other part is split into words; each word starts as one symbol per
// character (byte-level: per byte, in GPT-2's alphabet of 256 printable characters) and the
// adjacent pair of lowest merge rank is merged, leftmost first, until no pair is a merge.
// ---------------------------------------------------------------------------------------------

namespace {

const char* const kBpe = "qkv::Tokenizer::load";
const std::string kSpace = "\xE2\x96\x81";  // "▁" (U+2581), SentencePiece's space

// GPT-2's byte alphabet (bytes_to_unicode): the printable bytes ! … ~, ¡ … ¬, ® … ÿ are their own
// code point; the other 68 bytes, in order, are U+0100, U+0101, …
const std::array<char32_t, 256>& byte_chars() {
  static const auto table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool own = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[static_cast<std::size_t>(b)] = own ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

// The bytes a byte-level piece spells; a piece with a character outside the alphabet (an added
// token such as "<|endoftext|>" is inside it) stands for its own UTF-8 bytes, as tokenizers'
// ByteLevel decoder reads it.
std::string byte_level_bytes(std::string_view piece) {
  static const auto inverse = [] {
    std::unordered_map<char32_t, char> m;
    for (int b = 0; b < 256; ++b) m.emplace(byte_chars()[static_cast<std::size_t>(b)], static_cast<char>(b));
    return m;
  }();
  std::string out;
  for (std::size_t i = 0; i < piece.size();) {
    char32_t c = 0;
    const int n = uc::utf8_next(piece, i, &c);
    const auto it = n ? inverse.find(c) : inverse.end();
    if (it == inverse.end()) return std::string(piece);
    out += it->second;
    i += static_cast<std::size_t>(n);
  }
  return out;
}

bool is_letter(char32_t c) { return find_code(uc::kTables.letter, c) != nullptr; }
bool is_number(char32_t c) { return find_code(uc::kTables.number, c) != nullptr; }

// GPT-2's word split, the regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// written out: calls f(begin, end) for each word of the code points s.
template <class F>
void gpt2_words(const std::u32string& s, F&& f) {
  const std::size_t n = s.size();
  auto other = [](char32_t c) { return !is_whitespace(c) && !is_letter(c) && !is_number(c); };
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    if (s[i] == U'\'' && i + 1 < n) {
      const char32_t a = s[i + 1], b = i + 2 < n ? s[i + 2] : 0;
      if (a == U's' || a == U't' || a == U'm' || a == U'd') j = i + 2;
      else if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) j = i + 3;
    }
    if (j == i) {
      const std::size_t k = s[i] == U' ' && i + 1 < n ? i + 1 : i;  // the optional leading space
      for (auto cls : {is_letter, is_number}) {
        if (j == i && cls(s[k])) {
          j = k;
          while (j < n && cls(s[j])) ++j;
        }
      }
      if (j == i && other(s[k])) {
        j = k;
        while (j < n && other(s[j])) ++j;
      }
    }
    if (j == i) {  // whitespace: all of a run that ends the text, else all but its last character
      while (j < n && is_whitespace(s[j])) ++j;
      if (j < n && j - i > 1) --j;
    }
    f(i, j);
    i = j;
  }
}

std::uint64_t pair_key(int a, int b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

// Merges the symbols `t` (ids) in place: the adjacent pair of lowest rank first, the leftmost of
// equal ranks (tokenizers' Word::merge_all), with a heap of candidate pairs and a linked list of
// symbols: O(n log n) for a word of n symbols.
void merge_word(const std::unordered_map<std::uint64_t, std::pair<int, int>>& merges, std::vector<int>& t) {
  const int n = static_cast<int>(t.size());
  if (n < 2) return;
  std::vector<int> next(static_cast<std::size_t>(n)), prev(static_cast<std::size_t>(n));
  std::vector<char> gone(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) prev[static_cast<std::size_t>(i)] = i - 1, next[static_cast<std::size_t>(i)] = i + 1 < n ? i + 1 : -1;
  using Candidate = std::tuple<int, int, int>;  // (rank, position, merged id): smallest first
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto at = [](auto& v, int i) -> auto& { return v[static_cast<std::size_t>(i)]; };
  auto offer = [&](int pos) {
    const int right = at(next, pos);
    if (right < 0) return;
    const auto m = merges.find(pair_key(at(t, pos), at(t, right)));
    if (m != merges.end()) heap.emplace(m->second.first, pos, m->second.second);
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const auto [rank, pos, merged] = heap.top();
    heap.pop();
    const int right = at(next, pos);
    if (at(gone, pos) || right < 0) continue;
    const auto m = merges.find(pair_key(at(t, pos), at(t, right)));
    if (m == merges.end() || m->second.second != merged) continue;  // a pair that has changed since
    at(t, pos) = merged;
    at(gone, right) = true;
    at(next, pos) = at(next, right);
    if (at(next, pos) >= 0) at(prev, at(next, pos)) = pos;
    if (at(prev, pos) >= 0) offer(at(prev, pos));
    offer(pos);
  }
  std::size_t w = 0;
  for (int i = 0; i >= 0; i = at(next, i)) t[w++] = at(t, i);
  t.resize(w);
}

// A JSON value for an error message, cut at 120 characters.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

// The fields of a Hugging Face tokenizer.json, each error naming the file, the field and its value.
struct Fields {
  std::string where;
  [[noreturn]] void bad(const std::string& field, const nlohmann::json& v, const std::string& why) const {
    fail(kBpe, where + ": \"" + field + "\" is " + shown(v) + ": " + why);
  }
  const nlohmann::json& at(const nlohmann::json& o, const std::string& field, const char* key) const {
    if (!o.is_object() || !o.contains(key)) bad(field, o, std::string("has no \"") + key + "\"");
    return o.at(key);
  }
  std::string str(const nlohmann::json& o, const std::string& field, const char* key) const {
    const auto& v = at(o, field, key);
    if (!v.is_string()) bad(field + "." + key, v, "must be a string");
    return v.get<std::string>();
  }
  bool flag(const nlohmann::json& o, const std::string& field, const char* key, bool absent) const {
    if (!o.is_object() || !o.contains(key) || o.at(key).is_null()) return absent;
    if (!o.at(key).is_boolean()) bad(field + "." + key, o.at(key), "must be true or false");
    return o.at(key).get<bool>();
  }
  int id(const nlohmann::json& v, const std::string& field) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() >= (1 << 22))
      bad(field, v, "a token id must be an integer in [0, 4194304)");
    return v.get<int>();
  }
};

}  // namespace

Tokenizer Tokenizer::load_hf_bpe(const std::string& path, const std::string& bytes, bool gpt2_files) {
  namespace fs = std::filesystem;
  using json = nlohmann::json;
  auto b = std::make_shared<Bpe>();
  b->byte_ids.fill(-1);
  Tokenizer t;
  t.format_ = Format::hf_bpe;
  t.bos_id_ = t.eos_id_ = -1;
  const fs::path dir = fs::path(path).parent_path();
  std::string vocab_path = path, eos_name;
  std::vector<std::pair<std::string, std::string>> merge_pairs;
  Fields f;
  if (gpt2_files) {
    // GPT-2's vocab.json ({token: id}) and merges.txt ("#version" line, then "left right" per line).
    // Either may be the one named; the other is beside it.
    const bool named_merges = !starts_like_json(bytes);
    vocab_path = named_merges ? (dir / "vocab.json").string() : path;
    const std::string merges_path = named_merges ? path : (dir / "merges.txt").string();
    f.where = "file '" + vocab_path + "' (read as GPT-2's vocab.json, with merges.txt beside it)";
    for (const auto& [p, what] : {std::pair{vocab_path, "vocab.json"}, std::pair{merges_path, "merges.txt"}})
      if (const std::string why = detail::input_file_problem(p); !why.empty())
        fail(kBpe, "file '" + path + "' (read as GPT-2's " + (named_merges ? "merges.txt" : "vocab.json") + "): its " +
                       what + " '" + p + "': " + why);
    const std::string vbytes = named_merges ? detail::read_input_file(vocab_path, kBpe, "vocab.json", std::size_t{1} << 30) : bytes;
    const json v = json::parse(vbytes, detail::json_depth_limit(kBpe, f.where), false);
    if (v.is_discarded() || !v.is_object()) fail(kBpe, f.where + ": not a JSON object of token → id");
    for (const auto& [token, id] : v.items()) b->ids.emplace(token, f.id(id, token));
    const std::string mbytes = named_merges ? bytes : detail::read_input_file(merges_path, kBpe, "merges.txt", std::size_t{1} << 30);
    std::size_t line = 0;
    for (std::size_t at = 0; at < mbytes.size(); ++line) {
      std::size_t end = mbytes.find('\n', at);
      if (end == std::string::npos) end = mbytes.size();
      std::string_view l(mbytes.data() + at, end - at);
      at = end + 1;
      if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
      if (l.empty() || l.starts_with("#version")) continue;
      const auto sp = l.find(' ');
      if (sp == std::string_view::npos || l.find(' ', sp + 1) != std::string_view::npos)
        fail(kBpe, "file '" + merges_path + "' (GPT-2's merges.txt): line " + std::to_string(line + 1) + " \"" +
                       std::string(l.substr(0, 80)) + "\" is not two tokens separated by one space");
      merge_pairs.emplace_back(std::string(l.substr(0, sp)), std::string(l.substr(sp + 1)));
    }
    if (b->ids.count("<|endoftext|>")) {
      b->added.emplace_back("<|endoftext|>", b->ids.at("<|endoftext|>"));
      eos_name = "<|endoftext|>";
    }
  } else {
    f.where = "file '" + path + "' (read as a Hugging Face BPE tokenizer.json)";
    json j;
    try {
      j = json::parse(bytes, detail::json_depth_limit(kBpe, f.where), true, false);
    } catch (const json::exception& e) {
      fail(kBpe, f.where + ": not valid JSON (" + e.what() + ")");
    }
    const json& model = f.at(j, "model", "model");
    const json& vocab = f.at(model, "model", "vocab");
    if (!vocab.is_object()) f.bad("model.vocab", vocab, "must be an object of token → id");
    for (const auto& [token, id] : vocab.items()) b->ids.emplace(token, f.id(id, "model.vocab." + token));
    const json& merges = f.at(model, "model", "merges");
    if (!merges.is_array()) f.bad("model.merges", merges, "must be an array");
    for (std::size_t r = 0; r < merges.size(); ++r) {
      const json& m = merges[r];
      const std::string field = "model.merges[" + std::to_string(r) + "]";
      if (m.is_string()) {  // "left right" (tokenizers before 0.20)
        const std::string s = m.get<std::string>();
        const auto sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          f.bad(field, m, "must be two tokens separated by one space");
        merge_pairs.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merge_pairs.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        f.bad(field, m, "must be \"left right\" or [\"left\", \"right\"]");
      }
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && !model.at(key).is_null() && model.at(key) != "")
        f.bad(std::string("model.") + key, model.at(key), "qkv's BPE has no subword prefix or suffix");
    if (model.contains("dropout") && !model.at("dropout").is_null() && model.at("dropout") != 0.0)
      f.bad("model.dropout", model.at("dropout"), "qkv encodes deterministically (dropout null)");
    b->byte_fallback = f.flag(model, "model", "byte_fallback", false);
    b->fuse_unk = f.flag(model, "model", "fuse_unk", false);
    b->ignore_merges = f.flag(model, "model", "ignore_merges", false);
    if (model.contains("unk_token") && !model.at("unk_token").is_null()) {
      const std::string unk = f.str(model, "model", "unk_token");
      const auto it = b->ids.find(unk);
      if (it == b->ids.end()) f.bad("model.unk_token", model.at("unk_token"), "not in model.vocab");
      b->unk = it->second;
    }
    // The style: GPT-2's ByteLevel pre-tokenizer; Llama's Metaspace pre-tokenizer; or Llama's
    // legacy normalizer [Prepend "▁", Replace " " → "▁"] without a pre-tokenizer.
    const json none;
    const json& norm = j.contains("normalizer") ? j.at("normalizer") : none;
    const json& pre = j.contains("pre_tokenizer") ? j.at("pre_tokenizer") : none;
    const auto type = [&](const json& o, const std::string& field) {
      return o.is_object() && o.contains("type") && o.at("type").is_string() ? o.at("type").get<std::string>()
                                                                            : (f.bad(field, o, "has no \"type\""), "");
    };
    if (!pre.is_null() && type(pre, "pre_tokenizer") == "ByteLevel") {
      if (!norm.is_null()) f.bad("normalizer", norm, "qkv's byte-level BPE has no normalizer (null)");
      if (!f.flag(pre, "pre_tokenizer", "use_regex", true))
        f.bad("pre_tokenizer.use_regex", pre.at("use_regex"), "qkv's byte-level BPE splits words by GPT-2's regex (true)");
      b->style = Bpe::Style::byte_level;
      b->add_prefix_space = f.flag(pre, "pre_tokenizer", "add_prefix_space", false);
    } else if (!pre.is_null() && type(pre, "pre_tokenizer") == "Metaspace") {
      if (!norm.is_null()) f.bad("normalizer", norm, "qkv's Metaspace BPE has no normalizer (null)");
      if (f.str(pre, "pre_tokenizer", "replacement") != kSpace)
        f.bad("pre_tokenizer.replacement", pre.at("replacement"), "qkv's Metaspace replaces spaces by \"▁\"");
      b->style = Bpe::Style::metaspace;
      b->split = f.flag(pre, "pre_tokenizer", "split", true);
      const std::string scheme = pre.contains("prepend_scheme")
                                     ? f.str(pre, "pre_tokenizer", "prepend_scheme")
                                     : (f.flag(pre, "pre_tokenizer", "add_prefix_space", true) ? "always" : "never");
      if (scheme == "always") b->prepend = Bpe::Prepend::always;
      else if (scheme == "first") b->prepend = Bpe::Prepend::first;
      else if (scheme == "never") b->prepend = Bpe::Prepend::never;
      else f.bad("pre_tokenizer.prepend_scheme", pre.at("prepend_scheme"), "must be \"always\", \"first\" or \"never\"");
    } else if (pre.is_null() && !norm.is_null() && type(norm, "normalizer") == "Sequence") {
      const json& steps = f.at(norm, "normalizer", "normalizers");
      const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}};
      const json prepend = {{"type", "Prepend"}, {"prepend", kSpace}};
      if (steps == json::array({prepend, replace})) b->prepend = Bpe::Prepend::every_part;
      else if (steps == json::array({replace})) b->prepend = Bpe::Prepend::never;
      else f.bad("normalizer", norm, "qkv implements the Sequence [Prepend \"▁\", Replace \" \" → \"▁\"] (Llama's)");
      b->style = Bpe::Style::metaspace;
    } else {
      f.bad(pre.is_null() ? "normalizer" : "pre_tokenizer", pre.is_null() ? norm : pre,
            "qkv implements the pre_tokenizers ByteLevel (GPT-2) and Metaspace, or Llama's normalizer "
            "Sequence [Prepend \"▁\", Replace \" \" → \"▁\"]");
    }
    if (b->byte_fallback && b->style == Bpe::Style::byte_level)
      f.bad("model.byte_fallback", model.at("byte_fallback"), "byte fallback is for Metaspace BPE; byte-level BPE spells every byte");
    // Added tokens: matched as written.
    const json& added = j.contains("added_tokens") ? j.at("added_tokens") : json::array();
    if (!added.is_array()) f.bad("added_tokens", added, "must be an array");
    for (std::size_t i = 0; i < added.size(); ++i) {
      const std::string field = "added_tokens[" + std::to_string(i) + "]";
      const json& a = added[i];
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (f.flag(a, field, key, false))
          f.bad(field + "." + key, a.at(key), "qkv matches added tokens as written (lstrip, rstrip, single_word false)");
      if (f.flag(a, field, "normalized", false) && !norm.is_null())
        f.bad(field + ".normalized", a.at("normalized"),
              "qkv matches added tokens in the raw text: \"normalized\" true needs the normalizer null");
      const std::string content = f.str(a, field, "content");
      if (content.empty()) f.bad(field + ".content", a.at("content"), "must not be empty");
      b->added.emplace_back(content, f.id(f.at(a, field, "id"), field + ".id"));
    }
    // BOS (and EOS) from the post processor's template: [special, $A] or [special, $A, special].
    const json& post = j.contains("post_processor") ? j.at("post_processor") : none;
    if (!post.is_null() && type(post, "post_processor") == "TemplateProcessing") {
      const json& single = f.at(post, "post_processor", "single");
      const json& specials = f.at(post, "post_processor", "special_tokens");
      auto special = [&](const json& item, const std::string& field) {
        const std::string name = f.str(f.at(item, field, "SpecialToken"), field + ".SpecialToken", "id");
        const json& ids = f.at(f.at(specials, "post_processor.special_tokens", name.c_str()),
                               "post_processor.special_tokens." + name, "ids");
        if (!ids.is_array() || ids.size() != 1) f.bad("post_processor.special_tokens." + name + ".ids", ids, "must be one id");
        return f.id(ids[0], "post_processor.special_tokens." + name + ".ids[0]");
      };
      if (!single.is_array() || single.empty() || single.size() > 3)
        f.bad("post_processor.single", single, "qkv implements the templates [$A], [special, $A], [special, $A, special]");
      std::size_t k = 0;
      if (single[0].contains("SpecialToken")) t.bos_id_ = special(single[k++], "post_processor.single[0]");
      if (k >= single.size() || !single[k].contains("Sequence"))
        f.bad("post_processor.single", single, "qkv implements the templates [$A], [special, $A], [special, $A, special]");
      if (++k < single.size() && !single[k].contains("SpecialToken"))
        f.bad("post_processor.single", single, "qkv implements the templates [$A], [special, $A], [special, $A, special]");
      if (k < single.size()) t.eos_id_ = special(single[k], "post_processor.single[" + std::to_string(k) + "]");
      if (++k < single.size()) f.bad("post_processor.single", single, "has more than [special, $A, special]");
    } else if (!post.is_null() && type(post, "post_processor") != "ByteLevel") {
      f.bad("post_processor", post, "qkv implements TemplateProcessing and ByteLevel (which adds no tokens)");
    }
  }
  // The vocabulary: the model's tokens, then added tokens not among them; ids 0 … V − 1, each once.
  std::vector<std::string> vocab;
  std::vector<bool> seen;
  auto place = [&](const std::string& token, int id) {
    if (static_cast<std::size_t>(id) >= vocab.size()) vocab.resize(static_cast<std::size_t>(id) + 1), seen.resize(vocab.size());
    if (seen[static_cast<std::size_t>(id)] && vocab[static_cast<std::size_t>(id)] != token)
      fail(kBpe, f.where + ": id " + std::to_string(id) + " is given to \"" + vocab[static_cast<std::size_t>(id)].substr(0, 40) +
                     "\" and to \"" + token.substr(0, 40) + "\"");
    seen[static_cast<std::size_t>(id)] = true;
    vocab[static_cast<std::size_t>(id)] = token;
  };
  for (const auto& [token, id] : b->ids) place(token, id);
  for (const auto& [token, id] : b->added) place(token, id);
  for (std::size_t i = 0; i < seen.size(); ++i)
    if (!seen[i])
      fail(kBpe, f.where + ": no token has id " + std::to_string(i) + ", but the ids of a vocabulary of " +
                     std::to_string(vocab.size()) + " tokens must be 0 … V − 1");
  if (vocab.empty()) fail(kBpe, f.where + ": the vocabulary is empty");
  for (std::size_t r = 0; r < merge_pairs.size(); ++r) {
    const auto& [l, r2] = merge_pairs[r];
    const auto a = b->ids.find(l), c = b->ids.find(r2), m = b->ids.find(l + r2);
    if (a == b->ids.end() || c == b->ids.end() || m == b->ids.end())
      fail(kBpe, f.where + ": merge " + std::to_string(r) + " \"" + l.substr(0, 40) + "\" + \"" + r2.substr(0, 40) +
                     "\": \"" + (a == b->ids.end() ? l : c == b->ids.end() ? r2 : l + r2).substr(0, 80) +
                     "\" is not in the vocabulary");
    // A repeated pair takes its last rank, as tokenizers' map of merges does.
    b->merges.insert_or_assign(pair_key(a->second, c->second), std::pair{static_cast<int>(r), m->second});
  }
  // The pieces as decode gives them.
  for (int c = 0; c < 256; ++c) {
    std::string key;
    if (b->style == Bpe::Style::byte_level) {
      utf8_append(key, byte_chars()[static_cast<std::size_t>(c)]);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", c);
      key = hex;
    }
    if (const auto it = b->ids.find(key); it != b->ids.end()) b->byte_ids[static_cast<std::size_t>(c)] = it->second;
  }
  std::vector<bool> is_added(vocab.size());
  for (const auto& a : b->added) is_added[static_cast<std::size_t>(a.second)] = true;
  for (std::size_t i = 0; i < vocab.size(); ++i) {
    std::string& p = vocab[i];
    if (b->style == Bpe::Style::byte_level) {
      p = byte_level_bytes(p);
    } else if (!is_added[i]) {
      for (std::size_t at = p.find(kSpace); at != std::string::npos; at = p.find(kSpace, at + 1)) p.replace(at, kSpace.size(), " ");
    }
  }
  // EOS: tokenizer_config.json's "eos_token" ("</s>" or {"content": "</s>", ...}) when it is beside.
  const fs::path cfg = fs::path(vocab_path).parent_path() / "tokenizer_config.json";
  if (fs::is_regular_file(cfg)) {
    const std::string cwhere = "file '" + cfg.string() + "' (beside the tokenizer)";
    const json c = json::parse(detail::read_input_file(cfg.string(), kBpe, "tokenizer_config.json", 1 << 24),
                               detail::json_depth_limit(kBpe, cwhere), false);
    if (c.is_discarded() || !c.is_object()) fail(kBpe, cwhere + ": not a JSON object");
    if (c.contains("eos_token") && !c.at("eos_token").is_null()) {
      const json& e = c.at("eos_token");
      if (e.is_string()) eos_name = e.get<std::string>();
      else if (e.is_object() && e.contains("content") && e.at("content").is_string()) eos_name = e.at("content").get<std::string>();
      else fail(kBpe, cwhere + ": \"eos_token\" is " + shown(e) + ": must be a token or {\"content\": token}");
    }
  }
  if (!eos_name.empty()) {
    int id = -1;
    for (const auto& a : b->added) if (a.first == eos_name) id = a.second;
    if (const auto it = b->ids.find(eos_name); id < 0 && it != b->ids.end()) id = it->second;
    if (id < 0) fail(kBpe, f.where + ": the eos_token \"" + eos_name.substr(0, 40) + "\" is not in the vocabulary");
    t.eos_id_ = id;
  }
  std::stable_sort(b->added.begin(), b->added.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  t.vocab_ = std::move(vocab);
  t.scores_.assign(t.vocab_.size(), 0.0f);
  t.bpe_ = std::move(b);
  return t;
}

std::vector<int> Tokenizer::encode_bpe(std::string_view text, bool add_bos, bool add_eos) const {
  const Bpe& b = *bpe_;
  std::vector<int> out;
  if (add_bos && bos_id_ >= 0) out.push_back(bos_id_);
  std::unordered_map<std::string, std::vector<int>> cache;  // word → ids, within this call
  std::vector<int> syms;
  // One word (its characters as the vocabulary spells them) → ids.
  auto word = [&](const std::string& w) {
    auto [it, fresh] = cache.try_emplace(w);
    if (fresh) {
      if (b.ignore_merges) {
        if (const auto v = b.ids.find(w); v != b.ids.end()) it->second = {v->second};
      }
      if (it->second.empty()) {
        syms.clear();
        bool unk_last = false;  // fuse_unk: consecutive unknown characters are one [UNK]
        for (std::size_t i = 0; i < w.size();) {
          char32_t c = 0;
          const auto n = static_cast<std::size_t>(std::max(uc::utf8_next(w, i, &c), 1));
          const std::string ch = w.substr(i, n);
          i += n;
          if (const auto v = b.ids.find(ch); v != b.ids.end()) {
            syms.push_back(v->second);
            unk_last = false;
            continue;
          }
          if (b.byte_fallback &&
              std::all_of(ch.begin(), ch.end(), [&](char x) { return b.byte_ids[static_cast<unsigned char>(x)] >= 0; })) {
            for (char x : ch) syms.push_back(b.byte_ids[static_cast<unsigned char>(x)]);
            unk_last = false;
            continue;
          }
          if (b.unk >= 0 && !(b.fuse_unk && unk_last)) syms.push_back(b.unk);
          unk_last = b.unk >= 0;  // without an unk token the character is dropped, as tokenizers does
        }
        merge_word(b.merges, syms);
        it->second = syms;
      }
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  };
  // One part of the text between added tokens (`base`: its byte offset in the text).
  auto part = [&](std::string_view raw, std::size_t base) {
    if (raw.empty()) return;
    const std::u32string cps = utf8_decode(raw, base);  // refuses invalid UTF-8, naming the offset
    if (b.style == Bpe::Style::byte_level) {
      std::u32string s = cps;
      if (b.add_prefix_space && s[0] != U' ') s.insert(s.begin(), U' ');
      std::string w, bytes;
      gpt2_words(s, [&](std::size_t i, std::size_t j) {
        bytes.clear();
        for (std::size_t k = i; k < j; ++k) utf8_append(bytes, s[k]);
        w.clear();
        for (unsigned char x : bytes) utf8_append(w, byte_chars()[x]);
        word(w);
      });
      return;
    }
    std::string s;
    const bool starts = raw.starts_with(' ') || raw.starts_with(kSpace);
    if (b.prepend == Bpe::Prepend::every_part ||
        (!starts && (b.prepend == Bpe::Prepend::always || (b.prepend == Bpe::Prepend::first && base == 0))))
      s = kSpace;
    for (char x : raw) {
      if (x == ' ') s += kSpace;
      else s += x;
    }
    if (!b.split) return word(s);
    std::size_t from = 0;
    for (std::size_t at = s.find(kSpace, 1); at != std::string::npos; at = s.find(kSpace, at + 1)) {
      word(s.substr(from, at - from));
      from = at;
    }
    word(s.substr(from));
  };
  split_added(text, b.added, out, part);
  if (add_eos && eos_id_ >= 0) out.push_back(eos_id_);
  return out;
}
}  // namespace qkv
