// The model floor: the traced forward's invariants, incremental decoding against a full forward,
// safetensors round trips, the tokenizer's round trip, and every loader's refusal of bad files.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/parallel.hpp"
#include "model/safetensors.hpp"
#include "qkv/kv_cache.hpp"
#include "qkv/model.hpp"
#include "support/temp_path.hpp"

namespace {

const std::string kDir = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/";
const std::string kModel = kDir + "stories260K.bin";
const std::string kTok = kDir + "tok512.bin";

std::string read_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string tmp_path(const std::string& name) {
  return qkv::testing::temp_path(name);
}

std::string write_tmp(const std::string& name, const std::string& bytes) {
  const std::string p = tmp_path(name);
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return p;
}

// Runs f, expecting an error of type E (a bad argument unless E says otherwise; qkv/types.hpp)
// whose message contains every one of `parts`.
template <class E = std::invalid_argument, class F>
void expect_error(F f, std::initializer_list<const char*> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning " << *parts.begin();
  } catch (const E& e) {
    const std::string m = e.what();
    std::printf("  refused: %s\n", m.c_str());
    for (const char* p : parts) EXPECT_NE(m.find(p), std::string::npos) << "message: " << m << "\nmissing: " << p;
  }
}

// Forces the loaders' weight placement (src/model/weight_placement.hpp) while it lives, through
// QKV_WEIGHT_PLACEMENT ("copied" or "in_place"; "" restores the machine's rule), and restores
// the previous value.
class ScopedPlacement {
 public:
  explicit ScopedPlacement(const char* value) {
    if (const char* old = std::getenv("QKV_WEIGHT_PLACEMENT")) old_ = old, had_ = true;
    ::setenv("QKV_WEIGHT_PLACEMENT", value, 1);
  }
  ~ScopedPlacement() {
    if (had_) ::setenv("QKV_WEIGHT_PLACEMENT", old_.c_str(), 1);
    else ::unsetenv("QKV_WEIGHT_PLACEMENT");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// ---------------------------------------------------------------------------------------------
// Traced forward (for qkv inspect)
// ---------------------------------------------------------------------------------------------
TEST(Model, TraceHeadsSumToBlockAndPatternIsSoftmaxOfScores) {
  qkv::Model model(qkv::load_llama2c(kModel));
  const auto tok = qkv::Tokenizer::load(kTok, model.config().vocab_size);
  const std::vector<int> tokens = tok.encode("Lily saw a big red ball in the park.", true, false);
  qkv::Trace tr;
  model.forward_trace(tokens, tr);
  const auto& c = model.config();
  const std::int64_t S = static_cast<std::int64_t>(tokens.size()), H = c.n_heads, C = c.dim;
  ASSERT_EQ(static_cast<std::int64_t>(tr.layers.size()), c.n_layers);
  double err_sum = 0, err_pat = 0, max_row = 0;
  for (const auto& L : tr.layers) {
    const float *hd = L.head_delta.ptr<float>(), *bd = L.block_delta.ptr<float>();
    const float *sc = L.scores.ptr<float>(), *pa = L.pattern.ptr<float>();
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t o = 0; o < C; ++o) {
        double sum = 0;
        for (std::int64_t h = 0; h < H; ++h) sum += hd[(h * S + s) * C + o];
        err_sum = std::max(err_sum, std::abs(sum - bd[s * C + o]));
      }
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i) {
        const float* row = sc + (h * S + i) * S;
        double mx = -1e300, z = 0;
        for (std::int64_t j = 0; j <= i; ++j) mx = std::max(mx, double(row[j]));
        for (std::int64_t j = 0; j <= i; ++j) z += std::exp(row[j] - mx);
        double rs = 0;
        for (std::int64_t j = 0; j < S; ++j) {
          const double want = j <= i ? std::exp(row[j] - mx) / z : 0.0;
          if (j > i) {
            EXPECT_EQ(row[j], -std::numeric_limits<float>::infinity());
          }
          err_pat = std::max(err_pat, std::abs(want - pa[(h * S + i) * S + j]));
          rs += pa[(h * S + i) * S + j];
        }
        max_row = std::max(max_row, std::abs(rs - 1));
      }
  }
  std::printf("max |Σ_h Δe_h − block Δe| = %.3g, max |pattern − softmax(scores)| = %.3g, max |row sum − 1| = %.3g\n",
              err_sum, err_pat, max_row);
  // Per-head deltas are f64 dot products rounded to f32; the block delta an f32 sgemm over H·D = 64
  // terms: both err by ~1e-7 relative on values ≤ ~10.
  EXPECT_LT(err_sum, 1e-5);
  // Scores come from the same q, k in f64 here vs the kernel's f32: ~1e-6 after the softmax.
  EXPECT_LT(err_pat, 1e-5);
  EXPECT_LT(max_row, 1e-5);

  // The trace's logits are the ordinary forward's, position by position.
  qkv::KvCache cache(c);
  std::vector<float> logits(static_cast<std::size_t>(S * c.vocab_size));
  model.forward(tokens, cache, logits.data(), true);
  double err_l = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) err_l = std::max(err_l, std::abs(double(logits[i]) - tr.logits.ptr<float>()[i]));
  std::printf("max |trace logits − forward logits| = %.3g\n", err_l);
  EXPECT_LT(err_l, 1e-4);  // same f32 arithmetic except the attention kernel chosen: ~1e-6 on logits of ~10
}

