// gemm_bf16 and gemm_bf16_in (dense.hpp): bf16 × bf16 GEMM on oneDNN's matmul primitive, and
// gemm_f32_packed, its f32 twin on a packed W.
// The bf16 matmul runs where it has dot-product instructions (bf16_native()). Elsewhere oneDNN 2.6
// emulates it (about a quarter of its f32 matmul's speed on AVX-512 without BF16) or, below
// AVX-512, has none at all; there gemm_bf16_in multiplies the same bf16 values widened to f32 on the
// f32 matmul: a product of two bf16 values is exact in f32 and the sums are f32 in both, so the
// contract (and the twin) is the same, and PackedBf16 keeps its copy widened and packed for f32.
//   xb [M, in] bf16 (gemm_bf16 rounds its f32 x into a per-thread copy first)
//   W [out, in] bf16 (read as the [in, out] matrix Wᵀ in oneDNN's "ba" layout, nothing copied),
//     or its PackedBf16 copy in the blocked layout the primitive asks for
//   b [1, out] f32   y [M, out] f32, or bf16 when the caller asks for it
// The epilogue runs inside the primitive while each tile of y is still in registers:
//   bias → (sum: y += …, beta = 1) → eltwise (GELU, tanh or erf form) → rounding to bf16 (bf16 y).
// Primitives are compiled (JIT) once per shape, epilogue and thread count and kept: a model uses a
// handful of shapes per prompt length, the encoder one row-block size. The thread count is part of
// the key because oneDNN fixes a primitive's work split when it compiles it, and a primitive run
// inside one of qkv's parallel calls (one oneDNN thread) must not open a team of two.
// Threads and fork(): every function below that reaches oneDNN does so inside a OneDnnCall
// (onednn_call.hpp), so a fork() never happens while this file's primitive list, its mutex, or
// oneDNN's own caches are being changed by another thread.
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "blocks/dense.hpp"
#include "blocks/onednn_call.hpp"
#include "qkv/runtime.hpp"

