// The fast attention backward compiled for scalar (flags in src/kernels/CMakeLists.txt).
#define QKV_ISA_NS scalar
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

void backward_task_scalar(const Context& cx, float* arena, std::int64_t task) {
  scalar::backward_task(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
