// Greedy generation with the real stories260K model against llama2.c's published output; the
// sampler and generation on logits that are not finite; generation with qkv train's tokenizer.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "qkv/model.hpp"
#include "model/text_tokenizer.hpp"
#include "support/temp_path.hpp"

namespace {

const std::string kDir = std::string(QKV_SOURCE_DIR) + "/data/models/stories260K/";

// llama2.c's test suite (test_all.py): `run stories260K.bin -z tok512.bin -t 0.0 -n 200` prints
// exactly this (then a newline of its own). Greedy decoding has no tolerance: byte for byte.
const char* kPublished =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\n"
    "Lily's mom said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want to "
    "play with your ball, but I can't find it.\"\n"
    "Lily was sad and didn't know what to do. She said, \"I'm sorry, Lily. I didn't know what to do.\"\n"
    "Lily didn't want to help her mom, so she";

std::string run(const std::string& prompt, std::int64_t steps, qkv::ModelOptions mo = {}) {
  qkv::Model model(qkv::load_llama2c(kDir + "stories260K.bin"), mo);
  const auto tok = qkv::Tokenizer::load(kDir + "tok512.bin", model.config().vocab_size);
  qkv::GenerateOptions opt;
  opt.steps = steps;
  opt.sampling.temperature = 0.0f;
  std::string out;
  qkv::generate(model, tok, prompt, opt, [&](std::string_view p) { out += p; });
  return out;
}

TEST(Generate, Stories260KGreedyMatchesLlama2c) {
  const std::string out = run("", 200);
  std::printf("%s\n", out.c_str());
  EXPECT_EQ(out, kPublished);
}

// GenerateStats lists every position's token beside the text it added (qkv generate --json): the
// prompt's ids are the tokenizer's, one id per position and one past the last (steps + 1 in all),
// and the pieces joined are what `emit` received.
TEST(Generate, StatsListTokensAndTheirPieces) {
  qkv::Model model(qkv::load_llama2c(kDir + "stories260K.bin"));
  const auto tok = qkv::Tokenizer::load(kDir + "tok512.bin", model.config().vocab_size);
  qkv::GenerateOptions opt;
  opt.steps = 40;
  opt.sampling.temperature = 0.0f;
  const std::string prompt = "Once upon a time";
  std::string out;
  const qkv::GenerateStats st = qkv::generate(model, tok, prompt, opt, [&](std::string_view p) { out += p; });
  const std::vector<int> ids = tok.encode(prompt, /*add_bos=*/true, /*add_eos=*/false);
  ASSERT_EQ(st.tokens.size(), 41u);
  ASSERT_EQ(st.pieces.size(), st.tokens.size());
  EXPECT_EQ(static_cast<std::int64_t>(st.tokens.size()), st.prompt_tokens + st.generated);
  EXPECT_EQ(std::vector<int>(st.tokens.begin(), st.tokens.begin() + static_cast<std::ptrdiff_t>(ids.size())), ids);
  EXPECT_EQ(st.pieces[0], "");  // BOS prints nothing
  std::string joined;
  for (std::size_t i = 0; i < st.pieces.size(); ++i) {
    if (i > 0) {
      EXPECT_EQ(st.pieces[i], std::string(tok.decode(st.tokens[i - 1], st.tokens[i])));
    }
    joined += st.pieces[i];
  }
  EXPECT_EQ(joined, out);
  EXPECT_EQ(out, std::string(kPublished).substr(0, out.size()));
}

// With bf16 weights the logits move by a few 2^-9 of their scale (test_golden_model.cpp bounds
// them by 8 · 2^-9 · max|logit|), enough to flip a near-tie between the top two tokens somewhere in
// 200 greedy steps, after which the story goes its own way. The rule checked, instead of a count of
// equal bytes: fed the fp32 model's greedy tokens (llama2.c's published story), the bf16 model's
// logits stay within that bound at every position, so wherever its greedy choice differs the fp32
// logits of the two tokens are within twice the bound; and its text up to its first flip is the
// published text.
TEST(Generate, Stories260KGreedyWithBf16WeightsFlipsOnlyNearTies) {
  qkv::Model f32(qkv::load_llama2c(kDir + "stories260K.bin"));
  qkv::Model bf16(qkv::load_llama2c(kDir + "stories260K.bin"), qkv::ModelOptions{qkv::DType::bf16});
  const std::int64_t V = f32.config().vocab_size;
  qkv::KvCache cf = f32.new_cache(), cb = bf16.new_cache();
  std::vector<float> lf(static_cast<std::size_t>(V)), lb(lf.size());
  int token = 1;  // BOS
  std::size_t flips = 0;
  double worst_ratio = 0.0;
  for (int pos = 0; pos < 199; ++pos) {
    f32.forward(std::span<const int>(&token, 1), cf, lf.data());
    bf16.forward(std::span<const int>(&token, 1), cb, lb.data());
    double scale = 0.0, err = 0.0;
    for (std::int64_t i = 0; i < V; ++i) {
      scale = std::max(scale, std::fabs(static_cast<double>(lf[i])));
      err = std::max(err, std::fabs(static_cast<double>(lb[i]) - lf[i]));
    }
    const double bound = 8.0 * std::ldexp(1.0, -9) * scale;
    ASSERT_LE(err, bound) << "position " << pos;
    worst_ratio = std::max(worst_ratio, err / bound);
    const auto af = std::max_element(lf.begin(), lf.end()) - lf.begin();
    const auto ab = std::max_element(lb.begin(), lb.end()) - lb.begin();
    if (af != ab) {
      ++flips;
      EXPECT_LE(lf[af] - lf[ab], 2.0 * bound) << "position " << pos << ": bf16 chose " << ab << " over " << af;
    }
    token = static_cast<int>(af);
  }
  std::printf("bf16 weights over 199 positions: largest logit error %.2f of the bound, %zu greedy flips\n",
              worst_ratio, flips);

  const std::string out = run("", 200, qkv::ModelOptions{qkv::DType::bf16}), pub = kPublished;
  std::size_t same = 0;
  while (same < out.size() && same < pub.size() && out[same] == pub[same]) ++same;
  std::printf("the bf16 text equals llama2.c's for its first %zu bytes\n", same);
  EXPECT_EQ(same == out.size() || same == pub.size(), flips == 0) << "the text may leave the published one only at a flip";
}

// The message of the error of type E that f throws (a bad argument unless E says otherwise;
// qkv/types.hpp), or "(no error)".
template <class E = std::invalid_argument, class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    std::printf("  refused: %s\n", e.what());
    return e.what();
  }
  return "(no error)";
}

