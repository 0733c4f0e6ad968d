// ForkGate (fork_gate.hpp). The two sides check each other in opposite orders with sequentially
// consistent atomics (a thread entering adds itself, then reads the flag; a fork sets the flag,
// then reads the count), so at least one of them sees the other: either the fork waits for the
// thread, or the thread steps back and waits for the fork.
#include "core/fork_gate.hpp"

#include <chrono>
#include <thread>

namespace qkv {
namespace {

// A fork waits for calls, a held-back call for a fork: both rare and short, neither worth a futex.
void nap() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

}  // namespace

void ForkGate::enter() {
  for (;;) {
    inside_.fetch_add(1);
    if (!forking_.load()) return;
    inside_.fetch_sub(1);  // a fork is waiting: step back until it is done
    while (forking_.load()) nap();
  }
}

void ForkGate::leave() { inside_.fetch_sub(1); }

void ForkGate::before_fork() {
  fork_.lock();
  forking_.store(true);
  while (inside_.load() != 0) nap();
}

void ForkGate::after_fork() {
  forking_.store(false);
  fork_.unlock();
}

}  // namespace qkv
