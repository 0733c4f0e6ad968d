// gemm_bf16 (dense.hpp): bf16 × bf16 → f32 GEMM on oneDNN's matmul primitive.
//   x [M, in] f32 → xb [M, in] bf16 (rounded here)   W [out, in] bf16 (read as the [in, out]
//   matrix Wᵀ in oneDNN's "ba" layout, nothing copied)   b [1, out] f32   y [M, out] f32
// beta = 1 is the primitive's sum post-op (y += xb·Wᵀ + b). Primitives are compiled (JIT) once
// per shape and kept: a model uses a handful of shapes per prompt length.
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "blocks/dense.hpp"

namespace qkv::blocks {
namespace {

using i64 = std::int64_t;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

struct Cached {
  std::tuple<i64, i64, i64, bool, bool> key;  // M, in, out, bias, sum
  dnnl::matmul prim;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The primitive for one shape, compiled on first use. Kept in a short list (a model needs
// ≈ 4 shapes per prompt length); past 64 entries the list starts again.
dnnl::matmul primitive(i64 M, i64 in, i64 out, bool bias, bool sum) {
  static std::mutex mu;
  static std::vector<Cached> cache;
  const auto key = std::make_tuple(M, in, out, bias, sum);
  const std::lock_guard<std::mutex> lock(mu);
  for (const Cached& c : cache)
    if (c.key == key) return c.prim;
  const dnnl::memory::desc xd({M, in}, dt::bf16, tag::ab), wd({in, out}, dt::bf16, tag::ba),
      bd({1, out}, dt::f32, tag::ab), yd({M, out}, dt::f32, tag::ab);
  dnnl::primitive_attr attr;
  if (sum) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  const auto desc = bias ? dnnl::matmul::desc(xd, wd, bd, yd) : dnnl::matmul::desc(xd, wd, yd);
  dnnl::matmul prim(dnnl::matmul::primitive_desc(desc, attr, engine()));
  if (cache.size() >= 64) cache.clear();
  cache.push_back({key, prim});
  return prim;
}

}  // namespace

void gemm_bf16(const float* x, const std::uint16_t* W, const float* b, float* y, i64 M, i64 in, i64 out, float beta,
               int threads, Isa isa) {
  const char* fn = "qkv::blocks::gemm_bf16";
  if (M < 1 || in < 1 || out < 1 || (beta != 0.0f && beta != 1.0f))
    fail(fn, "M, in, out, beta: need sizes ≥ 1 and beta ∈ {0, 1}, got M = " + std::to_string(M) + ", in = " +
                 std::to_string(in) + ", out = " + std::to_string(out) + ", beta = " + std::to_string(beta));
  thread_local std::vector<std::uint16_t> xb;  // x rounded to bf16 [M, in]
  xb.resize(static_cast<std::size_t>(M * in));
  f32_to_bf16(xb.data(), x, M * in, threads, isa);
  try {
    const dnnl::matmul prim = primitive(M, in, out, b != nullptr, beta != 0.0f);
    dnnl::engine& e = engine();
    dnnl::stream s(e);
    const dnnl::memory xm({{M, in}, dt::bf16, tag::ab}, e, xb.data());
    const dnnl::memory wm({{in, out}, dt::bf16, tag::ba}, e, const_cast<std::uint16_t*>(W));
    const dnnl::memory ym({{M, out}, dt::f32, tag::ab}, e, y);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
    if (b) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, out}, dt::f32, tag::ab}, e, const_cast<float*>(b)));
    prim.execute(s, args);
    s.wait();
  } catch (const dnnl::error& err) {
    fail(fn, std::string("oneDNN matmul failed: ") + err.what() + " (M = " + std::to_string(M) + ", in = " +
                 std::to_string(in) + ", out = " + std::to_string(out) + ")");
  }
}

}  // namespace qkv::blocks
