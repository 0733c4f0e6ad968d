// Internal: a region of code that fork() waits for (issue #16, item 2).
//
// Some work leaves state behind that a forked child cannot repair: a mutex held by a thread of the
// parent (the child has no such thread to unlock it), a cache or a model half updated. A ForkGate
// counts the threads inside its region; its owner calls before_fork() and after_fork() from
// pthread_atfork handlers: before fork() new threads are held back at the gate and the ones inside
// are waited for, after it (in both processes) threads pass again. Entering and leaving cost one
// atomic add each; threads never wait for one another otherwise.
//
// Not reentrant: a thread inside must not enter the same gate again (it would wait for a fork that
// waits for it). Handlers of several gates run in the order pthread_atfork gives (prepare handlers
// last registered first): a gate whose region may enter another gate's region must be registered
// after it, so that it is drained first.
#pragma once

#include <atomic>
#include <mutex>

namespace qkv {

class ForkGate {
 public:
  void enter();
  void leave();
  void before_fork();
  void after_fork();

  class Pass {  // enter() for a scope
   public:
    explicit Pass(ForkGate& g) : g_(g) { g_.enter(); }
    ~Pass() { g_.leave(); }
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;

   private:
    ForkGate& g_;
  };

 private:
  std::atomic<int> inside_{0};        // threads in the region now
  std::atomic<bool> forking_{false};  // a fork() waits for inside_ to reach 0
  std::mutex fork_;                   // one fork() at a time sets and clears forking_
};

}  // namespace qkv
