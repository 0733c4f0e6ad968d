// Process-wide settings: thread count and instruction set (chosen once, overridable).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "qkv/runtime.hpp"
#include "qkv/types.hpp"

namespace qkv {
namespace {

// QKV_NUM_THREADS, when set and not empty, must be a whole number ≥ 1 (a typo is an error, not
// silently all cores).
int default_threads() {
  if (const char* s = std::getenv("QKV_NUM_THREADS"); s && *s) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(s, &end, 10);
    if (*end != '\0' || errno != 0 || n < 1 || n > 1 << 16)
      fail("qkv::num_threads", std::string("QKV_NUM_THREADS: must be a whole number in [1, 65536], got '") + s + "'");
    return static_cast<int>(n);
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Isa detect_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    // The levels are nested: avx512_bf16 also requires AVX512-VNNI, which every CPU with
    // AVX512-BF16 has (Cooper Lake, Sapphire Rapids, Zen 4). __builtin_cpu_supports("avx512bf16")
    // is not known to GCC 12; read CPUID leaf 7 sub-leaf 1 EAX bit 5 directly.
    if (!__builtin_cpu_supports("avx512vnni")) return Isa::avx512;
    unsigned a = 7, b = 0, c = 1, d = 0;
    __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
    return (a & (1u << 5)) ? Isa::avx512_bf16 : Isa::avx512_vnni;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  return Isa::scalar;
}

Isa env_or_cpu_isa() {
  const Isa cpu = detect_isa();
  if (const char* s = std::getenv("QKV_ISA"); s && *s) {
    std::string names;
    for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_vnni, Isa::avx512_bf16}) {
      if (std::strcmp(s, isa_name(i)) == 0) return std::min(i, cpu);
      names += std::string(names.empty() ? "" : ", ") + isa_name(i);
    }
    fail("qkv::active_isa", std::string("QKV_ISA: must be one of ") + names + ", got '" + s + "'");
  }
  return cpu;
}

std::atomic<int> g_threads{0};  // 0 = not yet read from the environment
std::atomic<int> g_isa{-1};     // -1 = not yet chosen

}  // namespace

void set_num_threads(int n) {
  if (n < 1) fail("qkv::set_num_threads", "n: must be ≥ 1, got " + std::to_string(n));
  g_threads = n;
}

int num_threads() {
  int n = g_threads.load();
  if (n == 0) {
    n = default_threads();
    g_threads = n;
  }
  return n;
}

Isa cpu_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

Isa active_isa() {
  int i = g_isa.load();
  if (i < 0) {
    i = static_cast<int>(env_or_cpu_isa());
    g_isa = i;
  }
  return static_cast<Isa>(i);
}

void set_isa(Isa isa) {
  if (isa > cpu_isa())
    fail("qkv::set_isa", std::string("isa: this CPU supports up to ") + isa_name(cpu_isa()) +
                             ", asked for " + isa_name(isa));
  g_isa = static_cast<int>(isa);
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    case Isa::avx512_vnni: return "avx512_vnni";
    case Isa::avx512_bf16: return "avx512_bf16";
  }
  return "?";
}

}  // namespace qkv
