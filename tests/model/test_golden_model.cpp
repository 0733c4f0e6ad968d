// qkv's model against the PyTorch model of tools/torch_model.py, position by position: the golden
// logits that tools/make_golden_model.py writes (fp32 PyTorch, explicit softmax attention) for the
// real stories260K and two random safetensors models covering the other configurations (learned
// positions + LayerNorm + GELU + biases + untied classifier; no positions + GQA + BF16 storage).
// Each is checked twice: one forward over the whole sequence, and a prefill followed by one token
// at a time through the KV cache.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>


#include "qkv/attention.hpp"
#include "qkv/model.hpp"

namespace {

const std::string kGolden = std::string(QKV_SOURCE_DIR) + "/tests/golden/model/";

struct Golden {
  std::int64_t S = 0, V = 0;
  std::vector<int> tokens;
  std::vector<float> logits;  // [S, V]
};

Golden read_golden(const std::string& name) {
  std::ifstream f(kGolden + name + ".logits", std::ios::binary);
  Golden g;
  std::int32_t sv[2] = {0, 0};
  f.read(reinterpret_cast<char*>(sv), sizeof sv);
  g.S = sv[0];
  g.V = sv[1];
  g.tokens.resize(static_cast<std::size_t>(g.S));
  g.logits.resize(static_cast<std::size_t>(g.S * g.V));
  f.read(reinterpret_cast<char*>(g.tokens.data()), static_cast<std::streamsize>(4 * g.tokens.size()));
  f.read(reinterpret_cast<char*>(g.logits.data()), static_cast<std::streamsize>(4 * g.logits.size()));
  EXPECT_TRUE(f.good()) << "cannot read " << name << ".logits (run tools/make_golden_model.py)";
  return g;
}

// The three golden models with their weights: Llama-style stories260K, GPT-2-style, and GQA with
// bf16 weights in the file.
struct GoldenCase {
  std::string name;
  qkv::Weights w;
};
std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> cases;
  cases.push_back({"stories260K", qkv::load_llama2c(std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin")});
  cases.push_back({"tiny_gpt2", qkv::load_safetensors(kGolden + "tiny_gpt2.safetensors", kGolden + "tiny_gpt2.json")});
  cases.push_back({"tiny_gqa_bf16", qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors")});
  return cases;
}

double max_abs_logit(const Golden& g) {
  double m = 0;
  for (float v : g.logits) m = std::max(m, std::abs(double(v)));
  return m;
}

// Max |qkv − torch| over all logits, for a full forward and for prefill + one-at-a-time decoding.
void check(const std::string& name, qkv::Weights w, double tol, qkv::ModelOptions opt = {}) {
  const Golden g = read_golden(name);
  qkv::Model model(std::move(w), opt);
  ASSERT_EQ(model.config().vocab_size, g.V);
  std::vector<float> full(g.logits.size()), step(static_cast<std::size_t>(g.V));
  qkv::KvCache c1(model.config());
  model.forward(g.tokens, c1, full.data(), true);
  double err_full = 0, err_inc = 0, max_logit = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    err_full = std::max(err_full, std::abs(double(full[i]) - g.logits[i]));
    max_logit = std::max(max_logit, std::abs(double(g.logits[i])));
  }
  qkv::KvCache c2(model.config());
  const std::int64_t prefill = g.S / 3;
  model.forward(std::span<const int>(g.tokens.data(), static_cast<std::size_t>(prefill)), c2, step.data());
  for (std::int64_t s = prefill - 1; s < g.S; ++s) {
    if (s >= prefill) model.forward(std::span<const int>(g.tokens.data() + s, 1), c2, step.data());
    for (std::int64_t v = 0; v < g.V; ++v)
      err_inc = std::max(err_inc, std::abs(double(step[v]) - g.logits[static_cast<std::size_t>(s * g.V + v)]));
  }
  std::printf("%s (%s weights): max |logit| %.2f, max |qkv − torch| full forward %.3g, KV-cache decoding %.3g "
              "(tolerance %.0e)\n",
              name.c_str(), qkv::dtype_name(opt.weights), max_logit, err_full, err_inc, tol);
  EXPECT_LT(err_full, tol);
  EXPECT_LT(err_inc, tol);
}

// Tolerances: both sides compute in fp32 with different summation orders (oneDNN / qkv's kernels vs
// PyTorch's), so logits differ by a few ulps of the partial sums they pass through: ~1e-6 relative
// per layer. 1e-4 on logits of magnitude ≤ ~21 leaves a 7× margin over the 1.5e-5 observed, and is
// far below the gaps between the top logits that decide greedy decoding.
TEST(GoldenModel, Stories260KMatchesTorch) {
  check("stories260K", qkv::load_llama2c(std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin"),
        1e-4);
}

TEST(GoldenModel, Gpt2StyleSafetensorsMatchesTorch) {
  check("tiny_gpt2", qkv::load_safetensors(kGolden + "tiny_gpt2.safetensors", kGolden + "tiny_gpt2.json"), 1e-4);
}

TEST(GoldenModel, GqaBf16SafetensorsMatchesTorch) {
  // The config is found beside the weights (tiny_gqa_bf16.json).
  check("tiny_gqa_bf16", qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors"), 1e-4);
}

// ---------------------------------------------------------------------------------------------
// bf16 weights (ModelOptions::weights = bf16)
// ---------------------------------------------------------------------------------------------
// The same parameters with every projection matrix and the classifier rounded to bf16, held as
// f32: what the bf16 model computes, done by the f32 model. Norms, biases and the embedding table
// (looked up in f32 by both) stay as they were, so a tied classifier becomes an untied, rounded copy.
qkv::Weights rounded_twin(const qkv::Weights& w) {
  qkv::Config c = w.config;
  c.tied_embeddings = false;
  qkv::Weights r = qkv::Weights::allocate(c);
  const auto src = w.tensors();
  for (const auto& t : r.tensors()) {
    const bool cls = t.name == "output.weight";
    const float* from = nullptr;
    for (const auto& s : src)
      if (s.name == t.name || (cls && s.name == (w.config.tied_embeddings ? "tok_embeddings.weight" : "output.weight")))
        from = s.data;
    std::int64_t n = 1;
    for (auto d : t.shape) n *= d;
    const bool matrix = t.shape.size() == 2 && t.name != "tok_embeddings.weight" && t.name != "pos_embeddings.weight";
    for (std::int64_t i = 0; i < n; ++i) t.data[i] = matrix ? qkv::bf16_to_f32(qkv::f32_to_bf16(from[i])) : from[i];
  }
  return r;
}

// Two checks per model. (1) Exactness of the bf16 path: the bf16 model against the f32 model run on
// the bf16-rounded matrices (rounded_twin): the same numbers, so only f32 summation order differs
// and the fp32 tolerance 1e-4 applies (plus the vdpbf16ps kernel's split, below). (2) Distance to the fp32 PyTorch logits: rounding a weight
// to bf16 moves it by ≤ 2^-9 relative (8 significand bits, round to nearest), so each projection's
// output moves by ≤ 2^-9 · Σ|x·w|; through L layers of residual updates these add up to a few 2^-9
// of the logits' scale. The bound used is 8 · 2^-9 · max|logit| per logit (8 ≈ 2 projections per
// sub-block × 2 sub-blocks × 2 for the classifier and norm), printed beside the error seen.
void check_bf16(const std::string& name, const qkv::Weights& w) {
  const Golden g = read_golden(name);
  qkv::Model bf(w, qkv::ModelOptions{qkv::DType::bf16});
  qkv::Model twin(rounded_twin(w));
  std::vector<float> a(g.logits.size()), b(g.logits.size());
  qkv::KvCache ca(bf.config()), cb(twin.config());
  bf.forward(g.tokens, ca, a.data(), true);
  twin.forward(g.tokens, cb, b.data(), true);
  double err_twin = 0, err_torch = 0, max_logit = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err_twin = std::max(err_twin, std::abs(double(a[i]) - b[i]));
    err_torch = std::max(err_torch, std::abs(double(a[i]) - g.logits[i]));
    max_logit = std::max(max_logit, std::abs(double(g.logits[i])));
  }
  const double tol_torch = 8.0 * std::ldexp(1.0, -9) * max_logit;
  std::printf("%s bf16 weights: max |bf16 model − f32 model on rounded weights| %.3g (tolerance 1e-4); "
              "max |bf16 model − torch fp32| %.3g (tolerance %.3g)\n",
              name.c_str(), err_twin, err_torch, tol_torch);
  // The KV-cache path (GEMV kernels with bf16 weights) against the twin's full forward.
  qkv::KvCache cc(bf.config());
  std::vector<float> step(static_cast<std::size_t>(g.V));
  const std::int64_t prefill = g.S / 3;
  double err_step = 0;
  bf.forward(std::span<const int>(g.tokens.data(), static_cast<std::size_t>(prefill)), cc, step.data());
  for (std::int64_t s = prefill - 1; s < g.S; ++s) {
    if (s >= prefill) bf.forward(std::span<const int>(g.tokens.data() + s, 1), cc, step.data());
    for (std::int64_t v = 0; v < g.V; ++v)
      err_step = std::max(err_step, std::abs(double(step[v]) - b[static_cast<std::size_t>(s * g.V + v)]));
  }
  // The vdpbf16ps kernel (Isa::avx512_bf16) also rounds each activation to x_hi + x_lo (≤ 2^-17
  // relative): by the argument below with 2^-17 for 2^-9, it adds up to 8 · 2^-17 · max|logit|.
  double max_logit_twin = 0;
  for (float v : b) max_logit_twin = std::max(max_logit_twin, std::abs(double(v)));
  const double tol_step =
      1e-4 + (qkv::active_isa() == qkv::Isa::avx512_bf16 ? 8.0 * std::ldexp(1.0, -17) * max_logit_twin : 0.0);
  std::printf("%s bf16 weights, KV-cache decoding on %s: max |bf16 model − f32 model on rounded weights| %.3g "
              "(tolerance %.3g)\n",
              name.c_str(), qkv::isa_name(qkv::active_isa()), err_step, tol_step);
  EXPECT_LT(err_twin, 1e-4);
  EXPECT_LT(err_step, tol_step);
  EXPECT_LT(err_torch, tol_torch);
  // And the KV-cache path (GEMV kernels) against the same golden logits, with the same bound.
  check(name, w, tol_torch, qkv::ModelOptions{qkv::DType::bf16});
}

TEST(GoldenModel, Bf16WeightsStories260K) {
  check_bf16("stories260K", qkv::load_llama2c(std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin"));
}

TEST(GoldenModel, Bf16WeightsGpt2Style) {
  check_bf16("tiny_gpt2", qkv::load_safetensors(kGolden + "tiny_gpt2.safetensors", kGolden + "tiny_gpt2.json"));
}

TEST(GoldenModel, Bf16WeightsGqa) { check_bf16("tiny_gqa_bf16", qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors")); }

// gemm_inputs = bf16: the prefill GEMMs also round their input rows to bf16 (≤ 2^-9 relative), a
// perturbation of the same size and reach as the weights' rounding, so the bound to the fp32
// PyTorch logits doubles: 16 · 2^-9 · max|logit|. Against the bf16-weights model (the same
// weights) only the activations' rounding differs: 8 · 2^-9 · max|logit|. Decoding (≤ 4 rows)
// does not take the GEMM: check() covers it with the doubled bound.
void check_bf16_gemm(const std::string& name, const qkv::Weights& w) {
  const Golden g = read_golden(name);
  const qkv::ModelOptions opt{qkv::DType::bf16, 0, qkv::DType::bf16};
  qkv::Model gm(w, opt), bf(w, qkv::ModelOptions{qkv::DType::bf16});
  std::vector<float> a(g.logits.size()), b(g.logits.size());
  qkv::KvCache ca(gm.config()), cb(bf.config());
  gm.forward(g.tokens, ca, a.data(), true);
  bf.forward(g.tokens, cb, b.data(), true);
  double err_bf = 0, err_torch = 0, max_logit = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    err_bf = std::max(err_bf, std::abs(double(a[i]) - b[i]));
    err_torch = std::max(err_torch, std::abs(double(a[i]) - g.logits[i]));
    max_logit = std::max(max_logit, std::abs(double(g.logits[i])));
  }
  const double tol_bf = 8.0 * std::ldexp(1.0, -9) * max_logit, tol_torch = 2.0 * tol_bf;
  std::printf("%s bf16 GEMM inputs: max |model − bf16-weights model| %.3g (tolerance %.3g); "
              "max |model − torch fp32| %.3g (tolerance %.3g)\n",
              name.c_str(), err_bf, tol_bf, err_torch, tol_torch);
  EXPECT_GT(err_bf, 0.0);  // the option does take the bf16 GEMM
  EXPECT_LT(err_bf, tol_bf);
  EXPECT_LT(err_torch, tol_torch);
  check(name, w, tol_torch, opt);
}

TEST(GoldenModel, Bf16GemmInputsStories260K) {
  check_bf16_gemm("stories260K",
                  qkv::load_llama2c(std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin"));
}

TEST(GoldenModel, Bf16GemmInputsGpt2Style) {
  check_bf16_gemm("tiny_gpt2", qkv::load_safetensors(kGolden + "tiny_gpt2.safetensors", kGolden + "tiny_gpt2.json"));
}

TEST(GoldenModel, Bf16GemmInputsGqa) {
  check_bf16_gemm("tiny_gqa_bf16", qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors"));
}

// One model and mode with a KV cache of dtype `cache` against the same model with an f32 cache:
// the full forward (prefill GEMMs; on 2 threads) within tol_full, and a prefill of S/3 then one token
// at a time (the GEMV path and, on 2 threads, Model::decode) within tol_inc; both against the fp32
// PyTorch logits within tol_torch. The cache must change the arithmetic (err_full > 0).
void check_kv_cache(const GoldenCase& cs, const Golden& g, const qkv::ModelOptions& opt, qkv::DType cache,
                    double tol_full, double tol_inc, double tol_torch) {
  qkv::Model m(cs.w, opt);
  std::vector<float> ref(g.logits.size()), full(g.logits.size()), step(static_cast<std::size_t>(g.V));
  qkv::KvCache cf(m.config()), cq(m.config(), 0, cache), ci(m.config(), 0, cache);
  m.forward(g.tokens, cf, ref.data(), true);
  m.forward(g.tokens, cq, full.data(), true);
  double err_full = 0, err_torch = 0, err_inc = 0;
  for (std::size_t i = 0; i < full.size(); ++i) {
    err_full = std::max(err_full, std::abs(double(full[i]) - ref[i]));
    err_torch = std::max(err_torch, std::abs(double(full[i]) - g.logits[i]));
  }
  const std::int64_t prefill = g.S / 3;
  m.forward(std::span<const int>(g.tokens.data(), static_cast<std::size_t>(prefill)), ci, step.data());
  for (std::int64_t s = prefill - 1; s < g.S; ++s) {
    if (s >= prefill) m.forward(std::span<const int>(g.tokens.data() + s, 1), ci, step.data());
    for (std::int64_t v = 0; v < g.V; ++v) {
      const auto i = static_cast<std::size_t>(s * g.V + v);
      err_inc = std::max(err_inc, std::abs(double(step[v]) - ref[i]));
      err_torch = std::max(err_torch, std::abs(double(step[v]) - g.logits[i]));
    }
  }
  std::printf("%s weights %s, GEMM inputs %s, %s cache: max |logits − f32 cache's| full forward %.3g (tolerance "
              "%.3g), prefill + decoding %.3g (tolerance %.3g); max |logits − torch fp32| %.3g (tolerance %.3g)\n",
              cs.name.c_str(), qkv::dtype_name(opt.weights), qkv::dtype_name(opt.gemm_inputs), qkv::dtype_name(cache),
              err_full, tol_full, err_inc, tol_inc, err_torch, tol_torch);
  EXPECT_GT(err_full, 0.0);  // the cache's dtype does change the arithmetic
  EXPECT_LT(err_full, tol_full);
  EXPECT_LT(err_inc, tol_inc);
  EXPECT_LT(err_torch, tol_torch);
  EXPECT_EQ(ci.len, g.S);
}

// A bf16 KV cache: the attention then runs on q, K, V rounded to bf16 (≤ 2^-9 relative each) and
// writes bf16 rows (rounded once more unless, with bf16 GEMM inputs, W_O's input is bf16 anyway):
// one more rounding stage of the size and reach of the weights' or the GEMM inputs', so against
// the same model with an f32 cache the bound is that of one stage, 8 · 2^-9 · max|logit|, and
// against the fp32 PyTorch logits the mode's bound plus that stage. With bf16 GEMM inputs the
// one-token steps (GEMVs on f32 rows) are one more stage from the f32-cache prefill: 2 stages. Each model and mode runs the
// full forward (prefill GEMMs; on 2 threads), and a prefill of S/3 then one token at a time (the
// GEMV path and, on 2 threads, Model::decode_step), both from a bf16 cache.
TEST(GoldenModel, Bf16KvCache) {
  for (const GoldenCase& cs : golden_cases()) {
    const Golden g = read_golden(cs.name);
    const double stage = 8.0 * std::ldexp(1.0, -9) * max_abs_logit(g);  // one bf16 rounding stage
    // (options, bound to torch: the mode's bound with an f32 cache (tests above) + one stage)
    const std::pair<qkv::ModelOptions, double> modes[] = {
        {qkv::ModelOptions{qkv::DType::f32, 2}, 1e-4 + stage},
        {qkv::ModelOptions{qkv::DType::bf16, 2}, 2.0 * stage},
        {qkv::ModelOptions{qkv::DType::bf16, 2, qkv::DType::bf16}, 3.0 * stage}};
    for (const auto& [opt, tol_torch] : modes) {
      const double tol_inc = opt.gemm_inputs == qkv::DType::bf16 ? 2.0 * stage : stage;
      check_kv_cache(cs, g, opt, qkv::DType::bf16, stage, tol_inc, tol_torch);
      EXPECT_EQ(qkv::Model(cs.w, opt).new_cache().k.dtype(),
                opt.gemm_inputs == qkv::DType::bf16 ? qkv::DType::bf16 : qkv::DType::f32);
    }
  }
}

// An i8 KV cache (llama.cpp's q8_0): each cached key and value row x [D] is stored as int8 with one
// f32 scale, which moves every element by ≤ half a step, max|x| / 254, so the row by
// ‖δx‖₂ ≤ √D · max|x| / 254 ≤ (√D / 254) ‖x‖₂; the kernel rounds each query row the same way
// (qkv/attention.hpp's int8 contract; its P·V weights to 15 bits, 64 / 65534 ≈ 2^-10 of V, below
// the rest). A bf16 cache rounds q, k, v by ≤ 2^-9 ‖x‖₂ each: the i8 cache is the same stage with
// each perturbation 512 / 254 · √D ≤ 2.02 √D times as large. So against the same model with an
// f32 cache the bound is 2.02 √D bf16 stages (Bf16KvCache's 8 · 2^-9 · max|logit| each; 5.7 stages
// at stories260K's D = 8), and against the fp32 PyTorch logits the mode's bound plus that. Full
// forward (the prefill's attention_kvcache on every layer) and a prefill of S/3 then one token at a
// time (Model::decode on 2 threads), f32 and bf16 weights, and bf16 GEMM inputs.
TEST(GoldenModel, I8KvCache) {
  for (const GoldenCase& cs : golden_cases()) {
    const Golden g = read_golden(cs.name);
    const double stage = 8.0 * std::ldexp(1.0, -9) * max_abs_logit(g);  // one bf16 rounding stage
    const double tol = 2.02 * std::sqrt(static_cast<double>(cs.w.config.head_dim())) * stage;
    // (options, bound to torch: the mode's bound with an f32 cache (tests above) + the i8 cache's).
    // With bf16 GEMM inputs the prefill's projections (block_gemm_bf16) feed the i8 cache: one more
    // stage against the f32-cache model of the same options, whose own bound to torch is 2 stages.
    const std::pair<qkv::ModelOptions, double> modes[] = {
        {qkv::ModelOptions{qkv::DType::f32, 2}, 1e-4 + tol},
        {qkv::ModelOptions{qkv::DType::bf16, 2}, stage + tol},
        {qkv::ModelOptions{qkv::DType::bf16, 2, qkv::DType::bf16}, 2.0 * stage + tol}};
    for (const auto& [opt, tol_torch] : modes) {
      // The one-token steps run GEMVs on f32 rows: with bf16 GEMM inputs one more stage from the prefill.
      const double tol_inc = opt.gemm_inputs == qkv::DType::bf16 ? tol + stage : tol;
      check_kv_cache(cs, g, opt, qkv::DType::i8, tol, tol_inc, tol_torch);
    }
  }
}

// A prefill that wants only the last position's logits runs the last layer past its attention on
// that one row (Model::forward). Against the golden torch logits of that position, with each
// mode's tolerance from the tests above, and against the same model's all-positions forward: the
// last layer's W_O and MLP then run on 1 row instead of S (a GEMV for f32 weights, oneDNN with
// M = 1 for bf16 GEMM inputs), so only f32 summation orders differ: 1e-4 · max|logit| (observed
// ≤ 3e-5). With bf16 GEMM inputs the all-positions forward also runs the classifier as a GEMM on
// rows rounded to bf16, where the one-row call takes the GEMV on f32 rows: one rounding stage
// apart, the bound of check_bf16_gemm for one stage, 8 · 2^-9 · max|logit|.
TEST(GoldenModel, LastPositionOnlyPrefillMatchesAllPositions) {
  for (const GoldenCase& cs : golden_cases()) {
    const Golden g = read_golden(cs.name);
    const double max_logit = max_abs_logit(g);
    const double tol_bf16 = 8.0 * std::ldexp(1.0, -9) * max_logit;  // as check_bf16 / check_bf16_gemm
    struct Mode {
      qkv::ModelOptions opt;
      double tol_torch, tol_all;
      qkv::DType cache = qkv::DType::f32;
    };
    // The last mode with a bf16 cache (Bf16KvCache's bound on top): the bf16 attention then runs
    // the last layer's one query row against all S cached keys.
    const Mode modes[] = {{qkv::ModelOptions{}, 1e-4, 1e-4 * max_logit},
                          {qkv::ModelOptions{qkv::DType::bf16}, tol_bf16, 1e-4 * max_logit},
                          {qkv::ModelOptions{qkv::DType::bf16, 0, qkv::DType::bf16}, 2.0 * tol_bf16, tol_bf16},
                          {qkv::ModelOptions{qkv::DType::bf16, 0, qkv::DType::bf16}, 3.0 * tol_bf16, tol_bf16,
                           qkv::DType::bf16}};
    for (const auto& [opt, tol_torch, tol_all, cache_dtype] : modes) {
      qkv::Model m(cs.w, opt);
      std::vector<float> all(g.logits.size()), last(static_cast<std::size_t>(g.V));
      qkv::KvCache ca(m.config(), 0, cache_dtype), cl(m.config(), 0, cache_dtype);
      m.forward(g.tokens, ca, all.data(), true);
      m.forward(g.tokens, cl, last.data());
      double err_all = 0, err_torch = 0;
      const std::size_t row = static_cast<std::size_t>((g.S - 1) * g.V);
      for (std::int64_t v = 0; v < g.V; ++v) {
        err_all = std::max(err_all, std::abs(double(last[v]) - all[row + v]));
        err_torch = std::max(err_torch, std::abs(double(last[v]) - g.logits[row + v]));
      }
      std::printf("%s weights %s, GEMM inputs %s, %s cache: last-position prefill vs all positions %.3g "
                  "(tolerance %.3g), vs torch fp32 %.3g (tolerance %.3g)\n",
                  cs.name.c_str(), qkv::dtype_name(opt.weights), qkv::dtype_name(opt.gemm_inputs),
                  qkv::dtype_name(cache_dtype), err_all,
                  tol_all, err_torch, tol_torch);
      EXPECT_LT(err_all, tol_all);
      EXPECT_LT(err_torch, tol_torch);
      EXPECT_EQ(cl.len, g.S);
    }
  }
}

TEST(GoldenModel, RefusesOtherWeightDtypes) {
  // bf16 GEMM inputs need bf16 weights; other dtypes are refused.
  EXPECT_THROW(qkv::Model(qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors"),
                          qkv::ModelOptions{qkv::DType::f32, 0, qkv::DType::bf16}),
               std::invalid_argument);
  EXPECT_THROW(qkv::Model(qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors"),
                          qkv::ModelOptions{qkv::DType::bf16, 0, qkv::DType::f64}),
               std::invalid_argument);
  EXPECT_THROW(qkv::Model(qkv::load_weights(kGolden + "tiny_gqa_bf16.safetensors"), qkv::ModelOptions{qkv::DType::f64}),
               std::invalid_argument);
}

}  // namespace
