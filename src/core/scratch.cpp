// The scratch pool (see scratch.hpp): a small array of free blocks under one mutex.
#include "core/scratch.hpp"

#include <pthread.h>

#include <cstdlib>
#include <mutex>
#include <new>

namespace qkv {
namespace {

struct Block {
  void* p;
  std::size_t size;
};

// Free blocks [0, n), unordered. Leases pick the smallest block that fits (best fit), so a
// small call does not take the block a large call in another thread is about to reuse.
class Pool {
 public:
  ~Pool() {
    for (std::size_t i = 0; i < n_; ++i) std::free(free_[i].p);
  }

  void* lease(std::size_t bytes, std::size_t* size_out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::size_t best = n_;
      for (std::size_t i = 0; i < n_; ++i)
        if (free_[i].size >= bytes && (best == n_ || free_[i].size < free_[best].size)) best = i;
      if (best < n_) {
        const Block b = free_[best];
        free_[best] = free_[--n_];
        bytes_ -= b.size;
        *size_out = b.size;
        return b.p;
      }
    }
    // Whole pages: blocks of nearby sizes (the same shape with another D) can serve each other.
    const std::size_t size = (bytes + 4095) / 4096 * 4096 + (bytes == 0 ? 4096 : 0);
    void* p = std::aligned_alloc(64, size);
    if (!p) throw std::bad_alloc();
    *size_out = size;
    return p;
  }

  void give_back(void* p, std::size_t size) noexcept {
    if (size > kScratchMaxCached) {
      std::free(p);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    free_[n_++] = {p, size};
    bytes_ += size;
    // Over a bound: drop the smallest blocks first (the large ones are the costly ones to fault in).
    while (n_ > kScratchPoolBlocks - 1 || bytes_ > kScratchPoolBytes) {
      std::size_t small = 0;
      for (std::size_t i = 1; i < n_; ++i)
        if (free_[i].size < free_[small].size) small = i;
      std::free(free_[small].p);
      bytes_ -= free_[small].size;
      free_[small] = free_[--n_];
    }
  }

  // fork(): taken before, released after in both processes. A child of a process in which
  // another thread held the mutex would otherwise inherit it locked, with no thread to unlock it.
  void lock_for_fork() { mu_.lock(); }
  void unlock_after_fork() { mu_.unlock(); }

  void held(std::size_t* blocks, std::size_t* bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    *blocks = n_;
    *bytes = bytes_;
  }

 private:
  std::mutex mu_;
  Block free_[kScratchPoolBlocks];  // n_ < kScratchPoolBlocks between calls (one slot for give_back)
  std::size_t n_ = 0;
  std::size_t bytes_ = 0;
};

Pool& pool() {
  static Pool p;  // destroyed at exit, freeing what it holds
  return p;
}

void lock_for_fork() { pool().lock_for_fork(); }
void unlock_after_fork() { pool().unlock_after_fork(); }
[[maybe_unused]] const int g_atfork = pthread_atfork(lock_for_fork, unlock_after_fork, unlock_after_fork);

}  // namespace

void* scratch_lease(std::size_t bytes, std::size_t* size_out) { return pool().lease(bytes, size_out); }

void scratch_return(void* p, std::size_t size) noexcept { pool().give_back(p, size); }

void scratch_pool_held(std::size_t* blocks, std::size_t* bytes) { pool().held(blocks, bytes); }

}  // namespace qkv
