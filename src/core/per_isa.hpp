// Internal: one loop compiled for each instruction set, chosen at run time.
//
// The library is built for the baseline x86-64, so a plain loop runs on SSE2 registers. A body
// written once as an always_inline function (its `omp simd` loops vectorise for whatever target
// it is inlined into) becomes three functions with QKV_PER_ISA(NAME, BODY, (params), (args)):
//   NAME_base  (baseline)   NAME_avx2  (AVX2 + FMA)   NAME_avx512  (AVX-512 F/DQ/VL/BW + FMA)
// The caller picks one by qkv::active_isa() (the CPU's best, overridable by QKV_ISA), e.g.
//   isa >= Isa::avx512 ? NAME_avx512 : isa >= Isa::avx2 ? NAME_avx2 : NAME_base
#pragma once

#define QKV_PER_ISA(NAME, BODY, PARAMS, ARGS)                                 \
  void NAME##_base PARAMS { BODY ARGS; }                                      \
  [[gnu::target("avx2,fma")]] void NAME##_avx2 PARAMS { BODY ARGS; }          \
  [[gnu::target("avx512f,avx512dq,avx512vl,avx512bw,fma")]] void NAME##_avx512 PARAMS { BODY ARGS; }
