// libFuzzer harness: the generic safetensors reader (src/model/safetensors.hpp), as training checkpoints use it
// (F32, I64, U64 and the other dtypes, "__metadata__" strings).
// Any input must be read or refused with std::invalid_argument. A file that is read hands out
// tensors whose bytes match their shape exactly, so the typed getters the trainer uses accept
// every F32, U64 and I64 tensor at its own element count and copy exactly its bytes.
#include <cstring>
#include <stdexcept>
#include <vector>

#include "fuzz/fuzz_common.hpp"
#include "model/safetensors.hpp"
#include "qkv/types.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace t = qkv::detail;
  t::StFile f;
  try {
    f = t::read_safetensors(qkv::fuzz::as_file(data, size));
  } catch (const std::invalid_argument&) {  // refused: a bad value, or (below) a corrupt file
    return 0;
  } catch (const qkv::FormatError&) {
    return 0;
  }
  for (const auto& [name, tensor] : f.tensors) {
    std::int64_t n = 1;
    for (auto d : tensor.shape) n *= d;
    if (tensor.dtype == "F32") {
      std::vector<float> out(static_cast<std::size_t>(n));
      t::st_copy_f32(f, name, out.data(), n, "fuzz");
      if (n > 0 && std::memcmp(out.data(), tensor.bytes.data(), tensor.bytes.size()) != 0) __builtin_trap();
    } else if (tensor.dtype == "U64") {
      const auto out = t::st_get_u64(f, name, n, "fuzz");
      if (n > 0 && std::memcmp(out.data(), tensor.bytes.data(), tensor.bytes.size()) != 0) __builtin_trap();
    } else if (tensor.dtype == "I64") {
      const auto out = t::st_get_i64(f, name, n, "fuzz");
      if (n > 0 && std::memcmp(out.data(), tensor.bytes.data(), tensor.bytes.size()) != 0) __builtin_trap();
    }
  }
  return 0;
}