// Issue #16, defect 1. Layer 0's w1 set to 3e38 everywhere: finite, so the loader's check passes,
// but h = W1 · x overflows to ±inf and the logits come out NaN. Every decoding mode must stop with
// an error naming the position whose logits are bad, after emitting what came before; before the
// fix greedy decoding printed <unk> to the end and sampling read past an empty candidate list.
TEST(Generate, NonFiniteLogitsStopWithThePosition) {
  qkv::Weights w = qkv::load_llama2c(kDir + "stories260K.bin");  // a private, writable mapping
  const qkv::Config& c = w.config;
  for (std::int64_t i = 0; i < c.hidden_dim * c.dim; ++i) w.layers[0].w1[i] = 3e38f;
  qkv::Model model(std::move(w));
  const auto tok = qkv::Tokenizer::load(kDir + "tok512.bin", c.vocab_size);
  // The prefill's logits are those of the prompt's last position, n − 1 (n counts BOS): the first
  // logits generation samples from.
  const std::string where =
      "[qkv::generate] the logits at position " + std::to_string(tok.encode("Once upon", true, false).size() - 1) +
      " are not finite";
  for (const auto& [temperature, top_p, top_k] : {std::tuple{0.0f, 0.9f, 0}, std::tuple{1.0f, 0.9f, 0},
                                                 std::tuple{0.8f, 0.0f, 0}, std::tuple{1.0f, 1.0f, 5}}) {
    qkv::GenerateOptions opt;
    opt.steps = 40;
    opt.sampling.temperature = temperature;
    opt.sampling.top_p = top_p;
    opt.sampling.top_k = top_k;
    opt.sampling.seed = 7;
    std::string out;
    const std::string m = error_of<qkv::NonFiniteError>([&] { qkv::generate(model, tok, "Once upon", opt, [&](std::string_view p) { out += p; }); });
    EXPECT_NE(m.find(where), std::string::npos) << m;
    EXPECT_EQ(out, "Once upon");  // the prompt, then nothing
  }
  // With an i8 KV cache the NaN keys and values of layer 1 cannot be quantised (kvcache_append
  // refuses them): each such row is stored as zeros with a NaN scale, which makes the logits NaN as
  // an f32 cache's NaN rows do, so generation stops with the same error, after a prefill of several
  // tokens (block()) and of BOS alone (Model::decode), on 1 and 2 threads (no thread may be left
  // waiting on a stage).
  for (int threads : {1, 2}) {
    qkv::Weights w2 = qkv::load_llama2c(kDir + "stories260K.bin");
    for (std::int64_t i = 0; i < c.hidden_dim * c.dim; ++i) w2.layers[0].w1[i] = 3e38f;
    qkv::Model m2(std::move(w2), qkv::ModelOptions{qkv::DType::f32, threads});
    for (const char* prompt : {"Once upon", ""}) {
      qkv::GenerateOptions opt;
      opt.steps = 40;
      opt.sampling.temperature = 0.0f;
      opt.kv_dtype = qkv::DType::i8;
      std::string out;
      const std::string m = error_of<qkv::NonFiniteError>([&] { qkv::generate(m2, tok, prompt, opt, [&](std::string_view p) { out += p; }); });
      const std::string at = "[qkv::generate] the logits at position " +
                             std::to_string(tok.encode(prompt, true, false).size() - 1) + " are not finite";
      EXPECT_NE(m.find(at), std::string::npos) << m << " (" << threads << " threads, prompt '" << prompt << "')";
      EXPECT_EQ(out, prompt);
    }
  }
}

