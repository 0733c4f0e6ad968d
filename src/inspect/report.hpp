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
//   last_logits  [V]         next-token logits read from the last token's final vector; null
//                            data for a model without a head (an encoder): no next tokens
//
// The Report keeps the scores and patterns (f32, row per query, as PyTorch stores them) and
// replaces the rest by the numbers the page draws: norms, entropies, argmax keys, top-10.
// The seeds draw the same pattern transposed (keys down the left, one column per query);
// the page offers both orientations, the data has one.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/model.hpp"   // HeadAblation
#include "qkv/params.hpp"  // NormKind
#include "qkv/types.hpp"

namespace qkv::inspect {

// The model the report shows: its one Config, its name and the longest input it runs. The JSON's
// "model" object (name, n_layers, n_heads, n_kv_heads, head_dim, d_model, vocab, max_seq) is read
// from these when written; make_report checks the layers it is given against config.
struct ModelInfo {
  std::string name;  // e.g. the checkpoint's file name
  Config config;
  std::int64_t max_seq = 0;  // config.seq_len unless the caller knows a shorter one (an encoder's max_seq_length)
  static ModelInfo of(std::string name, const Config& c) { return {std::move(name), c, c.seq_len}; }
};

struct Token {
  std::int32_t id = 0;
  std::string text;      // the token's piece as the tokenizer decodes it (may be invalid UTF-8)
  bool special = false;  // a marker the tokenizer adds: BOS, or an encoder's [CLS] / [SEP]
};

// An encoder's pooled embedding of another input line, and its cosine with the traced line's.
struct Neighbour {
  std::int64_t line = 0;  // 0-based index among the input lines
  std::string text;
  double cosine = 0;
};

struct LayerInput {
  View scores, pattern, head_delta, block_delta;
  // Optional (null data: none), for the query·key anatomy: q [H, S, D] and k [Hkv, S, D] after
  // rotary, so that scores[h, i, j] = q[h, i] · k[h / (H / Hkv), j] / √D.
  View q, k;
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

// ---- Direct logit attribution and the logit lens (attribution.cpp) -----------------------------
// The model ends with logits = W_U · (N(x_L) + b_N), x_L [C] the last position's residual and N
// the final norm: RMSNorm g ⊙ x / σ, σ = √(mean(x²) + eps), or LayerNorm g ⊙ (x − mean x) / σ,
// σ = √(var(x) + eps), with bias b_N. Holding σ at its value for the full x_L makes N linear, and
// x_L is a sum of parts (embedding, every head's Δe_h, every layer's attention bias b_O and MLP
// output), so each part's contribution to token t's logit is W_U[t] · N(part); with W_U[t] · b_N
// they sum to the logit exactly.

// One part's push on one token, and a head's strongest pushes.
struct ScoredToken {
  std::int32_t id = 0;
  std::string text;
  double value = 0;  // the contribution to that token's logit
};

struct TokenAttribution {
  std::int32_t id = 0;
  std::string text;
  double logit = 0;                // the model's logit (from last_logits)
  std::vector<double> heads;       // [L·H] W_U[t] · N(Δe_h) at the last position, layer-major
  double embed = 0;                // the embedding (token + learned position)
  std::vector<double> attn_bias;   // [L] b_O (0 without biases)
  std::vector<double> mlp;         // [L] the MLP's output (with its bias b2)
  double norm_bias = 0;            // W_U[t] · b_N (0 for RMSNorm)
  double sum = 0;                  // all of the above: the logit, up to rounding
};

struct Attribution {
  double sigma = 0;                       // the final norm's σ at the last position
  std::vector<TokenAttribution> tokens;   // one per next_tokens entry, same order (first: predicted)
  // [L·H]: the kTopPushed tokens whose logit N(Δe_h) raises most / lowers most (any token).
  std::vector<std::vector<ScoredToken>> up, down;
  std::vector<float> head_vectors;        // [L·H, C] N(Δe_h) at the last position (dot W_U[t] = push on t)
};
inline constexpr int kTopPushed = 5;

// The logit lens: the final norm (its real, non-linear σ) and W_U applied to the residual after
// every layer. Row 0 is the embedding, row l + 1 the residual after layer l (the last row gives
// the model's own logits).
struct LensRow {
  std::vector<NextToken> top;        // the kLensTop most likely at the last position
  std::vector<NextToken> positions;  // the most likely at positions lens_pos0 … S − 1
};
inline constexpr int kLensTop = 10;
// Queries whose q vectors the report keeps for the anatomy view (keys: all S).
inline constexpr std::int64_t kAnatomyQueries = 4;
// Positions read through the lens besides the last: the last kLensPositions, and fewer when
// (L + 1) · positions · V · C would exceed kLensBudget multiply-adds (a big vocabulary).
inline constexpr std::int64_t kLensPositions = 64;
inline constexpr double kLensBudget = 2e9;

// ---- Head ablation (ablation.cpp) --------------------------------------------------------------
// Knocking head (l, h) out (qkv::HeadAblation: its output zeroed, or replaced by its mean over the
// prompt's positions) and rerunning the model gives new logits [S, V]; the page shows what that
// does to the prediction at the last position and to the prompt's loss.
struct AblationEffect {
  double p_predicted = 0;          // the new probability of the unablated prediction (next_tokens[0])
  NextToken top;                   // the ablated model's own most likely next token
  double loss = 0;                 // mean −ln p(token s + 1) over s = 0 … S − 2 (NaN when S = 1)
};
struct AblationTable {
  double p_predicted = 0, loss = 0;        // the unablated model's (the baseline)
  std::vector<AblationEffect> zero, mean;  // [L·H] layer-major, one per kind
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
  // Query·key anatomy (when the layers gave q and k): the queries qk_q0 … S − 1 (the last
  // kAnatomyQueries) of every head and every key; empty otherwise.
  std::int64_t qk_q0 = 0, qk_D = 0, qk_Hkv = 0;
  std::vector<std::vector<float>> q_last;          // [L][H · (S − qk_q0) · D]
  std::vector<std::vector<float>> k_all;           // [L][Hkv · S · D]
  std::optional<Attribution> attribution;          // add_attribution() fills these two
  std::int64_t lens_pos0 = 0;
  std::vector<LensRow> lens;                       // [L + 1], empty without add_attribution()
  bool bidirectional = false;                      // an encoder: every query sees every key
  std::vector<Neighbour> neighbours;               // encoders: the other lines, nearest first
  std::vector<HeadAblation> ablated;               // heads knocked out in the run this report shows
  // With heads knocked out: the same prompt's patterns without them, [L][H·S·S] row per query, so
  // that the page draws each head's pattern beside its unablated one and their difference; empty
  // when nothing is ablated.
  std::vector<std::vector<float>> baseline_pattern;
  std::optional<AblationTable> ablation;           // add_ablation_table() fills it

