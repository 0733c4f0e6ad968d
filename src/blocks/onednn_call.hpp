// Internal: fork() safety of qkv's calls into oneDNN (issue #16, item 2).
//
// oneDNN keeps process-wide state behind its own mutexes: its sgemm takes a static mutex on every
// call (gemm_info_t's kernel tables, oneDNN 2.6), and building a primitive goes through its
// primitive cache. A child forked while another thread held one of them inherits it locked, with
// no thread left to unlock it, and its first GEMM waits forever.
//
// So every call qkv makes into oneDNN, building a primitive or running one (linear.cpp's sgemm,
// gemm_bf16.cpp's matmuls and reorders), is made inside a OneDnnCall, a region of a ForkGate
// (core/fork_gate.hpp): before fork() new calls are held back and the running ones finish (at most
// one GEMM's time), after it calls go on in both processes. Nested OneDnnCalls on one thread count
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
