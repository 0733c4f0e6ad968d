// Internal: a barrier for all the threads of the current run_team team (parallel.hpp), for
// regions that meet often.
//
// Decoding one token meets four times a layer (every 20–200 µs of work), and a futex wake-up costs
// 10–50 µs on this VM: a fifth of a bf16 decoding step if every meeting slept. Here a waiting
// thread spins on a generation counter (a WaitWord) for kSpinPauses pause rounds (longer than the
// imbalance of two halves of a GEMV), then sleeps on a futex, so a thread whose partner was
// preempted on a busy machine gives its core back instead of spinning for a whole time slice.
//
// The team is counted when a thread arrives (team_size()), not fixed in advance: a team opened
// inside another parallel call runs on one thread whatever it asked for, and a barrier waiting for
// the requested count would wait forever.
#pragma once

#include <atomic>

#include "core/parallel.hpp"

namespace qkv {

class SpinBarrier {
 public:
  SpinBarrier() = default;
  SpinBarrier(const SpinBarrier&) = delete;
  SpinBarrier& operator=(const SpinBarrier&) = delete;

  // Returns once every thread of the team has called it; everything a thread wrote before its
  // call is visible to every thread after theirs (acquire / release on the generation counter).
  void wait() {
    const std::uint32_t gen = gen_.load();
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == team_size()) {
      count_.store(0, std::memory_order_relaxed);  // no one arrives again before gen_ moves
      gen_.store(gen + 1);                         // a system call only when a thread sleeps
      return;
    }
    gen_.wait_change(gen);
  }

 private:
  alignas(64) std::atomic<int> count_{0};
  alignas(64) WaitWord gen_;
};

}  // namespace qkv
