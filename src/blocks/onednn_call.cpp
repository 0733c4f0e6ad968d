// OneDnnCall (onednn_call.hpp): one ForkGate around every call into oneDNN, registered with
// pthread_atfork when the library is loaded; nested calls on one thread pass it once.
#include "blocks/onednn_call.hpp"

#include <pthread.h>

#include "core/fork_gate.hpp"

namespace qkv::blocks {
namespace {

ForkGate g_gate;
thread_local int t_depth = 0;  // this thread's nested OneDnnCalls

void before_fork() { g_gate.before_fork(); }
void after_fork() { g_gate.after_fork(); }
[[maybe_unused]] const int g_atfork = pthread_atfork(before_fork, after_fork, after_fork);

}  // namespace

OneDnnCall::OneDnnCall() {
  if (t_depth++ == 0) g_gate.enter();
}

OneDnnCall::~OneDnnCall() {
  if (--t_depth == 0) g_gate.leave();
}

}  // namespace qkv::blocks
