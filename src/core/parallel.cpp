// The thread pool of parallel.hpp.
//
// One pool per calling thread, one job at a time. A job is published by bumping `epoch_`; the
// workers wake (spin, then futex) and claim the job's slots one by one from `claim_`, a single
// word holding (epoch, slots offered, slots claimed), so that a worker still reacting to an older
// job can never enter a newer one by mistake. The caller takes part as slot 0; when its part is
// done it closes the job (slots offered := slots claimed: no worker may enter after that, since
// fn's captured state is about to go away) and waits for `done_` to reach the claimed count.
#include "core/parallel.hpp"

#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "qkv/runtime.hpp"

namespace qkv {
namespace {

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_signal_fence(std::memory_order_seq_cst);
#endif
}

thread_local int t_index = 0;     // thread_index()
thread_local bool t_busy = false; // inside a parallel call: nested calls run on this thread alone
thread_local int t_max = 0;       // ScopedThreads; 0: qkv::num_threads()
// oneDNN (the GEMMs of blocks/linear.cpp) runs on libgomp's own threads, as many as this thread's
// omp_get_max_threads(). Inside a parallel call it must use one: the call's threads already
// share the cores (as OpenMP's inactive nested regions did when qkv ran on OpenMP). In a forked
// child the thread that forked keeps one for good: libgomp's team of that thread did not survive
// the fork, and a parallel region on it would wait forever for the missing threads.
thread_local bool t_gomp_lost = false;

// Sets this thread's OpenMP thread count (for oneDNN), at most 1 on a thread whose libgomp team
// was lost in a fork.
void set_gomp_threads(int n) { omp_set_num_threads(t_gomp_lost ? 1 : n); }

// Sets the calling thread's parallel context for a scope, restoring the previous one after.
// Inside a parallel call (busy) oneDNN gets one thread.
class Context {
 public:
  Context(int index, bool busy)
      : index_(t_index), busy_(t_busy), gomp_(busy && !t_busy ? omp_get_max_threads() : 0) {
    t_index = index, t_busy = busy;
    if (gomp_ > 1) set_gomp_threads(1);
  }
  ~Context() {
    t_index = index_, t_busy = busy_;
    if (gomp_ > 1) set_gomp_threads(gomp_);
  }
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

 private:
  int index_;
  bool busy_;
  int gomp_;  // this thread's OpenMP thread count to restore (0: unchanged)
};

// claim_ = epoch << 32 | offered << 16 | claimed (slots are worker threads, < 2^16).
constexpr std::uint64_t kSlotMask = 0xffff;
std::uint64_t offered(std::uint64_t w) { return (w >> 16) & kSlotMask; }
std::uint64_t claimed(std::uint64_t w) { return w & kSlotMask; }

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    epoch_.fetch_add(1);
    for (std::thread& w : workers_) w.join();
  }

  // fn(ctx, t) on the caller (t = 0) and up to threads − 1 workers.
  void run(int threads, detail::TaskFn fn, void* ctx) {
    const auto slots = static_cast<std::uint64_t>(threads - 1);
    const std::uint32_t e = epoch_.load() + 1;
    while (workers_.size() < slots) workers_.emplace_back(&Pool::work, this, e - 1);
    fn_ = fn, ctx_ = ctx;
    error_ = nullptr;
    failed_.store(false, std::memory_order_relaxed);
    done_.store(0);
    claim_.store(std::uint64_t{e} << 32 | slots << 16, std::memory_order_relaxed);
    epoch_.store(e);  // publishes everything above, wakes sleeping workers

    call(0);
    std::uint64_t w = claim_.load(std::memory_order_acquire);
    // Close: offered := claimed.
    while (!claim_.compare_exchange_weak(w, (w & ~(kSlotMask << 16)) | claimed(w) << 16, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
    }
    const auto need = static_cast<std::uint32_t>(claimed(w));
    for (std::uint32_t d = done_.load(); d != need;) d = done_.wait_change(d);
    if (failed_.load(std::memory_order_acquire)) std::rethrow_exception(error_);
  }

 private:
  void call(int t) {
    const Context cx(t, true);
    try {
      fn_(ctx_, t);
    } catch (...) {
      if (!failed_.exchange(true, std::memory_order_acq_rel)) error_ = std::current_exception();
    }
  }

  void work(std::uint32_t seen) {
    set_gomp_threads(1);  // oneDNN inside a worker: one thread (see t_gomp_lost)
    for (;;) {
      seen = epoch_.wait_change(seen);
      if (stop_.load(std::memory_order_relaxed)) return;
      std::uint64_t w = claim_.load(std::memory_order_acquire);
      bool mine = false;
      while ((w >> 32) == seen && claimed(w) < offered(w) && !mine)
        mine = claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel, std::memory_order_acquire);
      if (!mine) continue;  // an older job, or no slot left
      call(static_cast<int>(claimed(w)) + 1);
      done_.fetch_add(1);
    }
  }

  std::vector<std::thread> workers_;
  // The job: written by the caller before it bumps epoch_, read by a worker after its claim.
  detail::TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::exception_ptr error_;  // written by the first participant that sets failed_
  std::atomic<bool> failed_{false};
  std::atomic<bool> stop_{false};
  alignas(64) WaitWord epoch_;
  alignas(64) std::atomic<std::uint64_t> claim_{0};
  alignas(64) WaitWord done_;
};

