// inspect/report.hpp — what `qkv inspect` shows, computed once from a traced forward pass.
//
// Dimension letters:  S tokens of the prompt (BOS included), L layers, H query heads,
//                     d = d_model (embedding width), V vocabulary.
//
// Inputs (one LayerInput per layer, any float dtype, any strides):
//   scores       [H, S, S]   raw attention scores, one row per query: scale·q_i·k_j (+ mask);
//                            −∞ where the key is masked for that query
//   pattern      [H, S, S]   softmax of each score row; 0 exactly where masked
//   head_delta   [H, S, d]   Δe_h: the change head h proposes for each token's embedding
//   block_delta  [S, d]      Σ_h Δe_h (plus the output bias, if the model has one)
//   last_logits  [V]         next-token logits read from the last token's final vector
//
// The Report keeps the scores and patterns (f32, row per query, as PyTorch stores them) and
// replaces the rest by the numbers the page draws: norms, entropies, argmax keys, top-10.
// The seeds draw the same pattern transposed (keys down the left, one column per query);
// the page offers both orientations, the data has one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/types.hpp"

namespace qkv::inspect {

struct ModelInfo {
  std::string name;  // e.g. the checkpoint's file name
  std::int64_t n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, d_model = 0, vocab = 0,
               max_seq = 0;
};

struct Token {
  std::int32_t id = 0;
  std::string text;  // the token's piece as the tokenizer decodes it (may be invalid UTF-8)
};

struct LayerInput {
  View scores, pattern, head_delta, block_delta;
};

// What a head does, in numbers a reader can scan.
struct HeadSummary {
  std::vector<double> entropy_bits;      // [S] −Σ_k p log2 p of each query's distribution
  std::vector<std::int64_t> argmax_key;  // [S] the key each query attends most (−1: none allowed)
  double mean_entropy_bits = 0;          // mean of entropy_bits over queries
  // Mean weight on key i−1 / key 0 / key i, over queries i ≥ 2 (there keys 0, i−1, i differ);
  // NaN when S < 3.
  double previous_token = 0, first_token = 0, self_token = 0;
  // "previous-token" or "first-token" when that share is ≥ kHeadKindShare, else "".
  std::string kind;
  std::vector<double> delta_norm;  // [S] |Δe_h| per token
};

// A head is called previous-token (first-token) when more than half of the average query's
// attention goes to the previous (first) token.
inline constexpr double kHeadKindShare = 0.5;

struct NextToken {
  std::int32_t id = 0;
  std::string text;
  double prob = 0, logit = 0;
};

struct Report {
  ModelInfo model;
  std::string prompt;
  std::vector<Token> tokens;                       // [S]
  std::int64_t S = 0, L = 0, H = 0;
  std::vector<std::vector<float>> scores;          // [L][H·S·S], row per query, −∞ where masked
  std::vector<std::vector<float>> pattern;         // [L][H·S·S], row per query
  std::vector<std::vector<HeadSummary>> heads;     // [L][H]
  std::vector<std::vector<double>> block_delta_norm;  // [L][S] |Σ_h Δe_h| per token
  std::vector<NextToken> next_tokens;              // the 10 most likely, most likely first
  nlohmann::json params;                           // the `qkv params` scorekeeping, as given

  float score(std::int64_t l, std::int64_t h, std::int64_t q, std::int64_t k) const {
    return scores[static_cast<std::size_t>(l)][static_cast<std::size_t>((h * S + q) * S + k)];
  }
  float weight(std::int64_t l, std::int64_t h, std::int64_t q, std::int64_t k) const {
    return pattern[static_cast<std::size_t>(l)][static_cast<std::size_t>((h * S + q) * S + k)];
  }
};

// Builds the report; validates every shape and value (finite weights in [0, 1], 0 where the
// score is −∞, rows summing to 1 within kRowSumTolerance) and throws std::invalid_argument
// naming the layer and head otherwise. `token_text(id)` gives the piece of a vocabulary id.
Report make_report(const ModelInfo& model, std::string prompt, std::vector<Token> tokens,
                   const std::vector<LayerInput>& layers, const View& last_logits,
                   const std::function<std::string(std::int32_t)>& token_text,
                   nlohmann::json params);

// A softmax row of S ≤ 4096 f32 weights computed in f32 sums to 1 within S·2^-24 ≈ 2.4e-4;
// a row further off than 1e-3 is not a distribution and is refused.
inline constexpr double kRowSumTolerance = 1e-3;

// Span of stored keys per query: keys outside [key_lo[q], key_hi[q]) are masked in every
// layer and head (the causal triangle stores S·(S+1)/2 cells instead of S²).
struct KeySpans {
  std::vector<std::int64_t> key_lo, key_hi, row_offset;  // row_offset[S] = cells per head
};
KeySpans key_spans(const Report& r);

// The report as one JSON document (schema in docs/inspect.md). kJson writes the
// scores and patterns as nested arrays [L][H][S][S] (null for a masked score); kPage writes
// them as base64 little-endian f32, packed by KeySpans, for the HTML page to decode.
enum class Encoding { kJson, kPage };
std::string to_json(const Report& r, Encoding enc);

}  // namespace qkv::inspect