// The sampler itself refuses NaN and ±inf logits, and logits that overflow when divided by the
// temperature, instead of choosing among no candidates.
TEST(Sampler, RefusesNonFiniteLogits) {
  constexpr int V = 8;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()}) {
    for (const float top_p : {0.0f, 0.9f}) {
      qkv::Sampler s(V, {.temperature = 1.0f, .top_p = top_p, .top_k = 0, .seed = 3});
      std::vector<float> logits(V, bad);
      EXPECT_NE(error_of([&] { s.sample(logits.data()); }).find("non-finite logit"), std::string::npos);
    }
  }
  qkv::Sampler s(V, {.temperature = 0.5f, .top_p = 0.9f, .top_k = 0, .seed = 3});
  std::vector<float> logits(V, 3e38f);  // finite, but 3e38 / 0.5 is inf
  EXPECT_NE(error_of([&] { s.sample(logits.data()); }).find("overflows float when divided by the temperature 0.5"),
            std::string::npos);
}

// A flat distribution over V tokens gives each 1/V; with top_p below 1/V the nucleus cutoff
// (1 − p)/(V − 1) exceeds every probability, so no token passes it. The nucleus is then the most
// likely token alone: the first maximum, id 0 (before the fix: an empty list, indexed at −1).
TEST(Sampler, NucleusOfAFlatDistributionIsTheFirstMaximum) {
  constexpr int V = 100;
  qkv::Sampler s(V, {.temperature = 1.0f, .top_p = 0.005f, .top_k = 0, .seed = 11});
  for (int round = 0; round < 3; ++round) {
    std::vector<float> logits(V, 0.25f);
    EXPECT_EQ(s.sample(logits.data()), 0);
  }
}

// Issue #16, defect 10: Tokenizer::load reads the tokenizer.json qkv train writes (told apart from
// llama2.c's binary by its content), and encodes and decodes exactly as the trained tokenizer does.
TEST(Tokenizer, ReadsTheTokenizerJsonQkvTrainWrites) {
  const std::string corpus = "First Citizen:\nBefore we proceed any further, hear me speak.\n\u00e9t\u00e9 caf\u00e9\n";
  const std::string dir = qkv::testing::temp_path("tok_json_");
  for (const auto& trained : {qkv::detail::TextTokenizer::learn_chars(corpus), qkv::detail::TextTokenizer::learn_bpe(corpus, 270)}) {
    const std::string path = dir + (trained.kind() == qkv::detail::TextTokenizer::Kind::chars ? "chars.json" : "bpe.json");
    std::ofstream(path) << trained.to_json() << "\n";  // as the trainer writes it
    const auto tok = qkv::Tokenizer::load(path, trained.vocab_size());
    EXPECT_EQ(tok.format(), qkv::Tokenizer::Format::qkv_json);
    EXPECT_EQ(tok.bos_id(), -1);
    EXPECT_EQ(tok.eos_id(), -1);
    const std::string text = "Before we proceed, caf\u00e9.";
    const std::vector<std::int32_t> want = trained.encode(text);
    const std::vector<int> ids = tok.encode(text, true, true);  // no BOS/EOS to add
    EXPECT_EQ(ids, std::vector<int>(want.begin(), want.end()));
    std::string back;
    for (std::size_t i = 0; i < ids.size(); ++i) back += tok.decode(i ? ids[i - 1] : -1, ids[i]);
    EXPECT_EQ(back, text);
    // The wrong vocabulary size names the file and the format it was read as.
    const std::string m = error_of([&] { qkv::Tokenizer::load(path, 512); });
    EXPECT_NE(m.find("read as qkv train's tokenizer.json"), std::string::npos);
    EXPECT_NE(m.find("but the model's vocabulary has 512"), std::string::npos);
  }
  // JSON that is not a tokenizer, and a llama2.c file read for a qkv vocabulary: each message
  // says which format the file was taken for.
  const std::string not_tok = dir + "model.json";
  std::ofstream(not_tok) << R"({"dim": 8})";
  EXPECT_NE(error_of<qkv::FormatError>([&] { qkv::Tokenizer::load(not_tok, 65); }).find("read as qkv train's tokenizer.json"), std::string::npos);
  EXPECT_NE(error_of([&] { qkv::Tokenizer::load(kDir + "tok512.bin", 65); }).find("read as a llama2.c tokenizer.bin"),
            std::string::npos);
  // Merges that each double a piece ([97, 97], [256, 256], [257, 257], ...): 40 of them would ask
  // for 2^41 bytes; refused once the tokens pass kMaxBpeTokenBytes (16 MiB) in all (merge k makes 2^(k+1) bytes).
  std::string doubling = R"({"kind": "bpe", "merges": [[97, 97])";
  for (int i = 0; i < 39; ++i) doubling += ", [" + std::to_string(256 + i) + ", " + std::to_string(256 + i) + "]";
  const std::string bomb = dir + "bomb.json";
  std::ofstream(bomb) << doubling << "]}";
  EXPECT_NE(error_of<qkv::FormatError>([&] { qkv::Tokenizer::load(bomb, 296); }).find("more than the limit of 16777216"), std::string::npos);
}