// One query at a time against the cache gives what one call over the whole sequence gives.
TEST(Model, IncrementalDecodingMatchesFullForward) {
  qkv::Model model(qkv::load_llama2c(kModel));
  const auto& c = model.config();
  std::vector<int> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back(1 + (i * 37) % 511);
  const std::int64_t S = 40, V = c.vocab_size;
  qkv::KvCache full(c);
  std::vector<float> ref(static_cast<std::size_t>(S * V)), step(static_cast<std::size_t>(V));
  model.forward(tokens, full, ref.data(), true);
  qkv::KvCache inc(c);
  model.forward(std::span<const int>(tokens.data(), 7), inc, step.data());  // a prefill of 7, then one by one
  double err = 0;
  for (std::int64_t v = 0; v < V; ++v) err = std::max(err, std::abs(double(step[v]) - ref[6 * V + v]));
  for (std::int64_t s = 7; s < S; ++s) {
    model.forward(std::span<const int>(tokens.data() + s, 1), inc, step.data());
    for (std::int64_t v = 0; v < V; ++v) err = std::max(err, std::abs(double(step[v]) - ref[s * V + v]));
  }
  std::printf("max |incremental − full| logits = %.3g\n", err);
  EXPECT_LT(err, 1e-4);  // GEMV vs GEMM summation order in f32, 5 layers: ~1e-6 relative on logits ~10
  EXPECT_EQ(inc.len, S);
  expect_error([&] { model.forward(std::span<const int>(tokens.data(), 1), inc, nullptr); }, {"logits"});
  int bad = 512;
  expect_error([&] { model.forward(std::span<const int>(&bad, 1), inc, step.data()); }, {"outside the vocabulary"});
  qkv::KvCache small(c, 4);
  expect_error([&] { model.forward(tokens, small, ref.data(), true); }, {"capacity 4"});
  expect_error([&] { qkv::KvCache(c, 0, qkv::DType::f64); }, {"qkv::KvCache", "dtype", "f64"});
  qkv::KvCache mixed(c, 8);
  mixed.v = qkv::Buffer(qkv::DType::bf16, mixed.k.shape());
  expect_error([&] { model.forward(std::span<const int>(tokens.data(), 2), mixed, ref.data()); },
               {"qkv::Model::forward", "cache", "f32", "bf16"});
  qkv::KvCache unscaled(c, 8, qkv::DType::i8);
  unscaled.v_scale = qkv::Buffer();
  expect_error([&] { model.forward(std::span<const int>(tokens.data(), 2), unscaled, ref.data()); },
               {"qkv::Model::forward", "i8 cache", "v_scale"});
}

// The model's i8 cache holds, at every position, the rows qkv::kvcache_append makes of the f32
// rows it is given (the attention API's quantiser, not a second one), in its [L, Hkv, capacity, D]
// layout. Layer 0's keys and values depend only on the tokens, so they are the f32-cache model's
// layer-0 rows, which an AttentionKvCache (i8) quantises here: after a prefill of 9 tokens (block())
// and 6 one-token steps (Model::decode), on stories260K (GQA 8/4, rotary), the int8 rows and the
// scales must be those bytes exactly (tolerance 0).
TEST(Model, I8CacheRowsAreTheAttentionApisQuantisation) {
  qkv::Model model(qkv::load_llama2c(kModel), qkv::ModelOptions{qkv::DType::f32, 2});
  const auto& c = model.config();
  const std::int64_t Hkv = c.n_kv_heads, D = c.head_dim(), S = 15;
  std::vector<int> tokens;
  for (int i = 0; i < S; ++i) tokens.push_back(1 + (i * 53) % 511);
  std::vector<float> logits(static_cast<std::size_t>(c.vocab_size));
  qkv::KvCache f32(c, 32), i8(c, 32, qkv::DType::i8);
  for (qkv::KvCache* cache : {&f32, &i8}) {
    model.forward(std::span<const int>(tokens.data(), 9), *cache, logits.data());
    for (std::int64_t s = 9; s < S; ++s) model.forward(std::span<const int>(tokens.data() + s, 1), *cache, logits.data());
  }
  qkv::AttentionKvCache api(1, S, Hkv, D, qkv::DType::i8);
  // Layer 0 of the f32 cache, [Hkv, capacity, D], as rows [S, Hkv, D] (strides D, capacity·D, 1).
  const qkv::View k0 = qkv::View::strided(f32.k.data(), qkv::DType::f32, {S, Hkv, D}, {D, f32.capacity * D, 1});
  const qkv::View v0 = qkv::View::strided(f32.v.data(), qkv::DType::f32, {S, Hkv, D}, {D, f32.capacity * D, 1});
  api.append_to(0, k0, v0);
  const qkv::KvCacheView a = api.view();
  std::int64_t differ = 0;
  for (std::int64_t h = 0; h < Hkv; ++h)
    for (std::int64_t p = 0; p < S; ++p) {
      const std::int64_t row = h * i8.capacity + p;  // layer 0
      differ += i8.k_scale.ptr<float>()[row] != a.k_scale->ptr<float>()[a.k_scale->offset(0, p, h)];
      differ += i8.v_scale.ptr<float>()[row] != a.v_scale->ptr<float>()[a.v_scale->offset(0, p, h)];
      differ += std::memcmp(i8.k.ptr<std::int8_t>() + row * D, a.k.ptr<std::int8_t>() + a.k.offset(0, p, h, 0), D) != 0;
      differ += std::memcmp(i8.v.ptr<std::int8_t>() + row * D, a.v.ptr<std::int8_t>() + a.v.offset(0, p, h, 0), D) != 0;
    }
  EXPECT_EQ(differ, 0) << "rows or scales of layer 0 that differ from the attention API's";
  EXPECT_EQ(i8.len, S);
}

// A one-token call runs in one parallel region (Model::decode) on any number of threads. Every row
// goes through the same GEMV kernel and every head through the same attention kernel whichever
// thread computes it, so the logits must equal the one-thread path's bit for bit
// (tolerance 0): stories260K (RMSNorm, rotary, GQA 8/4, SwiGLU), the tiny GPT-2 (LayerNorm,
// learned positions, GELU, biases) and the tiny GQA model (4/2 heads, no positions), with f32 and
// bf16 weights, each with an f32, a bf16 and an i8 KV cache, on 2 and 3 threads (3 splits 4 KV heads
// 1/1/2, and 2 KV heads 0/1/1: a thread with no head). A prefill of 3 tokens (block() with GEMVs),
// then 12 tokens one at a time.
TEST(Model, DecodeStepOnThreadsEqualsOneThread) {
  const std::string golden = std::string(QKV_SOURCE_DIR) + "/tests/golden/model/";
  const std::pair<const char*, qkv::Weights> models[] = {
      {"stories260K", qkv::load_llama2c(kModel)},
      {"tiny_gpt2", qkv::load_weights(golden + "tiny_gpt2.safetensors")},
      {"tiny_gqa_bf16", qkv::load_weights(golden + "tiny_gqa_bf16.safetensors")}};
  for (const auto& [name, w] : models)
    for (qkv::DType dt : {qkv::DType::f32, qkv::DType::bf16})
    for (qkv::DType kv : {qkv::DType::f32, qkv::DType::bf16, qkv::DType::i8}) {
      const auto& c = w.config;
      std::vector<int> tokens;
      for (int i = 0; i < 15; ++i) tokens.push_back(1 + (i * 37) % static_cast<int>(c.vocab_size - 1));
      auto run = [&](int threads) {
        qkv::Model m(w, qkv::ModelOptions{dt, threads});
        qkv::KvCache cache(c, 0, kv);
        std::vector<float> logits, step(static_cast<std::size_t>(c.vocab_size));
        m.forward(std::span<const int>(tokens.data(), 3), cache, step.data());
        logits.insert(logits.end(), step.begin(), step.end());
        for (std::size_t s = 3; s < tokens.size(); ++s) {
          m.forward(std::span<const int>(tokens.data() + s, 1), cache, step.data());
          logits.insert(logits.end(), step.begin(), step.end());
        }
        return logits;
      };
      const auto one = run(1);
      for (int threads : {2, 3}) {
        const auto many = run(threads);
        double err = 0;
        for (std::size_t i = 0; i < one.size(); ++i) err = std::max(err, std::abs(double(many[i]) - one[i]));
        std::printf("%-13s %s weights, %s cache, %d threads: max |logits − one thread's| = %.3g\n", name,
                    qkv::dtype_name(dt), qkv::dtype_name(kv), threads, err);
        EXPECT_EQ(err, 0.0) << name << " " << qkv::dtype_name(dt) << " " << qkv::dtype_name(kv) << " on " << threads
                            << " threads";
      }
    }
  EXPECT_THROW(qkv::Model(qkv::load_llama2c(kModel), qkv::ModelOptions{qkv::DType::f32, -1}), std::invalid_argument);
}

