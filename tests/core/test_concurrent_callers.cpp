// Several std::threads calling qkv at once — attention forward (flash), its backward, and models
// decoding (each thread its own qkv::Model) — each with 2 threads of its own pool: every call must
// give the bits of the same call made alone. Exact equality: the kernels and the model are
// deterministic (a row's result depends on the shape, never on the thread count or on which
// thread computed it), so any difference is interference between callers. scripts/tsan.sh runs
// this under ThreadSanitizer.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "qkv/attention.hpp"
#include "qkv/model.hpp"
#include "support/sanitizers.hpp"

namespace {

using qkv::Buffer;
using qkv::DType;

const std::string kModel = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/stories260K.bin";

void fill(const Buffer& b, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float* p = b.ptr<float>();
  for (std::int64_t i = 0; i < b.numel(); ++i) p[i] = u(rng);
}

std::vector<float> as_vector(const Buffer& b) { return {b.ptr<float>(), b.ptr<float>() + b.numel()}; }

// Forward then backward of one causal GQA shape: out, lse, dq, dk, dv, concatenated.
std::vector<float> attention_round(unsigned seed) {
  const std::int64_t B = 1, H = 4, Hkv = 2, S = 77, D = 32;
  Buffer q(DType::f32, {B, H, S, D}), k(DType::f32, {B, Hkv, S, D}), v(DType::f32, {B, Hkv, S, D}),
      out(DType::f32, {B, H, S, D}), lse(DType::f32, {B, H, S}), dout(DType::f32, {B, H, S, D}),
      dq(DType::f32, {B, H, S, D}), dk(DType::f32, {B, Hkv, S, D}), dv(DType::f32, {B, Hkv, S, D});
  fill(q, seed), fill(k, seed + 1), fill(v, seed + 2), fill(dout, seed + 3);
  qkv::AttentionOptions o;
  o.causal = true;
  o.kernel = qkv::Kernel::flash;
  o.num_threads = 2;
  qkv::attention(q.view(), k.view(), v.view(), out.view(), o, lse.view());
  qkv::attention_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), dq.view(), dk.view(),
                          dv.view(), o);
  std::vector<float> all;
  for (const Buffer* b : {&out, &lse, &dq, &dk, &dv}) {
    const auto x = as_vector(*b);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

// A prompt, then one token at a time (the decode path, whose threads meet at barriers): the
// logits of every position.
std::vector<float> model_round(const qkv::Weights& w) {
  qkv::Model m(w, qkv::ModelOptions{DType::f32, 2});
  qkv::KvCache cache(w.config);
  const std::int64_t V = w.config.vocab_size;
  const std::vector<int> prompt = {1, 403, 407, 261, 378, 300, 17, 42};
  std::vector<float> logits(static_cast<std::size_t>(V)), all;
  m.forward(std::span<const int>(prompt.data(), 4), cache, logits.data());
  all.insert(all.end(), logits.begin(), logits.end());
  for (std::size_t i = 4; i < prompt.size(); ++i) {
    m.forward(std::span<const int>(&prompt[i], 1), cache, logits.data());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

TEST(ConcurrentCallers, AttentionBackwardAndModelsGiveTheirAloneResults) {
  const qkv::Weights w = qkv::load_llama2c(kModel);
  const std::vector<float> att_alone = attention_round(5), model_alone = model_round(w);
  constexpr int kEach = 3, kRounds = qkv::testing::tsan_rounds(4);  // 3 attention callers and 3 model callers
  std::vector<int> differ(2 * kEach, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < 2 * kEach; ++c)
    callers.emplace_back([&, c] {
      for (int r = 0; r < kRounds; ++r)
        differ[static_cast<std::size_t>(c)] += c < kEach ? attention_round(5) != att_alone : model_round(w) != model_alone;
    });
  for (auto& t : callers) t.join();
  for (int c = 0; c < 2 * kEach; ++c)
    EXPECT_EQ(differ[static_cast<std::size_t>(c)], 0)
        << (c < kEach ? "attention" : "model") << " caller " << c << ": rounds that differ from the call made alone";
}

}  // namespace
