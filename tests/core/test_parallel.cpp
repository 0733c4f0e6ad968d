// qkv's thread pool (src/core/parallel.hpp): every index exactly once, thread indices in range,
// nesting, exceptions, concurrent callers, and fork().
// Exact integer results throughout: a loop either visits each index once or it does not.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/parallel.hpp"
#include "support/sanitizers.hpp"

namespace {

// Σ i over [0, n) computed by parallel_for, each index also counted (visits[i] must end at 1).
std::int64_t parallel_sum(std::int64_t n, int threads, std::vector<int>* visits = nullptr) {
  std::atomic<std::int64_t> sum{0};
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(n));
  qkv::parallel_for(n, threads, [&](std::int64_t i) {
    seen[static_cast<std::size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    sum.fetch_add(i, std::memory_order_relaxed);
  });
  if (visits) {
    visits->clear();
    for (auto& s : seen) visits->push_back(s.load());
  }
  return sum.load();
}

TEST(Parallel, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8})
    for (std::int64_t n : {0, 1, 2, 7, 1000, 100003}) {
      std::vector<int> visits;
      EXPECT_EQ(parallel_sum(n, threads, &visits), n * (n - 1) / 2) << "n " << n << " threads " << threads;
      for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(visits[static_cast<std::size_t>(i)], 1) << "index " << i;
    }
}

TEST(Parallel, ThreadIndexInRangeAndUniquePerCall) {
  for (int threads : {2, 3, 5}) {
    // Each participant of one run_shared call has its own index: a slot written twice would show.
    std::vector<std::atomic<int>> used(static_cast<std::size_t>(threads));
    std::atomic<int> bad{0};
    qkv::run_shared(threads, [&](int t) {
      if (t < 0 || t >= threads || t != qkv::thread_index()) bad.fetch_add(1);
      else used[static_cast<std::size_t>(t)].fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let the workers arrive
    });
    EXPECT_EQ(bad.load(), 0);
    EXPECT_EQ(used[0].load(), 1) << "the caller always takes part, as index 0";
    for (auto& u : used) EXPECT_LE(u.load(), 1);
    EXPECT_EQ(qkv::thread_index(), 0) << "outside a call";
  }
}

TEST(Parallel, NestedCallsRunOnTheCallingThread) {
  std::atomic<int> wrong{0};
  std::atomic<std::int64_t> total{0};
  qkv::parallel_for(8, 2, [&](std::int64_t) {
    const std::thread::id me = std::this_thread::get_id();
    qkv::parallel_for(100, 4, [&](std::int64_t i) {
      if (std::this_thread::get_id() != me || qkv::thread_index() != 0) wrong.fetch_add(1);
      total.fetch_add(i);
    });
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(total.load(), 8 * 4950);
}

TEST(Parallel, ExceptionReachesTheCallerAndThePoolStillWorks) {
  for (int round = 0; round < qkv::testing::tsan_rounds(20); ++round) {
    EXPECT_THROW(qkv::parallel_for(1000, 2,
                                   [&](std::int64_t i) {
                                     if (i == 37 + round) throw std::runtime_error("item failed");
                                   }),
                 std::runtime_error);
    EXPECT_EQ(parallel_sum(5000, 2), std::int64_t{5000} * 4999 / 2);
  }
}

TEST(Parallel, ScopedThreadsSetsMaxThreadsForThisThreadOnly) {
  const int outer = qkv::max_threads();
  {
    const qkv::ScopedThreads s(7);
    EXPECT_EQ(qkv::max_threads(), 7);
    int other = 0;
    std::thread([&] { other = qkv::max_threads(); }).join();
    EXPECT_EQ(other, outer);
  }
  EXPECT_EQ(qkv::max_threads(), outer);
}

TEST(Parallel, ConcurrentCallersEachGetTheirOwnPool) {
  constexpr int kCallers = 6, kRounds = qkv::testing::tsan_rounds(50);
  std::vector<std::int64_t> got(kCallers);
  std::vector<std::thread> th;
  for (int c = 0; c < kCallers; ++c)
    th.emplace_back([&, c] {
      std::int64_t s = 0;
      for (int r = 0; r < kRounds; ++r) s += parallel_sum(2000 + c, 2);
      got[static_cast<std::size_t>(c)] = s;
    });
  for (auto& t : th) t.join();
  for (int c = 0; c < kCallers; ++c) {
    const std::int64_t n = 2000 + c;
    EXPECT_EQ(got[static_cast<std::size_t>(c)], kRounds * n * (n - 1) / 2) << "caller " << c;
  }
}

// The parent's pool has workers; a forked child has only the thread that forked. The child must
// compute with a pool of its own instead of waiting for workers that do not exist in it. An alarm
// turns a hang into a failure (SIGALRM kills the child).
TEST(Parallel, ForkedChildComputes) {
  ASSERT_EQ(parallel_sum(10000, 2), std::int64_t{10000} * 9999 / 2);
  for (int k = 0; k < 3; ++k) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(20);
      bool ok = parallel_sum(10000, 2) == std::int64_t{10000} * 9999 / 2;
      // And the child's own child (the child has a pool again by now).
      const pid_t grandchild = fork();
      if (grandchild == 0) {
        alarm(20);
        _exit(parallel_sum(777, 3) == std::int64_t{777} * 776 / 2 ? 0 : 1);
      }
      int st = 0;
      ok = ok && grandchild > 0 && waitpid(grandchild, &st, 0) == grandchild && WIFEXITED(st) && WEXITSTATUS(st) == 0;
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status)) << "the child was killed (signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                   << "; 14 = SIGALRM: it hung)";
    EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
    EXPECT_EQ(parallel_sum(10000, 2), std::int64_t{10000} * 9999 / 2) << "the parent's pool after the fork";
  }
}

}  // namespace