// Model::forward_batch: sequences with prompts of different lengths (prefilled alone), then one
// token each per batched step, against each sequence decoded alone with forward(): the logits must
// be the same bits (tolerance 0: each row of every matrix and each head's attention is computed by
// the same code for one sequence or eight; an i8 cache: the same qkv::attention_kvcache call per
// sequence and run of KV heads, whose result does not depend on the run). Models and modes as
// DecodeStepOnThreadsEqualsOneThread,
// on 1 and 2 threads; a sequence that stops early leaves the batch (B shrinks from 5 to 3).
TEST(Model, ForwardBatchEqualsOneSequenceAtATime) {
  const std::string golden = std::string(QKV_SOURCE_DIR) + "/tests/golden/model/";
  const std::pair<const char*, qkv::Weights> models[] = {
      {"stories260K", qkv::load_llama2c(kModel)},
      {"tiny_gpt2", qkv::load_weights(golden + "tiny_gpt2.safetensors")},
      {"tiny_gqa_bf16", qkv::load_weights(golden + "tiny_gqa_bf16.safetensors")}};
  const std::int64_t prompt_len[] = {1, 3, 7, 2, 5}, steps[] = {12, 12, 6, 12, 9};
  for (const auto& [name, w] : models)
    for (qkv::DType dt : {qkv::DType::f32, qkv::DType::bf16})
      for (qkv::DType kv : {qkv::DType::f32, qkv::DType::bf16, qkv::DType::i8})
        for (int threads : {1, 2}) {
          const auto& c = w.config;
          const int V = static_cast<int>(c.vocab_size);
          auto token = [&](std::size_t seq, std::int64_t i) { return 1 + static_cast<int>((seq * 101 + i * 37) % (V - 1)); };
          qkv::Model m(w, qkv::ModelOptions{dt, threads});
          std::vector<float> alone, batched, step(static_cast<std::size_t>(V));
          for (std::size_t b = 0; b < 5; ++b) {  // each sequence alone: prefill, then steps[b] tokens
            qkv::KvCache cache(c, 0, kv);
            std::vector<int> prompt;
            for (std::int64_t i = 0; i < prompt_len[b]; ++i) prompt.push_back(token(b, i));
            m.forward(prompt, cache, step.data());
            for (std::int64_t i = 0; i < steps[b]; ++i) {
              const int t = token(b, prompt_len[b] + i);
              m.forward(std::span<const int>(&t, 1), cache, step.data());
              alone.insert(alone.end(), step.begin(), step.end());
            }
          }
          std::vector<qkv::KvCache> caches;
          for (std::size_t b = 0; b < 5; ++b) {
            caches.emplace_back(c, 0, kv);
            std::vector<int> prompt;
            for (std::int64_t i = 0; i < prompt_len[b]; ++i) prompt.push_back(token(b, i));
            m.forward(prompt, caches[b], step.data());
          }
          std::vector<std::vector<float>> per_seq(5);
          for (std::int64_t i = 0; i < 12; ++i) {
            std::vector<int> toks;
            std::vector<qkv::KvCache*> cs;
            std::vector<std::size_t> who;
            for (std::size_t b = 0; b < 5; ++b)
              if (i < steps[b]) toks.push_back(token(b, prompt_len[b] + i)), cs.push_back(&caches[b]), who.push_back(b);
            std::vector<float> logits(toks.size() * static_cast<std::size_t>(V));
            m.forward_batch(toks, cs, logits.data());
            for (std::size_t j = 0; j < who.size(); ++j)
              per_seq[who[j]].insert(per_seq[who[j]].end(), logits.begin() + static_cast<std::ptrdiff_t>(j * V),
                                     logits.begin() + static_cast<std::ptrdiff_t>((j + 1) * V));
          }
          for (auto& p : per_seq) batched.insert(batched.end(), p.begin(), p.end());
          ASSERT_EQ(batched.size(), alone.size());
          double err = 0;
          for (std::size_t i = 0; i < alone.size(); ++i) err = std::max(err, std::abs(double(batched[i]) - alone[i]));
          std::printf("%-13s %s weights, %s cache, %d threads: max |batched − alone| = %.3g\n", name,
                      qkv::dtype_name(dt), qkv::dtype_name(kv), threads, err);
          EXPECT_EQ(err, 0.0) << name;
          for (std::size_t b = 0; b < 5; ++b) EXPECT_EQ(caches[b].len, prompt_len[b] + steps[b]);
        }
  // Refusals: name the argument.
  qkv::Model m(qkv::load_llama2c(kModel));
  qkv::KvCache a(m.config()), b(m.config(), 4);
  b.len = 4;
  std::vector<float> logits(2 * 512);
  const std::vector<int> two = {5, 6};
  expect_error([&] { m.forward_batch(two, std::vector<qkv::KvCache*>{&a}, logits.data()); }, {"forward_batch", "one per token"});
  expect_error([&] { m.forward_batch(two, std::vector<qkv::KvCache*>{&a, &a}, logits.data()); }, {"caches[1]", "same cache"});
  expect_error([&] { m.forward_batch(two, std::vector<qkv::KvCache*>{&a, &b}, logits.data()); }, {"caches[1]", "capacity 4"});
  expect_error([&] { m.forward_batch(two, std::vector<qkv::KvCache*>{&a, nullptr}, logits.data()); }, {"caches[1]", "null"});
  expect_error([&] { m.forward_batch({}, {}, logits.data()); }, {"tokens", "empty"});
}

