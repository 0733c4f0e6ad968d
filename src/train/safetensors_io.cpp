#include "train/safetensors_io.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "model/input_file.hpp"
#include "model/json_depth.hpp"
#include "qkv/types.hpp"

namespace qkv::train {
namespace {

std::int64_t dtype_bytes(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64") return 8;
  if (d == "BF16" || d == "F16" || d == "I16") return 2;
  if (d == "I32" || d == "U32") return 4;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  return 0;
}

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
  const auto it = f.tensors.find(name);
  if (it == f.tensors.end()) fail("qkv::train::read_checkpoint", what + ": tensor '" + name + "' is missing");
  const StTensor& t = it->second;
  std::int64_t count = 1;
  for (auto d : t.shape) count *= d;
  if (t.dtype != dtype || count != n)
    fail("qkv::train::read_checkpoint", what + ": tensor '" + name + "' should be " + dtype + " with " +
                                            std::to_string(n) + " elements, got " + t.dtype + " with " +
                                            std::to_string(count));
  return t;
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
  const StTensor& t = get(f, name, "U64", n, what);
  std::vector<std::uint64_t> out(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

std::vector<std::int64_t> st_get_i64(const StFile& f, const std::string& name, std::int64_t n,
                                     const std::string& what) {
  const StTensor& t = get(f, name, "I64", n, what);
  std::vector<std::int64_t> out(static_cast<std::size_t>(n));
  if (n > 0) std::memcpy(out.data(), t.bytes.data(), t.bytes.size());
  return out;
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const char* fn = "qkv::train::write_file";
  // A name no other writer uses: this process's pid and a count of its writes (two runs on one
  // folder, or two threads of one, never share a temporary).
  static std::atomic<std::uint64_t> count{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(count++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail(fn, "path '" + tmp + "': cannot open for writing: " + std::strerror(errno));
  // Any failure from here on removes the temporary: a full disk leaves nothing behind.
  auto give_up = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail(fn, "path '" + path + "': " + what + ": " + std::strerror(err) + " (the temporary was removed)");
  };
  for (std::size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) give_up("write failed after " + std::to_string(at) + " of " + std::to_string(text.size()) + " bytes",
                        n < 0 ? errno : ENOSPC);
    at += static_cast<std::size_t>(n);
  }
  // On the disk before the rename, so a crash leaves the old file or the new one, never a hole.
  if (::fsync(fd) != 0) give_up("fsync failed", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(fn, "path '" + path + "': close failed: " + std::strerror(e) + " (the temporary was removed)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail(fn, "path '" + path + "': cannot rename the temporary file into place: " + std::strerror(e));
  }
}

void write_safetensors(const std::string& path, const StFile& file) {
  nlohmann::json h = nlohmann::json::object();
  if (!file.metadata.empty()) h["__metadata__"] = file.metadata;
  std::int64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    const auto n = static_cast<std::int64_t>(t.bytes.size());
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const std::uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  for (const auto& [name, t] : file.tensors) out += t.bytes;
  write_file_atomic(path, out);
}

StFile read_safetensors(const std::string& path) {
  const char* fn = "qkv::train::read_safetensors";
  const std::string data = detail::read_input_file(path, fn, "path");
  if (data.size() < 8) fail(fn, "path '" + path + "': " + std::to_string(data.size()) + " bytes, too short for safetensors");
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(data[static_cast<std::size_t>(i)]);
  if (len > data.size() - 8)
    fail(fn, "path '" + path + "': header length " + std::to_string(len) + " exceeds the file size " +
                 std::to_string(data.size()));
  const auto h =
      nlohmann::json::parse(data.substr(8, len), qkv::detail::json_depth_limit(fn, "path '" + path + "'"), false);
  if (h.is_discarded() || !h.is_object()) fail(fn, "path '" + path + "': the header is not a JSON object");
  const std::size_t base = 8 + len, body = data.size() - base;
  StFile out;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const auto& v = it.value();
    if (it.key() == "__metadata__") {
      if (!v.is_object()) fail(fn, "path '" + path + "': __metadata__ must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) fail(fn, "path '" + path + "': metadata '" + m.key() + "' must be a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "path '" + path + "': tensor '" + it.key() + "'";
    if (!v.is_object() || !v.contains("dtype") || !v["dtype"].is_string() || !v.contains("shape") ||
        !v["shape"].is_array() || !v.contains("data_offsets") || !v["data_offsets"].is_array() ||
        v["data_offsets"].size() != 2)
      fail(fn, where + ": needs dtype, shape and data_offsets");
    StTensor t;
    t.dtype = v["dtype"].get<std::string>();
    const std::int64_t esize = dtype_bytes(t.dtype);
    if (esize == 0) fail(fn, where + ": unknown dtype " + t.dtype);
    std::int64_t count = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0 || d.get<std::int64_t>() > (std::int64_t{1} << 40))
        fail(fn, where + ": bad shape " + v["shape"].dump());
      t.shape.push_back(d.get<std::int64_t>());
      count *= t.shape.back();
      if (count > (std::int64_t{1} << 40)) fail(fn, where + ": shape " + v["shape"].dump() + " is too large");
    }
    const auto& o = v["data_offsets"];
    if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned())
      fail(fn, where + ": data_offsets must be non-negative integers");
    const auto b = o[0].get<std::uint64_t>(), e = o[1].get<std::uint64_t>();
    if (b > e || e > body || e - b != static_cast<std::uint64_t>(count * esize))
      fail(fn, where + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + ") do not fit " +
                   std::to_string(count) + " × " + std::to_string(esize) + " bytes inside the " +
                   std::to_string(body) + " data bytes");
    t.bytes = data.substr(base + b, e - b);
    out.tensors.emplace(it.key(), std::move(t));
  }
  return out;
}

}  // namespace qkv::train
