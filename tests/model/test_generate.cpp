// Greedy generation with the real stories260K model against llama2.c's published output.
#include <string>

#include <gtest/gtest.h>

#include "qkv/model.hpp"

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

std::string run(const std::string& prompt, std::int64_t steps) {
  qkv::Model model(qkv::load_llama2c(kDir + "stories260K.bin"));
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

}  // namespace
