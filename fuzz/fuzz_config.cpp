// libFuzzer harness: model configurations as JSON text, both qkv's own model.json and a Hugging
// Face config.json (detected by "model_type"). Any input must give a valid Config or be refused
// with std::invalid_argument. A config that is accepted must survive its own JSON form:
// config_to_json -> config_from_json gives the same config (compared through its JSON text).
#include <stdexcept>
#include <string>
#include <string_view>

#include "qkv/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  qkv::Config c;
  try {
    c = qkv::config_from_json(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const std::invalid_argument&) {  // refused: a bad value, or (below) a corrupt file
    return 0;
  } catch (const qkv::FormatError&) {
    return 0;
  }
  const std::string once = qkv::config_to_json(c, false);
  const std::string twice = qkv::config_to_json(qkv::config_from_json(once, "fuzz round trip"), false);
  if (once != twice) __builtin_trap();
  return 0;
}
