// Internal: the tokenizers `qkv train` learns from its corpus (Tokenizer in qkv/model.hpp loads
// their tokenizer.json by content and encodes with this class).
//
//   chars  every distinct Unicode character of the corpus is a token, ids in code-point order
//          (nanoGPT's shakespeare_char: 65 tokens for tiny Shakespeare).
//   bpe    byte-level BPE: ids 0…255 are the bytes, and each learned merge (a, b) → 256 + rank
//          joins two adjacent tokens. Training counts pairs inside words (a word is a run of
//          letters/digits or of other non-space bytes, with the spaces before it), merges the most
//          frequent pair (ties: the smaller pair of ids), and repeats up to the vocabulary size.
//          Encoding applies merges by rank, lowest first, within each word; any byte string
//          encodes, and decode(encode(s)) == s.
//
// Both serialise to a small JSON object kept in checkpoints and written beside trained weights.
//
// The bytes of all BPE tokens together are at most kMaxBpeTokenBytes: a merge doubles the length
// of its token when it joins a token with itself, so a 500-byte merges list of 40 such merges
// would spell 2^41 bytes (found by fuzz/fuzz_text_tokenizer.cpp). Learning stops there too, so
// every tokenizer learn_bpe makes, from_json reads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::detail {

inline constexpr std::int64_t kMaxBpeTokenBytes = std::int64_t{1} << 24;  // 16 MiB; GPT-2's 50k tokens: 0.35 MiB

class TextTokenizer {
 public:
  enum class Kind : std::uint8_t { chars, bpe };

  // Throws std::invalid_argument if the corpus is empty or not UTF-8 text (NUL bytes, invalid
  // sequences): the signs of a binary file given by mistake.
  static TextTokenizer learn_chars(std::string_view corpus);
  // vocab_size in [257, 65536]; stops early when no pair occurs twice.
  static TextTokenizer learn_bpe(std::string_view corpus, std::int64_t vocab_size);
  static TextTokenizer from_json(std::string_view json);
  std::string to_json() const;

  std::vector<std::int32_t> encode(std::string_view text) const;  // throws on a character outside a chars vocabulary
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::string token_text(std::int32_t id) const;  // the bytes of one token
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(pieces_.size()); }
  Kind kind() const { return kind_; }

 private:
  Kind kind_ = Kind::chars;
  std::vector<std::string> pieces_;                         // bytes of each token id
  std::vector<std::pair<std::int32_t, std::int32_t>> merges_;  // bpe: merge r makes token 256 + r
};

// Throws (naming `fn`) unless `corpus` is non-empty UTF-8 text without NUL bytes.
void check_text(const char* fn, std::string_view corpus);

}  // namespace qkv::detail
