// Sampling and the generation loop, following llama2.c's run.c step for step so that the same
// seed gives the same text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>
#include <span>
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
  if (opt.kv_dtype && *opt.kv_dtype != DType::f32 && *opt.kv_dtype != DType::bf16 && *opt.kv_dtype != DType::i8)
    fail(fn, std::string("kv_dtype: must be f32, bf16 or i8, got ") + dtype_name(*opt.kv_dtype));
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

namespace {

// One sequence of llama2.c's generation loop, as a state machine so that several can share each
// decoding step (generate_batch). Position pos holds `token`; its successor is the prompt's next
// token or a sample. llama2.c prints the successor's piece at each of the `steps` positions and
// stops at a sampled EOS (llama2.c: or BOS).
struct Sequence {
  std::vector<int> tokens;  // the prompt (with BOS when the tokenizer has one)
  std::int64_t n = 0, pos = 0;
  int token = 0;
  KvCache cache;
  Sampler sampler;
  bool fresh = false;  // logits hold the prediction for `token` at `pos`
  bool done = false;
  GenerateStats st;
  Sequence(const Sampler& s) : sampler(s) {}
};

class Generator {
 public:
  Generator(Model& model, const Tokenizer& tok, const GenerateOptions& opt, const char* fn)
      : model_(model), tok_(tok), c_(model.config()), fn_(fn) {
    validate_generate_options(opt, fn);
    if (tok.vocab_size() != c_.vocab_size)
      fail(fn, "tok: vocabulary of " + std::to_string(tok.vocab_size()) + " tokens, but the model's is " +
                   std::to_string(c_.vocab_size));
    opt_ = opt;
    steps_ = (opt.steps <= 0 || opt.steps > c_.seq_len) ? c_.seq_len : opt.steps;
  }

  // Encodes the prompt, prefills it (when generation goes past it), emits what precedes the first
  // decoding step.
  void start(Sequence& s, std::string_view prompt, std::span<float> logits,
             const std::function<void(std::string_view)>& emit) {
    s.tokens = tok_.encode(prompt, true, false);
    // Without BOS the first token is the prompt's own (emitted below), or "\n" for an empty prompt.
    const bool has_bos = tok_.bos_id() >= 0;
    if (!has_bos && s.tokens.empty()) {
      s.tokens = tok_.encode("\n", false, false);
      if (s.tokens.size() != 1)
        fail(fn_, "prompt: empty, and the tokenizer has neither BOS nor a \"\\n\" token to start from; give a prompt");
    }
    s.n = static_cast<std::int64_t>(s.tokens.size());
    if (s.n > c_.seq_len)
      fail(fn_, "prompt: " + std::to_string(s.n) + " tokens (with BOS) do not fit the model's context of " +
                    std::to_string(c_.seq_len) + " positions");
    s.st.prompt_tokens = s.n;
    s.st.tokens = s.tokens;
    s.st.pieces.assign(s.tokens.size(), std::string());
    const std::int64_t cap = std::max<std::int64_t>(steps_, 1);
    s.cache = opt_.kv_dtype ? KvCache(c_, cap, *opt_.kv_dtype) : model_.new_cache(cap);
    // The prompt is needed in the cache only if generation goes past it.
    if (steps_ >= s.n) {
      const auto t0 = clock::now();
      model_.forward(s.tokens, s.cache, logits.data());
      s.st.prefill_seconds = seconds(t0);
      s.fresh = true;
    }
    s.token = s.tokens[0];
    if (!has_bos && !prompt.empty()) {
      s.st.pieces[0] = tok_.decode(-1, s.token);
      emit(s.st.pieces[0]);
    }
  }

  // Advances s until it needs the logits of a new token (s.done false: forward s.token next) or ends.
  void advance(Sequence& s, std::span<float> logits, const std::function<void(std::string_view)>& emit) {
    while (s.pos < steps_) {
      int next;
      if (s.pos < s.n - 1) {
        next = s.tokens[static_cast<std::size_t>(s.pos + 1)];
      } else {
        if (s.pos >= s.n && !s.fresh) return;
        s.fresh = false;
        check_logits(logits, s.pos);
        next = s.sampler.sample(logits.data());
        ++s.st.generated;
        s.st.tokens.push_back(next);
        s.st.pieces.emplace_back();
      }
      // A sampled EOS ends the text; llama2.c also stops at a sampled BOS. A Hugging Face prompt
      // may hold them as added tokens written in the text, and goes on.
      const bool sampled = s.pos >= s.n - 1;
      if (sampled && (next == tok_.eos_id() || (tok_.format() == Tokenizer::Format::llama2c && next == tok_.bos_id())))
        break;
      const std::string_view piece = tok_.decode(s.token, next);
      if (Tokenizer::printable(piece)) {
        s.st.pieces[static_cast<std::size_t>(s.pos + 1)] = piece;
        emit(piece);
      }
      s.token = next;
      ++s.pos;
    }
    s.done = true;
  }

