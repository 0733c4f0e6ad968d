// The fast attention backward compiled for avx2 (flags in src/kernels/CMakeLists.txt).
#define QKV_ISA_NS avx2
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

void backward_task_avx2(const Context& cx, float* arena, std::int64_t task) {
  avx2::backward_task(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
