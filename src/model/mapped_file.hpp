// Internal: a whole file mapped private (copy-on-write) and writable, so weights can be used in
// place and even updated in memory without ever touching the file. The file stays open while the
// object lives, so read() copies from the very file that was mapped.
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

  // Copies bytes [offset, offset + n) of the file into dst with pread: the page cache copies
  // straight into dst, and no page of the mapping is faulted in (weight_placement.hpp: cheaper
  // than a memcpy from data()). Throws qkv::IoError naming `function` and the path if a read fails.
  void read(std::uint64_t offset, std::uint64_t n, void* dst, const char* function) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace qkv::detail
