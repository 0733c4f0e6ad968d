// libFuzzer harness: the tokenizer files Tokenizer::load tells apart by content: llama2.c's binary,
// Hugging Face BPE tokenizer.json (GPT-2's byte-level and Llama's metaspace styles), GPT-2's
// vocab.json / merges.txt (refused without the other beside it), WordPiece, qkv train's JSON. The
// first two bytes choose the vocabulary size the file is read for (3 … 65538; the seed tok512.bin is
// prefixed with 512 − 3); a file that loads is then used: a fixed text (accents, CJK, emoji, runs of
// whitespace, a contraction, added tokens written in it) is encoded and every token decoded.
#include <stdexcept>

#include "fuzz/fuzz_common.hpp"
#include "qkv/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::int64_t vocab = 3 + (data[0] | (data[1] << 8));
  try {
    const auto tok = qkv::Tokenizer::load(qkv::fuzz::as_file(data + 2, size - 2), vocab);
    const auto ids = tok.encode(
        "Once upon a time, a caf\xc3\xa9 \xe7\x8c\xab.  \t\n\xf0\x9f\x98\x80 it's <s></s><|endoftext|> \xe2\x96\x81" "an", true, true);
    std::size_t n = 0;
    for (std::size_t i = 1; i < ids.size(); ++i) n += tok.decode(ids[i - 1], ids[i]).size();
    for (int id = 0; id < tok.vocab_size(); ++id) n += tok.decode(tok.bos_id(), id).size();
    if (n == static_cast<std::size_t>(-1)) __builtin_trap();
  } catch (const std::invalid_argument&) {  // refused: a bad value, or (below) a corrupt file
  } catch (const qkv::FormatError&) {
  }
  return 0;
}
