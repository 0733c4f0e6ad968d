// Views, buffers, dtypes and the error helpers of qkv/types.hpp.
#include "qkv/types.hpp"

#include <sys/mman.h>

#include <cstdlib>
#include <limits>
#include <new>
#include <sstream>

namespace qkv {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::i8: return 1;
    case DType::f16: return 2;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::u8: return "u8";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::i8: return "i8";
    case DType::f16: return "f16";
  }
  return "?";
}

namespace {
std::string error_message(std::string_view function, std::string_view message) {
  std::string s;
  s.reserve(function.size() + message.size() + 4);
  s += '[';
  s += function;
  s += "] ";
  s += message;
  return s;
}
}  // namespace

void fail(std::string_view function, std::string_view message) {
  throw std::invalid_argument(error_message(function, message));
}
void fail_io(std::string_view function, std::string_view message) {
  throw IoError(error_message(function, message));
}
void fail_format(std::string_view function, std::string_view message) {
  throw FormatError(error_message(function, message));
}
void fail_nonfinite(std::string_view function, std::string_view message) {
  throw NonFiniteError(error_message(function, message));
}

std::int64_t checked_numel(std::string_view function, std::string_view what,
                           const std::vector<std::int64_t>& shape, std::size_t elem_bytes) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    if (d < 0) {
      std::ostringstream m;
      m << what << ": negative dimension " << d;
      fail(function, m.str());
    }
    if (d != 0 && n > kMax / d) {
      std::ostringstream m;
      m << what << ": element count overflows 64 bits";
      fail(function, m.str());
    }
    n *= d;
  }
  if (elem_bytes != 0 && n > kMax / static_cast<std::int64_t>(elem_bytes)) {
    std::ostringstream m;
    m << what << ": size in bytes overflows 64 bits";
    fail(function, m.str());
  }
  return n;
}

// ------------------------------------------------------------------------------------------
View View::contiguous(void* data, DType dtype, const std::vector<std::int64_t>& shape) {
  if (shape.empty() || shape.size() > static_cast<std::size_t>(kMaxRank))
    fail("qkv::View::contiguous", "shape: rank must be 1..4, got " + std::to_string(shape.size()));
  View v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  std::int64_t s = 1;
  for (int i = v.rank - 1; i >= 0; --i) {
    v.shape[static_cast<std::size_t>(i)] = shape[static_cast<std::size_t>(i)];
    v.strides[static_cast<std::size_t>(i)] = s;
    s *= shape[static_cast<std::size_t>(i)];
  }
  return v;
}

View View::contiguous(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
  return contiguous(data, dtype, std::vector<std::int64_t>(shape));
}

View View::strided(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                   std::initializer_list<std::int64_t> strides) {
  if (shape.size() != strides.size() || shape.size() == 0 ||
      shape.size() > static_cast<std::size_t>(kMaxRank))
    fail("qkv::View::strided", "shape and strides must have the same rank 1..4");
  View v;
  v.data = data;
  v.dtype = dtype;
  v.rank = static_cast<int>(shape.size());
  std::size_t i = 0;
  for (auto d : shape) v.shape[i++] = d;
  i = 0;
  for (auto s : strides) v.strides[i++] = s;
  return v;
}

std::int64_t View::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[static_cast<std::size_t>(i)];
  return n;
}

bool View::is_contiguous() const {
  std::int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    const auto d = shape[static_cast<std::size_t>(i)];
    if (d != 1 && strides[static_cast<std::size_t>(i)] != s) return false;
    s *= d;
  }
  return true;
}

std::string View::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[static_cast<std::size_t>(i)]);
  }
  return s + "]";
}

double View::load(std::int64_t off) const {
  switch (dtype) {
    case DType::f32: return static_cast<const float*>(data)[off];
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(data)[off]);
    case DType::f64: return static_cast<const double*>(data)[off];
    case DType::u8: return static_cast<const std::uint8_t*>(data)[off];
    case DType::i32: return static_cast<const std::int32_t*>(data)[off];
    case DType::i64: return static_cast<double>(static_cast<const std::int64_t*>(data)[off]);
    case DType::i8: return static_cast<const std::int8_t*>(data)[off];
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(data)[off]);
  }
  return 0.0;
}

void View::store(std::int64_t off, double x) const {
  switch (dtype) {
    case DType::f32: static_cast<float*>(data)[off] = static_cast<float>(x); return;
    case DType::bf16: static_cast<std::uint16_t*>(data)[off] = f32_to_bf16(static_cast<float>(x)); return;
    case DType::f64: static_cast<double*>(data)[off] = x; return;
    case DType::u8: static_cast<std::uint8_t*>(data)[off] = x != 0.0; return;
    case DType::i32: static_cast<std::int32_t*>(data)[off] = static_cast<std::int32_t>(x); return;
    case DType::i64: static_cast<std::int64_t*>(data)[off] = static_cast<std::int64_t>(x); return;
    case DType::i8: static_cast<std::int8_t*>(data)[off] = static_cast<std::int8_t>(x); return;
    case DType::f16: static_cast<std::uint16_t*>(data)[off] = f32_to_f16(static_cast<float>(x)); return;
  }
}

// ------------------------------------------------------------------------------------------
void Buffer::Free::operator()(void* p) const { std::free(p); }

Buffer::Buffer(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  if (shape_.empty() || shape_.size() > static_cast<std::size_t>(kMaxRank))
    fail("qkv::Buffer", "shape: rank must be 1..4, got " + std::to_string(shape_.size()));
  numel_ = checked_numel("qkv::Buffer", "shape", shape_, dtype_size(dtype));
  // Round up to a multiple of the alignment (aligned_alloc's contract) and keep at least 64 bytes.
  // Buffers of 4 MiB and more (model weights, KV caches) are aligned to 2 MiB and asked for
  // transparent huge pages before the first write touches them: where THP is madvise-only, a
  // decoding step that streams 250–500 MB of weights otherwise walks 60–120 k 4-KiB pages (TLB
  // misses that cut the GEMV's read speed by up to 2× here). The advice is a hint: a kernel
  // without THP ignores it, and the buffer works the same.
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  std::size_t bytes = static_cast<std::size_t>(numel_) * dtype_size(dtype);
  const std::size_t align = bytes >= 2 * kHuge ? kHuge : 64;
  bytes = (bytes + align - 1) / align * align;
  if (bytes == 0) bytes = 64;
  void* p = std::aligned_alloc(align, bytes);
  if (!p) throw std::bad_alloc();
  if (align == kHuge) madvise(p, bytes, MADV_HUGEPAGE);
  std::memset(p, 0, bytes);
  data_.reset(p);
}

View Buffer::view() const { return View::contiguous(data_.get(), dtype_, shape_); }

}  // namespace qkv
