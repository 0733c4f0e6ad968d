// check_memory(): see qkv/memory.hpp.
#include "qkv/memory.hpp"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace qkv {
namespace {

constexpr std::uint64_t kUnknown = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kSmall = std::uint64_t{64} << 20;

// The first number in `path` (a cgroup file holds one, or "max"); kUnknown if none.
std::uint64_t read_number(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  if (!(f >> s) || s.empty() || s[0] < '0' || s[0] > '9') return kUnknown;
  return std::stoull(s);
}

// MemAvailable of /proc/meminfo in bytes; kUnknown if absent.
std::uint64_t mem_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return kUnknown;
}

// Room left under one cgroup's limit: `limit` − `usage` (files of one directory); kUnknown when
// there is no limit (v2 "max"; v1 reports none as a number near 2^63: ≥ 2^60 counts as none).
std::uint64_t room(const std::string& limit, const std::string& usage) {
  const std::uint64_t max = read_number(limit), cur = read_number(usage);
  if (max == kUnknown || cur == kUnknown || max >= (std::uint64_t{1} << 60)) return kUnknown;
  return max > cur ? max - cur : 0;
}

// Room left under this process's cgroup memory limit, the smallest of what is found: cgroup v2
// ("0::/path", mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified) and v1 (a line whose
// controllers include "memory", mounted at /sys/fs/cgroup/memory). kUnknown without a limit.
std::uint64_t cgroup_room() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  std::uint64_t best = kUnknown;
  auto take = [&best](std::uint64_t r) { best = r < best ? r : best; };
  while (std::getline(f, line)) {
    const std::size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
    if (c1 == std::string::npos || c2 == std::string::npos) continue;
    const std::string controllers = line.substr(c1 + 1, c2 - c1 - 1), path = line.substr(c2 + 1);
    if (controllers.empty()) {
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"})
        take(room(root + path + "/memory.max", root + path + "/memory.current"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      const std::string dir = "/sys/fs/cgroup/memory" + path;
      take(room(dir + "/memory.limit_in_bytes", dir + "/memory.usage_in_bytes"));
    }
  }
  return best;
}

std::string human(std::uint64_t b) {
  char s[64];
  if (b == kUnknown) return "unknown";
  std::snprintf(s, sizeof s, "%.3g GB", static_cast<double>(b) / 1e9);
  return s;
}

}  // namespace

std::uint64_t available_memory() {
  const std::uint64_t a = mem_available(), c = cgroup_room();
  return a < c ? a : c;
}

void check_memory(std::string_view function, std::string_view what, std::uint64_t bytes) {
  // Below 64 MiB nothing is read (the two files cost tens of µs, per call of small attention):
  // the check is for sizes a caller's input can blow up, not for the last megabytes of a machine.
  if (bytes < kSmall) return;
  const std::uint64_t mem = mem_available(), room = cgroup_room();
  const std::uint64_t avail = mem < room ? mem : room;
  if (avail == kUnknown) return;
  std::uint64_t margin = avail / 16;
  if (margin < kSmall) margin = kSmall;
  if (bytes <= avail && avail - bytes >= margin) return;
  std::ostringstream m;
  m << "[" << function << "] " << what << ": needs " << human(bytes) << " (" << bytes << " bytes), but "
    << human(avail) << " are available (MemAvailable " << human(mem) << ", cgroup limit "
    << (room == kUnknown ? std::string("none") : human(room) + " left") << ") less a margin of " << human(margin);
  throw OutOfMemory(m.str());
}

std::uint64_t bytes_of(std::initializer_list<std::int64_t> dims, std::uint64_t elem_bytes) {
  std::uint64_t n = elem_bytes;
  for (std::int64_t d : dims) {
    if (d <= 0) return 0;
    const auto u = static_cast<std::uint64_t>(d);
    if (n > kUnknown / u) return kUnknown;
    n *= u;
  }
  return n;
}

}  // namespace qkv
