#include "model/text_tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "model/json_depth.hpp"
#include "model/unicode.hpp"
#include "qkv/types.hpp"

namespace qkv::detail {
namespace {

using unicode::utf8_next;

bool is_space(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }
// Word classes for BPE pre-splitting: letters, digits and every non-ASCII byte (so UTF-8
// sequences stay inside words) form one class, other printable ASCII the other.
bool is_wordish(unsigned char c) { return c >= 0x80 || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

// Splits text into words: the whitespace before a word, then a maximal run of one class.
template <class F>
void for_each_word(std::string_view s, F&& f) {
  std::size_t i = 0;
  while (i < s.size()) {
    std::size_t j = i;
    while (j < s.size() && is_space(static_cast<unsigned char>(s[j]))) ++j;
    if (j < s.size()) {
      const bool w = is_wordish(static_cast<unsigned char>(s[j]));
      while (j < s.size() && !is_space(static_cast<unsigned char>(s[j])) &&
             is_wordish(static_cast<unsigned char>(s[j])) == w)
        ++j;
    }
    f(s.substr(i, j - i));
    i = j;
  }
}

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

// Replaces every non-overlapping occurrence (left to right) of (a, b) in ids by `merged`.
void merge_pair(std::vector<std::int32_t>& ids, std::int32_t a, std::int32_t b, std::int32_t merged) {
  std::size_t w = 0;
  for (std::size_t r = 0; r < ids.size(); ++r) {
    if (r + 1 < ids.size() && ids[r] == a && ids[r + 1] == b) {
      ids[w++] = merged;
      ++r;
    } else {
      ids[w++] = ids[r];
    }
  }
  ids.resize(w);
}

std::vector<std::int32_t> bytes_of(std::string_view s) {
  std::vector<std::int32_t> ids(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) ids[i] = static_cast<unsigned char>(s[i]);
  return ids;
}

}  // namespace

void check_text(const char* fn, std::string_view corpus) {
  if (corpus.empty()) fail(fn, "corpus: the file is empty, there is nothing to train on");
  for (std::size_t i = 0; i < corpus.size();) {
    char32_t cp = 0;
    const int len = utf8_next(corpus, i, &cp);
    if (len == 0 || cp == 0) {
      char what[32];
      if (len == 0)
        std::snprintf(what, sizeof what, "invalid byte 0x%02X",
                      static_cast<unsigned>(static_cast<unsigned char>(corpus[i])));
      else
        std::snprintf(what, sizeof what, "a NUL byte");
      fail(fn, std::string("corpus: not UTF-8 text (") + what + " at offset " + std::to_string(i) +
                   "); is it a binary file?");
    }
    i += static_cast<std::size_t>(len);
  }
}

TextTokenizer TextTokenizer::learn_chars(std::string_view corpus) {
  check_text("qkv::TextTokenizer::learn_chars", corpus);
  std::map<char32_t, std::string> seen;  // code point order
  for (std::size_t i = 0; i < corpus.size();) {
    char32_t cp = 0;
    const int len = utf8_next(corpus, i, &cp);
    seen.emplace(cp, std::string(corpus.substr(i, static_cast<std::size_t>(len))));
    i += static_cast<std::size_t>(len);
  }
  TextTokenizer t;
  t.kind_ = Kind::chars;
  for (auto& [cp, s] : seen) t.pieces_.push_back(std::move(s));
  return t;
}

TextTokenizer TextTokenizer::learn_bpe(std::string_view corpus, std::int64_t vocab_size) {
  const char* fn = "qkv::TextTokenizer::learn_bpe";
  check_text(fn, corpus);
  if (vocab_size < 257 || vocab_size > 65536)
    fail(fn, "vocab_size: must be in [257, 65536] (256 bytes + at least one merge), got " +
                 std::to_string(vocab_size));
  // Distinct words with their counts; merges are learned on these, not on the whole text.
  std::unordered_map<std::string_view, std::int64_t> counts;
  for_each_word(corpus, [&](std::string_view w) { ++counts[w]; });
  std::vector<std::pair<std::vector<std::int32_t>, std::int64_t>> words;
  words.reserve(counts.size());
  for (auto& [w, c] : counts) words.emplace_back(bytes_of(w), c);
  // A fixed order of the words, so the learned merges never depend on hash-table iteration.
  std::sort(words.begin(), words.end());

  TextTokenizer t;
  t.kind_ = Kind::bpe;
  for (int b = 0; b < 256; ++b) t.pieces_.emplace_back(1, static_cast<char>(b));
  std::unordered_map<std::uint64_t, std::int64_t> pairs;
  std::int64_t token_bytes = 256;  // the bytes of all tokens so far (kMaxBpeTokenBytes)
  while (t.vocab_size() < vocab_size) {
    pairs.clear();
    for (const auto& [ids, c] : words)
      for (std::size_t i = 0; i + 1 < ids.size(); ++i) pairs[pair_key(ids[i], ids[i + 1])] += c;
    std::uint64_t best = 0;
    std::int64_t best_count = 0;
    for (auto [k, c] : pairs)
      if (c > best_count || (c == best_count && k < best)) best = k, best_count = c;
    if (best_count < 2) break;
    const auto a = static_cast<std::int32_t>(best >> 32), b = static_cast<std::int32_t>(best & 0xffffffffu);
    token_bytes += static_cast<std::int64_t>(t.pieces_[static_cast<std::size_t>(a)].size() +
                                             t.pieces_[static_cast<std::size_t>(b)].size());
    if (token_bytes > kMaxBpeTokenBytes) break;
    const auto merged = static_cast<std::int32_t>(t.vocab_size());
    t.merges_.emplace_back(a, b);
    t.pieces_.push_back(t.pieces_[static_cast<std::size_t>(a)] + t.pieces_[static_cast<std::size_t>(b)]);
    for (auto& [ids, c] : words) merge_pair(ids, a, b, merged);
  }
  return t;
}

std::vector<std::int32_t> TextTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  if (kind_ == Kind::chars) {
    std::unordered_map<std::string_view, std::int32_t> id;
    for (std::size_t i = 0; i < pieces_.size(); ++i) id.emplace(pieces_[i], static_cast<std::int32_t>(i));
    for (std::size_t i = 0; i < text.size();) {
      char32_t cp = 0;
      const int len = utf8_next(text, i, &cp);
      const auto it = len ? id.find(text.substr(i, static_cast<std::size_t>(len))) : id.end();
      if (it == id.end())
        fail("qkv::TextTokenizer::encode",
             "text: the character at byte offset " + std::to_string(i) + " is not in the " +
                 std::to_string(pieces_.size()) + "-character vocabulary learned from the corpus");
      out.push_back(it->second);
      i += static_cast<std::size_t>(len);
    }
    return out;
  }
  std::unordered_map<std::uint64_t, std::int32_t> rank;
  for (std::size_t r = 0; r < merges_.size(); ++r)
    rank.emplace(pair_key(merges_[r].first, merges_[r].second), static_cast<std::int32_t>(r));
  std::unordered_map<std::string_view, std::vector<std::int32_t>> cache;
  for_each_word(text, [&](std::string_view w) {
    auto [it, fresh] = cache.try_emplace(w);
    if (fresh) {
      std::vector<std::int32_t> ids = bytes_of(w);
      for (;;) {  // merge the adjacent pair learned earliest, until none is a merge
        std::int32_t best = -1;
        for (std::size_t i = 0; i + 1 < ids.size(); ++i) {
          const auto r = rank.find(pair_key(ids[i], ids[i + 1]));
          if (r != rank.end() && (best < 0 || r->second < best)) best = r->second;
        }
        if (best < 0) break;
        const auto& m = merges_[static_cast<std::size_t>(best)];
        merge_pair(ids, m.first, m.second, 256 + best);
      }
      it->second = std::move(ids);
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  });
  return out;
}

std::string TextTokenizer::token_text(std::int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("qkv::TextTokenizer::token_text",
         "id: must be in [0, " + std::to_string(vocab_size()) + "), got " + std::to_string(id));
  return pieces_[static_cast<std::size_t>(id)];
}

std::string TextTokenizer::decode(const std::vector<std::int32_t>& ids) const {
  std::string s;
  for (auto id : ids) s += token_text(id);
  return s;
}

std::string TextTokenizer::to_json() const {
  nlohmann::json j;
  if (kind_ == Kind::chars) {
    j["kind"] = "chars";
    j["chars"] = pieces_;
  } else {
    j["kind"] = "bpe";
    auto m = nlohmann::json::array();
    for (auto [a, b] : merges_) m.push_back({a, b});
    j["merges"] = m;
  }
  return j.dump();
}

TextTokenizer TextTokenizer::from_json(std::string_view json) {
  const char* fn = "qkv::TextTokenizer::from_json";
  const auto j = nlohmann::json::parse(json, json_depth_limit(fn, "json"), false);
  if (j.is_discarded() || !j.is_object() || !j.contains("kind"))
    fail_format(fn, "json: not a tokenizer description (an object with \"kind\")");
  TextTokenizer t;
  if (j["kind"] == "chars") {
    t.kind_ = Kind::chars;
    if (!j.contains("chars") || !j["chars"].is_array() || j["chars"].empty())
      fail_format(fn, "json: \"chars\" must be a non-empty array of strings");
    for (const auto& c : j["chars"]) {
      if (!c.is_string()) fail_format(fn, "json: \"chars\" must hold strings, got " + c.dump());
      t.pieces_.push_back(c.get<std::string>());
    }
  } else if (j["kind"] == "bpe") {
    t.kind_ = Kind::bpe;
    for (int b = 0; b < 256; ++b) t.pieces_.emplace_back(1, static_cast<char>(b));
    if (!j.contains("merges") || !j["merges"].is_array()) fail_format(fn, "json: \"merges\" must be an array");
    if (j["merges"].size() > 65536 - 256)
      fail_format(fn, "json: " + std::to_string(j["merges"].size()) + " merges, more than a 65536-token vocabulary holds");
    std::int64_t token_bytes = 256;  // the bytes of all tokens so far (kMaxBpeTokenBytes)
    for (const auto& m : j["merges"]) {
      const auto next = static_cast<std::int32_t>(t.pieces_.size());
      if (!m.is_array() || m.size() != 2 || !m[0].is_number_integer() || !m[1].is_number_integer() ||
          m[0].get<std::int64_t>() < 0 || m[0].get<std::int64_t>() >= next || m[1].get<std::int64_t>() < 0 ||
          m[1].get<std::int64_t>() >= next)
        fail_format(fn, "json: merge " + std::to_string(next - 256) + " must be two ids below " + std::to_string(next) +
                     ", got " + m.dump());
      const auto a = m[0].get<std::int32_t>(), b = m[1].get<std::int32_t>();
      token_bytes += static_cast<std::int64_t>(t.pieces_[static_cast<std::size_t>(a)].size() +
                                               t.pieces_[static_cast<std::size_t>(b)].size());
      if (token_bytes > kMaxBpeTokenBytes)
        fail_format(fn, "json: merge " + std::to_string(next - 256) + " " + m.dump() + " makes the tokens " +
                     std::to_string(token_bytes) + " bytes long in all, more than the limit of " +
                     std::to_string(kMaxBpeTokenBytes) + " (merges that join a token with itself double it)");
      t.merges_.emplace_back(a, b);
      t.pieces_.push_back(t.pieces_[static_cast<std::size_t>(a)] + t.pieces_[static_cast<std::size_t>(b)]);
    }
  } else {
    fail_format(fn, "json: \"kind\" must be \"chars\" or \"bpe\", got " + j["kind"].dump());
  }
  return t;
}

}  // namespace qkv::detail