  float score(std::int64_t l, std::int64_t h, std::int64_t q, std::int64_t k) const {
    return scores[static_cast<std::size_t>(l)][static_cast<std::size_t>((h * S + q) * S + k)];
  }
  float weight(std::int64_t l, std::int64_t h, std::int64_t q, std::int64_t k) const {
    return pattern[static_cast<std::size_t>(l)][static_cast<std::size_t>((h * S + q) * S + k)];
  }
};

// Builds the report; validates every shape and value (finite weights in [0, 1], 0 where the
// score is −∞, rows summing to 1 within kRowSumTolerance; L, H and d_model equal to model.config's)
// and throws std::invalid_argument naming the layer and head otherwise. `token_text(id)` gives the piece of a vocabulary id.
Report make_report(const ModelInfo& model, std::string prompt, std::vector<Token> tokens,
                   const std::vector<LayerInput>& layers, const View& last_logits,
                   const std::function<std::string(std::int32_t)>& token_text,
                   nlohmann::json params);

// What add_attribution reads: plain f32 arrays, contiguous, shapes as written (C = d_model).
struct ModelTail {
  NormKind norm = NormKind::rmsnorm;
  double eps = 1e-5;
  const float* norm_w = nullptr;               // [C] g
  const float* norm_b = nullptr;               // [C] b_N, or null (RMSNorm, LayerNorm without bias)
  const float* unembed = nullptr;              // [V, C] W_U
  const float* embed = nullptr;                // [S, C] residual before layer 0
  std::vector<const float*> resid;             // L × [S, C] residual after layer l
  std::vector<const float*> head_delta;        // L × [H, S, C] Δe_h
  std::vector<const float*> out_bias;          // L × [C] b_O, or null
};
// Fills r.attribution (for every token of r.next_tokens) and r.lens from a report made by
// make_report; throws std::invalid_argument if a pointer is null or the sizes disagree.
void add_attribution(Report& r, const ModelTail& m, const std::function<std::string(std::int32_t)>& token_text);

// The effect read from logits [S, V] (row s: the prediction after token s).
AblationEffect ablation_effect(const Report& r, const float* logits,
                               const std::function<std::string(std::int32_t)>& token_text);
// Fills r.ablation: the baseline from the unablated logits [S, V], then for every head and both
// kinds forward(a, logits) must write the logits [S, V] of the model with head a knocked out.
using AblatedForward = std::function<void(const HeadAblation& a, float* logits)>;
void add_ablation_table(Report& r, const float* logits, const AblatedForward& forward,
                        const std::function<std::string(std::int32_t)>& token_text);

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
// them packed by KeySpans for the HTML page to decode: as base64 little-endian f32 (exact) when
// the two matrices' stored cells take at most `exact_bytes` as f32, else compact — the weight as
// u16 round(p · 65535) (|error| ≤ 0.5/65535), the score as bf16 (nearest even: relative error ≤ 2^-8,
// −∞ kept), each array split into its high-byte and low-byte planes and deflated (zlib), then
// base64. The baseline patterns (when present) are written as the patterns are: "baseline_pattern"
// per head (kJson), "baseline_f32" / "baseline_u16" per layer (kPage). The 512-token stories260K
// page: 58.7 MB exact, under 10 MB compact.
//
// A compact page of more than kCompactScoresCells stored cells (L·H·Σ_q spans) leaves the scores
// out ("scores_stored": false) when no stored cell is masked (then the spans alone say what is
// masked): the page shows weights for every cell and scores where it has q and k (the anatomy's
// last queries, q·k/√D). The 512-token stories260K page (5.3 M cells) keeps them and weighs 9.1
// MB; at 1,000 tokens (20 M cells) its bf16 scores alone took 17.6 MB, its weights 4.6 MB. In the
// page, q and k are base64 little-endian f32 ("q_f32" [H][S − qk_q0][D], "k_f32" [Hkv][S][D]).
enum class Encoding { kJson, kPage };
inline constexpr double kExactPageBytes = 8e6;
inline constexpr double kCompactScoresCells = 8e6;
std::string to_json(const Report& r, Encoding enc, double exact_bytes = kExactPageBytes);

}  // namespace qkv::inspect
