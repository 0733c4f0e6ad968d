// OneDnnCall (onednn_call.hpp): a count of the threads inside oneDNN, and a flag that holds new
// ones back while a fork() waits for the count to reach zero.
//
// The two sides check each other in opposite orders with sequentially consistent atomics (a thread
// entering adds itself, then reads the flag; fork sets the flag, then reads the count), so at
// least one of them sees the other: either fork waits for the thread, or the thread steps back
// and waits for the fork.
#include "blocks/onednn_call.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace qkv::blocks {
namespace {

std::atomic<int> g_inside{0};        // threads inside oneDNN now
std::atomic<bool> g_forking{false};  // a fork() is waiting for g_inside to reach 0
std::mutex g_fork;                   // one fork() at a time sets and clears g_forking
thread_local int t_depth = 0;        // this thread's nested OneDnnCalls

// A fork waits for GEMMs, a held-back call for a fork: both are short, neither worth a futex.
void nap() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

void before_fork() {
  g_fork.lock();
  g_forking.store(true);
  while (g_inside.load() != 0) nap();
}

void after_fork() {
  g_forking.store(false);
  g_fork.unlock();
}

[[maybe_unused]] const int g_atfork = pthread_atfork(before_fork, after_fork, after_fork);

}  // namespace

OneDnnCall::OneDnnCall() {
  if (t_depth++ > 0) return;
  for (;;) {
    g_inside.fetch_add(1);
    if (!g_forking.load()) return;
    g_inside.fetch_sub(1);  // a fork is waiting: step back until it is done
    while (g_forking.load()) nap();
  }
}

OneDnnCall::~OneDnnCall() {
  if (--t_depth == 0) g_inside.fetch_sub(1);
}

}  // namespace qkv::blocks
