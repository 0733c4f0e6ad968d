// Internal: the one safetensors module (Hugging Face's format), for model weights (safetensors.cpp
// below load_safetensors / save_safetensors), training checkpoints and the Python package.
//
//   [u64 little-endian N] [N bytes of JSON, space-padded to a multiple of 8] [data]
//   { "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//     "__metadata__": {"<key>": "<string>", ...} }
//
// Offsets are relative to the first byte after the header. parse_safetensors validates everything
// against the file size before any tensor is touched: the header fits (and is at most 100 MB, the
// reference implementation's limit), the JSON parses (at most kJsonMaxDepth deep), each shape has
// at most 8 sizes ≤ 2^40, every offset pair of a known dtype spans numel · dtype size bytes, and the
// tensors tile the data region exactly, without overlap, holes or trailing bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::detail {

// Bytes per element of a safetensors dtype (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 BOOL), 0 if unknown.
std::size_t safetensors_dtype_bytes(std::string_view dtype);

struct SafetensorsEntry {
  std::string dtype;                // a tensor of an unknown dtype is kept; its size is not checked
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // [begin, end) in the data region
};

struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  const std::uint8_t* data = nullptr;  // the first byte after the header
  std::uint64_t data_size = 0;
};

// The validated header of the safetensors file `bytes[0, size)`; a violation throws qkv::FormatError
// "[fn] where: what".
SafetensorsHeader parse_safetensors(const std::uint8_t* bytes, std::uint64_t size, std::string_view fn,
                                    const std::string& where);

// One tensor to write: `bytes` holds numel(shape) · dtype size bytes, little-endian, row-major.
struct SafetensorsView {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string_view bytes;
};

// Writes `metadata` and `tensors` (stored in the order given, header padded so the data starts
// 8-byte aligned) through write_file_atomic. Throws naming `fn` if a name repeats or is
// "__metadata__", a dtype is unknown, or a tensor's bytes do not match its shape.
void write_safetensors(const std::string& path, const std::map<std::string, std::string>& metadata,
                       std::span<const SafetensorsView> tensors, std::string_view fn);

// A whole file in memory, for files that hold more than model weights (training checkpoints:
// optimiser moments, step, RNG state) and for the Python package.
struct StTensor {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;  // little-endian raw data, numel(shape) · dtype size long
};
struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
};

// Reads and validates `path` (parse_safetensors; here an unknown dtype is an error too).
StFile read_safetensors(const std::string& path, std::string_view fn = "qkv::read_safetensors");
// Tensors in name order.
void write_safetensors(const std::string& path, const StFile& file, std::string_view fn = "qkv::write_safetensors");

// Helpers for the dtypes a checkpoint uses.
StTensor st_f32(const float* data, std::vector<std::int64_t> shape);
StTensor st_u64(const std::vector<std::uint64_t>& data);
StTensor st_i64(const std::vector<std::int64_t>& data);
// Copies a tensor out, checking its dtype and element count (qkv::FormatError naming `what`).
void st_copy_f32(const StFile& f, const std::string& name, float* out, std::int64_t n, const std::string& what);
std::vector<std::uint64_t> st_get_u64(const StFile& f, const std::string& name, std::int64_t n, const std::string& what);
std::vector<std::int64_t> st_get_i64(const StFile& f, const std::string& name, std::int64_t n, const std::string& what);

}  // namespace qkv::detail
