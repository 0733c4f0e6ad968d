// qkv/types.hpp — the ground floor: dtypes, bf16, strided views, owning buffers, errors.
//
// A View is a non-owning window on memory: pointer, dtype, rank ≤ 4, shape and strides.
// Strides count elements (not bytes), are ≥ 0, and may be 0 to broadcast a dimension.
// Nothing here allocates except Buffer. Kernels receive Views and read them through
// their strides, so a transposed or sliced tensor is never copied to be used.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

// ---------------------------------------------------------------------------------------------
// dtypes
// ---------------------------------------------------------------------------------------------
enum class DType : std::uint8_t {
  f32,   // IEEE binary32
  bf16,  // bfloat16: the upper 16 bits of a binary32, stored as std::uint16_t
  f64,   // IEEE binary64, used by the reference (oracle) paths
  u8,    // booleans in masks: nonzero = true
  i32,
  i64,
  i8,    // int8 KV caches (qkv::attention_kvcache), dequantised by a scale per row and head
  f16,   // IEEE binary16: KV caches only (attention_kvcache), widened to f32 in the kernel
};

std::size_t dtype_size(DType t);
const char* dtype_name(DType t);
inline bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

// bf16 <-> f32. to_bf16 rounds to nearest even; NaN stays NaN (quiet); ±inf stays ±inf.
inline float bf16_to_f32(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// binary16 <-> f32. f16_to_f32 is exact; f32_to_f16 rounds to nearest even, overflows to ±inf,
// keeps subnormals, NaN stays NaN (quiet).
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16, em = h & 0x7fffu;
  std::uint32_t u;
  if (em >= 0x7c00u) {
    u = sign | 0x7f800000u | ((em & 0x3ffu) << 13);  // ±inf, NaN
  } else if (em >= 0x0400u) {
    u = sign | ((em << 13) + 0x38000000u);  // normal: exponent rebiased 15 → 127
  } else {
    const float f = static_cast<float>(em) * 0x1p-24f;  // subnormal or zero: em · 2^-24, exact
    std::memcpy(&u, &f, sizeof u);
    u |= sign;
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // ≥ 65520 rounds to inf
  if (u < 0x38800000u) {                        // below 2^-14: a subnormal half, |f| · 2^24 rounded
    float a;
    std::memcpy(&a, &u, sizeof a);
    a *= 0x1p24f;  // exact (a power of two), < 2^10
    const auto m = static_cast<std::uint32_t>(a);
    const float rest = a - static_cast<float>(m);
    const std::uint32_t r = m + (rest > 0.5f || (rest == 0.5f && (m & 1u)) ? 1u : 0u);
    return static_cast<std::uint16_t>(sign | r);
  }
  u += 0xfffu + ((u >> 13) & 1u);  // round the 23-bit mantissa to 10 bits, nearest even
  return static_cast<std::uint16_t>(sign | ((u - 0x38000000u) >> 13));
}

// ---------------------------------------------------------------------------------------------
// View: a strided, non-owning tensor of rank 1..4
// ---------------------------------------------------------------------------------------------
inline constexpr int kMaxRank = 4;

struct View {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<std::int64_t, kMaxRank> shape{};    // shape[0..rank)
  std::array<std::int64_t, kMaxRank> strides{};  // in elements, ≥ 0

  // A row-major contiguous view of `shape` over `data`.
  static View contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  static View contiguous(void* data, DType dtype, const std::vector<std::int64_t>& shape);
  // A view with explicit strides (in elements).
  static View strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                      std::initializer_list<std::int64_t> strides);

  std::int64_t dim(int i) const { return shape[static_cast<std::size_t>(i)]; }
  std::int64_t stride(int i) const { return strides[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;
  bool is_contiguous() const;  // row-major, no gaps, no broadcast
  // "[2, 3, 4]" — used in error messages.
  std::string shape_str() const;

  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
  // Offset, in elements, of index (i0, i1, ...) — only the first `rank` entries are used.
  std::int64_t offset(std::int64_t i0, std::int64_t i1 = 0, std::int64_t i2 = 0, std::int64_t i3 = 0) const {
    return i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3];
  }
  // Element at an offset, converted to double / stored from double (any float dtype, u8, i32, i64).
  double load(std::int64_t off) const;
  void store(std::int64_t off, double x) const;
};

// ---------------------------------------------------------------------------------------------
// Buffer: an owning, 64-byte aligned, zero-initialised contiguous tensor.
// ---------------------------------------------------------------------------------------------
class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, std::vector<std::int64_t> shape);
  Buffer(Buffer&&) noexcept = default;
  Buffer& operator=(Buffer&&) noexcept = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  View view() const;
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const { return numel_; }
  std::size_t bytes() const { return numel_ < 0 ? 0 : static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  void* data() const { return data_.get(); }
  template <class T>
  T* ptr() const { return static_cast<T*>(data_.get()); }

 private:
  struct Free { void operator()(void* p) const; };
  std::unique_ptr<void, Free> data_;
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  std::int64_t numel_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Errors. Every message reads "[qkv::function] argument: what was wrong (got ...)"; the type says
// whose fault it is, so a caller (and the Python module, and the qkv CLI's exit code) can tell:
//   std::invalid_argument   a bad argument: a value, shape or option, or a path that names no
//                           readable regular file (checked before any work). fail().
//                           Python: ValueError. qkv CLI: exit 1.
//   qkv::IoError            the system refused a read or write during the work (read, mmap, write,
//                           fsync, rename, mkdir: disk full, file size limit, device error).
//                           fail_io(). Python: qkv.IoError, an OSError. qkv CLI: exit 3.
//   qkv::FormatError        a file's bytes break its format: truncated, not valid JSON, impossible
//                           sizes, overlapping offsets, a required key missing or of the wrong type.
//                           fail_format(). Python: qkv.FormatError, an OSError and a ValueError
//                           (before it had a type of its own it was a ValueError). qkv CLI: exit 4.
//   qkv::NonFiniteError     a run's numbers left the finite range: training diverged (NaN or ±inf
//                           loss), a model's logits overflowed while generating. fail_nonfinite().
//                           Python: qkv.NonFiniteError, a RuntimeError. qkv CLI: exit 5.
// A file that is valid but asks for something qkv does not implement (another tokenizer model, an
// unknown model_type) is a bad argument, not a FormatError: the remedy is another file.
// ---------------------------------------------------------------------------------------------
// The base of the errors no argument caused: catch qkv::Error to handle all three kinds.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class IoError : public Error {
 public:
  using Error::Error;
};
class FormatError : public Error {
 public:
  using Error::Error;
};
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void fail(std::string_view function, std::string_view message);
[[noreturn]] void fail_io(std::string_view function, std::string_view message);
[[noreturn]] void fail_format(std::string_view function, std::string_view message);
[[noreturn]] void fail_nonfinite(std::string_view function, std::string_view message);

// Number of elements of `shape`, throwing (naming `function` and `what`) if a dimension is
// negative or the product, or the largest byte offset, would not fit in 63 bits.
std::int64_t checked_numel(std::string_view function, std::string_view what,
                           const std::vector<std::int64_t>& shape, std::size_t elem_bytes);

}  // namespace qkv
