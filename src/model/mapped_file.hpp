// Internal: a whole file mapped private (copy-on-write) and writable, so weights can be used in
// place and even updated in memory without ever touching the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qkv::detail {

class MappedFile {
 public:
  // Throws, naming `function` and the path, if the file cannot be opened or mapped.
  MappedFile(const std::string& path, const char* function);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace qkv::detail
