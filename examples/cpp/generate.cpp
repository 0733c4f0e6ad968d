// Load a real model (Andrej Karpathy's stories260K, llama2.c's format) and its tokenizer, then generate
// greedily. With temperature 0 the text is llama2.c's own output for this model, byte for byte.
//
//   build/examples/generate data/models/stories260K/stories260K.bin data/models/stories260K/tok512.bin
#include <cstdio>
#include <string>

#include "qkv/model.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s MODEL.bin TOKENIZER.bin\n", argv[0]);
    return 2;
  }
  qkv::Model model(qkv::load_weights(argv[1]));
  const qkv::Tokenizer tok = qkv::Tokenizer::load(argv[2], model.config().vocab_size);

  qkv::GenerateOptions opt;
  opt.steps = 200;                    // positions in all, BOS included, as llama2.c's -n
  opt.sampling.temperature = 0.0f;    // greedy
  std::string text;
  const qkv::GenerateStats st = qkv::generate(model, tok, "", opt, [&](std::string_view piece) { text += piece; });
  std::printf("%s\n", text.c_str());
  std::fprintf(stderr, "%lld tokens, %.0f tok/s\n", static_cast<long long>(st.generated),
               st.generated / (st.decode_seconds > 0 ? st.decode_seconds : 1.0));
  return 0;
}