// A forward called from inside a parallel call of qkv's pool (core/parallel.hpp): the model's team
// is then nested and runs on the calling thread alone, whatever num_threads asks for. The decode
// step's threads meet at barriers, so this must neither hang nor change the logits.
TEST(Model, DecodeInsideACallersParallelRegion) {
  const qkv::Weights w = qkv::load_llama2c(kModel);
  const std::vector<int> tokens = {1, 403, 407, 261, 378};
  auto run = [&] {
    qkv::Model m(w, qkv::ModelOptions{qkv::DType::f32, 2});
    qkv::KvCache cache(w.config);
    std::vector<float> logits(static_cast<std::size_t>(w.config.vocab_size));
    for (int t : tokens) m.forward(std::span<const int>(&t, 1), cache, logits.data());
    return logits;
  };
  const auto outside = run();
  std::vector<float> inside;
  qkv::run_shared(2, [&](int t) {
    if (t == 0) inside = run();  // the caller, inside its own parallel call
  });
  ASSERT_EQ(inside.size(), outside.size());
  EXPECT_EQ(std::memcmp(inside.data(), outside.data(), 4 * inside.size()), 0);  // the same rows, one thread
}

// ---------------------------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------------------------
TEST(Model, SafetensorsRoundTripIsExact) {
  const qkv::Weights w = qkv::load_llama2c(kModel);
  const std::string p = tmp_path("rt.safetensors");
  qkv::save_safetensors(w, p);
  const qkv::Weights r = qkv::load_weights(p);  // config from the file's qkv_config metadata
  EXPECT_EQ(qkv::config_to_json(r.config), qkv::config_to_json(w.config));
  const auto a = w.tensors(), b = r.tensors();
  ASSERT_EQ(a.size(), b.size());
  std::int64_t n_all = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
    std::int64_t n = 1;
    for (auto d : a[i].shape) n *= d;
    n_all += n;
    EXPECT_EQ(std::memcmp(a[i].data, b[i].data, static_cast<std::size_t>(n) * 4), 0) << a[i].name;  // bit for bit
  }
  EXPECT_EQ(n_all, 260032);  // stories260K: the float count of the file less header and rotary tables
  std::remove(p.c_str());
}

// Builds a small safetensors file by hand: header JSON + data, to corrupt on purpose.
std::string safetensors_bytes(const std::string& header, std::size_t data_bytes) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\0');
}

// Issue #24: the one safetensors module under the model loader, checkpoints and Python. The bytes
// of a small file are spelled out by hand (header JSON, its space padding to 8, little-endian data),
// and what the writer refuses is named.
TEST(Model, SafetensorsModuleWritesTheFormatByteForByte) {
  namespace d = qkv::detail;
  const std::string p = tmp_path("generic.safetensors");
  const std::int32_t i32[2] = {-2, 7};
  const std::uint8_t u8[3] = {1, 2, 255};
  const std::vector<d::SafetensorsView> views = {
      {"b", "I32", {2}, {reinterpret_cast<const char*>(i32), 8}},
      {"a", "U8", {3, 1}, {reinterpret_cast<const char*>(u8), 3}}};
  d::write_safetensors(p, {{"k", "v"}}, views, "test");
  std::string header = R"({"__metadata__":{"k":"v"},"b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
                       R"("a":{"dtype":"U8","shape":[3,1],"data_offsets":[8,11]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string want(8, '\0');
  want[0] = static_cast<char>(header.size());
  want += header + std::string("\xfe\xff\xff\xff\x07\x00\x00\x00\x01\x02\xff", 11);
  EXPECT_EQ(read_file(p), want);
  const d::StFile f = d::read_safetensors(p);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  EXPECT_EQ(f.tensors.at("b").bytes, want.substr(8 + header.size(), 8));
  EXPECT_EQ(f.tensors.at("a").shape, (std::vector<std::int64_t>{3, 1}));
  // The writer: a repeated or reserved name, an unknown dtype, bytes that do not match the shape.
  const auto refuse = [&](d::SafetensorsView v, const char* what) {
    const std::vector<d::SafetensorsView> two = {views[0], std::move(v)};
    expect_error([&] { d::write_safetensors(p, {}, two, "test"); }, {"[test]", what});
  };
  refuse({"b", "I32", {2}, views[0].bytes}, "\"b\": the name is given twice");
  refuse({"__metadata__", "I32", {2}, views[0].bytes}, "the name is reserved");
  refuse({"c", "Q8", {3}, views[1].bytes}, "unknown dtype 'Q8'");
  refuse({"c", "I32", {3}, views[0].bytes}, "I32 of 3 elements needs 12 bytes, got 8");
  // The generic reader refuses what it cannot size; the model loader only refuses it if it is used.
  const std::string q = write_tmp("q8.safetensors",
                                  safetensors_bytes(R"({"x": {"dtype": "Q8", "shape": [2], "data_offsets": [0, 2]}})", 2));
  expect_error([&] { d::read_safetensors(q); }, {"q8.safetensors", "\"x\": unknown dtype 'Q8'"});
  std::remove(p.c_str());
  std::remove(q.c_str());
}

