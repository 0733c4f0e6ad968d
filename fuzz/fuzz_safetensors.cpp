// libFuzzer harness: safetensors model files, in qkv's tensor names and in the Hugging Face GPT-2 and
// Llama layouts. The first byte picks one of two small configs the file is checked against; the
// rest is the file. (Config JSON has its own harness, fuzz_config.cpp.)
#include <stdexcept>

#include "fuzz/fuzz_common.hpp"
#include "qkv/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  qkv::Config c;
  c.dim = 8; c.hidden_dim = 16; c.n_layers = 1; c.n_heads = 2; c.n_kv_heads = 1; c.vocab_size = 5; c.seq_len = 4;
  if (data[0] & 1) {  // the GPT-2 family: learned positions, LayerNorm with biases, GELU, untied
    c.pos = qkv::PosEncoding::learned;
    c.norm = qkv::NormKind::layernorm;
    c.mlp = qkv::MlpKind::gelu;
    c.bias = true;
    c.tied_embeddings = false;
    c.n_kv_heads = 2;
  }
  try {
    const qkv::Weights w = qkv::load_safetensors(qkv::fuzz::as_file(data + 1, size - 1), c);
    float sum = 0;
    for (const auto& t : w.tensors()) sum += t.data[0];
    if (sum != sum) __builtin_trap();
  } catch (const std::invalid_argument&) {  // refused: a bad value, or (below) a corrupt file
  } catch (const qkv::FormatError&) {
  }
  return 0;
}
