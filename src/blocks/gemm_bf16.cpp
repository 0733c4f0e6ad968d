// gemm_bf16 and gemm_bf16_in (dense.hpp): bf16 × bf16 GEMM on oneDNN's matmul primitive.
//   xb [M, in] bf16 (gemm_bf16 rounds its f32 x into a per-thread copy first)
//   W [out, in] bf16 (read as the [in, out] matrix Wᵀ in oneDNN's "ba" layout, nothing copied),
//     or its PackedBf16 copy in the blocked layout the primitive asks for
//   b [1, out] f32   y [M, out] f32, or bf16 when the caller asks for it
// The epilogue runs inside the primitive while each tile of y is still in registers:
//   bias → (sum: y += …, beta = 1) → eltwise (GELU, tanh or erf form) → rounding to bf16 (bf16 y).
// Primitives are compiled (JIT) once per shape and epilogue and kept: a model uses a handful of
// shapes per prompt length.
// Threads and fork(): every function below that reaches oneDNN does so inside a OneDnnCall
// (onednn_call.hpp), so a fork() never happens while this file's primitive list, its mutex, or
// oneDNN's own caches are being changed by another thread.
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include "blocks/dense.hpp"
#include "blocks/onednn_call.hpp"

namespace qkv::blocks {
namespace {

using i64 = std::int64_t;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// M, in, out, bias, sum, act, bf16 y, packed W
using Key = std::tuple<i64, i64, i64, bool, bool, GemmAct, bool, bool>;

struct Cached {
  Key key;
  dnnl::matmul prim;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Wᵀ [in, out] as oneDNN sees W [out, in]: plain ("ba") or the layout the matmul chooses ("any").
dnnl::memory::desc weights_desc(i64 in, i64 out, bool any) {
  return dnnl::memory::desc({in, out}, dt::bf16, any ? tag::any : tag::ba);
}

// The layout a matmul of 512 rows asks for Wᵀ [in, out] (PackedBf16's layout).
dnnl::memory::desc packed_desc(i64 in, i64 out) {
  const dnnl::matmul::desc d(dnnl::memory::desc({512, in}, dt::bf16, tag::ab), weights_desc(in, out, true),
                             dnnl::memory::desc({512, out}, dt::f32, tag::ab));
  return dnnl::matmul::primitive_desc(d, engine()).weights_desc();
}

// The primitive for one shape and epilogue, compiled on first use, or an empty one where a packed
// W's layout is not the one this primitive asks for (the caller then takes the plain W). Kept in
// a short list (a model needs ≈ 5 entries per prompt length); past 64 entries it starts again.
// Called inside a OneDnnCall.
dnnl::matmul primitive(const Key& key, const dnnl::memory::desc* packed) {
  static std::mutex mu;
  static std::vector<Cached> cache;
  const std::lock_guard<std::mutex> lock(mu);
  for (const Cached& c : cache)
    if (c.key == key) return c.prim;
  const auto [M, in, out, bias, sum, act, y_bf16, is_packed] = key;
  const dnnl::memory::desc xd({M, in}, dt::bf16, tag::ab), wd = weights_desc(in, out, is_packed),
      bd({1, out}, dt::f32, tag::ab), yd({M, out}, y_bf16 ? dt::bf16 : dt::f32, tag::ab);
  dnnl::post_ops ops;
  if (sum) ops.append_sum(1.0f);
  if (act != GemmAct::none)
    ops.append_eltwise(1.0f, act == GemmAct::gelu_tanh ? dnnl::algorithm::eltwise_gelu_tanh
                                                        : dnnl::algorithm::eltwise_gelu_erf,
                       0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const auto desc = bias ? dnnl::matmul::desc(xd, wd, bd, yd) : dnnl::matmul::desc(xd, wd, yd);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine());
  dnnl::matmul prim;
  if (!packed || pd.weights_desc() == *packed) prim = dnnl::matmul(pd);
  if (cache.size() >= 64) cache.clear();
  cache.push_back({key, prim});
  return prim;
}

}  // namespace

struct PackedBf16::Impl {
  i64 in, out;
  dnnl::memory::desc desc;
  dnnl::memory mem;  // owns the packed copy
};

PackedBf16::PackedBf16(const std::uint16_t* W, i64 in, i64 out) {
  if (!W || in < 1 || out < 1)
    fail("qkv::blocks::PackedBf16", "W, in, out: need a matrix, got " + std::string(W ? "" : "null W, ") +
                                        "in = " + std::to_string(in) + ", out = " + std::to_string(out));
  try {
    const OneDnnCall call;
    auto impl = std::make_shared<Impl>();
    impl->in = in;
    impl->out = out;
    impl->desc = packed_desc(in, out);
    impl->mem = dnnl::memory(impl->desc, engine());
    dnnl::memory plain(weights_desc(in, out, false), engine(), const_cast<std::uint16_t*>(W));
    dnnl::stream s(engine());
    dnnl::reorder(plain, impl->mem).execute(s, plain, impl->mem);
    s.wait();
    impl_ = std::move(impl);
  } catch (const dnnl::error& err) {
    fail("qkv::blocks::PackedBf16", std::string("oneDNN reorder failed: ") + err.what() + " (in = " +
                                        std::to_string(in) + ", out = " + std::to_string(out) + ")");
  }
}

void gemm_bf16_in(const std::uint16_t* xb, const std::uint16_t* W, const float* b, void* y, DType y_dtype, i64 M,
                  i64 in, i64 out, float beta, GemmAct act, const PackedBf16* packed) {
  const char* fn = "qkv::blocks::gemm_bf16_in";
  if (M < 1 || in < 1 || out < 1 || (beta != 0.0f && beta != 1.0f))
    fail(fn, "M, in, out, beta: need sizes ≥ 1 and beta ∈ {0, 1}, got M = " + std::to_string(M) + ", in = " +
                 std::to_string(in) + ", out = " + std::to_string(out) + ", beta = " + std::to_string(beta));
  if (y_dtype != DType::f32 && y_dtype != DType::bf16)
    fail(fn, std::string("y_dtype: must be f32 or bf16, got ") + dtype_name(y_dtype));
  if (beta != 0.0f && (y_dtype != DType::f32 || act != GemmAct::none))
    fail(fn, std::string("beta: 1 (y += …) needs an f32 y and no activation, got y_dtype = ") +
                 dtype_name(y_dtype) + (act == GemmAct::none ? "" : " with an activation"));
  const PackedBf16::Impl* pk = packed ? packed->impl() : nullptr;
  if (pk && (pk->in != in || pk->out != out))
    fail(fn, "packed: made for in = " + std::to_string(pk->in) + ", out = " + std::to_string(pk->out) +
                 ", got in = " + std::to_string(in) + ", out = " + std::to_string(out));
  const bool y_bf16 = y_dtype == DType::bf16;
  try {
    const OneDnnCall call;
    const Key key{M, in, out, b != nullptr, beta != 0.0f, act, y_bf16, pk != nullptr};
    dnnl::matmul prim = primitive(key, pk ? &pk->desc : nullptr);
    if (!prim) {  // this primitive wants W in another layout than the packed one: the plain W
      pk = nullptr;
      prim = primitive({M, in, out, b != nullptr, beta != 0.0f, act, y_bf16, false}, nullptr);
    }
    dnnl::engine& e = engine();
    dnnl::stream s(e);
    const dnnl::memory xm({{M, in}, dt::bf16, tag::ab}, e, const_cast<std::uint16_t*>(xb));
    const dnnl::memory wm = pk ? pk->mem : dnnl::memory(weights_desc(in, out, false), e, const_cast<std::uint16_t*>(W));
    const dnnl::memory ym({{M, out}, y_bf16 ? dt::bf16 : dt::f32, tag::ab}, e, y);
    std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}};
    if (b) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, out}, dt::f32, tag::ab}, e, const_cast<float*>(b)));
    prim.execute(s, args);
    s.wait();
  } catch (const dnnl::error& err) {
    fail(fn, std::string("oneDNN matmul failed: ") + err.what() + " (M = " + std::to_string(M) + ", in = " +
                 std::to_string(in) + ", out = " + std::to_string(out) + ")");
  }
}

void gemm_bf16(const float* x, const std::uint16_t* W, const float* b, float* y, i64 M, i64 in, i64 out, float beta,
               int threads, Isa isa) {
  if (M < 1 || in < 1 || out < 1 || (beta != 0.0f && beta != 1.0f))
    fail("qkv::blocks::gemm_bf16",
         "M, in, out, beta: need sizes ≥ 1 and beta ∈ {0, 1}, got M = " + std::to_string(M) + ", in = " +
             std::to_string(in) + ", out = " + std::to_string(out) + ", beta = " + std::to_string(beta));
  thread_local std::vector<std::uint16_t> xb;  // x rounded to bf16 [M, in]
  xb.resize(static_cast<std::size_t>(M * in));
  f32_to_bf16(xb.data(), x, M * in, threads, isa);
  gemm_bf16_in(xb.data(), W, b, y, DType::f32, M, in, out, beta, GemmAct::none);
}

}  // namespace qkv::blocks
