// The instruction-set levels (qkv/runtime.hpp): cpu_isa() against the flags the Linux kernel
// reports in /proc/cpuinfo (a source independent of the CPUID reads in runtime.cpp), and set_isa()
// taking every level up to it, refusing the ones above with the function and both names.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "qkv/runtime.hpp"

namespace {

using qkv::Isa;

constexpr Isa kAll[] = {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_vnni, Isa::avx512_bf16};

// The flags of the first processor in /proc/cpuinfo (empty when there is none to read).
std::set<std::string> cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> r;
      for (std::string w; words >> w;) r.insert(w);
      return r;
    }
  return {};
}

TEST(Runtime, CpuIsaFollowsTheCpuFlags) {
  const std::set<std::string> f = cpuinfo_flags();
  if (f.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const auto has = [&](const char* x) { return f.count(x) > 0; };
  // The levels nest: each takes the one below it plus its own flags (avx512_bf16 also needs VNNI).
  Isa want = Isa::scalar;
  if (has("avx2") && has("fma")) want = Isa::avx2;
  if (want == Isa::avx2 && has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")) want = Isa::avx512;
  if (want == Isa::avx512 && has("avx512_vnni")) want = Isa::avx512_vnni;
  if (want == Isa::avx512_vnni && has("avx512_bf16")) want = Isa::avx512_bf16;
  std::printf("cpu_isa %s, /proc/cpuinfo says %s\n", qkv::isa_name(qkv::cpu_isa()), qkv::isa_name(want));
  EXPECT_EQ(qkv::cpu_isa(), want);
}

TEST(Runtime, SetIsaTakesEveryLevelUpToTheCpus) {
  const Isa saved = qkv::active_isa();
  std::set<std::string> names;
  for (Isa i : kAll) {
    names.insert(qkv::isa_name(i));
    if (i <= qkv::cpu_isa()) {
      qkv::set_isa(i);
      EXPECT_EQ(qkv::active_isa(), i) << qkv::isa_name(i);
      continue;
    }
    try {
      qkv::set_isa(i);
      ADD_FAILURE() << "no error for " << qkv::isa_name(i);
    } catch (const std::invalid_argument& e) {
      const std::string want = std::string("[qkv::set_isa] isa: this CPU supports up to ") +
                               qkv::isa_name(qkv::cpu_isa()) + ", asked for " + qkv::isa_name(i);
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(names.size(), std::size(kAll));  // one name per level
  EXPECT_EQ(std::string(qkv::isa_name(Isa::avx512_vnni)), "avx512_vnni");
  qkv::set_isa(saved);
}

}  // namespace
