// The machine's own fp32 FMA and bf16 dot-product peaks and memory bandwidth (see machine_peak.cpp).
#pragma once

namespace qkv_bench {

double fma_peak_gflops(int threads, bool avx512);  // best of 3, GFLOP/s
double bf16_dot_peak_gflops(int threads);          // vdpbf16ps, best of 3, GFLOP/s (AVX-512 BF16 only)
double read_bandwidth_gbs(int threads);           // best of 5 sweeps over 512 MiB, GB/s
double stream_triad_gbs(int threads);             // McCalpin's STREAM triad, best of 5, GB/s
double read_probe_gbs(int threads);               // best of 3 sweeps over a kept 512 MiB buffer, GB/s

}  // namespace qkv_bench