namespace qkv::blocks {
namespace {

using i64 = std::int64_t;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

// M, in, out, bias, sum, act, bf16 y, packed W, input dtype (bf16 or f32), oneDNN threads
using Key = std::tuple<i64, i64, i64, bool, bool, GemmAct, bool, bool, dt, int>;

// A compiled primitive and the scratchpad it asks for. The scratchpad is the caller's (user mode):
// oneDNN's own ("library" mode, built without DNNL_ENABLE_CONCURRENT_EXEC) is one buffer shared by
// every primitive, so two threads running GEMMs at once (the encoder's row blocks) would overwrite
// each other's.
struct Prim {
  dnnl::matmul prim;
  dnnl::memory::desc scratch;
};

struct Cached {
  Key key;
  Prim p;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Wᵀ [in, out] as oneDNN sees W [out, in]: plain ("ba") or the layout the matmul chooses ("any").
dnnl::memory::desc weights_desc(i64 in, i64 out, bool any, dt type = dt::bf16) {
  return dnnl::memory::desc({in, out}, type, any ? tag::any : tag::ba);
}

// bf16 × bf16 on dot-product instructions: qkv's active ISA (the CPU's best, or QKV_ISA / set_isa)
// has AVX-512 BF16 and oneDNN may use it too (ONEDNN_MAX_CPU_ISA can hold it below).
bool bf16_native() {
  if (active_isa() != Isa::avx512_bf16) return false;
  static const bool onednn = [] {
    const dnnl::cpu_isa i = dnnl::get_effective_cpu_isa();
    return i == dnnl::cpu_isa::all || i == dnnl::cpu_isa::avx512_core_bf16 || i == dnnl::cpu_isa::avx512_core_amx;
  }();
  return onednn;
}

// The layout a matmul of 512 rows asks for Wᵀ [in, out] (PackedBf16's and PackedF32's layout).
dnnl::memory::desc packed_desc(i64 in, i64 out, dt type) {
  const dnnl::matmul::desc d(dnnl::memory::desc({512, in}, type, tag::ab), weights_desc(in, out, true, type),
                             dnnl::memory::desc({512, out}, dt::f32, tag::ab));
  return dnnl::matmul::primitive_desc(d, engine()).weights_desc();
}

// The primitive for one shape and epilogue, compiled on first use, or an empty one where a packed
// W's layout is not the one this primitive asks for (the caller then takes the plain W). Kept in
// a short list (a model needs ≈ 5 entries per prompt length); past 64 entries it starts again.
// Called inside a OneDnnCall.
Prim primitive(const Key& key, const dnnl::memory::desc* packed) {
  static std::mutex mu;
  static std::vector<Cached> cache;
  const std::lock_guard<std::mutex> lock(mu);
  for (const Cached& c : cache)
    if (c.key == key) return c.p;
  // threads is only a key: the primitive takes this thread's oneDNN thread count when it compiles.
  [[maybe_unused]] const auto [M, in, out, bias, sum, act, y_bf16, is_packed, x_type, threads] = key;
  const dnnl::memory::desc xd({M, in}, x_type, tag::ab), wd = weights_desc(in, out, is_packed, x_type),
      bd({1, out}, dt::f32, tag::ab), yd({M, out}, y_bf16 ? dt::bf16 : dt::f32, tag::ab);
  dnnl::post_ops ops;
  if (sum) ops.append_sum(1.0f);
  if (act != GemmAct::none)
    ops.append_eltwise(1.0f, act == GemmAct::gelu_tanh ? dnnl::algorithm::eltwise_gelu_tanh
                                                        : dnnl::algorithm::eltwise_gelu_erf,
                       0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const auto desc = bias ? dnnl::matmul::desc(xd, wd, bd, yd) : dnnl::matmul::desc(xd, wd, yd);
  const dnnl::matmul::primitive_desc pd(desc, attr, engine());
  Prim p;
  if (!packed || pd.weights_desc() == *packed) p = {dnnl::matmul(pd), pd.scratchpad_desc()};
  if (cache.size() >= 64) cache.clear();
  cache.push_back({key, p});
  return p;
}

// Runs p on x, W and y, with b [1, out] f32 as its bias when given, and a scratchpad of this
// thread's own.
void run(const Prim& p, dnnl::stream& s, const dnnl::memory& xm, const dnnl::memory& wm, const dnnl::memory& ym,
         const float* b, i64 out) {
  thread_local std::vector<std::uint8_t> scratch;
  const std::size_t bytes = p.scratch.get_size();
  if (scratch.size() < bytes) scratch.resize(bytes);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym},
                                             {DNNL_ARG_SCRATCHPAD, dnnl::memory(p.scratch, engine(), scratch.data())}};
  if (b) args.emplace(DNNL_ARG_BIAS, dnnl::memory({{1, out}, dt::f32, tag::ab}, engine(), const_cast<float*>(b)));
  p.prim.execute(s, args);
  s.wait();
}

[[noreturn]] void matmul_failed(const char* fn, const dnnl::error& err, i64 M, i64 in, i64 out) {
  fail(fn, std::string("oneDNN matmul failed: ") + err.what() + " (M = " + std::to_string(M) + ", in = " +
               std::to_string(in) + ", out = " + std::to_string(out) + ")");
}

}  // namespace

struct PackedImpl {
  i64 in, out;
  dt type;  // of the packed copy: bf16, or f32 (PackedF32, and PackedBf16 where bf16 is not native)
  dnnl::memory::desc desc;
  dnnl::memory mem;  // owns the packed copy
};

namespace {

// W [out, in] of `type` (bf16 bits or f32) reordered into the packed layout.
std::shared_ptr<const PackedImpl> pack(const char* fn, const void* W, dt type, i64 in, i64 out) {
  if (!W || in < 1 || out < 1)
    fail(fn, "W, in, out: need a matrix, got " + std::string(W ? "" : "null W, ") + "in = " + std::to_string(in) +
                 ", out = " + std::to_string(out));
  try {
    const OneDnnCall call;
    auto impl = std::make_shared<PackedImpl>();
    impl->in = in;
    impl->out = out;
    impl->type = type;
    impl->desc = packed_desc(in, out, type);
    impl->mem = dnnl::memory(impl->desc, engine());
    dnnl::memory plain(weights_desc(in, out, false, type), engine(), const_cast<void*>(W));
    dnnl::stream s(engine());
    dnnl::reorder(plain, impl->mem).execute(s, plain, impl->mem);
    s.wait();
    return impl;
  } catch (const dnnl::error& err) {
    fail(fn, std::string("oneDNN reorder failed: ") + err.what() + " (in = " + std::to_string(in) + ", out = " +
                 std::to_string(out) + ")");
  }
}

}  // namespace

namespace {

// W [out, in] bf16 packed for the GEMM gemm_bf16_in runs on this machine: the bf16 matmul's layout,
// or, where bf16 is not native, W widened to f32 in the f32 matmul's.
std::shared_ptr<const PackedImpl> pack_bf16(const std::uint16_t* W, i64 in, i64 out) {
  const char* fn = "qkv::blocks::PackedBf16";
  if (bf16_native() || !W || in < 1 || out < 1) return pack(fn, W, dt::bf16, in, out);
  std::vector<float> wide(static_cast<std::size_t>(in * out));
  bf16_to_f32(wide.data(), W, in * out, omp_get_max_threads());
  return pack(fn, wide.data(), dt::f32, in, out);
}

// y [M, out] = act(x · Wᵀ + b) (beta 0) or y += x · Wᵀ + b (beta 1) on oneDNN's f32 matmul, all f32,
// W from pk (packed f32) where the primitive takes its layout, else from the plain W [out, in]
// (Wplain, or pk unpacked for this call when there is none).
void matmul_f32(const char* fn, const float* x, const PackedImpl* pk, const float* Wplain, const float* b, float* y,
                i64 M, i64 in, i64 out, float beta, GemmAct act) {
  try {
    const OneDnnCall call;
    const int threads = omp_get_max_threads();
    Prim prim = pk ? primitive({M, in, out, b != nullptr, beta != 0.0f, act, false, true, dt::f32, threads}, &pk->desc)
                   : Prim{};
    dnnl::engine& e = engine();
    dnnl::stream s(e);
    dnnl::memory wm = pk ? pk->mem : dnnl::memory();
    if (!prim.prim) {  // no packed W, or this primitive wants another layout (not seen on oneDNN 2.6)
      prim = primitive({M, in, out, b != nullptr, beta != 0.0f, act, false, false, dt::f32, threads}, nullptr);
      if (Wplain) {
        wm = dnnl::memory(weights_desc(in, out, false, dt::f32), e, const_cast<float*>(Wplain));
      } else {
        dnnl::memory packed_w = pk->mem;
        wm = dnnl::memory(weights_desc(in, out, false, dt::f32), e);
        dnnl::reorder(packed_w, wm).execute(s, packed_w, wm);
      }
    }
    const dnnl::memory xm({{M, in}, dt::f32, tag::ab}, e, const_cast<float*>(x));
    const dnnl::memory ym({{M, out}, dt::f32, tag::ab}, e, y);
    run(prim, s, xm, wm, ym, b, out);
  } catch (const dnnl::error& err) {
    matmul_failed(fn, err, M, in, out);
  }
}

// gemm_bf16_in where bf16 is not native: the inputs widened to f32 (exact), the f32 matmul with the
// same epilogue, a bf16 y rounded from its f32 result (nearest even, as oneDNN's bf16 dst rounds).
void gemm_bf16_widened(const std::uint16_t* xb, const std::uint16_t* W, const PackedImpl* pk, const float* b,
                       void* y, DType y_dtype, i64 M, i64 in, i64 out, float beta, GemmAct act) {
  const int threads = omp_get_max_threads();
  thread_local std::vector<float> xw, ww, yw;  // x, W (when not packed) and a bf16 y's f32 values
  xw.resize(static_cast<std::size_t>(M * in));
  bf16_to_f32(xw.data(), xb, M * in, threads);
  if (pk && pk->type != dt::f32) pk = nullptr;  // packed for the bf16 matmul (before a set_isa)
  if (!pk) {
    ww.resize(static_cast<std::size_t>(in * out));
    bf16_to_f32(ww.data(), W, in * out, threads);
  }
  const bool y_bf16 = y_dtype == DType::bf16;
  if (y_bf16) yw.resize(static_cast<std::size_t>(M * out));
  float* yf = y_bf16 ? yw.data() : static_cast<float*>(y);
  matmul_f32("qkv::blocks::gemm_bf16_in", xw.data(), pk, pk ? nullptr : ww.data(), b, yf, M, in, out, beta, act);
  if (y_bf16) f32_to_bf16(static_cast<std::uint16_t*>(y), yf, M * out, threads, active_isa());
}

}  // namespace

PackedBf16::PackedBf16(const std::uint16_t* W, i64 in, i64 out) : impl_(pack_bf16(W, in, out)) {}

PackedF32::PackedF32(const float* W, i64 in, i64 out) : impl_(pack("qkv::blocks::PackedF32", W, dt::f32, in, out)) {}

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
  const PackedImpl* pk = packed ? packed->impl() : nullptr;
  if (pk && (pk->in != in || pk->out != out))
    fail(fn, "packed: made for in = " + std::to_string(pk->in) + ", out = " + std::to_string(pk->out) +
                 ", got in = " + std::to_string(in) + ", out = " + std::to_string(out));
  if (!bf16_native()) return gemm_bf16_widened(xb, W, pk, b, y, y_dtype, M, in, out, beta, act);
  if (pk && pk->type != dt::bf16) pk = nullptr;  // widened for f32 (packed before a set_isa)
  const bool y_bf16 = y_dtype == DType::bf16;
  try {
    const OneDnnCall call;
    const int threads = omp_get_max_threads();
    const Key key{M, in, out, b != nullptr, beta != 0.0f, act, y_bf16, pk != nullptr, dt::bf16, threads};
    Prim prim = primitive(key, pk ? &pk->desc : nullptr);
    if (!prim.prim) {  // this primitive wants W in another layout than the packed one: the plain W
      pk = nullptr;
      prim = primitive({M, in, out, b != nullptr, beta != 0.0f, act, y_bf16, false, dt::bf16, threads}, nullptr);
    }
    dnnl::engine& e = engine();
    dnnl::stream s(e);
    const dnnl::memory xm({{M, in}, dt::bf16, tag::ab}, e, const_cast<std::uint16_t*>(xb));
    const dnnl::memory wm = pk ? pk->mem : dnnl::memory(weights_desc(in, out, false), e, const_cast<std::uint16_t*>(W));
    const dnnl::memory ym({{M, out}, y_bf16 ? dt::bf16 : dt::f32, tag::ab}, e, y);
    run(prim, s, xm, wm, ym, b, out);
  } catch (const dnnl::error& err) {
    matmul_failed(fn, err, M, in, out);
  }
}

void gemm_f32_packed(const float* x, const PackedF32& W, const float* b, float* y, i64 M, i64 in, i64 out,
                     float beta, GemmAct act) {
  const char* fn = "qkv::blocks::gemm_f32_packed";
  if (M < 1 || in < 1 || out < 1 || (beta != 0.0f && beta != 1.0f))
    fail(fn, "M, in, out, beta: need sizes ≥ 1 and beta ∈ {0, 1}, got M = " + std::to_string(M) + ", in = " +
                 std::to_string(in) + ", out = " + std::to_string(out) + ", beta = " + std::to_string(beta));
  if (beta != 0.0f && act != GemmAct::none) fail(fn, "beta: 1 (y += …) needs no activation");
  const PackedImpl* pk = W.impl();
  if (!pk) fail(fn, "W: empty (construct it from a matrix)");
  if (pk->in != in || pk->out != out)
    fail(fn, "W: packed for in = " + std::to_string(pk->in) + ", out = " + std::to_string(pk->out) + ", got in = " +
                 std::to_string(in) + ", out = " + std::to_string(out));
  matmul_f32(fn, x, pk, nullptr, b, y, M, in, out, beta, act);
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
