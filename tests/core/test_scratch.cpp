// The scratch pool (src/core/scratch.hpp): alignment, reuse, its bounds, and concurrent leases.
// Independent values: the sizes asked for and the bounds stated in scratch.hpp; the pattern each
// thread writes into its own blocks.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "core/scratch.hpp"
#include "support/fork_testing.hpp"
#include "support/sanitizers.hpp"

namespace {

struct Lease {
  void* p;
  std::size_t size;
};

Lease lease(std::size_t bytes) {
  Lease l{};
  l.p = qkv::scratch_lease(bytes, &l.size);
  return l;
}

TEST(Scratch, AlignedLargeEnoughAndReused) {
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{300000}}) {
    const Lease a = lease(bytes);
    ASSERT_NE(a.p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.p) % 64, 0u) << bytes;
    EXPECT_GE(a.size, bytes);
    std::memset(a.p, 0xab, a.size);  // all of it is usable (ASan checks the bounds)
    qkv::scratch_return(a.p, a.size);
    const Lease b = lease(bytes);  // the block just returned is the best fit
    EXPECT_EQ(b.p, a.p) << bytes;
    qkv::scratch_return(b.p, b.size);
  }
}

TEST(Scratch, PoolStaysWithinItsBounds) {
  // More blocks than the pool keeps, then one larger than it caches.
  std::vector<Lease> ls;
  for (std::size_t i = 0; i < qkv::kScratchPoolBlocks + 10; ++i) ls.push_back(lease(4096 * (1 + i % 7)));
  for (const Lease& l : ls) qkv::scratch_return(l.p, l.size);
  std::size_t blocks = 0, bytes = 0;
  qkv::scratch_pool_held(&blocks, &bytes);
  std::printf("held after %zu returns: %zu blocks, %zu bytes\n", ls.size(), blocks, bytes);
  EXPECT_LT(blocks, qkv::kScratchPoolBlocks);
  EXPECT_LE(bytes, qkv::kScratchPoolBytes);

  const Lease big = lease(qkv::kScratchMaxCached + 1);
  qkv::scratch_return(big.p, big.size);
  std::size_t blocks2 = 0, bytes2 = 0;
  qkv::scratch_pool_held(&blocks2, &bytes2);
  EXPECT_EQ(bytes2, bytes);  // freed, not cached
  // Five blocks of 16 MiB out at once (80 MiB), then all returned: the byte bound (64 MiB) holds.
  std::vector<Lease> large;
  for (int i = 0; i < 5; ++i) large.push_back(lease(qkv::kScratchMaxCached));
  for (const Lease& l : large) qkv::scratch_return(l.p, l.size);
  qkv::scratch_pool_held(&blocks2, &bytes2);
  std::printf("held after large returns: %zu blocks, %zu bytes\n", blocks2, bytes2);
  EXPECT_LE(bytes2, qkv::kScratchPoolBytes);
}

TEST(Scratch, ConcurrentLeasesNeverOverlap) {
  // Each thread fills the bytes it asked for with its own byte and checks they are still there
  // after other threads had time to lease and write. Blocks are whole allocations, so two threads
  // holding one block would both write from its first byte on. (Not the whole block: after
  // PoolStaysWithinItsBounds the best fit can be a 16 MiB block, and TSan checks every byte read.)
  constexpr int kThreads = 6, kRounds = qkv::testing::tsan_rounds(100);
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t, &bad] {
      int wrong = 0;
      for (int r = 0; r < kRounds; ++r) {
        const auto na = static_cast<std::size_t>(1000 + 977 * ((t + r) % 13)),
                   nb = static_cast<std::size_t>(64 + 4096 * (r % 3));
        const Lease a = lease(na), b = lease(nb);
        std::memset(a.p, t + 1, na);
        std::memset(b.p, t + 101, nb);
        std::this_thread::yield();
        const auto* pa = static_cast<const unsigned char*>(a.p);
        const auto* pb = static_cast<const unsigned char*>(b.p);
        for (std::size_t i = 0; i < na; ++i) wrong += pa[i] != t + 1;
        for (std::size_t i = 0; i < nb; ++i) wrong += pb[i] != t + 101;
        qkv::scratch_return(b.p, b.size);
        qkv::scratch_return(a.p, a.size);
      }
      bad[static_cast<std::size_t>(t)] = wrong;
    });
  for (auto& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t;
}

// fork() while another thread leases and returns blocks: the pool's mutex is held across fork()
// (pthread_atfork), so a child never inherits it locked by a thread it does not have. The busy
// thread spends most of its time inside that mutex; the child leases, fills and returns a block.
// Under TSan, where 60 forks took 15 s on the shared machine, 6 forks.
TEST(Scratch, ForkedChildLeasesWhileAnotherThreadDoes) {
  auto busy = [](long k) {
    Lease ls[8];
    for (int i = 0; i < 8; ++i) ls[i] = lease(static_cast<std::size_t>(64 + 4096 * ((k + i) % 9)));
    for (const Lease& l : ls) qkv::scratch_return(l.p, l.size);
  };
  auto child = [] {
    const Lease a = lease(5000);
    std::memset(a.p, 7, a.size);
    qkv::scratch_return(a.p, a.size);
    return a.size >= 5000;
  };
  EXPECT_EQ(qkv::testing::fork_while_busy(busy, child, qkv::testing::tsan_rounds(60)), "");
}

}  // namespace