TEST(Model, SafetensorsRefusesBadFiles) {
  qkv::Config c;
  c.dim = 8; c.hidden_dim = 16; c.n_layers = 1; c.n_heads = 2; c.n_kv_heads = 1; c.vocab_size = 5; c.seq_len = 4;
  const qkv::Weights w = qkv::Weights::random(c, 3);
  const std::string good = tmp_path("good.safetensors");
  qkv::save_safetensors(w, good);
  EXPECT_NO_THROW(qkv::load_safetensors(good, c));
  const std::string bytes = read_file(good);

  auto p = write_tmp("trunc.safetensors", bytes.substr(0, bytes.size() - 3));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"trunc.safetensors", "data_offsets"});
  p = write_tmp("over.safetensors", bytes + "xxxx");
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"over.safetensors", "trailing bytes"});
  p = write_tmp("short.safetensors", bytes.substr(0, 5));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"short.safetensors", "8-byte header length"});
  p = write_tmp("hlen.safetensors", std::string("\xff\xff\xff\xff\x00\x00\x00\x00{}", 10));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"hlen.safetensors", "does not fit"});
  p = write_tmp("json.safetensors", safetensors_bytes("{\"a\": [1,", 0));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"json.safetensors", "not valid JSON"});
  p = write_tmp("shape.safetensors",
                safetensors_bytes(R"({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"shape.safetensors", "\"x\"", "needs 6 × 4 bytes"});
  p = write_tmp("overlap.safetensors",
                safetensors_bytes(R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                      "y": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12));
  expect_error<qkv::FormatError>([&] { qkv::load_safetensors(p, c); }, {"overlap.safetensors", "overlaps"});
  p = write_tmp("dtype.safetensors",
                safetensors_bytes(R"({"tok_embeddings.weight": {"dtype": "I64", "shape": [5, 8], "data_offsets": [0, 320]}})", 320));
  expect_error([&] { qkv::load_safetensors(p, c); }, {"dtype.safetensors", "I64"});
  // A config that does not match the weights: one layer more, a wider model, an untied classifier.
  qkv::Config more = c;
  more.n_layers = 2;
  expect_error([&] { qkv::load_safetensors(good, more); }, {"good.safetensors", "layers.1.", "missing"});
  qkv::Config wide = c;
  wide.hidden_dim = 32;
  expect_error([&] { qkv::load_safetensors(good, wide); }, {"good.safetensors", "feed_forward.w1.weight", "[16, 8]", "[32, 8]"});
  qkv::Config fewer = c;
  fewer.mlp = qkv::MlpKind::gelu;
  expect_error([&] { qkv::load_safetensors(good, fewer); }, {"good.safetensors", "w3.weight", "not a parameter"});
  // A NaN weight is refused, not turned into NaN logits.
  qkv::Weights nan = qkv::Weights::random(c, 4);
  nan.layers[0].wk[3] = std::numeric_limits<float>::quiet_NaN();
  p = tmp_path("nan.safetensors");
  qkv::save_safetensors(nan, p);
  for (const char* placement : {"in_place", "copied"}) {  // screened wherever the floats are placed
    SCOPED_TRACE(placement);
    const ScopedPlacement forced(placement);
    expect_error([&] { qkv::load_safetensors(p, c); }, {"nan.safetensors", "layers.0.attention.wk.weight", "non-finite"});
  }
  // Configs: unknown key, bad value, missing size.
  expect_error<qkv::FormatError>([] { qkv::config_from_json(R"({"dim": 8})", "cfg.json"); }, {"cfg.json", "hidden_dim"});
  expect_error([] { qkv::config_from_json(R"({"dim":8,"hidden_dim":8,"n_layers":1,"n_heads":3,"n_kv_heads":1,"vocab_size":5,"seq_len":4,"pos":"rotary","norm":"rmsnorm","mlp":"swiglu","tied_embeddings":true,"bias":false,"norm_eps":1e-5,"rope_theta":1e4})", "cfg.json"); },
               {"cfg.json", "multiple of n_heads"});
  expect_error<qkv::FormatError>([] { qkv::config_from_json(R"({"dim":8,"hidden_dim":8,"n_layers":1,"n_heads":2,"n_kv_heads":1,"vocab_size":5,"seq_len":4,"pos":"rotary","norm":"rmsnorm","mlp":"swiglu","tied_embeddings":true,"bias":false,"norm_eps":1e-5,"rope_theta":1e4,"rope":1})", "cfg.json"); },
               {"cfg.json", "unknown key \"rope\""});
}

// A safetensors file of F32 tensors (name, shape, values), written by hand.
struct HandTensor {
  std::string name;
  std::vector<std::int64_t> shape;
  std::vector<float> v;
};
std::string safetensors_of(const std::vector<HandTensor>& ts) {
  std::string header = "{";
  std::size_t at = 0;
  for (const auto& t : ts) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    header += (at ? ",\"" : "\"") + t.name + "\":{\"dtype\":\"F32\",\"shape\":[" + shape + "],\"data_offsets\":[" +
              std::to_string(at) + "," + std::to_string(at + 4 * t.v.size()) + "]}";
    at += 4 * t.v.size();
  }
  std::string out = safetensors_bytes(header + "}", 0);
  for (const auto& t : ts) out.append(reinterpret_cast<const char*>(t.v.data()), 4 * t.v.size());
  return out;
}
std::vector<float> values(const float* p, std::int64_t n) { return {p, p + n}; }

// Every parameter of `a` and `b` has the same name, shape and bits.
void expect_bit_equal(const qkv::Weights& a, const qkv::Weights& b) {
  const auto ta = a.tensors(), tb = b.tensors();
  ASSERT_EQ(ta.size(), tb.size());
  for (std::size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].name, tb[i].name);
    ASSERT_EQ(ta[i].shape, tb[i].shape) << ta[i].name;
    std::int64_t n = 1;
    for (auto d : ta[i].shape) n *= d;
    EXPECT_EQ(std::memcmp(ta[i].data, tb[i].data, static_cast<std::size_t>(n) * 4), 0) << ta[i].name;
  }
}

