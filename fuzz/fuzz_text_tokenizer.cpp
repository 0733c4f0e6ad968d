// libFuzzer harness: the tokenizer JSON that `qkv train` writes (src/model/text_tokenizer.hpp:
// {"kind": "chars", "chars": [...]} or {"kind": "bpe", "merges": [[a, b], ...]}). Any input must load
// or be refused with std::invalid_argument. A tokenizer that loads must
//   - write itself back unchanged: to_json -> from_json -> to_json gives the same text;
//   - encode the input bytes themselves losslessly: a BPE tokenizer encodes any byte string and
//     decode(encode(s)) == s; a chars tokenizer may refuse a character it lacks (invalid_argument),
//     and when it does encode, decoding gives the text back.
#include <stdexcept>
#include <string>
#include <string_view>

#include "model/text_tokenizer.hpp"
#include "qkv/types.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using qkv::detail::TextTokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  TextTokenizer tok;
  try {
    tok = TextTokenizer::from_json(text);
  } catch (const std::invalid_argument&) {  // refused: a bad value, or (below) a corrupt file
    return 0;
  } catch (const qkv::FormatError&) {
    return 0;
  }
  const std::string json = tok.to_json();
  if (TextTokenizer::from_json(json).to_json() != json) __builtin_trap();
  std::vector<std::int32_t> ids;
  try {
    ids = tok.encode(text);
  } catch (const std::invalid_argument&) {
    if (tok.kind() == TextTokenizer::Kind::bpe) __builtin_trap();  // BPE encodes every byte string
    return 0;
  }
  if (tok.decode(ids) != text) __builtin_trap();
  return 0;
}
