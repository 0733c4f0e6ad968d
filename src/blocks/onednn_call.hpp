// Internal: fork() safety of qkv's calls into oneDNN (issue #16, item 2).
//
// oneDNN keeps process-wide state behind its own mutexes: its sgemm takes a static mutex on every
// call (gemm_info_t's kernel tables, oneDNN 2.6), and building a primitive goes through its
// primitive cache. A child forked while another thread held one of them inherits it locked, with
// no thread left to unlock it, and its first GEMM waits forever.
//
// So every call qkv makes into oneDNN, building a primitive or running one (linear.cpp's sgemm,
// gemm_bf16.cpp's matmuls and reorders), is made inside a OneDnnCall: a pthread_atfork handler
// stops new calls from starting, waits for the running ones to return (at most one GEMM's time),
// and lets calls start again after fork() in both processes. Calls never wait for one another
// otherwise: entering and leaving cost one atomic add each. Nested OneDnnCalls on one thread count
// once. gemm_bf16.cpp's primitive-cache mutex is taken only inside one, so it is never held at a
// fork either.
#pragma once

namespace qkv::blocks {

class OneDnnCall {
 public:
  OneDnnCall();
  ~OneDnnCall();
  OneDnnCall(const OneDnnCall&) = delete;
  OneDnnCall& operator=(const OneDnnCall&) = delete;
};

}  // namespace qkv::blocks
