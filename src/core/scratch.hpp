// Internal: scratch memory for the kernels, cached across calls.
//
// A kernel call leases its blocks on the calling thread before its parallel region (one block
// holding every thread's scratch, and the shared partial results) and hands them back when it
// ends. Returned blocks stay in a process-wide
// pool, so the next call of a similar size gets memory whose pages are already mapped: no
// allocation and no page faults per call, which at S = 256 cost a measurable share of a call
// (each thread's forward scratch is ≈ 0.25 MiB).
//
// Thread safety: leasing and returning take one mutex; a leased block belongs to its holder
// alone, so any number of caller threads (each with its own thread pool) may run kernels at once.
// fork(): the mutex is held across it (pthread_atfork), so a child never inherits it locked.
// Bounds: the pool keeps at most kScratchPoolBlocks blocks and kScratchPoolBytes bytes; a block
// larger than kScratchMaxCached is freed when returned instead of cached (the flash-decode
// partial results can reach 256 MiB). What the pool holds is freed at exit.
//
// Both functions are out of line on purpose: the ISA translation units call them, and must not
// instantiate shared inline code (see simd_common.hpp).
#pragma once

#include <cstddef>

namespace qkv {

inline constexpr std::size_t kScratchMaxCached = std::size_t{16} << 20;  // largest block kept
inline constexpr std::size_t kScratchPoolBytes = std::size_t{64} << 20;  // all blocks kept, together
inline constexpr std::size_t kScratchPoolBlocks = 64;                    // blocks kept

// A 64-byte aligned block of at least `bytes` bytes (contents undefined); never null: throws
// std::bad_alloc when memory runs out, so call it outside parallel regions. Give it back with
// scratch_return(p, *size_out).
void* scratch_lease(std::size_t bytes, std::size_t* size_out);
void scratch_return(void* p, std::size_t size) noexcept;

// What the pool holds now (free blocks and their bytes), for tests.
void scratch_pool_held(std::size_t* blocks, std::size_t* bytes);

}  // namespace qkv
