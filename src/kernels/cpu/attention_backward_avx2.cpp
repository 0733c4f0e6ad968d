// The fast attention backward compiled for avx2 (flags in CMakeLists.txt beside this file).
#include "kernels/cpu/simd_avx2.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

// Register tile: 6 rows × 16 columns = 12 of the 16 ymm registers.
void backward_task_avx2(const Context& cx, float* arena, std::int64_t task) {
  backward_task<cpu::SimdAvx2, OpsF32<cpu::SimdAvx2, 6, 1>>(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
