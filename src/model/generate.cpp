// Sampling and the generation loop, following llama2.c's run.c step for step so that the same
// seed gives the same text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "qkv/model.hpp"

namespace qkv {

Sampler::Sampler(std::int64_t vocab_size, const SamplerOptions& opt) : V_(vocab_size), opt_(opt), state_(opt.seed) {
  const char* fn = "qkv::Sampler";
  if (vocab_size < 1) fail(fn, "vocab_size: must be ≥ 1, got " + std::to_string(vocab_size));
  if (!(opt.temperature >= 0.0f) || !std::isfinite(opt.temperature))
    fail(fn, "opt.temperature: must be a finite number ≥ 0, got " + std::to_string(opt.temperature));
  if (!std::isfinite(opt.top_p)) fail(fn, "opt.top_p: must be finite, got " + std::to_string(opt.top_p));
  if (opt.top_k < 0) fail(fn, "opt.top_k: must be ≥ 0 (0 disables it), got " + std::to_string(opt.top_k));
  if (opt.seed == 0) fail(fn, "opt.seed: must be non-zero (xorshift's state 0 never changes)");
  cand_.reserve(static_cast<std::size_t>(vocab_size));
}

// The rules `qkv generate` documents for its flags, named as the options (steps, temperature,
// top_p, top_k, seed) so that the CLI and Python (qkv.Model.generate) give the same message.
void validate_generate_options(const GenerateOptions& opt, std::string_view fn) {
  const auto num = [](double x) {
    std::ostringstream s;
    s << x;
    return s.str();
  };
  if (opt.steps < 0)
    fail(fn, "steps: must be ≥ 0 (positions in all, 0: the whole context), got " + std::to_string(opt.steps));
  const SamplerOptions& s = opt.sampling;
  if (!(s.temperature >= 0.0f && s.temperature <= 100.0f))
    fail(fn, "temperature: must be in [0, 100] (0 is greedy), got " + num(s.temperature));
  if (!(s.top_p >= 0.0f && s.top_p <= 1.0f))
    fail(fn, "top_p: must be in [0, 1] (0 or 1 disables nucleus sampling), got " + num(s.top_p));
  if (s.top_k < 0) fail(fn, "top_k: must be ≥ 0 (0 disables it), got " + std::to_string(s.top_k));
  if (s.seed == 0) fail(fn, "seed: must be ≥ 1 (xorshift's state 0 never changes), got 0");
}

// xorshift*, exactly llama2.c's random_u32 / random_f32.
float Sampler::random_f32() {
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  const auto u = static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  return static_cast<float>(u >> 8) / 16777216.0f;
}

namespace {

// The index of the first logit that is NaN or ±inf, or −1.
std::int64_t first_non_finite(const float* logits, std::int64_t V) {
  for (std::int64_t i = 0; i < V; ++i)
    if (!std::isfinite(logits[i])) return i;
  return -1;
}

}  // namespace

int Sampler::sample(float* logits) {
  const char* fn = "qkv::Sampler::sample";
  const std::int64_t V = V_;
  if (const std::int64_t bad = first_non_finite(logits, V); bad >= 0)
    fail(fn, "logits: token " + std::to_string(bad) + " has the non-finite logit " + std::to_string(logits[bad]) +
                 "; no token can be sampled");
  if (opt_.temperature == 0.0f) {  // greedy: the first maximum
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < V; ++i)
      if (logits[i] > logits[best]) best = i;
    return static_cast<int>(best);
  }
  for (std::int64_t i = 0; i < V; ++i) logits[i] /= opt_.temperature;
  if (const std::int64_t bad = first_non_finite(logits, V); bad >= 0)
    fail(fn, "logits: token " + std::to_string(bad) + "'s logit overflows float when divided by the temperature " +
                 std::to_string(opt_.temperature));
  if (opt_.top_k > 0 && opt_.top_k < V) {
    // Keep the k largest logits (the first ones among equals); the rest get probability 0.
    cand_.clear();
    for (std::int64_t i = 0; i < V; ++i) cand_.emplace_back(logits[i], static_cast<int>(i));
    std::nth_element(cand_.begin(), cand_.begin() + opt_.top_k - 1, cand_.end(), [](auto a, auto b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    const auto kth = cand_[static_cast<std::size_t>(opt_.top_k - 1)];
    for (std::int64_t i = 0; i < V; ++i)
      if (logits[i] < kth.first || (logits[i] == kth.first && i > kth.second))
        logits[i] = -std::numeric_limits<float>::infinity();
  }
  // softmax in f32 as llama2.c: max, exp(x − max), divide by the sum.
  float mx = logits[0];
  for (std::int64_t i = 1; i < V; ++i) mx = std::max(mx, logits[i]);
  float sum = 0.0f;
  for (std::int64_t i = 0; i < V; ++i) {
    logits[i] = std::exp(logits[i] - mx);
    sum += logits[i];
  }
  for (std::int64_t i = 0; i < V; ++i) logits[i] /= sum;
  const float coin = random_f32();
  if (opt_.top_p <= 0.0f || opt_.top_p >= 1.0f) {
    float cdf = 0.0f;
    for (std::int64_t i = 0; i < V; ++i) {
      cdf += logits[i];
      if (coin < cdf) return static_cast<int>(i);
    }
    return static_cast<int>(V - 1);  // rounding: the cdf fell short of the coin
  }
  // Nucleus: tokens below (1 − p)/(V − 1) cannot be in it and are dropped before sorting;
  // sort by probability (stable, as glibc's merge-sort qsort), cut where the mass exceeds p.
  const float cutoff = (1.0f - opt_.top_p) / static_cast<float>(V - 1);
  cand_.clear();
  for (std::int64_t i = 0; i < V; ++i)
    if (logits[i] >= cutoff) cand_.emplace_back(logits[i], static_cast<int>(i));
  // The cutoff can exceed every probability (a flat distribution with top_p < 1/V): the nucleus
  // is then the most likely token alone (the first maximum), never an empty list.
  if (cand_.empty()) return static_cast<int>(std::max_element(logits, logits + V) - logits);
  std::stable_sort(cand_.begin(), cand_.end(), [](auto a, auto b) { return a.first > b.first; });
  float cum = 0.0f;
  std::size_t last = cand_.size() - 1;
  for (std::size_t i = 0; i < cand_.size(); ++i) {
    cum += cand_[i].first;
    if (cum > opt_.top_p) {
      last = i;
      break;
    }
  }
  const float r = coin * cum;
  float cdf = 0.0f;
  for (std::size_t i = 0; i <= last; ++i) {
    cdf += cand_[i].first;
    if (r < cdf) return cand_[i].second;
  }
  return cand_[last].second;
}

GenerateStats generate(Model& model, const Tokenizer& tok, std::string_view prompt, const GenerateOptions& opt,
                       const std::function<void(std::string_view)>& emit) {
  const char* fn = "qkv::generate";
  validate_generate_options(opt, fn);
  const Config& c = model.config();
  if (tok.vocab_size() != c.vocab_size)
    fail(fn, "tok: vocabulary of " + std::to_string(tok.vocab_size()) + " tokens, but the model's is " +
                 std::to_string(c.vocab_size));
  Sampler sampler(c.vocab_size, opt.sampling);
  const std::int64_t steps = (opt.steps <= 0 || opt.steps > c.seq_len) ? c.seq_len : opt.steps;
  std::vector<int> tokens = tok.encode(prompt, true, false);
  // Without BOS the first token is the prompt's own (emitted below), or "\n" for an empty prompt.
  const bool has_bos = tok.bos_id() >= 0;
  if (!has_bos && tokens.empty()) {
    tokens = tok.encode("\n", false, false);
    if (tokens.size() != 1)
      fail(fn, "prompt: empty, and the tokenizer has neither BOS nor a \"\\n\" token to start from; give a prompt");
  }
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n > c.seq_len)
    fail(fn, "prompt: " + std::to_string(n) + " tokens (with BOS) do not fit the model's context of " +
                 std::to_string(c.seq_len) + " positions");

  GenerateStats st;
  st.prompt_tokens = n;
  st.tokens = tokens;
  st.pieces.assign(tokens.size(), std::string());
  KvCache cache = model.new_cache();
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); };
  // The prompt is needed in the cache only if generation goes past it.
  // Logits of position `pos` (the prediction of its successor) with a NaN or inf: stop, naming it.
  auto check_logits = [&](std::int64_t pos) {
    if (const std::int64_t bad = first_non_finite(logits.data(), c.vocab_size); bad >= 0)
      fail(fn, "the logits at position " + std::to_string(pos) + " are not finite (token " + std::to_string(bad) +
                   ": " + std::to_string(logits[static_cast<std::size_t>(bad)]) +
                   "): the model's weights or activations overflow float; generation stopped there");
  };
  if (steps >= n) {
    const auto t0 = clock::now();
    model.forward(tokens, cache, logits.data());
    st.prefill_seconds = seconds(t0);
  }
  // Position pos holds `token`; its successor is the prompt's next token or a sample. llama2.c
  // prints the successor's piece at each of the `steps` positions and stops at BOS.
  int token = tokens[0];
  if (!has_bos && !prompt.empty()) {
    st.pieces[0] = tok.decode(-1, token);
    emit(st.pieces[0]);
  }
  const auto t1 = clock::now();
  for (std::int64_t pos = 0; pos < steps; ++pos) {
    int next;
    if (pos < n - 1) {
      next = tokens[static_cast<std::size_t>(pos + 1)];
    } else {
      if (pos >= n) model.forward(std::span<const int>(&token, 1), cache, logits.data());
      check_logits(pos);
      next = sampler.sample(logits.data());
      ++st.generated;
      st.tokens.push_back(next);
      st.pieces.emplace_back();
    }
    if (next == tok.bos_id() || next == tok.eos_id()) break;
    const std::string_view piece = tok.decode(token, next);
    if (Tokenizer::printable(piece)) {
      st.pieces[static_cast<std::size_t>(pos + 1)] = piece;
      emit(piece);
    }
    token = next;
  }
  st.decode_seconds = seconds(t1);
  return st;
}

}  // namespace qkv
