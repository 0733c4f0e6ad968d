// Internal: the nesting limit of every JSON document qkv reads (model.json and Hugging Face
// config.json, safetensors headers, the tokenizer JSON and checkpoints of qkv train, train --config).
//
// nlohmann::json parses iteratively, but dump(), copies and comparisons recurse once per level:
// a 1 MB config of 400 000 '[' as the value of "dim" parsed, and then the error message that
// printed the value overflowed the stack (found by fuzz/fuzz_config.cpp). qkv's own formats nest
// at most 3 levels, so a document deeper than kJsonMaxDepth is refused while it is parsed.
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "qkv/types.hpp"

namespace qkv::detail {

inline constexpr int kJsonMaxDepth = 64;

// The callback of nlohmann::json::parse(text, callback, ...): keeps every value, and throws
// qkv::FormatError (naming `fn` and `where`, e.g. "config 'model.json'") as soon as arrays
// and objects nest deeper than kJsonMaxDepth.
inline nlohmann::json::parser_callback_t json_depth_limit(std::string fn, std::string where) {
  return [fn = std::move(fn), where = std::move(where)](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kJsonMaxDepth)
      fail_format(fn, where + ": JSON nested more than " + std::to_string(kJsonMaxDepth) +
                   " levels deep (arrays and objects inside each other); not a file qkv reads");
    return true;
  };
}

}  // namespace qkv::detail
