#include "model/input_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qkv/types.hpp"

namespace qkv::detail {
namespace {

// What a stat mode is, for a file that is not regular.
const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "is a directory";
  if (S_ISFIFO(m)) return "is a FIFO, not a regular file";
  if (S_ISCHR(m)) return "is a character device, not a regular file";
  if (S_ISBLK(m)) return "is a block device, not a regular file";
  if (S_ISSOCK(m)) return "is a socket, not a regular file";
  return "is not a regular file";
}

[[noreturn]] void refuse(const std::string& path, std::string_view fn, std::string_view arg, const std::string& why) {
  fail(fn, std::string(arg) + " '" + path + "': " + why);
}
// The system failed an open or read that the checks above expected to work.
[[noreturn]] void refuse_io(const std::string& path, std::string_view fn, std::string_view arg, const std::string& why) {
  fail_io(fn, std::string(arg) + " '" + path + "': " + why);
}

}  // namespace

std::string input_file_problem(const std::string& path) {
  if (path.empty()) return "the path is empty";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return "no such file or directory";
    if (errno == EACCES) return "permission denied (a folder on the way cannot be searched)";
    return std::strerror(errno);
  }
  if (!S_ISREG(st.st_mode)) return kind_of(st.st_mode);
  if (::access(path.c_str(), R_OK) != 0) return "permission denied (not readable)";
  return {};
}

int open_input_file(const std::string& path, std::string_view fn, std::string_view arg) {
  if (const std::string why = input_file_problem(path); !why.empty()) refuse(path, fn, arg, why);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int e = errno;
    refuse_io(path, fn, arg, std::string("cannot open: ") + (e == EACCES ? "permission denied" : std::strerror(e)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(path, fn, arg, kind_of(st.st_mode));
  }
  // Reads of a regular file never return EAGAIN; clear the flag all the same for the caller.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string read_input_file(const std::string& path, std::string_view fn, std::string_view arg, std::size_t max_bytes) {
  const int fd = open_input_file(path, fn, arg);
  struct stat st {};
  ::fstat(fd, &st);
  if (static_cast<std::size_t>(st.st_size) > max_bytes) {
    ::close(fd);
    refuse(path, fn, arg, std::to_string(st.st_size) + " bytes, more than the " + std::to_string(max_bytes) +
                              " a file of this kind may have");
  }
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      refuse_io(path, fn, arg, std::string("read failed: ") + std::strerror(e));
    }
    out.append(buf, static_cast<std::size_t>(n));
    if (out.size() > max_bytes) {
      ::close(fd);
      refuse(path, fn, arg, "more than the " + std::to_string(max_bytes) + " bytes a file of this kind may have");
    }
  }
  ::close(fd);
  return out;
}

std::string tokenizer_beside(const std::string& model, std::string_view fn, std::string_view arg) {
  namespace fs = std::filesystem;
  const fs::path p(model);
  const fs::path dir = fs::is_directory(p) ? p : p.parent_path().empty() ? fs::path(".") : p.parent_path();
  for (const char* name : {"tokenizer.json", "tokenizer.bin"})
    if (fs::is_regular_file(dir / name)) return (dir / name).string();
  // GPT-2's two files (a folder saved by the slow GPT2Tokenizer): vocab.json, merges.txt beside it.
  if (fs::is_regular_file(dir / "vocab.json") && fs::is_regular_file(dir / "merges.txt"))
    return (dir / "vocab.json").string();
  std::string found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("tok") && e.path().extension() == ".bin") {
      if (!found.empty()) fail(fn, std::string(arg) + ": not given, and " + dir.string() + " holds several tok*.bin");
      found = e.path().string();
    }
  }
  return found;
}

}  // namespace qkv::detail
