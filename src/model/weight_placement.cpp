// The one weight-placement rule of every loader: see weight_placement.hpp.
#include "model/weight_placement.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <sys/mman.h>

#include "qkv/memory.hpp"
#include "qkv/types.hpp"

namespace qkv::detail {
namespace {

constexpr std::uint64_t kHuge = std::uint64_t{2} << 20;  // one transparent huge page (x86-64)

// True when an madvise(MADV_HUGEPAGE) region gets huge pages: the kernel's setting reads
// "always [madvise] never" with the active choice in brackets.
bool huge_pages_for_advised_memory() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos || s.find("[madvise]") != std::string::npos;
}

}  // namespace

Placement weight_placement(const char* fn) {
  if (const char* s = std::getenv("QKV_WEIGHT_PLACEMENT"); s && *s) {
    if (std::strcmp(s, "copied") == 0) return Placement::copied;
    if (std::strcmp(s, "in_place") == 0) return Placement::in_place;
    fail(fn, std::string("QKV_WEIGHT_PLACEMENT: must be copied or in_place, got '") + s + "'");
  }
  return huge_pages_for_advised_memory() ? Placement::copied : Placement::in_place;
}

WeightArena weight_arena(std::uint64_t bytes, const char* fn, const std::string& what) {
  check_memory(fn, what, bytes);
  // Map one huge page more than needed, then unmap the unaligned head and the tail, so the arena
  // starts on a 2 MiB boundary (a huge page can only back an aligned 2 MiB range).
  const std::uint64_t len = (std::max<std::uint64_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  void* m = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    throw OutOfMemory("[" + std::string(fn) + "] " + what + ": cannot map " + std::to_string(len) +
                      " bytes: " + std::strerror(errno));
  auto* base = static_cast<std::uint8_t*>(m);
  auto* a = reinterpret_cast<std::uint8_t*>((reinterpret_cast<std::uintptr_t>(base) + kHuge - 1) / kHuge * kHuge);
  if (a > base) ::munmap(base, static_cast<std::size_t>(a - base));
  ::munmap(a + len, static_cast<std::size_t>(base + kHuge - a));  // > 0: a < base + kHuge
  ::madvise(a, len, MADV_HUGEPAGE);  // a hint: without THP the arena works the same on 4 KiB pages
  return {std::shared_ptr<void>(a, [len](void* p) { ::munmap(p, len); }), reinterpret_cast<float*>(a)};
}

}  // namespace qkv::detail
