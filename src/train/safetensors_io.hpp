// Internal: a small generic safetensors reader and writer for training checkpoints, which hold
// more than model weights (optimiser moments, step, RNG state; dtypes F32, I64, U64).
//
// Format: u64 little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end)}, "__metadata__": {string: string}}, then the data. The writer pads the header with
// spaces to a multiple of 8 and writes to a temporary "<path>.tmp.<pid>.<n>" before renaming it over <path>, so a crash
// never leaves a half-written checkpoint. The reader checks every offset against the file size.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace qkv::train {

struct StTensor {
  std::string dtype;                // "F32" | "I64" | "U64"
  std::vector<std::int64_t> shape;
  std::string bytes;                // little-endian raw data, product(shape) · dtype size long
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::map<std::string, StTensor> tensors;
};

void write_safetensors(const std::string& path, const StFile& file);
StFile read_safetensors(const std::string& path);

// Helpers for the dtypes a checkpoint uses.
StTensor st_f32(const float* data, std::vector<std::int64_t> shape);
StTensor st_u64(const std::vector<std::uint64_t>& data);
StTensor st_i64(const std::vector<std::int64_t>& data);
// Copies a tensor out, checking dtype and element count (naming `what` in errors).
void st_copy_f32(const StFile& f, const std::string& name, float* out, std::int64_t n, const std::string& what);
std::vector<std::uint64_t> st_get_u64(const StFile& f, const std::string& name, std::int64_t n, const std::string& what);
std::vector<std::int64_t> st_get_i64(const StFile& f, const std::string& name, std::int64_t n, const std::string& what);

// Writes text to a temporary "<path>.tmp.<pid>.<n>" (unique per process and write), fsyncs and renames
// it over path; any failure removes the temporary and throws naming path and errno's text.
void write_file_atomic(const std::string& path, const std::string& text);

}  // namespace qkv::train
