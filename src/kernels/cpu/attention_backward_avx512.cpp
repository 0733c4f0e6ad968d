// The fast attention backward compiled for avx512 (flags in src/kernels/CMakeLists.txt).
#define QKV_ISA_NS avx512
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

void backward_task_avx512(const Context& cx, float* arena, std::int64_t task) {
  avx512::backward_task(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