  using clock = std::chrono::steady_clock;
  static double seconds(clock::time_point a) { return std::chrono::duration<double>(clock::now() - a).count(); }
  const GenerateOptions& options() const { return opt_; }

 private:
  // Logits of position `pos` (the prediction of its successor) with a NaN or inf: stop, naming it.
  void check_logits(std::span<const float> logits, std::int64_t pos) const {
    if (const std::int64_t bad = first_non_finite(logits.data(), c_.vocab_size); bad >= 0)
      fail_nonfinite(fn_, "the logits at position " + std::to_string(pos) + " are not finite (token " + std::to_string(bad) +
                    ": " + std::to_string(logits[static_cast<std::size_t>(bad)]) +
                    "): the model's weights or activations overflow float; generation stopped there");
  }
  Model& model_;
  const Tokenizer& tok_;
  const Config& c_;
  const char* fn_;
  GenerateOptions opt_;
  std::int64_t steps_ = 0;
};

}  // namespace

GenerateStats generate(Model& model, const Tokenizer& tok, std::string_view prompt, const GenerateOptions& opt,
                       const std::function<void(std::string_view)>& emit) {
  Generator g(model, tok, opt, "qkv::generate");
  const auto V = static_cast<std::size_t>(model.config().vocab_size);
  std::vector<float> logits(V);
  Sequence s(Sampler(static_cast<std::int64_t>(V), opt.sampling));
  g.start(s, prompt, logits, emit);
  const auto t1 = Generator::clock::now();
  for (g.advance(s, logits, emit); !s.done; g.advance(s, logits, emit)) {
    model.forward(std::span<const int>(&s.token, 1), s.cache, logits.data());
    s.fresh = true;
  }
  s.st.decode_seconds = Generator::seconds(t1);
  return s.st;
}

std::vector<std::string> generate_batch(Model& model, const Tokenizer& tok, std::span<const std::string> prompts,
                                        const GenerateOptions& opt, GenerateStats* stats) {
  const char* fn = "qkv::generate_batch";
  if (prompts.empty()) fail(fn, "prompts: must not be empty");
  Generator g(model, tok, opt, fn);
  const auto B = prompts.size();
  const auto V = static_cast<std::size_t>(model.config().vocab_size);
  std::vector<float> logits(B * V);
  std::vector<std::string> texts(B);
  std::vector<Sequence> seqs;
  seqs.reserve(B);
  auto emit_to = [&](std::size_t i) { return [&texts, i](std::string_view piece) { texts[i] += piece; }; };
  GenerateStats total;
  for (std::size_t i = 0; i < B; ++i) {
    seqs.emplace_back(Sampler(static_cast<std::int64_t>(V), opt.sampling));
    g.start(seqs[i], prompts[i], std::span<float>(logits.data() + i * V, V), emit_to(i));
    total.prompt_tokens += seqs[i].n;
    total.prefill_seconds += seqs[i].st.prefill_seconds;
  }
  // Lockstep: every sequence still going gets one token of the batched step; its logits row is
  // then its own prediction, as forward() of that token alone would give it (the same bits).
  const auto t1 = Generator::clock::now();
  std::vector<int> step_tokens;
  std::vector<KvCache*> step_caches;
  std::vector<std::size_t> step_seqs;
  std::vector<float> step_logits;
  for (std::size_t i = 0; i < B; ++i) g.advance(seqs[i], std::span<float>(logits.data() + i * V, V), emit_to(i));
  for (;;) {
    step_tokens.clear();
    step_caches.clear();
    step_seqs.clear();
    for (std::size_t i = 0; i < B; ++i)
      if (!seqs[i].done) {
        step_tokens.push_back(seqs[i].token);
        step_caches.push_back(&seqs[i].cache);
        step_seqs.push_back(i);
      }
    if (step_seqs.empty()) break;
    step_logits.resize(step_seqs.size() * V);
    model.forward_batch(step_tokens, step_caches, step_logits.data());
    for (std::size_t j = 0; j < step_seqs.size(); ++j) {
      const std::size_t i = step_seqs[j];
      std::span<float> row(logits.data() + i * V, V);
      std::copy_n(step_logits.data() + j * V, V, row.data());
      seqs[i].fresh = true;
      g.advance(seqs[i], row, emit_to(i));
    }
  }
  total.decode_seconds = Generator::seconds(t1);
  for (const Sequence& s : seqs) total.generated += s.st.generated;
  if (stats) *stats = total;
  return texts;
}

}  // namespace qkv
