// The fast attention backward compiled for scalar (flags in CMakeLists.txt beside this file).
#include "kernels/cpu/simd_scalar.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

// Register tile: 4 rows × 16 columns (the compiler keeps what it can in SSE registers).
void backward_task_scalar(const Context& cx, float* arena, std::int64_t task) {
  backward_task<cpu::SimdScalar, OpsF32<cpu::SimdScalar, 4, 1>>(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