thread_local std::unique_ptr<Pool> t_pool;

// In a forked child only the thread that forked exists: its pool's workers are gone (joining
// them would wait forever, destroying their joinable std::threads would terminate). The child
// forgets that pool, without destroying it, and starts a new one at its next parallel call.
// libgomp's team cannot be rebuilt that way: oneDNN runs on one thread on this thread from now on
// (PyTorch does the same in a forked child).
void forget_pool_in_child() {
  static_cast<void>(t_pool.release());
  t_gomp_lost = true;
  set_gomp_threads(1);
}

[[maybe_unused]] const int g_atfork = pthread_atfork(nullptr, nullptr, forget_pool_in_child);

void run(int threads, detail::TaskFn fn, void* ctx) {
  if (threads <= 1 || t_busy) {
    const Context cx(0, t_busy);
    fn(ctx, 0);
    return;
  }
  if (!t_pool) t_pool = std::make_unique<Pool>();
  t_pool->run(threads, fn, ctx);
}

}  // namespace

void WaitWord::wake() const {
  if (sleepers_.load(std::memory_order_seq_cst) > 0)
    syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word_), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void WaitWord::store(std::uint32_t v) {
  word_.store(v, std::memory_order_seq_cst);
  wake();
}

std::uint32_t WaitWord::fetch_add(std::uint32_t d) {
  const std::uint32_t old = word_.fetch_add(d, std::memory_order_seq_cst);
  wake();
  return old;
}

// A sleeper registers before it re-reads the word, and a writer reads the count after it writes
// (both sequentially consistent): either the sleeper sees the new value, or the writer sees the
// sleeper and wakes it; FUTEX_WAIT itself returns at once if the word no longer equals old.
std::uint32_t WaitWord::wait_change(std::uint32_t old) const {
  for (int i = 0; i < kSpinPauses; ++i) {
    const std::uint32_t v = word_.load(std::memory_order_acquire);
    if (v != old) return v;
    pause();
  }
  for (;;) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    std::uint32_t v = word_.load(std::memory_order_seq_cst);
    if (v == old)
      syscall(SYS_futex, reinterpret_cast<const std::uint32_t*>(&word_), FUTEX_WAIT_PRIVATE, old, nullptr, nullptr, 0);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    v = word_.load(std::memory_order_acquire);
    if (v != old) return v;
  }
}

void detail::run_shared(int threads, TaskFn fn, void* ctx) { run(threads, fn, ctx); }

int thread_index() { return t_index; }

int max_threads() { return t_max > 0 ? t_max : num_threads(); }

ScopedThreads::ScopedThreads(int n) : saved_(t_max), saved_gomp_(omp_get_max_threads()) {
  t_max = n;
  if (!t_busy) set_gomp_threads(n);
}

ScopedThreads::~ScopedThreads() {
  t_max = saved_;
  if (!t_busy) set_gomp_threads(saved_gomp_);
}

}  // namespace qkv
