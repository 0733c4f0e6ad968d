// The safetensors module (safetensors.hpp): the format itself, then qkv's model weights on it.
// Weights are placed by the loaders' one rule (weight_placement.hpp): F32 tensors stored as qkv
// uses them are read into an arena on transparent huge pages, or used in place from the private
// mapping; the others are converted to f32 into the arena. The tensor names are qkv's own
// (weights.cpp) or those of a Hugging Face GPT-2 or Llama checkpoint (hf_layout.hpp), told apart
// by the token embedding's name.
#include "model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/output_file.hpp"
#include "model/hf_layout.hpp"
#include "model/input_file.hpp"
#include "model/weight_placement.hpp"
#include "model/json_depth.hpp"
#include "model/mapped_file.hpp"
#include "model/weights.hpp"

namespace qkv::detail {

std::size_t safetensors_dtype_bytes(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL") return 1;
  return 0;
}

SafetensorsHeader parse_safetensors(const std::uint8_t* bytes, std::uint64_t size, std::string_view fn,
                                    const std::string& where) {
  if (size < 8) fail_format(fn, where + ": " + std::to_string(size) + " bytes is shorter than the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  // The reference implementation refuses headers over 100 MB.
  if (n > 100'000'000 || n > size - 8)
    fail_format(fn, where + ": header length " + std::to_string(n) + " does not fit in the file of " + std::to_string(size) +
                 " bytes (limit 100000000)");
  const std::string fn_s(fn);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes + 8, bytes + 8 + n, json_depth_limit(fn_s.c_str(), where));
  } catch (const nlohmann::json::exception& e) {
    fail_format(fn, where + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) fail_format(fn, where + ": header must be a JSON object, got " + std::string(j.type_name()));
  SafetensorsHeader h;
  h.data = bytes + 8 + n;
  h.data_size = size - 8 - n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail_format(fn, where + ": __metadata__ must be an object of strings");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail_format(fn, where + ": __metadata__[\"" + m.key() + "\"] is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string t = where + ": tensor \"" + name + "\"";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail_format(fn, t + ": needs dtype, shape and data_offsets, got " + v.dump().substr(0, 200));
    SafetensorsEntry info;
    if (!v["dtype"].is_string()) fail_format(fn, t + ": dtype must be a string");
    info.dtype = v["dtype"].get<std::string>();
    const auto& shape = v["shape"];
    if (!shape.is_array() || shape.size() > 8) fail_format(fn, t + ": shape must be an array of at most 8 sizes");
    for (const auto& d : shape) {
      if (!d.is_number_unsigned() || d.get<std::uint64_t>() > (1ull << 40))
        fail_format(fn, t + ": shape " + shape.dump() + " has an impossible size");
      info.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail_format(fn, t + ": data_offsets must be [begin, end], got " + off.dump());
    info.begin = off[0].get<std::uint64_t>();
    info.end = off[1].get<std::uint64_t>();
    if (info.begin > info.end || info.end > h.data_size)
      fail_format(fn, t + ": data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                   "] outside the data region of " + std::to_string(h.data_size) + " bytes");
    const std::size_t eb = safetensors_dtype_bytes(info.dtype);
    if (eb != 0) {
      // Each size ≤ 2^40 and rank ≤ 8 could still overflow the product: refused here.
      std::int64_t numel = 1;
      for (auto d : info.shape) {
        if (d != 0 && numel > (std::int64_t{1} << 62) / d) fail_format(fn, t + ": shape " + shape.dump() + " overflows");
        numel *= d;
      }
      if (static_cast<std::uint64_t>(numel) > (std::uint64_t{1} << 61) ||
          static_cast<std::uint64_t>(numel) * eb != info.end - info.begin)
        fail_format(fn, t + ": " + info.dtype + " " + shape.dump() + " needs " + std::to_string(numel) + " × " +
                     std::to_string(eb) + " bytes but data_offsets span " + std::to_string(info.end - info.begin));
    }
    h.tensors[name] = std::move(info);
  }
  // The tensors must tile [0, data_size) exactly.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const auto& [name, info] : h.tensors) spans.emplace_back(info.begin, info.end);
  std::sort(spans.begin(), spans.end());
  std::uint64_t at = 0;
  for (const auto& [b, e] : spans) {
    if (b != at)
      fail_format(fn, where + ": tensor data " + (b < at ? "overlaps" : "leaves a hole") + " at byte " + std::to_string(b) +
                   " of the data region");
    at = e;
  }
  if (at != h.data_size)
    fail_format(fn, where + ": the tensors cover " + std::to_string(at) + " bytes of a data region of " +
                 std::to_string(h.data_size) + " (trailing bytes)");
  return h;
}

void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const SafetensorsView> tensors, std::string_view fn) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::uint64_t at = 0;
  std::vector<std::string_view> pieces(1 + tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsView& t = tensors[i];
    const std::string what = "path '" + path + "': tensor \"" + t.name + "\"";
    if (t.name == "__metadata__" || j.contains(t.name))
      fail(fn, what + ": the name is " + (t.name == "__metadata__" ? "reserved" : "given twice"));
    const std::size_t eb = safetensors_dtype_bytes(t.dtype);
    if (eb == 0) fail(fn, what + ": unknown dtype '" + t.dtype + "'");
    const std::int64_t n = checked_numel(fn, what, t.shape, eb);
    if (static_cast<std::uint64_t>(n) * eb != t.bytes.size())
      fail(fn, what + ": " + t.dtype + " of " + std::to_string(n) + " elements needs " + std::to_string(n * eb) +
                   " bytes, got " + std::to_string(t.bytes.size()));
    j[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
    pieces[1 + i] = t.bytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::string head(8, '\0');
  for (int i = 0; i < 8; ++i) head[static_cast<std::size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  head += header;
  pieces[0] = head;
  write_file_atomic(path, pieces, fn);
}

StFile read_safetensors(const std::string& path, std::string_view fn) {
  const std::string where = "path '" + path + "'";
  const std::string bytes = read_input_file(path, fn, "path");
  const SafetensorsHeader h =
      parse_safetensors(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size(), fn, where);
  StFile out;
  out.metadata = h.metadata;
  for (const auto& [name, e] : h.tensors) {
    if (safetensors_dtype_bytes(e.dtype) == 0) fail(fn, where + ": tensor \"" + name + "\": unknown dtype '" + e.dtype + "'");
    out.tensors[name] = {e.dtype, e.shape,
                         std::string(reinterpret_cast<const char*>(h.data + e.begin), e.end - e.begin)};
  }
  return out;
}

void write_safetensors(const std::string& path, const StFile& file, std::string_view fn) {
  std::vector<SafetensorsView> views;
  views.reserve(file.tensors.size());
  for (const auto& [name, t] : file.tensors) views.push_back({name, t.dtype, t.shape, t.bytes});
  write_safetensors(path, file.metadata, views, fn);
}

namespace {

template <class T>
StTensor make(const T* data, std::vector<std::int64_t> shape, const char* dtype) {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  StTensor t{dtype, std::move(shape), std::string(static_cast<std::size_t>(n) * sizeof(T), '\0')};
  if (n > 0) std::memcpy(t.bytes.data(), data, t.bytes.size());
  return t;
}

const StTensor& get(const StFile& f, const std::string& name, const char* dtype, std::int64_t n,
                    const std::string& what) {
  const char* fn = "qkv::read_checkpoint";
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail_format(fn, what + ": tensor '" + name + "' is missing");
  const StTensor& t = it->second;
  std::int64_t count = 1;
  for (auto d : t.shape) count *= d;
  if (t.dtype != dtype || count != n)
    fail_format(fn, what + ": tensor '" + name + "' should be " + dtype + " with " + std::to_string(n) +
                 " elements, got " + t.dtype + " with " + std::to_string(count));
  return t;
}

template <class T>
std::vector<T> get_vector(const StFile& f, const std::string& name, const char* dtype, std::int64_t n,
                          const std::string& what) {
  const StTensor& t = get(f, name, dtype, n, what);
  std::vector<T> out(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace

StTensor st_f32(const float* data, std::vector<std::int64_t> shape) { return make(data, std::move(shape), "F32"); }
StTensor st_u64(const std::vector<std::uint64_t>& d) {
  return make(d.data(), {static_cast<std::int64_t>(d.size())}, "U64");
}
StTensor st_i64(const std::vector<std::int64_t>& d) {
  return make(d.data(), {static_cast<std::int64_t>(d.size())}, "I64");
}

void st_copy_f32(const StFile& f, const std::string& name, float* out, std::int64_t n, const std::string& what) {
  const StTensor& t = get(f, name, "F32", n, what);
  if (n > 0) std::memcpy(out, t.bytes.data(), t.bytes.size());
}
std::vector<std::uint64_t> st_get_u64(const StFile& f, const std::string& name, std::int64_t n,
                                      const std::string& what) {
  return get_vector<std::uint64_t>(f, name, "U64", n, what);
}
std::vector<std::int64_t> st_get_i64(const StFile& f, const std::string& name, std::int64_t n,
                                     const std::string& what) {
  return get_vector<std::int64_t>(f, name, "I64", n, what);
}

}  // namespace qkv::detail

namespace qkv {
namespace {

using detail::SafetensorsEntry;
using detail::SafetensorsHeader;

std::int64_t numel(const std::vector<std::int64_t>& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

struct SafetensorsStorage {
  std::shared_ptr<detail::MappedFile> file;  // only while a tensor is used in place
  std::shared_ptr<void> arena;
};

}  // namespace

Weights load_safetensors(const std::string& path, const Config& config) {
  const char* fn = "qkv::load_safetensors";
  const std::string where = "file '" + path + "'";
  config.validate(fn);
  auto file = std::make_shared<detail::MappedFile>(path, fn);
  const SafetensorsHeader h = detail::parse_safetensors(file->data(), file->size(), fn, where);

  Weights w;
  w.config = config;
  detail::prepare_layout(w);
  // Which names the file uses: qkv's own, or a Hugging Face GPT-2 / Llama checkpoint's
  // (hf_layout.hpp: each parameter's stored tensor and how it is rearranged).
  const detail::FileLayout layout =
      detail::detect_layout([&](const std::string& n) { return h.tensors.count(n) > 0; });
  // Match the config's parameter list against the file: every tensor present with its exact shape
  // and a supported dtype, nothing left over.
  // F32 tensors stored as qkv uses them, at 4-byte aligned offsets: used in place, or read as they
  // are into the arena, each at the offset within a 64-byte line it has in the file (so up to 15
  // floats of padding go before it; weight_placement.hpp). The others are converted into the arena.
  auto as_stored = [&](const detail::Source& s, const SafetensorsEntry& t) {
    return s.op == detail::Source::Op::copy && t.dtype == "F32" && (h.data - file->data() + t.begin) % 4 == 0;
  };
  const bool may_stay = detail::weight_placement(fn) == detail::Placement::in_place;
  auto in_place = [&](const detail::Source& s, const SafetensorsEntry& t) { return may_stay && as_stored(s, t); };
  std::int64_t arena_floats = 0, scratch_floats = 0;
  std::set<std::string> used;
  detail::for_each_param(w, [&](const std::string& name, const std::vector<std::int64_t>& shape, float*&) {
    const detail::Source s = detail::source_of(layout, config, name, shape);
    const std::string what = "tensor \"" + s.tensor + "\"" + (s.tensor == name ? "" : " (qkv's " + name + ")");
    auto it = h.tensors.find(s.tensor);
    if (it == h.tensors.end()) fail(fn, where + ": " + what + " " + shape_str(s.shape) + " that the config needs is missing");
    const SafetensorsEntry& t = it->second;
    if (t.shape != s.shape)
      fail(fn, where + ": " + what + " is " + shape_str(t.shape) + " but the config needs " + shape_str(s.shape));
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
      fail(fn, where + ": " + what + " has dtype " + t.dtype + "; supported: F32, BF16, F16");
    const std::int64_t stored = static_cast<std::int64_t>((t.end - t.begin) / detail::safetensors_dtype_bytes(t.dtype));
    if (!in_place(s, t)) arena_floats += numel(shape) + (as_stored(s, t) ? 16 : 0);
    if (s.op != detail::Source::Op::copy) scratch_floats = std::max(scratch_floats, stored);
    used.insert(s.tensor);
  });
  for (const auto& [name, t] : h.tensors)
    if (!used.count(name) && !detail::ignorable(layout, config, name))
      fail(fn, where + ": tensor \"" + name + "\" " + shape_str(t.shape) +
                   " is not a parameter of a model with this config: " + config_to_json(config, false));

  auto storage = std::make_shared<SafetensorsStorage>();
  float* arena = nullptr;
  if (arena_floats > 0) {
    detail::WeightArena a = detail::weight_arena(static_cast<std::uint64_t>(arena_floats) * sizeof(float), fn,
                                                 where + ": its " + std::to_string(arena_floats) + " floats");
    storage->arena = std::move(a.owner);
    arena = a.data;
  }
  std::vector<float> scratch(static_cast<std::size_t>(scratch_floats));
  detail::for_each_param(w, [&](const std::string& name, const std::vector<std::int64_t>& shape, float*& slot) {
    const detail::Source s = detail::source_of(layout, config, name, shape);
    const SafetensorsEntry& t = h.tensors.at(s.tensor);
    const std::uint8_t* src = h.data + t.begin;
    const std::int64_t n = static_cast<std::int64_t>((t.end - t.begin) / detail::safetensors_dtype_bytes(t.dtype));
    if (in_place(s, t)) {
      slot = reinterpret_cast<float*>(const_cast<std::uint8_t*>(src));
      storage->file = file;
      return;
    }
    if (as_stored(s, t)) {
      // Straight from the page cache into the arena (weight_placement.hpp: no fault of the mapping).
      const std::uint64_t at = static_cast<std::uint64_t>(h.data - file->data()) + t.begin;
      while ((reinterpret_cast<std::uintptr_t>(arena) - at) % 64 != 0) ++arena;
      slot = arena;
      arena += numel(shape);
      file->read(at, t.end - t.begin, slot, fn);
      return;
    }
    slot = arena;
    arena += numel(shape);
    float* out = s.op == detail::Source::Op::copy ? slot : scratch.data();
    for (std::int64_t k = 0; k < n; ++k) {
      if (t.dtype == "F32") {
        std::memcpy(out + k, src + 4 * k, 4);
      } else {
        std::uint16_t b;
        std::memcpy(&b, src + 2 * k, 2);
        out[k] = t.dtype == "BF16" ? bf16_to_f32(b) : f16_to_f32(b);
      }
    }
    if (s.op != detail::Source::Op::copy) detail::rearrange(s, shape, scratch.data(), slot);
  });
  w.storage = storage;
  detail::finish_layout(w);
  detail::check_finite(w, fn, where);
  return w;
}

Weights load_safetensors(const std::string& path, const std::string& config_path) {
  return load_safetensors(path, load_config(config_path));
}

Weights load_weights(const std::string& path, const std::string& config_path) {
  // A folder as `save_pretrained` writes it: its model.safetensors (config.json found beside it below).
  if (std::filesystem::is_directory(path))
    return load_weights((path.ends_with('/') ? path : path + "/") + "model.safetensors", config_path);
  const std::string ext = ".safetensors";
  const bool st = path.size() > ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0;
  if (!st) {
    if (!config_path.empty())
      fail("qkv::load_weights", "config_path: '" + config_path + "' given, but '" + path +
                                    "' is a llama2.c checkpoint whose header is its config");
    return load_llama2c(path);
  }
  // A training checkpoint beside a model folder's config.json is still not a model.
  detail::MappedFile file(path, "qkv::load_weights");
  const SafetensorsHeader h = detail::parse_safetensors(file.data(), file.size(), "qkv::load_weights", "file '" + path + "'");
  if (const auto f = h.metadata.find("format"); f != h.metadata.end() && f->second.rfind("qkv-train-checkpoint-", 0) == 0)
    fail("qkv::load_weights", "path '" + path + "': a qkv train checkpoint (weights with optimiser state); the model "
                                  "to run is model.safetensors beside it");
  if (!config_path.empty()) return load_safetensors(path, config_path);
  const std::string beside = path.substr(0, path.size() - ext.size()) + ".json";
  const auto slash = path.find_last_of('/');
  const std::string folder = (slash == std::string::npos ? std::string("config.json")
                                                          : path.substr(0, slash + 1) + "config.json");
  for (const std::string& c : {beside, folder})
    if (::access(c.c_str(), R_OK) == 0) return load_safetensors(path, c);
  // Last resort: the config a qkv writer stored in the file's metadata.
  auto it = h.metadata.find("qkv_config");
  if (it == h.metadata.end())
    fail("qkv::load_weights", "path '" + path + "': no config given, none found at '" + beside + "' or '" + folder +
                                  "', and no qkv_config in the file's metadata");
  return load_safetensors(path, config_from_json(it->second, "qkv_config metadata of '" + path + "'"));
}

void save_safetensors(const Weights& w, const std::string& path) {
  const auto tensors = w.tensors();
  std::vector<detail::SafetensorsView> views;
  views.reserve(tensors.size());
  for (const auto& t : tensors) {
    std::size_t n = 1;
    for (auto d : t.shape) n *= static_cast<std::size_t>(d);
    views.push_back({t.name, "F32", t.shape, {reinterpret_cast<const char*>(t.data), 4 * n}});
  }
  detail::write_safetensors(path, {{"format", "pt"}, {"qkv_config", config_to_json(w.config)}}, views,
                            "qkv::save_safetensors");
}

}  // namespace qkv
