#include "model/mapped_file.hpp"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/input_file.hpp"
#include "qkv/types.hpp"

namespace qkv::detail {

MappedFile::MappedFile(const std::string& path, const char* fn) {
  // Refuses a directory, FIFO or device before opening (a FIFO would block open()).
  const int fd = open_input_file(path, fn, "path");
  struct stat st {};
  ::fstat(fd, &st);
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail_io(fn, "path '" + path + "': cannot map " + std::to_string(size_) + " bytes: " + std::strerror(e));
    }
    data_ = static_cast<std::uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

}  // namespace qkv::detail
