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

MappedFile::MappedFile(const std::string& path, const char* fn) : path_(path) {
  // Refuses a directory, FIFO or device before opening (a FIFO would block open()).
  fd_ = open_input_file(path, fn, "path");
  struct stat st {};
  ::fstat(fd_, &st);
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd_, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd_);
      fail_io(fn, "path '" + path + "': cannot map " + std::to_string(size_) + " bytes: " + std::strerror(e));
    }
    data_ = static_cast<std::uint8_t*>(p);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
  ::close(fd_);
}

void MappedFile::read(std::uint64_t offset, std::uint64_t n, void* dst, const char* fn) const {
  auto* out = static_cast<std::uint8_t*>(dst);
  for (std::uint64_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd_, out + done, static_cast<std::size_t>(n - done), static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail_io(fn, "path '" + path_ + "': reading " + std::to_string(n) + " bytes at offset " +
                      std::to_string(offset) + ": " +
                      (r == 0 ? std::string("the file ended early (truncated while loading)") : std::strerror(errno)));
    done += static_cast<std::uint64_t>(r);
  }
}

}  // namespace qkv::detail
