// Internal: a barrier for all the threads of the current OpenMP team, for regions that meet often.
//
// Decoding one token meets ~60 times (every 20–200 µs of work). libgomp's barriers and region
// starts under OMP_WAIT_POLICY=PASSIVE (the setting the benchmarks use for every engine) put a
// waiting thread to sleep at once, and each futex wake-up costs 10–50 µs on this VM: a fifth of a
// bf16 decoding step. Here a waiting thread spins on an atomic generation counter for kSpin pause
// rounds (≈ 30 µs on Zen 4, longer than the imbalance of two halves of a GEMV), then sleeps in
// std::atomic::wait (futex), so a thread whose partner was preempted on a busy machine gives its
// core back instead of spinning for a whole time slice.
//
// The team is counted when a thread arrives (omp_get_num_threads()), not fixed in advance: a region
// opened inside the caller's own parallel region is inactive and runs on one thread whatever
// num_threads asked for, and a barrier waiting for the requested count would wait forever.
#pragma once

#include <omp.h>

#include <atomic>

namespace qkv {

class SpinBarrier {
 public:
  SpinBarrier() = default;
  SpinBarrier(const SpinBarrier&) = delete;
  SpinBarrier& operator=(const SpinBarrier&) = delete;

  // Returns once every thread of the team has called it; everything a thread wrote before its
  // call is visible to every thread after theirs (acquire / release on the generation counter).
  void wait() {
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == omp_get_num_threads()) {
      count_.store(0, std::memory_order_relaxed);  // no one arrives again before gen_ moves
      gen_.store(gen + 1, std::memory_order_release);
      gen_.notify_all();  // a system call only when a thread sleeps (libstdc++ counts waiters)
      return;
    }
    for (int i = 0; i < kSpin; ++i) {
      if (gen_.load(std::memory_order_acquire) != gen) return;
      pause();
    }
    while (gen_.load(std::memory_order_acquire) == gen) gen_.wait(gen, std::memory_order_acquire);
  }

 private:
  static constexpr int kSpin = 2000;  // × PAUSE (≈ 60 cycles each on Zen 4)
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  alignas(64) std::atomic<int> count_{0};
  alignas(64) std::atomic<unsigned> gen_{0};
};

}  // namespace qkv