// Issue #24: one Tokenizer::load for every format, told by content. A Hugging Face WordPiece
// tokenizer.json (it has "model") loads through load_wordpiece; each loader, given a file of
// another format, says which format the file was read as and which one it expected.
TEST(Tokenizer, ToldByContentWithMismatchErrors) {
  const std::string dir = qkv::testing::temp_path("tok_content_");
  const std::string hf = dir + "tokenizer.json";
  std::ofstream(hf) << R"({"model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
    "max_input_chars_per_word": 100, "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4,
    "the": 5, "cat": 6, "sat": 7, "##s": 8, "on": 9, "mat": 10, ".": 11}},
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "lowercase": true,
                   "strip_accents": null},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "cls": ["[CLS]", 2], "sep": ["[SEP]", 3]},
    "added_tokens": []})";
  const auto tok = qkv::Tokenizer::load(hf, 12);
  EXPECT_EQ(tok.format(), qkv::Tokenizer::Format::wordpiece);
  // By hand: [CLS] the cat sat ##s on the mat . [SEP] (lower-cased, "sats" → sat ##s).
  EXPECT_EQ(tok.encode("The cat SATS on the mat.", true, true), (std::vector<int>{2, 5, 6, 7, 8, 9, 5, 10, 11, 3}));
  std::string m = error_of([&] { qkv::Tokenizer::load(hf, 512); });
  EXPECT_NE(m.find("read as a Hugging Face WordPiece tokenizer.json"), std::string::npos) << m;
  EXPECT_NE(m.find("12 tokens, but the model's vocabulary has 512"), std::string::npos) << m;
  // qkv train's tokenizer.json and llama2.c's binary given to the WordPiece loader.
  const std::string chars = dir + "chars.json";
  std::ofstream(chars) << qkv::detail::TextTokenizer::learn_chars("abc").to_json();
  m = error_of([&] { qkv::Tokenizer::load_wordpiece(chars); });
  EXPECT_NE(m.find("it is qkv train's tokenizer.json (\"kind\": \"chars\"), not WordPiece"), std::string::npos) << m;
  m = error_of([&] { qkv::Tokenizer::load_wordpiece(kDir + "tok512.bin"); });
  EXPECT_NE(m.find("binary (it holds NUL bytes)"), std::string::npos) << m;
  // A vocab.txt given to Tokenizer::load is read as llama2.c's binary; the error lists what load reads.
  const std::string vocab = dir + "vocab.txt";
  std::ofstream(vocab) << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n";
  m = error_of<qkv::FormatError>([&] { qkv::Tokenizer::load(vocab, 5); });
  EXPECT_NE(m.find("read as a llama2.c tokenizer.bin"), std::string::npos) << m;
  EXPECT_NE(m.find("impossible max_token_length"), std::string::npos) << m;
  EXPECT_NE(m.find("qkv train's tokenizer.json"), std::string::npos) << m;
  for (const auto& f : {hf, chars, vocab}) std::remove(f.c_str());
}

// Issue #16, defect 16: a prompt's characters outside the vocabulary come back whole (byte-fallback
// tokens, one byte each, were dropped as unprintable); control bytes are still dropped.
TEST(Generate, EchoesNonAsciiPromptCharacters) {
  const std::string prompt = "Caf\u00e9 \u732b na\u00efve";
  const std::string out = run(prompt, 40);  // steps count the prompt: a byte-fallback character takes a position per byte
  EXPECT_EQ(out.substr(0, prompt.size()), prompt);
  EXPECT_TRUE(qkv::Tokenizer::printable("\xC3"));
  EXPECT_TRUE(qkv::Tokenizer::printable("\n"));
  EXPECT_FALSE(qkv::Tokenizer::printable("\x07"));
  EXPECT_FALSE(qkv::Tokenizer::printable("\x7F"));
}

}  // namespace
