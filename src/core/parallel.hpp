// Internal: the one parallel loop of qkv (OpenMP underneath).
#pragma once

#include <cstdint>

#include <omp.h>

namespace qkv {

// Runs fn(i) for every i in [0, n) on up to `threads` threads, handing out indices one at a
// time (dynamic schedule), so uneven work (causal rows, ragged batches) balances itself.
// fn must not throw.
template <class F>
void parallel_for(std::int64_t n, int threads, F&& fn) {
  if (threads <= 1 || n <= 1) {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (std::int64_t i = 0; i < n; ++i) fn(i);
}

// Index of the calling thread inside parallel_for, in [0, threads).
inline int thread_index() { return omp_get_thread_num(); }

}  // namespace qkv
