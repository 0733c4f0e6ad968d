// The fast attention backward compiled for avx512 (flags in CMakeLists.txt beside this file).
#include "kernels/cpu/simd_avx512.hpp"  // first: see simd_avx512.hpp on GCC 12
#include "kernels/cpu/attention_backward_impl.hpp"

namespace qkv::kernels::bwd {

// Register tile: 6 rows × 4 groups of 16 columns = 24 of the 32 zmm registers.
void backward_task_avx512(const Context& cx, float* arena, std::int64_t task) {
  backward_task<cpu::SimdAvx512, OpsF32<cpu::SimdAvx512, 6, 4>>(cx, arena, task);
}

}  // namespace qkv::kernels::bwd
