// Shared by the loader fuzzers: the input becomes a file (an in-memory memfd, reached through
// /proc/self/fd), because the loaders take paths and map files exactly as they do in use.
#pragma once

#include <cstdint>
#include <string>

#include <sys/mman.h>
#include <unistd.h>

namespace qkv::fuzz {

inline std::string as_file(const std::uint8_t* data, std::size_t size) {
  static const int fd = ::memfd_create("qkv_fuzz", 0);
  if (::ftruncate(fd, 0) != 0) __builtin_trap();
  std::size_t at = 0;
  while (at < size) {
    const ssize_t n = ::pwrite(fd, data + at, size - at, static_cast<off_t>(at));
    if (n <= 0) __builtin_trap();
    at += static_cast<std::size_t>(n);
  }
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace qkv::fuzz