// Hugging Face checkpoints: the config.json keys, and the layouts (hf_layout.hpp) undone exactly.
// Oracle: the files are written here from random qkv weights by the inverse rearrangement, so the
// loaded weights must equal the originals bit for bit. (python/tests/test_hf_checkpoints.py
// checks the same loader against the transformers library's own models.)
TEST(Model, HuggingFaceCheckpoints) {
  const qkv::Config g = qkv::config_from_json(
      R"({"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, "n_positions": 4, "vocab_size": 5,
          "n_inner": null, "attn_pdrop": 0.1, "activation_function": "gelu_new"})", "gpt2.json");
  EXPECT_EQ(g.hidden_dim, 32);  // n_inner null: 4 · n_embd
  EXPECT_TRUE(g.bias && g.tied_embeddings && g.pos == qkv::PosEncoding::learned && g.norm == qkv::NormKind::layernorm &&
              g.mlp == qkv::MlpKind::gelu && g.n_kv_heads == 2 && g.norm_eps == 1e-5f);
  const qkv::Config l = qkv::config_from_json(
      R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 12, "num_attention_heads": 2,
          "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 5, "max_position_embeddings": 4,
          "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "rms_norm_eps": 1e-6})", "llama.json");
  EXPECT_TRUE(!l.bias && !l.tied_embeddings && l.pos == qkv::PosEncoding::rotary && l.norm == qkv::NormKind::rmsnorm &&
              l.mlp == qkv::MlpKind::swiglu && l.n_kv_heads == 1 && l.rope_theta == 500000.0f && l.norm_eps == 1e-6f);
  expect_error([] { qkv::config_from_json(R"({"model_type": "t5", "d_model": 8})", "t5.json"); },
               {"t5.json", "\"t5\" is not supported", "gpt2, llama and bert"});
  expect_error<qkv::FormatError>([] { qkv::config_from_json(R"({"model_type": "gpt2", "n_embd": 8})", "g.json"); }, {"g.json", "n_head"});

  // GPT-2: Conv1D weights [in, out], W_Q | W_K | W_V fused in c_attn [C, 3C].
  {
    const qkv::Weights w = qkv::Weights::random(g, 11);
    const qkv::LayerWeights& L = w.layers[0];
    const std::int64_t C = 8, F = 32;
    auto t = [](const float* a, std::int64_t rows, std::int64_t cols) {  // [rows, cols] → [cols, rows]
      std::vector<float> o(static_cast<std::size_t>(rows * cols));
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t k = 0; k < cols; ++k) o[static_cast<std::size_t>(k * rows + r)] = a[r * cols + k];
      return o;
    };
    std::vector<float> c_attn(static_cast<std::size_t>(3 * C * C)), c_attn_b;
    const float* qkv_w[3] = {L.wq, L.wk, L.wv};
    const float* qkv_b[3] = {L.bq, L.bk, L.bv};
    for (int part = 0; part < 3; ++part) {
      for (std::int64_t r = 0; r < C; ++r)
        for (std::int64_t k = 0; k < C; ++k) c_attn[static_cast<std::size_t>(k * 3 * C + part * C + r)] = qkv_w[part][r * C + k];
      c_attn_b.insert(c_attn_b.end(), qkv_b[part], qkv_b[part] + C);
    }
    const std::string p = write_tmp("gpt2_hf.safetensors", safetensors_of({
        {"wte.weight", {5, C}, values(w.wte, 5 * C)},
        {"wpe.weight", {4, C}, values(w.wpe, 4 * C)},
        {"h.0.ln_1.weight", {C}, values(L.norm1_w, C)}, {"h.0.ln_1.bias", {C}, values(L.norm1_b, C)},
        {"h.0.attn.bias", {1, 1, 4, 4}, std::vector<float>(16, 1.0f)},  // the causal-mask buffer: skipped
        {"h.0.attn.c_attn.weight", {C, 3 * C}, c_attn}, {"h.0.attn.c_attn.bias", {3 * C}, c_attn_b},
        {"h.0.attn.c_proj.weight", {C, C}, t(L.wo, C, C)}, {"h.0.attn.c_proj.bias", {C}, values(L.bo, C)},
        {"h.0.ln_2.weight", {C}, values(L.norm2_w, C)}, {"h.0.ln_2.bias", {C}, values(L.norm2_b, C)},
        {"h.0.mlp.c_fc.weight", {C, F}, t(L.w1, F, C)}, {"h.0.mlp.c_fc.bias", {F}, values(L.b1, F)},
        {"h.0.mlp.c_proj.weight", {F, C}, t(L.w2, C, F)}, {"h.0.mlp.c_proj.bias", {C}, values(L.b2, C)},
        {"ln_f.weight", {C}, values(w.normf_w, C)}, {"ln_f.bias", {C}, values(w.normf_b, C)}}));
    const qkv::Weights r = qkv::load_safetensors(p, g);
    expect_bit_equal(w, r);
    std::remove(p.c_str());
  }
  // Llama: q/k rows of each head in rotate-half order (HF row t·D/2 + j is qkv's row 2j + t).
  {
    const qkv::Weights w = qkv::Weights::random(l, 12);
    const qkv::LayerWeights& L = w.layers[0];
    const std::int64_t C = 8, D = 4, F = 12;
    auto hf_rows = [&](const float* a, std::int64_t heads) {
      std::vector<float> o(static_cast<std::size_t>(heads * D * C));
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t j = 0; j < D / 2; ++j)
          for (std::int64_t t = 0; t < 2; ++t)
            std::memcpy(&o[static_cast<std::size_t>((h * D + t * D / 2 + j) * C)], a + (h * D + 2 * j + t) * C, 4 * C);
      return o;
    };
    const std::string p = write_tmp("llama_hf.safetensors", safetensors_of({
        {"model.embed_tokens.weight", {5, C}, values(w.wte, 5 * C)},
        {"model.layers.0.input_layernorm.weight", {C}, values(L.norm1_w, C)},
        {"model.layers.0.self_attn.q_proj.weight", {2 * D, C}, hf_rows(L.wq, 2)},
        {"model.layers.0.self_attn.k_proj.weight", {D, C}, hf_rows(L.wk, 1)},
        {"model.layers.0.self_attn.v_proj.weight", {D, C}, values(L.wv, D * C)},
        {"model.layers.0.self_attn.o_proj.weight", {C, 2 * D}, values(L.wo, 2 * D * C)},
        {"model.layers.0.post_attention_layernorm.weight", {C}, values(L.norm2_w, C)},
        {"model.layers.0.mlp.gate_proj.weight", {F, C}, values(L.w1, F * C)},
        {"model.layers.0.mlp.down_proj.weight", {C, F}, values(L.w2, C * F)},
        {"model.layers.0.mlp.up_proj.weight", {F, C}, values(L.w3, F * C)},
        {"model.norm.weight", {C}, values(w.normf_w, C)},
        {"lm_head.weight", {5, C}, values(w.wcls, 5 * C)}}));
    const qkv::Weights r = qkv::load_safetensors(p, l);
    expect_bit_equal(w, r);
    qkv::Config gqa2 = l;
    gqa2.n_kv_heads = 2;  // k_proj would be [8, 8]
    expect_error([&] { qkv::load_safetensors(p, gqa2); },
                 {"llama_hf.safetensors", "\"model.layers.0.self_attn.k_proj.weight\" (qkv's layers.0.attention.wk.weight)",
                  "[4, 8]", "[8, 8]"});
    std::remove(p.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// llama2.c checkpoint and tokenizer files
// ---------------------------------------------------------------------------------------------
TEST(Model, Llama2cLoaderRefusesBadFiles) {
  for (const char* placement : {"in_place", "copied"}) {  // the same refusals either way
    SCOPED_TRACE(placement);
    const ScopedPlacement forced(placement);
    const std::string bytes = read_file(kModel);
    auto p = write_tmp("trunc.bin", bytes.substr(0, bytes.size() - 100));
    expect_error<qkv::FormatError>([&] { qkv::load_llama2c(p); }, {"trunc.bin", "1056440 bytes", "implies 1056540", "truncated"});
    p = write_tmp("over.bin", bytes + std::string(8, '\0'));
    expect_error<qkv::FormatError>([&] { qkv::load_llama2c(p); }, {"over.bin", "trailing bytes"});
    p = write_tmp("tiny.bin", bytes.substr(0, 20));
    expect_error<qkv::FormatError>([&] { qkv::load_llama2c(p); }, {"tiny.bin", "28-byte header"});
    std::string bad = bytes;
    const std::int32_t seven = 7;
    std::memcpy(bad.data() + 12, &seven, 4);  // n_heads 7 does not divide dim 64
    p = write_tmp("heads.bin", bad);
    expect_error<qkv::FormatError>([&] { qkv::load_llama2c(p); }, {"heads.bin", "n_heads 7", "multiple of n_heads"});
    bad = bytes;
    const std::int32_t huge = 0x7fffffff;
    std::memcpy(bad.data() + 20, &huge, 4);  // vocab_size 2^31 − 1
    p = write_tmp("vocab.bin", bad);
    expect_error<qkv::FormatError>([&] { qkv::load_llama2c(p); }, {"vocab.bin", "vocab_size"});
    expect_error([] { qkv::load_llama2c("/nonexistent/model.bin"); }, {"/nonexistent/model.bin", "no such file"});
  }
}

// A checkpoint of more than 64 MiB of floats, in place in the file's mapping and copied into the
// huge-page arena (weight_placement.hpp): the tensors hold the file's floats bit for bit, and the
// finiteness screen, which checks 4096 values at a time, still finds a NaN inside a full block and
// an infinity in a tensor's last, partial block, naming the tensor and the flat index.
TEST(Model, Llama2cLargeCheckpointEitherPlacement) {
  const std::int32_t C = 32, V = 524800, P = 4;  // V·C floats = 64.06 MiB: over the copy limit
  const std::int32_t header[7] = {C, C, 1, 1, 1, V, P};
  const std::int64_t floats = std::int64_t{V} * C + C + 4 * C * C + C + 3 * C * C + C + P * C;
  std::vector<float> data(static_cast<std::size_t>(floats));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(static_cast<std::int64_t>(i % 2001) - 1000) / 1024.0f;
  auto bytes = [&](const std::vector<float>& d) {
    std::string b(reinterpret_cast<const char*>(header), sizeof header);
    b.append(reinterpret_cast<const char*>(d.data()), d.size() * sizeof(float));
    return b;
  };
  std::string p = write_tmp("large.bin", bytes(data));
  for (const char* placement : {"in_place", "copied"}) {
    SCOPED_TRACE(placement);
    const ScopedPlacement forced(placement);
    const qkv::Weights w = qkv::load_llama2c(p);
    if (std::string(placement) == "in_place")
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.wte) % 4096, 28u);  // the file's byte 28: its mapping
    else
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(w.wte) % (std::uintptr_t{2} << 20), 28u);  // byte 28 of the arena
    EXPECT_EQ(std::memcmp(w.wte, data.data(), sizeof(float) * static_cast<std::size_t>(V) * C), 0);
    const std::size_t normf = data.size() - static_cast<std::size_t>(P * C + C);  // rms_final, before the rotary tables
    EXPECT_EQ(std::memcmp(w.normf_w, data.data() + normf, sizeof(float) * C), 0);
    EXPECT_EQ(w.layers[0].w3[C * C - 1], data[normf - 1]);  // w3's last float ends the layers
  }
  std::vector<float> bad = data;
  bad[123457] = std::numeric_limits<float>::quiet_NaN();  // in wte's 31st block of 4096
  const std::string nan_path = write_tmp("large_nan.bin", bytes(bad));
  bad = data;
  bad[data.size() - static_cast<std::size_t>(P * C + C) - 5] = -std::numeric_limits<float>::infinity();  // w3, its tail
  p = write_tmp("large_inf.bin", bytes(bad));
  for (const char* placement : {"in_place", "copied"}) {
    SCOPED_TRACE(placement);
    const ScopedPlacement forced(placement);
    expect_error([&] { qkv::load_llama2c(nan_path); }, {"large_nan.bin", "tok_embeddings.weight", "non-finite", "flat index 123457"});
    expect_error([&] { qkv::load_llama2c(p); }, {"large_inf.bin", "layers.0.feed_forward.w3.weight", "-inf", "flat index 1019"});
  }
  std::remove(p.c_str());
  std::remove(tmp_path("large.bin").c_str());
  std::remove(tmp_path("large_nan.bin").c_str());
}

