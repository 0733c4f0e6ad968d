#include "core/output_file.hpp"

#include <atomic>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "qkv/types.hpp"

namespace qkv::detail {

void write_file_atomic(const std::string& path, std::span<const std::string_view> pieces, std::string_view fn,
                       std::string_view arg) {
  const std::string who = std::string(arg) + " '" + path + "'";
  // A name no other writer uses: this process's pid and a count of its writes (two runs on one
  // folder, or two threads of one, never share a temporary).
  static std::atomic<std::uint64_t> count{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(count++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail_io(fn, who + ": cannot open the temporary '" + tmp + "' for writing: " + std::strerror(errno));
  // Any failure from here on removes the temporary: a full disk leaves nothing behind.
  auto give_up = [&](const std::string& what, int err) {
    ::close(fd);
    ::unlink(tmp.c_str());
    fail_io(fn, who + ": " + what + ": " + std::strerror(err) + " (the temporary was removed)");
  };
  std::size_t total = 0, done = 0;
  for (std::string_view p : pieces) total += p.size();
  for (std::string_view p : pieces) {
    for (std::size_t at = 0; at < p.size();) {
      const ssize_t n = ::write(fd, p.data() + at, p.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        give_up("write failed after " + std::to_string(done) + " of " + std::to_string(total) + " bytes",
                n < 0 ? errno : ENOSPC);
      at += static_cast<std::size_t>(n);
      done += static_cast<std::size_t>(n);
    }
  }
  // On the disk before the rename, so a crash leaves the old file or the new one, never a hole.
  if (::fsync(fd) != 0) give_up("fsync failed", errno);
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail_io(fn, who + ": close failed: " + std::strerror(e) + " (the temporary was removed)");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail_io(fn, who + ": cannot rename the temporary file into place: " + std::strerror(e) +
                 " (the temporary was removed)");
  }
}

}  // namespace qkv::detail
