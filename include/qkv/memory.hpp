// qkv/memory.hpp — refusing an allocation that cannot fit, instead of being killed.
//
// Linux overcommits: a 25 GB std::vector on a 16 GB machine is granted, and the process is killed
// by the kernel when the pages are touched. Every allocation whose size comes from the caller
// (block weights, a model's KV cache and work buffers sized by its config, attention outputs
// sized by the caller's shapes, Python result arrays) is checked first with check_memory().
#pragma once

#include <cstdint>
#include <new>
#include <string>
#include <string_view>

namespace qkv {

// A std::bad_alloc (Python: MemoryError) with a message:
//   "[function] what: needs 25.6 GB (25600000000 bytes), but 14.2 GB are available (MemAvailable
//    14.2 GB, cgroup limit none) less a margin of 1 GB"
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string message) : msg_(std::move(message)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

// Bytes the process can still get: MemAvailable from /proc/meminfo, lowered to the room left
// under the cgroup's limit (v2 memory.max − memory.current of this process's cgroup, or v1
// memory.limit_in_bytes − memory.usage_in_bytes) when there is one. UINT64_MAX if unknown.
std::uint64_t available_memory();

// Throws OutOfMemory naming `function`, `what`, the bytes asked and the bytes available unless
// `bytes` fit in available_memory() less a margin kept for everything else (1/16 of it, at
// least 64 MiB). Requests under 64 MiB pass without a look (no file read: free on small calls);
// others cost two small file reads. Call it once per allocation of user-sized memory, with the
// total of the buffers about to be allocated together.
void check_memory(std::string_view function, std::string_view what, std::uint64_t bytes);

// n0 · n1 · ... · elem_bytes, saturating at UINT64_MAX (sizes from user input may overflow).
std::uint64_t bytes_of(std::initializer_list<std::int64_t> dims, std::uint64_t elem_bytes);

}  // namespace qkv
