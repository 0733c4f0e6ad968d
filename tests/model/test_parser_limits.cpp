// Regression tests for the findings of the fuzz harnesses (fuzz/, docs/fuzzing.md): inputs that
// crashed or exhausted memory in a parser must now be refused with qkv::FormatError, and
// inputs just inside each limit must still load.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include <gtest/gtest.h>

#include "model/json_depth.hpp"
#include "qkv/model.hpp"
#include "model/safetensors.hpp"
#include "model/text_tokenizer.hpp"

namespace {

namespace fs = std::filesystem;

// `depth` arrays inside each other: "[[[ … ]]]".
std::string nested(std::size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// Depth of the crashing inputs: 1 000 000 levels (2 MB of text) overflowed the 8 MiB stack in
// nlohmann::json's recursive dump() of an error message, in the g++ release build too.
constexpr std::size_t kDeep = 1'000'000;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const qkv::FormatError& e) {
    return e.what();
  }
  return "(no qkv::FormatError)";
}

std::string safetensors_file(const std::string& name, const std::string& header) {
  const fs::path p = fs::temp_directory_path() / ("qkv_parser_limits_" + name + "_" + std::to_string(::getpid()));
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::ofstream(p, std::ios::binary) << bytes << header;
  return p.string();
}

const char* kNested = "nested more than 64 levels deep";

TEST(ParserLimits, ConfigJsonNestedTooDeep) {
  const std::string text = "{\"dim\": " + nested(kDeep) + "}";
  EXPECT_NE(message_of([&] { qkv::config_from_json(text, "deep.json"); }).find(kNested), std::string::npos);
  // Hugging Face config.json: a size that is not an integer is printed the same way.
  const std::string hf = "{\"model_type\": \"gpt2\", \"n_embd\": " + nested(kDeep) + "}";
  EXPECT_NE(message_of([&] { qkv::config_from_json(hf, "config.json"); }).find(kNested), std::string::npos);
  // 64 levels are still JSON that parses (and is refused only as a wrong value).
  const std::string ok = "{\"dim\": " + nested(qkv::detail::kJsonMaxDepth - 1) + "}";
  EXPECT_NE(message_of([&] { qkv::config_from_json(ok, "ok.json"); }).find("\"dim\" must be an integer"),
            std::string::npos);
}

TEST(ParserLimits, SafetensorsHeaderNestedTooDeep) {
  qkv::Config c;
  c.dim = 8; c.hidden_dim = 16; c.n_layers = 1; c.n_heads = 2; c.n_kv_heads = 1; c.vocab_size = 5; c.seq_len = 4;
  const std::string path = safetensors_file("model", "{\"t\": " + nested(kDeep) + "}");
  EXPECT_NE(message_of([&] { qkv::load_safetensors(path, c); }).find(kNested), std::string::npos);
  fs::remove(path);
}

TEST(ParserLimits, CheckpointHeaderNestedTooDeep) {
  const std::string path = safetensors_file(
      "checkpoint", "{\"t\": {\"dtype\": \"F32\", \"shape\": " + nested(kDeep) + ", \"data_offsets\": [0, 0]}}");
  EXPECT_NE(message_of([&] { qkv::detail::read_safetensors(path); }).find(kNested), std::string::npos);
  fs::remove(path);
}

TEST(ParserLimits, TokenizerJsonNestedTooDeep) {
  const std::string text = "{\"kind\": \"chars\", \"chars\": [" + nested(kDeep) + "]}";
  EXPECT_NE(message_of([&] { qkv::detail::TextTokenizer::from_json(text); }).find(kNested), std::string::npos);
}

// K merges that each join the last token with itself: token 256 + k is 2^(k+1) bytes, and all
// tokens together are 256 + 2^(K+1) - 2 bytes.
std::string doubling_merges(int k_merges) {
  std::string m = "[[97, 97]";
  for (int k = 1; k < k_merges; ++k) m += ", [" + std::to_string(255 + k) + ", " + std::to_string(255 + k) + "]";
  return "{\"kind\": \"bpe\", \"merges\": " + m + "]}";
}

TEST(ParserLimits, TokenizerJsonMergesSpellTooManyBytes) {
  // 22 merges: 256 + 2^23 - 2 bytes, inside the 2^24 limit; the last token is 2^22 'a's.
  const auto ok = qkv::detail::TextTokenizer::from_json(doubling_merges(22));
  EXPECT_EQ(ok.token_text(256 + 21), std::string(std::size_t{1} << 22, 'a'));
  // 23 merges: 256 + 2^24 - 2 bytes, over it. (40 such merges, a 500-byte file, asked for 2^41.)
  const std::string msg = message_of([] { qkv::detail::TextTokenizer::from_json(doubling_merges(23)); });
  EXPECT_NE(msg.find("merge 22 [277,277] makes the tokens 16777470 bytes long in all"), std::string::npos) << msg;
}

}  // namespace
