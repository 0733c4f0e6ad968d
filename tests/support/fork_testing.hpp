// fork() while another thread is busy inside qkv: the child must not inherit a lock that a thread
// it does not have was holding (issue #16, item 2). A second thread runs `busy` in a loop; this
// thread forks `forks` times at staggered moments, and each child runs `child` once under
// alarm(kChildSeconds) and exits 0 if it returned true. A child that hangs is killed by SIGALRM,
// so a regression fails the test instead of hanging it.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace qkv::testing {

// A child does one small call; 10 s is ~1000× what it needs even on a loaded machine.
inline constexpr unsigned kChildSeconds = 10;

// "" when every child exited 0, else what went wrong with the first child that did not.
inline std::string fork_while_busy(const std::function<void(long)>& busy, const std::function<bool()>& child,
                                   int forks) {
  std::atomic<bool> stop{false};
  std::atomic<long> rounds{0};
  std::thread t([&] {
    for (long k = 0; !stop.load(std::memory_order_relaxed); ++k) {
      busy(k);
      rounds.store(k + 1, std::memory_order_relaxed);
    }
  });
  while (rounds.load(std::memory_order_relaxed) < 2) std::this_thread::yield();  // the loop is under way
  std::string failure;
  for (int f = 0; f < forks && failure.empty(); ++f) {
    // Staggered: 0 … 1.9 ms after the previous child, so forks land at every phase of `busy`.
    std::this_thread::sleep_for(std::chrono::microseconds(100 * (f % 20)));
    const pid_t pid = fork();
    if (pid < 0) {
      failure = "fork failed";
      break;
    }
    if (pid == 0) {
      alarm(kChildSeconds);
      _exit(child() ? 0 : 1);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid)
      failure = "waitpid failed";
    else if (WIFSIGNALED(st))
      failure = "child " + std::to_string(f) + " was killed by signal " + std::to_string(WTERMSIG(st)) +
                (WTERMSIG(st) == SIGALRM ? " (SIGALRM: it hung)" : "");
    else if (WEXITSTATUS(st) != 0)
      failure = "child " + std::to_string(f) + " exited " + std::to_string(WEXITSTATUS(st)) + " (a wrong result)";
  }
  stop.store(true);
  t.join();
  return failure;
}

}  // namespace qkv::testing
