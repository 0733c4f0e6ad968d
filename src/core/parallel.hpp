// Internal: qkv's own thread pool and the parallel loops built on it (parallel.cpp).
//
// Why not OpenMP (which qkv's own loops used until issue #16; oneDNN's GEMMs still run on
// libgomp, see parallel.cpp for how a fork and nesting are handled for them):
//   - fork(): libgomp's thread pool does not survive it, and a child that opens a parallel region
//     after its parent did hangs forever (multiprocessing's default start method, DataLoader
//     workers). Here a forked child forgets its parent's workers and starts its own.
//   - waiting: libgomp reads its policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT) from the environment
//     once, when it loads, so neither the CLI nor the Python module can choose it; the default
//     spins for up to ~0.3 M rounds, and beside another busy process a spinning thread holds the
//     core its partner needs (`qkv train` 448k → 482 tok/s). Here a waiting thread spins for
//     kSpinPauses pause instructions (tens of µs) and then sleeps on a futex.
//   - ThreadSanitizer does not see libgomp's synchronisation; it sees std::atomic and futexes.
//
// The model: every thread that calls qkv owns a pool of workers (started at its first parallel
// call, grown when a call asks for more threads, joined when that thread exits), so callers in
// several threads never wait for one another. A parallel call from inside a parallel call (a
// worker, or the caller while it takes part) runs on the calling thread alone, with index 0.
//
// The call:
//   run_shared(threads, fn): fn(t) on the caller (t = 0) and on the workers that arrive while the
//     work lasts, each with its own t in [0, threads). fn takes its work from a shared counter, so
//     the call completes with any number of participants: a worker that is not scheduled (busy
//     machine) leaves its share to the others instead of holding them up. Work in stages (the
//     model's decoding step) counts each stage's finished units in a WaitWord and waits on it,
//     never on a thread.
// Exceptions: one thrown by fn is rethrown on the caller once every participant has returned
// (the first one, if several throw).
//
// The templates below only erase the callable's type: an ISA translation unit instantiates them
// with its own (internal-linkage) lambdas, and the shared code they call is out of line.
#pragma once

#include <atomic>
#include <cstdint>

namespace qkv {

// Pause instructions a waiting thread spins for before it sleeps (≈ 30–60 µs: longer than the
// imbalance of two halves of a GEMV, far shorter than a scheduler time slice).
inline constexpr int kSpinPauses = 2000;

// A 32-bit word threads wait on for a change: spin for kSpinPauses pause rounds, then sleep on a
// futex. Not std::atomic::wait: libstdc++'s yields the CPU (sched_yield) before it sleeps, and on a
// loaded machine a yielding thread waits behind every other runnable thread (measured: decode
// 2–4× slower at a load of 18 on 2 cores). Wakes are system calls only when a thread sleeps.
class WaitWord {
 public:
  std::uint32_t load() const { return word_.load(std::memory_order_acquire); }
  // Sets the word (release) and wakes every thread sleeping on it.
  void store(std::uint32_t v);
  // Adds d (acq_rel), wakes every sleeper, returns the previous value.
  std::uint32_t fetch_add(std::uint32_t d);
  // Returns the word's value once it differs from old (acquire).
  std::uint32_t wait_change(std::uint32_t old) const;

 private:
  void wake() const;
  std::atomic<std::uint32_t> word_{0};
  mutable std::atomic<int> sleepers_{0};
};

namespace detail {
using TaskFn = void (*)(void* ctx, int t);
void run_shared(int threads, TaskFn fn, void* ctx);
}  // namespace detail

template <class F>
void run_shared(int threads, F&& fn) {
  detail::run_shared(threads, [](void* c, int t) { (*static_cast<F*>(c))(t); }, &fn);
}

// Runs fn(i) for every i in [0, n) on up to `threads` threads, handing out indices one at a
// time (dynamic schedule), so uneven work (causal rows, ragged batches) balances itself.
template <class F>
void parallel_for(std::int64_t n, int threads, F&& fn) {
  std::atomic<std::int64_t> next{0};
  run_shared(n > 1 ? threads : 1, [&](int) {
    for (std::int64_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  });
}

// Index of the calling thread inside run_shared / parallel_for, in [0, threads); 0 outside them.
int thread_index();

// Threads a parallel call made by this thread uses when its caller does not say: the innermost
// ScopedThreads of this thread, else qkv::num_threads().
int max_threads();

// Sets max_threads() for the calling thread until the end of the scope (n ≥ 1), and the number of
// threads oneDNN's GEMMs use on this thread (omp_get_max_threads(), outside parallel calls).
class ScopedThreads {
 public:
  explicit ScopedThreads(int n);
  ~ScopedThreads();
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int saved_, saved_gomp_;
};

}  // namespace qkv