// The loaders' one placement rule (src/model/weight_placement.hpp) forced each way, for a
// llama2.c checkpoint and for a safetensors file of the same model: every tensor holds the same
// bits, placed where the rule says (in the file's mapping, or in a 2 MiB-aligned arena at the
// same offset within a 64-byte line as in the file), and the model's logits over a prompt are the
// same bits (the same arithmetic on the same floats: exact equality is the bound).
TEST(Model, WeightPlacementInPlaceAndCopiedAgreeBitForBit) {
  const std::string st = tmp_path("placement.safetensors");
  qkv::save_safetensors(qkv::load_llama2c(kModel), st);
  const std::string st_bytes = read_file(st);
  const qkv::detail::SafetensorsHeader h = qkv::detail::parse_safetensors(reinterpret_cast<const std::uint8_t*>(st_bytes.data()),
                                                      st_bytes.size(), "test", st);
  const std::uintptr_t data_at = static_cast<std::uintptr_t>(h.data - reinterpret_cast<const std::uint8_t*>(st_bytes.data()));
  const std::uintptr_t wte_at = data_at + h.tensors.at("tok_embeddings.weight").begin;  // the byte wte starts at
  const std::vector<int> tokens = {1, 403, 407, 261, 378, 302};  // BOS and a few of tok512's pieces
  for (const auto& [path, wte_byte] : {std::pair{kModel, std::uintptr_t{28}}, std::pair{st, wte_at}}) {
    SCOPED_TRACE(path);
    std::vector<qkv::Weights> ws;
    for (const char* placement : {"in_place", "copied"}) {
      const ScopedPlacement forced(placement);
      ws.push_back(qkv::load_weights(path));
    }
    const auto in = ws[0].tensors(), cp = ws[1].tensors();
    ASSERT_EQ(in.size(), cp.size());
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(in[0].data) % 4096, wte_byte % 4096);  // in the file's mapping
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cp[0].data) % (std::uintptr_t{2} << 20), wte_byte % 64);  // the arena's first line
    for (std::size_t i = 0; i < in.size(); ++i) {
      std::int64_t n = 1;
      for (auto dd : in[i].shape) n *= dd;
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(cp[i].data) % 64, reinterpret_cast<std::uintptr_t>(in[i].data) % 64) << cp[i].name;
      EXPECT_EQ(std::memcmp(in[i].data, cp[i].data, 4 * static_cast<std::size_t>(n)), 0) << in[i].name;
    }
    std::vector<std::vector<float>> logits;
    for (qkv::Weights& w : ws) {
      qkv::Model m(std::move(w));
      qkv::KvCache cache(m.config());
      logits.emplace_back(tokens.size() * static_cast<std::size_t>(m.config().vocab_size));
      m.forward(tokens, cache, logits.back().data(), true);
    }
    EXPECT_EQ(std::memcmp(logits[0].data(), logits[1].data(), 4 * logits[0].size()), 0);
  }
  std::remove(st.c_str());
  const ScopedPlacement typo("huge");
  expect_error([] { qkv::load_llama2c(kModel); }, {"qkv::load_llama2c", "QKV_WEIGHT_PLACEMENT", "copied or in_place", "'huge'"});
}

