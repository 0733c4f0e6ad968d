// qkv/runtime.hpp — process-wide settings of the kernels: threads and instruction set.
// Included by qkv/attention.hpp; code that needs only these (the dense layers, the optimiser)
// includes this header alone.
#pragma once

#include <cstdint>

namespace qkv {

// Instruction sets of the CPU kernels, in increasing order of capability (avx512: F, BW, VL, DQ;
// avx512_vnni: also AVX512-VNNI, which only the int8 KV-cache decode uses (Cascade Lake, Ice
// Lake); avx512_bf16: also AVX512-BF16, for the bf16 kernels, on top of avx512_vnni).
enum class Isa : std::uint8_t { scalar, avx2, avx512, avx512_vnni, avx512_bf16 };

// Threads used by the kernels when a call does not name its own (AttentionOptions::num_threads
// = 0, ModelOptions::num_threads = 0). The default is the environment variable QKV_NUM_THREADS if
// set, else the number of cores.
void set_num_threads(int n);
int num_threads();

// Instruction sets. cpu_isa(): the best the CPU supports. active_isa(): the one the kernels
// use — cpu_isa() unless the environment variable QKV_ISA (scalar | avx2 | avx512 |
// avx512_vnni | avx512_bf16) or set_isa() chose a lower one. set_isa() throws if the CPU lacks `isa`.
Isa cpu_isa();
Isa active_isa();
void set_isa(Isa isa);
const char* isa_name(Isa isa);

}  // namespace qkv
