// Prefill and decode speed of qkv's model at batch 1 (BENCHMARKS.md, "Model"):
//
//   bench_model --model M [--config C] | --gpt2-small      [--prompt P] [--decode N] [--repeats R] [--batch B]
//               [--weights f32|bf16]   (bf16: ModelOptions::weights, projections read as bf16)
//               [--gemm-inputs f32|bf16]  (bf16: ModelOptions::gemm_inputs, prefill GEMMs in bf16;
//                                          needs --weights bf16)
//
// prefill: one forward over P prompt tokens into an empty cache (tokens/s = P / time);
// decode:  N more tokens, each one query against the cache (tokens/s = N / time).
// --batch B (> 1): B sequences, each prefilled with its own P tokens, then N steps of forward_batch
// (one token for each sequence a step): decode tokens/s = B·N / time, CPU time per token = per step / B.
// Prints the median of R repeats as one JSON line, which bench/model_peer.py reads (with every
// repeat's figures in prefill_all and decode_all, for medians over several runs); with it the
// process CPU time (CLOCK_PROCESS_CPUTIME_ID, all threads) of one prefill and of one decoded token,
// medians too: on a shared machine that moves far less with the load than the wall time does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "qkv/model.hpp"

namespace {
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  std::string model, config;
  bool gpt2 = false;
  std::int64_t prompt = 128, decode = 128;
  int repeats = 5;
  std::int64_t batch = 1;
  qkv::ModelOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_model: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--config") config = next();
    else if (a == "--gpt2-small") gpt2 = true;
    else if (a == "--prompt") prompt = std::stoll(next());
    else if (a == "--decode") decode = std::stoll(next());
    else if (a == "--repeats") repeats = std::stoi(next());
    else if (a == "--batch") batch = std::max<std::int64_t>(1, std::stoll(next()));
    else if (a == "--weights") {
      const std::string w = next();
      if (w != "f32" && w != "bf16") {
        std::fprintf(stderr, "bench_model: --weights must be f32 or bf16, got %s\n", w.c_str());
        return 2;
      }
      options.weights = w == "bf16" ? qkv::DType::bf16 : qkv::DType::f32;
    } else if (a == "--gemm-inputs") {
      const std::string g = next();
      if (g != "f32" && g != "bf16") {
        std::fprintf(stderr, "bench_model: --gemm-inputs must be f32 or bf16, got %s\n", g.c_str());
        return 2;
      }
      options.gemm_inputs = g == "bf16" ? qkv::DType::bf16 : qkv::DType::f32;
    }
    else {
      std::fprintf(stderr, "bench_model: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    qkv::Model m(gpt2 ? qkv::Weights::random(qkv::Config::gpt2_small(), 1) : qkv::load_weights(model, config),
               options);
    const auto& c = m.config();
    if (prompt + decode > c.seq_len) qkv::fail("bench_model", "--prompt + --decode exceed the context");
    // Sequence b reads the token list from offset b (different prompts, the same lengths).
    std::vector<int> tokens(static_cast<std::size_t>(prompt + decode + batch));
    for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 7919 + 1) % static_cast<std::size_t>(c.vocab_size));
    std::vector<float> logits(static_cast<std::size_t>(batch * c.vocab_size));
    std::vector<double> pre, dec, pre_cpu, dec_cpu;
    using clock = std::chrono::steady_clock;
    for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up (page faults, JIT, threads)
      std::vector<qkv::KvCache> caches;
      std::vector<qkv::KvCache*> ptrs;
      for (std::int64_t b = 0; b < batch; ++b) caches.push_back(m.new_cache(prompt + decode));
      for (qkv::KvCache& k : caches) ptrs.push_back(&k);
      const double c0 = cpu_seconds();
      auto t0 = clock::now();
      for (std::int64_t b = 0; b < batch; ++b)
        m.forward(std::span<const int>(tokens.data() + b, static_cast<std::size_t>(prompt)), caches[static_cast<std::size_t>(b)],
                  logits.data());
      auto t1 = clock::now();
      const double c1 = cpu_seconds();
      for (std::int64_t s = prompt; s < prompt + decode; ++s) {
        if (batch == 1) m.forward(std::span<const int>(tokens.data() + s, 1), caches[0], logits.data());
        else m.forward_batch(std::span<const int>(tokens.data() + s, static_cast<std::size_t>(batch)), ptrs, logits.data());
      }
      auto t2 = clock::now();
      const double c2 = cpu_seconds();
      if (r == 0) continue;
      pre.push_back(static_cast<double>(batch * prompt) / std::chrono::duration<double>(t1 - t0).count());
      dec.push_back(static_cast<double>(batch * decode) / std::chrono::duration<double>(t2 - t1).count());
      pre_cpu.push_back(1e3 * (c1 - c0) / static_cast<double>(batch));
      dec_cpu.push_back(decode > 0 ? 1e3 * (c2 - c1) / static_cast<double>(batch * decode) : 0.0);
    }
    auto list = [](const std::vector<double>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "]";
    };
    std::printf("{\"prefill_tok_s\": %.2f, \"decode_tok_s\": %.2f, \"prefill_cpu_ms\": %.2f, "
                "\"decode_cpu_ms_per_token\": %.3f, \"params\": %lld, \"prefill_all\": %s, \"decode_all\": %s}\n",
                median(pre), median(dec), median(pre_cpu), median(dec_cpu),
                static_cast<long long>(m.weights().num_params()), list(pre).c_str(), list(dec).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