// Issue #16, defect 12: a model.json without "norm" (or any other field that shapes the model)
// is refused naming the file and the key, instead of running the weights as an RMSNorm model.
TEST(Model, ConfigMissingFieldNamesFileAndKey) {
  const std::string full = qkv::config_to_json(qkv::Config::gpt2_small());
  EXPECT_NO_THROW(qkv::config_from_json(full, "full.json"));
  for (const char* key : {"norm", "pos", "mlp", "tied_embeddings", "bias", "norm_eps"}) {
    auto j = full;
    const std::string needle = std::string("\"") + key + "\":";
    const auto at = j.find(needle);
    ASSERT_NE(at, std::string::npos) << key;
    j.erase(at, j.find('\n', at) + 1 - at);  // one "key": value line of the indented JSON
    const std::string p = write_tmp(std::string("no_") + key + ".json", j);
    expect_error<qkv::FormatError>([&] { qkv::load_config(p); }, {p.c_str(), "missing required key", needle.substr(0, needle.size() - 1).c_str()});
  }
  // rope_theta is needed by a rotary model only.
  qkv::Config rot = qkv::Config::gpt2_small();
  rot.pos = qkv::PosEncoding::rotary;
  std::string j = qkv::config_to_json(rot);
  j.erase(j.find("\"rope_theta\""));  // the last key: cut it and the comma before it, close the object
  while (!j.empty() && (j.back() == ' ' || j.back() == '\n' || j.back() == ',')) j.pop_back();
  j += "}";
  expect_error<qkv::FormatError>([&] { qkv::config_from_json(j, "rot.json"); }, {"rot.json", "missing required key \"rope_theta\""});
}

// Issue #16, defect 15 (and 13): every loader names the path and what is wrong with it, a folder,
// a device or a missing file, instead of "basic_filebuf::underflow" or "the file is empty".
TEST(Model, LoadersNameWhatThePathIs) {
  const std::string folder = ::testing::TempDir();
  const std::string missing = tmp_path("missing.bin");
  const std::vector<std::pair<std::string, const char*>> paths = {
      {folder, "is a directory"}, {"/dev/null", "is a character device, not a regular file"}, {missing, "no such file or directory"}};
  for (const auto& [path, why] : paths) {
    expect_error([&] { qkv::load_config(path); }, {"qkv::load_config", path.c_str(), why});
    expect_error([&] { qkv::Tokenizer::load(path, 512); }, {"qkv::Tokenizer::load", path.c_str(), why});
    expect_error([&] { qkv::load_llama2c(path); }, {"qkv::load_llama2c", path.c_str(), why});
    expect_error([&] { qkv::load_safetensors(path, qkv::Config::gpt2_small()); }, {"qkv::load_safetensors", path.c_str(), why});
  }
}

TEST(Model, TokenizerRefusesBadFilesAndRoundTrips) {
  const std::string bytes = read_file(kTok);
  EXPECT_NO_THROW(qkv::Tokenizer::load(kTok, 512));
  expect_error<qkv::FormatError>([&] { qkv::Tokenizer::load(kTok, 600); }, {"tok512.bin", "truncated"});
  expect_error([&] { qkv::Tokenizer::load(kTok, 500); }, {"tok512.bin", "bytes left after 500 tokens"});
  std::string bad = bytes;
  const std::int32_t len = 1 << 20;
  std::memcpy(bad.data() + 4 + 4, &len, 4);  // token 0's length
  auto p = write_tmp("tok_len.bin", bad);
  expect_error<qkv::FormatError>([&] { qkv::Tokenizer::load(p, 512); }, {"tok_len.bin", "token 0", "impossible length 1048576"});
  const std::int32_t neg = -5;
  std::memcpy(bad.data() + 8, &neg, 4);
  p = write_tmp("tok_neg.bin", bad);
  expect_error<qkv::FormatError>([&] { qkv::Tokenizer::load(p, 512); }, {"tok_neg.bin", "impossible length -5"});
  std::memcpy(bad.data(), &neg, 4);
  p = write_tmp("tok_max.bin", bad);
  expect_error<qkv::FormatError>([&] { qkv::Tokenizer::load(p, 512); }, {"tok_max.bin", "max_token_length -5"});

  // decode(encode(text)) gives the text back: the dummy-prefix space is dropped after BOS, and
  // characters outside the 512-token vocabulary (ü, 猫) go through byte fallback and come back whole.
  const auto tok = qkv::Tokenizer::load(kTok, 512);
  for (const std::string text : {"Once upon a time, Lily had a cat.", "caf\xc3\xa9 m\xc3\xbc" "de \xe7\x8c\xab!", "  two spaces\n"}) {
    const auto ids = tok.encode(text, true, true);
    EXPECT_EQ(ids.front(), qkv::Tokenizer::bos);
    EXPECT_EQ(ids.back(), qkv::Tokenizer::eos);
    std::string back;
    for (std::size_t i = 1; i + 1 < ids.size(); ++i) back += tok.decode(ids[i - 1], ids[i]);
    EXPECT_EQ(back, text);
  }
  // é is a token of its own (485); ü is not, so it becomes its UTF-8 bytes as tokens 3 + 0xC3, 3 + 0xBC.
  const auto e = tok.encode("\xc3\xa9", false, false);  // [dummy " ", é]
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1], 485);
  const auto u = tok.encode("\xc3\xbc", false, false);
  ASSERT_EQ(u.size(), 3u);
  EXPECT_EQ(u[1], 3 + 0xC3);
  EXPECT_EQ(u[2], 3 + 0xBC);
  EXPECT_EQ(tok.encode("", true, false), std::vector<int>{1});  // empty prompt: BOS alone, no dummy space

  // A 4-token vocabulary (<unk>, <s>, </s>, " ") has no byte-fallback tokens: encoding "a" (byte
  // 0x61, fallback token 3 + 97 = 100) is refused, not read past the vocabulary (fuzz finding).
  std::string small;
  auto put_i32 = [&small](std::int32_t v) { small.append(reinterpret_cast<const char*>(&v), 4); };
  put_i32(5);
  for (const std::string piece : {"<unk>", "<s>", "</s>", " "}) {
    put_i32(0);  // score 0.0f
    put_i32(static_cast<std::int32_t>(piece.size()));
    small += piece;
  }
  const auto tiny = qkv::Tokenizer::load(write_tmp("tok_tiny.bin", small), 4);
  EXPECT_EQ(tiny.encode(" ", false, false), (std::vector<int>{3, 3}));
  expect_error([&] { tiny.encode("a", true, false); }, {"Tokenizer::encode", "byte 0x61", "token 100", "vocabulary of 4"});
}

}  // namespace
