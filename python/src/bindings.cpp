// qkv._qkv — the thin native layer under the Python package (a face: it converts and calls).
//
// Every array argument arrives as a nanobind ndarray: a NumPy array, a torch tensor or any other
// DLPack producer, read in place through its own strides (no copy, no contiguity demanded).
// The Python layer (python/qkv/) does the PyTorch-style broadcasting, allocates the outputs in
// the caller's framework and passes them here already shaped [B, H, S, D].
//
// dtypes accepted: float32 → f32, float64 → f64, float16 → f16 (KV caches only), bfloat16 → bf16, uint16 → bf16 (NumPy has no
// bfloat16: qkv/_arrays.py passes an ml_dtypes.bfloat16 array as its uint16 bit view), bool and
// uint8 → u8, int32 → i32, int64 → i64. Anything else raises TypeError.
//
// The GIL is released while a kernel runs, so Python threads calling qkv compute at the same time.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <pthread.h>

#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "core/fork_gate.hpp"
#include "inspect/page.hpp"
#include "inspect/run.hpp"
#include "model/safetensors.hpp"
#include "qkv/attention.hpp"
#include "qkv/encoder.hpp"
#include "qkv/kv_cache.hpp"
#include "qkv/memory.hpp"
#include "qkv/mha.hpp"
#include "qkv/model.hpp"
#include "qkv/types.hpp"
#include "qkv/version.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Inputs may be read-only (broadcast NumPy views are): qkv never writes through them.
using In = nb::ndarray<nb::ro, nb::device::cpu>;
// Outputs are written by the kernel.
using Out = nb::ndarray<nb::device::cpu>;

qkv::DType to_dtype(const char* fn, const char* name, nb::dlpack::dtype t) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(t.code);
  if (t.lanes == 1) {
    if (code == C::Float && t.bits == 32) return qkv::DType::f32;
    if (code == C::Float && t.bits == 64) return qkv::DType::f64;
    if (code == C::Bfloat && t.bits == 16) return qkv::DType::bf16;
    if (code == C::UInt && t.bits == 16) return qkv::DType::bf16;
    if ((code == C::Bool || code == C::UInt) && t.bits == 8) return qkv::DType::u8;
    if (code == C::Int && t.bits == 32) return qkv::DType::i32;
    if (code == C::Int && t.bits == 64) return qkv::DType::i64;
    if (code == C::Int && t.bits == 8) return qkv::DType::i8;
    if (code == C::Float && t.bits == 16) return qkv::DType::f16;
  }
  throw nb::type_error((std::string("[") + fn + "] " + name + ": unsupported dtype (DLPack code " +
                        std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits)")
                           .c_str());
}

template <class A>
qkv::View to_view(const char* fn, const char* name, const A& a) {
  if (a.ndim() < 1 || a.ndim() > static_cast<size_t>(qkv::kMaxRank))
    throw nb::value_error((std::string("[") + fn + "] " + name + ": rank must be 1.." +
                           std::to_string(qkv::kMaxRank) + ", got " + std::to_string(a.ndim()))
                              .c_str());
  qkv::View v;
  v.data = const_cast<void*>(static_cast<const void*>(a.data()));
  v.dtype = to_dtype(fn, name, a.dtype());
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[static_cast<size_t>(i)] = static_cast<std::int64_t>(a.shape(static_cast<size_t>(i)));
    v.strides[static_cast<size_t>(i)] = a.stride(static_cast<size_t>(i));
  }
  return v;
}

template <class A>
std::optional<qkv::View> to_view(const char* fn, const char* name, const std::optional<A>& a) {
  if (!a) return std::nullopt;
  return to_view(fn, name, *a);
}

qkv::Align to_align(const std::string& s) {
  if (s == "top_left") return qkv::Align::top_left;
  if (s == "bottom_right") return qkv::Align::bottom_right;
  if (s == "bottom_right_key_lengths") return qkv::Align::bottom_right_key_lengths;
  throw nb::value_error(
      ("[qkv.attention] align: must be 'top_left', 'bottom_right' or 'bottom_right_key_lengths', got '" + s + "'")
          .c_str());
}

qkv::ScoreStage to_score_stage(const std::string& s) {
  if (s == "scaled") return qkv::ScoreStage::scaled;
  if (s == "softcapped") return qkv::ScoreStage::softcapped;
  if (s == "masked") return qkv::ScoreStage::masked;
  throw nb::value_error(
      ("[qkv.attention] return_scores: must be 'scaled', 'softcapped' or 'masked', got '" + s + "'").c_str());
}

qkv::Kernel to_kernel(const std::string& s) {
  for (qkv::Kernel k : {qkv::Kernel::automatic, qkv::Kernel::reference, qkv::Kernel::flash, qkv::Kernel::flash_decode})
    if (s == qkv::kernel_name(k)) return k;
  throw nb::value_error(
      ("[qkv.attention] kernel: must be 'automatic', 'reference', 'flash' or 'flash_decode', got '" + s + "'").c_str());
}

qkv::Isa to_isa(const std::string& s) {
  for (qkv::Isa i : {qkv::Isa::scalar, qkv::Isa::avx2, qkv::Isa::avx512, qkv::Isa::avx512_vnni, qkv::Isa::avx512_bf16})
    if (s == qkv::isa_name(i)) return i;
  throw nb::value_error(
      ("[qkv.set_isa] isa: must be 'scalar', 'avx2', 'avx512', 'avx512_vnni' or 'avx512_bf16', got '" + s + "'").c_str());
}

using Info = std::tuple<std::string, std::string, std::string>;  // (kernel, isa, name)
Info info_tuple(const qkv::KernelInfo& i) { return {qkv::kernel_name(i.kernel), qkv::isa_name(i.isa), i.name}; }

qkv::AttentionOptions options(const char* fn, const std::optional<In>& mask, const std::optional<In>& key_lengths,
                              std::optional<double> scale, bool causal, const std::string& align,
                              std::int64_t window_left, std::int64_t window_right, int num_threads,
                              const std::string& kernel) {
  qkv::AttentionOptions o;
  o.scale = scale;
  o.causal = causal;
  o.align = to_align(align);
  o.window_left = window_left;
  o.window_right = window_right;
  o.mask = to_view(fn, "mask", mask);
  o.key_lengths = to_view(fn, "key_lengths", key_lengths);
  o.num_threads = num_threads;
  o.kernel = to_kernel(kernel);
  return o;
}

// Attention dropout (qkv/attention.hpp): probability, seed and offset of the mask.
qkv::AttentionOptions with_dropout(qkv::AttentionOptions o, double dropout_p, std::uint64_t seed, std::uint64_t offset) {
  o.dropout_p = dropout_p;
  o.dropout_seed = seed;
  o.dropout_offset = offset;
  return o;
}

// The score variants (issue #19) into o: softcap, ALiBi slopes [H], sinks [H].
void add_score_variants(const char* fn, qkv::AttentionOptions& o, std::optional<double> softcap,
                        const std::optional<In>& alibi_slopes, const std::optional<In>& sinks) {
  o.softcap = softcap;
  o.alibi_slopes = to_view(fn, "alibi_slopes", alibi_slopes);
  o.sinks = to_view(fn, "sinks", sinks);
}

Info attention(In q, In k, In v, Out out, std::optional<In> mask, std::optional<In> key_lengths,
               std::optional<Out> lse, std::optional<Out> pattern, std::optional<double> scale, bool causal,
               const std::string& align, std::int64_t window_left, std::int64_t window_right, int num_threads,
               const std::string& kernel, double dropout_p, std::uint64_t seed, std::uint64_t offset,
               std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks,
               std::optional<Out> scores, const std::string& scores_stage, std::int64_t keep_first) {
  const char* fn = "qkv.attention";
  qkv::AttentionOptions o = with_dropout(
      options(fn, mask, key_lengths, scale, causal, align, window_left, window_right, num_threads, kernel), dropout_p,
      seed, offset);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const qkv::View qv = to_view(fn, "q", q), kv = to_view(fn, "k", k), vv = to_view(fn, "v", v),
                  ov = to_view(fn, "out", out);
  const auto lv = to_view(fn, "lse", lse), pv = to_view(fn, "pattern", pattern);
  std::optional<qkv::ScoresOutput> sv;
  if (scores) sv = qkv::ScoresOutput{*to_view(fn, "scores", scores), to_score_stage(scores_stage)};
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = qkv::attention(qv, kv, vv, ov, o, lv, pv, sv);
  }
  return info_tuple(info);
}

// attention_kvcache (qkv/attention.hpp): q [B, H, Sq, D] against a contiguous, paged and/or int8 cache.
Info attention_kvcache(In q, In k_cache, In v_cache, Out out, std::optional<In> block_table,
                       std::optional<In> k_scale, std::optional<In> v_scale, std::optional<In> key_lengths,
                       std::optional<Out> lse, std::optional<double> scale, bool causal, const std::string& align,
                       std::int64_t window_left, std::int64_t window_right, int num_threads, const std::string& kernel,
                       std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks,
                       std::int64_t keep_first) {
  const char* fn = "qkv.attention_kvcache";
  qkv::AttentionOptions o =
      options(fn, std::nullopt, key_lengths, scale, causal, align, window_left, window_right, num_threads, kernel);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const qkv::KvCacheView cache{to_view(fn, "k_cache", k_cache), to_view(fn, "v_cache", v_cache),
                               to_view(fn, "block_table", block_table), to_view(fn, "k_scale", k_scale),
                               to_view(fn, "v_scale", v_scale)};
  const qkv::View qv = to_view(fn, "q", q), ov = to_view(fn, "out", out);
  const auto lv = to_view(fn, "lse", lse);
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = qkv::attention_kvcache(qv, cache, ov, o, lv);
  }
  return info_tuple(info);
}

// qkv::AttentionKvCache (qkv/kv_cache.hpp) for qkv.KVCache (python/qkv/kvcache.py), which
// checks the Python-side arguments and allocates the outputs in q's framework.
qkv::DType cache_dtype(const std::string& s) {
  if (s == "float32") return qkv::DType::f32;
  if (s == "bfloat16") return qkv::DType::bf16;
  if (s == "float16") return qkv::DType::f16;
  if (s == "int8") return qkv::DType::i8;
  throw nb::value_error(
      ("[qkv.KVCache] dtype: must be 'float32', 'bfloat16', 'float16' or 'int8', got '" + s + "'").c_str());
}

// A NumPy array over t's memory (no copy) that keeps `owner` (the cache) alive; bf16 as its uint16
// bits (NumPy has no bfloat16; python/qkv/kvcache.py views them as ml_dtypes.bfloat16).
nb::ndarray<nb::numpy> numpy_view(const qkv::View& t, nb::handle owner) {
  using C = nb::dlpack::dtype_code;
  nb::dlpack::dtype d{static_cast<std::uint8_t>(C::Float), 32, 1};
  switch (t.dtype) {
    case qkv::DType::f32: break;
    case qkv::DType::bf16: d = {static_cast<std::uint8_t>(C::UInt), 16, 1}; break;
    case qkv::DType::f16: d = {static_cast<std::uint8_t>(C::Float), 16, 1}; break;
    case qkv::DType::i8: d = {static_cast<std::uint8_t>(C::Int), 8, 1}; break;
    case qkv::DType::i32: d = {static_cast<std::uint8_t>(C::Int), 32, 1}; break;
    case qkv::DType::i64: d = {static_cast<std::uint8_t>(C::Int), 64, 1}; break;
    default: throw nb::type_error((std::string("[qkv.KVCache] storage of dtype ") + qkv::dtype_name(t.dtype)).c_str());
  }
  size_t shape[qkv::kMaxRank];
  std::int64_t strides[qkv::kMaxRank];
  for (int i = 0; i < t.rank; ++i)
    shape[i] = static_cast<size_t>(t.shape[static_cast<size_t>(i)]), strides[i] = t.strides[static_cast<size_t>(i)];
  return nb::ndarray<nb::numpy>(t.data, static_cast<size_t>(t.rank), shape, owner, strides, d);
}

// {"k", "v", "lengths"} and, when the cache has them, "k_scale", "v_scale", "block_table".
nb::dict kv_cache_storage(nb::handle self_h) {
  const auto& self = nb::cast<const qkv::AttentionKvCache&>(self_h);
  const qkv::KvCacheView c = self.view();
  nb::dict d;
  d["k"] = numpy_view(c.k, self_h);
  d["v"] = numpy_view(c.v, self_h);
  d["lengths"] = numpy_view(self.lengths(), self_h);
  if (c.k_scale) d["k_scale"] = numpy_view(*c.k_scale, self_h), d["v_scale"] = numpy_view(*c.v_scale, self_h);
  if (c.block_table) d["block_table"] = numpy_view(*c.block_table, self_h);
  return d;
}

void kv_cache_append(qkv::AttentionKvCache& self, In k_new, In v_new) {
  const char* fn = "qkv.KVCache.append";
  const qkv::View kn = to_view(fn, "k_new", k_new), vn = to_view(fn, "v_new", v_new);
  nb::gil_scoped_release unlocked;
  self.append(kn, vn);
}

void kv_cache_append_to(qkv::AttentionKvCache& self, std::int64_t b, In k_new, In v_new) {
  const char* fn = "qkv.KVCache.append_to";
  const qkv::View kn = to_view(fn, "k_new", k_new), vn = to_view(fn, "v_new", v_new);
  nb::gil_scoped_release unlocked;
  self.append_to(b, kn, vn);
}

Info kv_cache_attend(const qkv::AttentionKvCache& self, In q, Out out, std::optional<Out> lse,
                     std::optional<double> scale, bool causal, const std::string& align, std::int64_t window_left,
                     std::int64_t window_right, int num_threads, const std::string& kernel,
                     std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks,
                     std::int64_t keep_first) {
  const char* fn = "qkv.KVCache.attend";
  qkv::AttentionOptions o =
      options(fn, std::nullopt, std::nullopt, scale, causal, align, window_left, window_right, num_threads, kernel);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const qkv::View qv = to_view(fn, "q", q), ov = to_view(fn, "out", out);
  const auto lv = to_view(fn, "lse", lse);
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = self.attend(qv, ov, o, lv);
  }
  return info_tuple(info);
}

Info attention_varlen(In q, In k, In v, Out out, In cu_seqlens_q, In cu_seqlens_k, std::optional<Out> lse,
                      std::optional<double> scale, bool causal, const std::string& align, std::int64_t window_left,
                      std::int64_t window_right, int num_threads, const std::string& kernel, double dropout_p,
                      std::uint64_t seed, std::uint64_t offset,
               std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks,
               std::int64_t keep_first) {
  const char* fn = "qkv.attention";
  qkv::AttentionOptions o = with_dropout(
      options(fn, std::nullopt, std::nullopt, scale, causal, align, window_left, window_right, num_threads, kernel),
      dropout_p, seed, offset);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const qkv::View qv = to_view(fn, "q", q), kv = to_view(fn, "k", k), vv = to_view(fn, "v", v),
                  ov = to_view(fn, "out", out), cq = to_view(fn, "cu_seqlens_q", cu_seqlens_q),
                  ck = to_view(fn, "cu_seqlens_k", cu_seqlens_k);
  const auto lv = to_view(fn, "lse", lse);
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = qkv::attention_varlen(qv, kv, vv, ov, cq, ck, o, lv);
  }
  return info_tuple(info);
}

Info attention_backward(In q, In k, In v, In out, In dout, In lse, Out dq, Out dk, Out dv, std::optional<In> mask,
                        std::optional<In> key_lengths, std::optional<double> scale, bool causal,
                        const std::string& align, std::int64_t window_left, std::int64_t window_right,
                        int num_threads, const std::string& kernel, double dropout_p, std::uint64_t seed,
                        std::uint64_t offset,
                        std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks, std::optional<Out> dsinks,
                        std::int64_t keep_first) {
  const char* fn = "qkv.attention_backward";
  qkv::AttentionOptions o = with_dropout(
      options(fn, mask, key_lengths, scale, causal, align, window_left, window_right, num_threads, kernel), dropout_p,
      seed, offset);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const auto dsv = to_view(fn, "dsinks", dsinks);
  const qkv::View qv = to_view(fn, "q", q), kv = to_view(fn, "k", k), vv = to_view(fn, "v", v),
                  ov = to_view(fn, "out", out), gv = to_view(fn, "dout", dout), lv = to_view(fn, "lse", lse),
                  dqv = to_view(fn, "dq", dq), dkv = to_view(fn, "dk", dk), dvv = to_view(fn, "dv", dv);
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = qkv::attention_backward(qv, kv, vv, ov, gv, lv, dqv, dkv, dvv, o, dsv);
  }
  return info_tuple(info);
}

Info attention_varlen_backward(In q, In k, In v, In out, In dout, In lse, Out dq, Out dk, Out dv, In cu_seqlens_q,
                               In cu_seqlens_k, std::optional<double> scale, bool causal, const std::string& align,
                               std::int64_t window_left, std::int64_t window_right, int num_threads,
                               const std::string& kernel, double dropout_p, std::uint64_t seed, std::uint64_t offset,
                        std::optional<double> softcap, std::optional<In> alibi_slopes, std::optional<In> sinks, std::optional<Out> dsinks,
                        std::int64_t keep_first) {
  const char* fn = "qkv.attention_backward";
  qkv::AttentionOptions o = with_dropout(
      options(fn, std::nullopt, std::nullopt, scale, causal, align, window_left, window_right, num_threads, kernel),
      dropout_p, seed, offset);
  add_score_variants(fn, o, softcap, alibi_slopes, sinks);
  o.keep_first = keep_first;
  const auto dsv = to_view(fn, "dsinks", dsinks);
  const qkv::View qv = to_view(fn, "q", q), kv = to_view(fn, "k", k), vv = to_view(fn, "v", v),
                  ov = to_view(fn, "out", out), gv = to_view(fn, "dout", dout), lv = to_view(fn, "lse", lse),
                  dqv = to_view(fn, "dq", dq), dkv = to_view(fn, "dk", dk), dvv = to_view(fn, "dv", dv),
                  cq = to_view(fn, "cu_seqlens_q", cu_seqlens_q), ck = to_view(fn, "cu_seqlens_k", cu_seqlens_k);
  qkv::KernelInfo info;
  {
    nb::gil_scoped_release unlocked;
    info = qkv::attention_varlen_backward(qv, kv, vv, ov, gv, lv, dqv, dkv, dvv, cq, ck, o, dsv);
  }
  return info_tuple(info);
}

void dropout_mask(Out mask, double dropout_p, std::uint64_t seed, std::uint64_t offset) {
  const qkv::View mv = to_view("qkv.dropout_mask", "mask", mask);
  nb::gil_scoped_release unlocked;
  qkv::dropout_mask(mv, dropout_p, seed, offset);
}

// ---- the multi-head attention block (include/qkv/mha.hpp)

using Mha = qkv::MultiHeadAttention;

void mha_init(Mha* self, std::int64_t d_model, std::int64_t d_source, std::int64_t n_heads, std::int64_t n_kv_heads,
              std::int64_t d_head, std::int64_t d_value, bool bias) {
  qkv::MhaConfig c;
  c.d_model = d_model, c.d_source = d_source, c.n_heads = n_heads, c.n_kv_heads = n_kv_heads;
  c.d_head = d_head, c.d_value = d_value, c.bias = bias;
  new (self) Mha(c);
}

// The weights as writable NumPy arrays over the block's own buffers (no copy); each keeps the
// block alive as long as it lives.
nb::dict mha_weights(nb::handle self_h) {
  Mha& self = nb::cast<Mha&>(self_h);
  nb::dict d;
  const std::pair<const char*, qkv::Buffer*> all[] = {{"w_q", &self.w_q}, {"w_k", &self.w_k}, {"w_v", &self.w_v},
                                                      {"w_o", &self.w_o}, {"b_q", &self.b_q}, {"b_k", &self.b_k},
                                                      {"b_v", &self.b_v}, {"b_o", &self.b_o}};
  for (auto [name, buf] : all) {
    size_t shape[2];
    for (size_t i = 0; i < buf->shape().size(); ++i) shape[i] = static_cast<size_t>(buf->shape()[i]);
    d[name] = nb::ndarray<nb::numpy, float>(buf->ptr<float>(), buf->shape().size(), shape, self_h);
  }
  return d;
}

void mha_forward(const Mha& self, In x, std::optional<In> source, Out delta, std::optional<Out> head_delta,
                 std::optional<Out> pattern, std::optional<In> mask, std::optional<In> key_lengths,
                 std::optional<double> scale, bool causal, const std::string& align, std::int64_t window_left,
                 std::int64_t window_right, int num_threads, const std::string& kernel) {
  const char* fn = "qkv.MultiHeadAttention";
  const qkv::AttentionOptions o =
      options(fn, mask, key_lengths, scale, causal, align, window_left, window_right, num_threads, kernel);
  const qkv::View xv = to_view(fn, "x", x), dv = to_view(fn, "delta", delta);
  const auto sv = to_view(fn, "source", source), hv = to_view(fn, "head_delta", head_delta),
             pv = to_view(fn, "pattern", pattern);
  nb::gil_scoped_release unlocked;
  self.forward(xv, sv, o, dv, hv, pv);
}

// ---- the model (include/qkv/model.hpp): weights, the llama2.c tokenizer, a KV cache, generation

using F32Array = nb::ndarray<nb::numpy, float>;

// A Buffer handed to NumPy without a copy: the array owns it through a capsule.
F32Array to_numpy(qkv::Buffer&& b) {
  auto* owned = new qkv::Buffer(std::move(b));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<qkv::Buffer*>(p); });
  size_t shape[qkv::kMaxRank];
  const std::vector<std::int64_t>& s = owned->shape();
  for (size_t i = 0; i < s.size(); ++i) shape[i] = static_cast<size_t>(s[i]);
  return F32Array(owned->ptr<float>(), s.size(), shape, del);
}

// A model and its own KV cache: forward() continues from the positions already run.
// The model's work buffers and the cache are one state: Python threads (the GIL is released while
// the model runs) take turns through `mu`, held for a whole forward / trace / generate / reset
// (taken after the GIL is released, and let go before it is taken back, so neither lock waits on
// the other). Without it two threads generating on one model wrote each other's buffers.
//
// fork(): a thread running a model holds its `mu` and has its buffers and cache half written; a
// child forked then inherited both, and its first call on that model hung. So every model call
// also passes model_gate(), a ForkGate (src/core/fork_gate.hpp): fork() waits until the models
// being run have returned (a generate() of a few hundred tokens: well under a second for small
// models, longer for large ones). Its fork handlers are registered when the first model is made,
// after the library's own (OneDnnCall's gate, the scratch pool), so that they run first: a model
// call passes those while it finishes. Test: python/tests/test_fork.py.
qkv::ForkGate& model_gate() {
  static qkv::ForkGate gate;
  [[maybe_unused]] static const int registered = pthread_atfork(
      [] { model_gate().before_fork(); }, [] { model_gate().after_fork(); }, [] { model_gate().after_fork(); });
  return gate;
}

struct PyModel {
  qkv::Model model;
  qkv::KvCache cache;
  std::mutex mu;
  PyModel(qkv::Weights w, qkv::ModelOptions o) : model(std::move(w), o), cache(model.new_cache()) { model_gate(); }
};

std::vector<int> to_tokens(const char* fn, const std::vector<std::int64_t>& t) {
  std::vector<int> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] < 0 || t[i] > INT32_MAX)
      throw nb::value_error((std::string("[") + fn + "] tokens: token " + std::to_string(i) + " is " +
                             std::to_string(t[i]) + ", outside [0, 2^31)")
                                .c_str());
    out[i] = static_cast<int>(t[i]);
  }
  return out;
}

F32Array model_forward(PyModel& self, const std::vector<std::int64_t>& tokens, bool all_logits) {
  const std::vector<int> t = to_tokens("qkv.Model.forward", tokens);
  const std::int64_t V = self.model.config().vocab_size;
  const std::int64_t rows = all_logits ? static_cast<std::int64_t>(t.size()) : 1;
  qkv::check_memory("qkv.Model.forward", "logits", qkv::bytes_of({rows, V}, 4));
  qkv::Buffer logits(qkv::DType::f32, all_logits ? std::vector<std::int64_t>{rows, V} : std::vector<std::int64_t>{V});
  {
    nb::gil_scoped_release unlocked;
    const qkv::ForkGate::Pass no_fork_meanwhile(model_gate());
    const std::lock_guard<std::mutex> one_at_a_time(self.mu);
    self.model.forward(std::span<const int>(t), self.cache, logits.ptr<float>(), all_logits);
  }
  return to_numpy(std::move(logits));
}

// A sentence encoder (qkv/encoder.hpp); its work buffers are one state, so calls take turns (`mu`).
struct PyEncoder {
  qkv::Encoder enc;
  std::mutex mu;
  explicit PyEncoder(qkv::Encoder e) : enc(std::move(e)) {}
};

F32Array encoder_embed(PyEncoder& self, const std::vector<std::string>& texts, std::int64_t batch) {
  const auto N = static_cast<std::int64_t>(texts.size());
  qkv::check_memory("qkv.Encoder.embed", "embeddings", qkv::bytes_of({N, self.enc.dim()}, 4));
  qkv::Buffer out(qkv::DType::f32, {N, self.enc.dim()});
  {
    nb::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_at_a_time(self.mu);
    self.enc.embed(texts, out.ptr<float>(), batch);
  }
  return to_numpy(std::move(out));
}

// forward_trace as Python data: ([{scores, pattern, head_delta, block_delta, resid, q, k} per
// layer], logits, embed), with the heads in `ablate` ((layer, head, mean?) each) knocked out.
std::tuple<nb::list, F32Array, F32Array> model_trace(PyModel& self, const std::vector<std::int64_t>& tokens,
                                                     const std::vector<std::tuple<int, int, bool>>& ablate) {
  const std::vector<int> t = to_tokens("qkv.Model.trace", tokens);
  std::vector<qkv::HeadAblation> heads;
  for (const auto& [layer, head, mean] : ablate) {
    heads.push_back({layer, head, mean ? qkv::HeadAblation::Kind::mean : qkv::HeadAblation::Kind::zero});
  }
  qkv::Trace tr;
  {
    nb::gil_scoped_release unlocked;
    const qkv::ForkGate::Pass no_fork_meanwhile(model_gate());
    const std::lock_guard<std::mutex> one_at_a_time(self.mu);
    self.model.forward_trace(t, tr, heads);
  }
  nb::list layers;
  for (qkv::LayerTrace& l : tr.layers) {
    nb::dict d;
    d["scores"] = to_numpy(std::move(l.scores));
    d["pattern"] = to_numpy(std::move(l.pattern));
    d["head_delta"] = to_numpy(std::move(l.head_delta));
    d["block_delta"] = to_numpy(std::move(l.block_delta));
    d["resid"] = to_numpy(std::move(l.resid));
    d["q"] = to_numpy(std::move(l.q));
    d["k"] = to_numpy(std::move(l.k));
    layers.append(d);
  }
  return {layers, to_numpy(std::move(tr.logits)), to_numpy(std::move(tr.embed))};
}

// GenerateOptions from generate's arguments; kv_dtype "" (None in Python: the model's choice), "f32",
// "bf16" or "int8". Throws std::invalid_argument (ValueError) naming fn, with the CLI's rules and messages.
qkv::GenerateOptions generate_options(const char* fn, std::int64_t steps, float temperature, float top_p, int top_k,
                                      std::uint64_t seed, const std::string& kv_dtype) {
  qkv::GenerateOptions o;
  o.steps = steps;
  o.sampling.temperature = temperature;
  o.sampling.top_p = top_p;
  o.sampling.top_k = top_k;
  o.sampling.seed = seed;
  if (kv_dtype == "f32") o.kv_dtype = qkv::DType::f32;
  else if (kv_dtype == "bf16") o.kv_dtype = qkv::DType::bf16;
  else if (kv_dtype == "int8") o.kv_dtype = qkv::DType::i8;
  else if (!kv_dtype.empty())
    throw std::invalid_argument(std::string("[") + fn + "] kv_dtype: must be 'f32', 'bf16', 'int8' or None, got '" +
                                kv_dtype + "'");
  qkv::validate_generate_options(o, fn);
  return o;
}

// llama2.c's generation loop; the text comes back as bytes (pieces may split UTF-8 characters).
std::tuple<nb::bytes, std::int64_t, std::int64_t, double, double> model_generate(
    PyModel& self, const qkv::Tokenizer& tok, const std::string& prompt, std::int64_t steps, float temperature,
    float top_p, int top_k, std::uint64_t seed, const std::string& kv_dtype) {
  const qkv::GenerateOptions o = generate_options("qkv.Model.generate", steps, temperature, top_p, top_k, seed, kv_dtype);
  std::string text;
  qkv::GenerateStats st;
  {
    nb::gil_scoped_release unlocked;
    const qkv::ForkGate::Pass no_fork_meanwhile(model_gate());
    const std::lock_guard<std::mutex> one_at_a_time(self.mu);
    st = qkv::generate(self.model, tok, prompt, o, [&text](std::string_view piece) { text += piece; });
  }
  return {nb::bytes(text.data(), text.size()), st.prompt_tokens, st.generated, st.prefill_seconds,
          st.decode_seconds};
}

// generate_batch: the prompts advanced in lockstep; each text as bytes, in order.
std::tuple<std::vector<nb::bytes>, std::int64_t, std::int64_t, double, double> model_generate_batch(
    PyModel& self, const qkv::Tokenizer& tok, const std::vector<std::string>& prompts, std::int64_t steps,
    float temperature, float top_p, int top_k, std::uint64_t seed, const std::string& kv_dtype) {
  const qkv::GenerateOptions o =
      generate_options("qkv.Model.generate_batch", steps, temperature, top_p, top_k, seed, kv_dtype);
  std::vector<std::string> texts;
  qkv::GenerateStats st;
  {
    nb::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_at_a_time(self.mu);
    texts = qkv::generate_batch(self.model, tok, prompts, o, &st);
  }
  std::vector<nb::bytes> out;
  for (const std::string& t : texts) out.emplace_back(t.data(), t.size());
  return {out, st.prompt_tokens, st.generated, st.prefill_seconds, st.decode_seconds};
}

// The safetensors module of the library (src/model/safetensors.hpp), for qkv/safetensors.py:
// {name: (dtype, shape, bytes)} and the metadata; the file is read and validated without the GIL.
nb::tuple safetensors_read(const std::string& path) {
  qkv::detail::StFile f;
  {
    nb::gil_scoped_release unlocked;
    f = qkv::detail::read_safetensors(path, "qkv.safetensors.load_file");
  }
  nb::dict tensors;
  for (const auto& [name, t] : f.tensors)
    tensors[nb::str(name.c_str(), name.size())] =
        nb::make_tuple(t.dtype, nb::tuple(nb::cast(t.shape)), nb::bytes(t.bytes.data(), t.bytes.size()));
  return nb::make_tuple(tensors, nb::cast(f.metadata));
}

// Writes (name, dtype, shape, bytes) tensors in the order given, through the library's atomic writer.
void safetensors_write(const std::string& path,
                       const std::vector<std::tuple<std::string, std::string, std::vector<std::int64_t>, nb::bytes>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<qkv::detail::SafetensorsView> views;
  views.reserve(tensors.size());
  for (const auto& [name, dtype, shape, bytes] : tensors)
    views.push_back({name, dtype, shape, {bytes.c_str(), bytes.size()}});
  nb::gil_scoped_release unlocked;  // `tensors` keeps every bytes object alive meanwhile
  qkv::detail::write_safetensors(path, metadata, views, "qkv.safetensors.save_file");
}


// ---- qkv.inspect (src/inspect/run.hpp): the `qkv inspect` report, computed in this process ----

// A vector handed to NumPy without a copy, shaped `shape` (its product = v.size()).
template <class T>
nb::ndarray<nb::numpy, T> vector_to_numpy(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nb::capsule del(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), del);
}

qkv::inspect::Report inspect_run(const std::string& model, const std::string& tokenizer, const std::string& config,
                                 const std::string& text, const std::vector<std::int64_t>& tokens,
                                 const std::vector<std::string>& ablate, const std::string& ablation_table) {
  namespace qi = qkv::inspect;
  qi::Request r;
  r.names = qi::kPythonArgs;
  r.model = model;
  r.tokenizer = tokenizer;
  r.config = config;
  r.prompt = text;
  if (!tokens.empty()) r.tokens = to_tokens("qkv.inspect", tokens);
  for (const std::string& a : ablate) r.ablate.push_back(qi::parse_ablation(a, r.names));
  if (ablation_table == "on") r.ablation_table = qi::AblationTableMode::on;
  else if (ablation_table == "off") r.ablation_table = qi::AblationTableMode::off;
  else if (ablation_table != "auto")
    throw nb::value_error(("[qkv.inspect] ablation_table: must be 'auto', 'on' or 'off', got '" + ablation_table + "'").c_str());
  nb::gil_scoped_release unlocked;
  return qi::run(r);
}

// One of the report's [L][H·S·S] matrices (pattern or scores) for layer l, as [H, S, S].
nb::ndarray<nb::numpy, float> report_matrix(const qkv::inspect::Report& r, const std::vector<std::vector<float>>& m,
                                            std::int64_t l, const char* what) {
  if (l < 0 || l >= r.L)
    throw nb::index_error(("[qkv.Inspection." + std::string(what) + "] layer: " + std::to_string(l) + " is not in [0, " +
                           std::to_string(r.L) + ")").c_str());
  std::vector<float> copy = m[static_cast<size_t>(l)];
  const auto H = static_cast<size_t>(r.H), S = static_cast<size_t>(r.S);
  return vector_to_numpy(std::move(copy), {H, S, S});
}

// An ablation table's column as [L, H]: p_predicted, loss or the ablated top token's id.
nb::ndarray<nb::numpy, double> report_ablation(const qkv::inspect::Report& r, const std::string& kind,
                                               const std::string& key) {
  if (kind != "zero" && kind != "mean")
    throw nb::value_error(("[qkv.Inspection] kind: '" + kind + "' is not 'zero' or 'mean'").c_str());
  if (!r.ablation) throw nb::value_error("[qkv.Inspection] ablation: the table was not computed (ablation_table='on')");
  const auto& t = kind == "zero" ? r.ablation->zero : r.ablation->mean;
  std::vector<double> v;
  for (const qkv::inspect::AblationEffect& e : t)
    v.push_back(key == "p_predicted" ? e.p_predicted : key == "loss" ? e.loss : static_cast<double>(e.top.id));
  return vector_to_numpy(std::move(v), {static_cast<size_t>(r.L), static_cast<size_t>(r.H)});
}
}  // namespace

NB_MODULE(_qkv, m) {
  m.attr("__version__") = QKV_VERSION;  // CMakeLists.txt's project(VERSION), the one place it is written
  m.doc() = "Native layer of qkv: attention on the CPU over strided arrays. Use the qkv package, not this module.";
  // The errors no argument caused (qkv/types.hpp). A bad argument stays a ValueError (nanobind's
  // translation of std::invalid_argument). FormatError is an OSError, as the file problem it is,
  // and a ValueError, which corrupt files raised before they had a type of their own (the pair of
  // bases io.UnsupportedOperation has).
  nb::exception<qkv::IoError>(m, "IoError", PyExc_OSError).attr("__doc__") =
      "A read or write the system refused during the work (disk full, file size limit, no permission).";
  nb::exception<qkv::FormatError>(m, "FormatError",
                                  nb::make_tuple(nb::handle(PyExc_OSError), nb::handle(PyExc_ValueError)))
      .attr("__doc__") = "A file whose bytes break its format: truncated, not valid JSON, impossible sizes or offsets.";
  nb::exception<qkv::NonFiniteError>(m, "NonFiniteError", PyExc_RuntimeError).attr("__doc__") =
      "Numbers that became NaN or ±inf where a run needs finite ones (training diverged, logits overflowed).";

  m.def("safetensors_read", &safetensors_read, "path"_a,
        "({name: (dtype, shape, bytes)}, metadata) of a safetensors file, every header field validated first.");
  m.def("safetensors_write", &safetensors_write, "path"_a, "tensors"_a, "metadata"_a,
        "Writes [(name, dtype, shape, bytes)] and string metadata to a temporary file renamed over path.");
  m.def("alibi_standard_slopes", &qkv::alibi_standard_slopes, "H"_a,
        "The ALiBi paper's slopes for H heads (as BLOOM and MPT build them), a list of H floats.");
  m.def("check_memory", &qkv::check_memory, "function"_a, "what"_a, "bytes"_a,
        "Raises MemoryError naming `function` and `what` unless `bytes` fit in the memory available now.");
  m.def("available_memory", &qkv::available_memory, "Bytes this process can still get (MemAvailable, cgroup limit).");
  m.def("attention", &attention, "q"_a, "k"_a, "v"_a, "out"_a, "mask"_a.none(), "key_lengths"_a.none(),
        "lse"_a.none(), "pattern"_a.none(), "scale"_a.none(), "causal"_a, "align"_a, "window_left"_a,
        "window_right"_a, "num_threads"_a, "kernel"_a, "dropout_p"_a = 0.0, "seed"_a = 0, "offset"_a = 0,
        "softcap"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
        "sinks"_a.none() = nb::none(), "scores"_a.none() = nb::none(), "scores_stage"_a = "masked",
        "keep_first"_a = 0,
        "Forward attention over [B, H, S, D] arrays into `out` (and `lse`, `pattern`, `scores` when given).\n"
        "Returns (kernel, isa, name) of the kernel that ran.");
  m.def("attention_kvcache", &attention_kvcache, "q"_a, "k_cache"_a, "v_cache"_a, "out"_a, "block_table"_a.none(),
        "k_scale"_a.none(), "v_scale"_a.none(), "key_lengths"_a.none(), "lse"_a.none(), "scale"_a.none(), "causal"_a,
        "align"_a, "window_left"_a, "window_right"_a, "num_threads"_a, "kernel"_a, "softcap"_a.none(),
        "alibi_slopes"_a.none(), "sinks"_a.none(), "keep_first"_a = 0,
        "Attention of q [B, H, Sq, D] against a KV cache [Bc, Sc, Hkv, D] (paged by block_table, int8 with scales).\n"
        "Returns (kernel, isa, name) of the kernel that ran.");
  m.def("attention_varlen", &attention_varlen, "q"_a, "k"_a, "v"_a, "out"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a,
        "lse"_a.none(), "scale"_a.none(), "causal"_a, "align"_a, "window_left"_a, "window_right"_a,
        "num_threads"_a, "kernel"_a, "dropout_p"_a = 0.0, "seed"_a = 0, "offset"_a = 0,
        "softcap"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
        "sinks"_a.none() = nb::none(), "keep_first"_a = 0,
        "Forward attention over packed [T, H, D] sequences delimited by cumulative offsets.\n"
        "Returns (kernel, isa, name) of the kernel that ran.");
  m.def("attention_backward", &attention_backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a, "dq"_a,
        "dk"_a, "dv"_a, "mask"_a.none(), "key_lengths"_a.none(), "scale"_a.none(), "causal"_a, "align"_a,
        "window_left"_a, "window_right"_a, "num_threads"_a, "kernel"_a, "dropout_p"_a = 0.0, "seed"_a = 0,
        "offset"_a = 0,
        "softcap"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
        "sinks"_a.none() = nb::none(), "dsinks"_a.none() = nb::none(), "keep_first"_a = 0,
        "Backward attention: writes dq, dk, dv from dout and the forward's out and lse.\n"
        "Returns (kernel, isa, name) of the kernel that ran.");

  m.def("attention_varlen_backward", &attention_varlen_backward, "q"_a, "k"_a, "v"_a, "out"_a, "dout"_a, "lse"_a,
        "dq"_a, "dk"_a, "dv"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "scale"_a.none(), "causal"_a, "align"_a,
        "window_left"_a, "window_right"_a, "num_threads"_a, "kernel"_a, "dropout_p"_a = 0.0, "seed"_a = 0,
        "offset"_a = 0,
        "softcap"_a.none() = nb::none(), "alibi_slopes"_a.none() = nb::none(),
        "sinks"_a.none() = nb::none(), "dsinks"_a.none() = nb::none(), "keep_first"_a = 0,
        "Backward of attention_varlen over packed [T, H, D] sequences: writes dq, dk, dv.\n"
        "Returns (kernel, isa, name) of the kernel that ran.");

  m.def("dropout_mask", &dropout_mask, "mask"_a, "dropout_p"_a, "seed"_a, "offset"_a,
        "Writes into the uint8/bool [B, H, Sq, Skv] `mask` the keep mask (1 kept) of an attention call\n"
        "with this dropout_p, seed and offset (qkv/attention.hpp).");

  nb::class_<qkv::AttentionKvCache>(m, "AttentionKvCache",
                                    "The KV cache of include/qkv/kv_cache.hpp (use qkv.KVCache).")
      .def(
          "__init__",
          [](qkv::AttentionKvCache* self, std::int64_t batch, std::int64_t max_len, std::int64_t kv_heads,
             std::int64_t head_dim, const std::string& dtype, std::int64_t value_dim, std::int64_t block_size) {
            new (self) qkv::AttentionKvCache(batch, max_len, kv_heads, head_dim, cache_dtype(dtype), value_dim,
                                             block_size);
          },
          "batch"_a, "max_len"_a, "kv_heads"_a, "head_dim"_a, "dtype"_a, "value_dim"_a, "block_size"_a,
          "A zeroed cache; dtype 'float32' | 'bfloat16' | 'float16' | 'int8', value_dim 0: head_dim, "
          "block_size 0: contiguous, else a power of two (paged).")
      .def("storage", &kv_cache_storage,
           "The cache's arrays by name (k, v, lengths; k_scale, v_scale, block_table when it has them): "
           "writable NumPy views of its memory, bfloat16 as uint16 bits.")
      .def("append", &kv_cache_append, "k_new"_a, "v_new"_a,
           "Writes k_new [B, Snew, Hkv, D], v_new [B, Snew, Hkv, Dv] after each sequence's tokens (int8: "
           "quantised per token and head) and advances the lengths.")
      .def("append_to", &kv_cache_append_to, "b"_a, "k_new"_a, "v_new"_a,
           "Writes k_new [Snew, Hkv, D], v_new [Snew, Hkv, Dv] after sequence b's tokens and advances its "
           "length alone.")
      .def("reset", nb::overload_cast<>(&qkv::AttentionKvCache::reset), "Every length to 0.")
      .def("reset", nb::overload_cast<std::int64_t>(&qkv::AttentionKvCache::reset), "b"_a,
           "Sequence b's length to 0.")
      .def("attend", &kv_cache_attend, "q"_a, "out"_a, "lse"_a.none(), "scale"_a.none(), "causal"_a, "align"_a,
           "window_left"_a, "window_right"_a, "num_threads"_a, "kernel"_a, "softcap"_a.none(),
           "alibi_slopes"_a.none(), "sinks"_a.none(), "keep_first"_a,
           "out [B, H, Sq, Dv] (and lse [B, H, Sq]) <- attention of q [B, H, Sq, D] against every token held.\n"
           "Returns (kernel, isa, name) of the kernel that ran.")
      .def_prop_ro("max_len", &qkv::AttentionKvCache::max_len,
                   "Tokens a sequence can hold (paged: rounded up to whole blocks).");

  nb::class_<Mha>(m, "MultiHeadAttention",
                  "The multi-head attention block of include/qkv/mha.hpp (use qkv.MultiHeadAttention).")
      .def("__init__", &mha_init, "d_model"_a, "d_source"_a, "n_heads"_a, "n_kv_heads"_a, "d_head"_a, "d_value"_a,
           "bias"_a, "A block with zero weights; 0 for d_source, n_kv_heads, d_value means the default.")
      .def("init_random", &Mha::init_random, "seed"_a,
           "Weights ~ N(0, 1/fan_in), biases ~ N(0, 0.01^2), from a fixed seed.")
      .def(
          "config",
          [](const Mha& self) {
            const qkv::MhaConfig& c = self.config();
            return std::make_tuple(c.d_model, c.d_source, c.n_heads, c.n_kv_heads, c.d_head, c.d_value, c.bias);
          },
          "(d_model, d_source, n_heads, n_kv_heads, d_head, d_value, bias), defaults resolved.")
      .def("weights", &mha_weights, "The eight weight arrays by name, writable views of the block's memory.")
      .def("forward", &mha_forward, "x"_a, "source"_a.none(), "delta"_a, "head_delta"_a.none(), "pattern"_a.none(),
           "mask"_a.none(), "key_lengths"_a.none(), "scale"_a.none(), "causal"_a, "align"_a, "window_left"_a,
           "window_right"_a, "num_threads"_a, "kernel"_a,
           "Writes delta [B, S, d_model] (and head_delta [B, H, S, d_model], pattern [B, H, S, Skv]).");

  nb::class_<qkv::Tokenizer>(m, "Tokenizer", "A tokenizer of any format qkv reads (use qkv.Tokenizer).")
      .def_static("load", &qkv::Tokenizer::load, "path"_a, "vocab_size"_a,
                  "Reads a llama2.c tokenizer.bin, qkv train's tokenizer.json, a Hugging Face WordPiece or BPE "
                  "tokenizer.json or GPT-2's vocab.json + merges.txt (told apart by content; a folder: the "
                  "tokenizer in it) for a vocabulary of vocab_size tokens.")
      .def("encode", &qkv::Tokenizer::encode, "text"_a, "bos"_a, "eos"_a, "Token ids of text in the file's format.")
      .def_prop_ro("format",
                   [](const qkv::Tokenizer& t) {
                     static const char* const names[] = {"llama2c", "qkv_json", "wordpiece", "hf_bpe"};  // Format's order
                     return names[static_cast<int>(t.format())];
                   })
      .def_prop_ro("bos_id", &qkv::Tokenizer::bos_id)
      .def_prop_ro("eos_id", &qkv::Tokenizer::eos_id)
      .def(
          "decode",
          [](const qkv::Tokenizer& t, int prev, int token) {
            if (token < 0 || token >= t.vocab_size() || prev < 0 || prev >= t.vocab_size())
              throw nb::value_error(("[qkv.Tokenizer.decode] token: must be in [0, " +
                                     std::to_string(t.vocab_size()) + "), got prev " + std::to_string(prev) +
                                     ", token " + std::to_string(token))
                                        .c_str());
            const std::string_view p = t.decode(prev, token);
            return nb::bytes(p.data(), p.size());
          },
          "prev"_a, "token"_a, "The bytes of token after prev (leading space dropped after BOS; <0xXX> → the byte).")
      .def_prop_ro("vocab_size", &qkv::Tokenizer::vocab_size);

  nb::class_<PyModel>(m, "Model", "A transformer with its KV cache (use qkv.Model).")
      .def("__init__",
           [](PyModel* self, const std::string& path, const std::string& config, const std::string& weights,
              const std::string& gemm_inputs) {
             qkv::ModelOptions o;
             if (weights == "bf16") {
               o.weights = qkv::DType::bf16;
             } else if (weights != "f32") {
               throw nb::value_error(("[qkv.Model.load] weights: must be 'f32' or 'bf16', got '" + weights + "'").c_str());
             }
             if (gemm_inputs == "bf16") {
               o.gemm_inputs = qkv::DType::bf16;
             } else if (gemm_inputs != "f32") {
               throw nb::value_error(
                   ("[qkv.Model.load] gemm_inputs: must be 'f32' or 'bf16', got '" + gemm_inputs + "'").c_str());
             }
             if (o.gemm_inputs == qkv::DType::bf16 && o.weights != qkv::DType::bf16)
               throw nb::value_error(
                   ("[qkv.Model.load] gemm_inputs: 'bf16' needs weights='bf16', got weights='" + weights + "'").c_str());
             nb::gil_scoped_release unlocked;
             qkv::Weights w = qkv::load_weights(path, config);
             new (self) PyModel(std::move(w), o);
           },
           "path"_a, "config"_a, "weights"_a, "gemm_inputs"_a,
           "Loads a llama2.c checkpoint or a .safetensors file (+ config JSON); weights stored as f32 or bf16, "
           "prefill GEMM inputs (and the KV cache) f32 or bf16.")
      .def("config_json", [](const PyModel& self) { return qkv::config_to_json(self.model.config(), false); })
      .def("num_params", [](const PyModel& self) { return self.model.weights().num_params(); })
      .def_prop_ro("position",
                   [](PyModel& self) {
                     nb::gil_scoped_release unlocked;
                     const qkv::ForkGate::Pass no_fork_meanwhile(model_gate());
                     const std::lock_guard<std::mutex> one_at_a_time(self.mu);
                     return self.cache.len;
                   })
      .def("reset",
           [](PyModel& self) {
             nb::gil_scoped_release unlocked;
             const qkv::ForkGate::Pass no_fork_meanwhile(model_gate());
             const std::lock_guard<std::mutex> one_at_a_time(self.mu);
             self.cache.clear();
           })
      .def("forward", &model_forward, "tokens"_a, "all_logits"_a,
           "Runs tokens after the cached positions; logits [V] for the last, or [S, V].")
      .def("trace", &model_trace, "tokens"_a, "ablate"_a,
           "The whole sequence from position 0, every layer recorded; ablate: (layer, head, mean) heads knocked out.")
      .def("generate_batch", &model_generate_batch, "tokenizer"_a, "prompts"_a, "steps"_a, "temperature"_a,
           "top_p"_a, "top_k"_a, "seed"_a, "kv_dtype"_a,
           "generate_batch: ([text bytes], prompt tokens, generated, prefill s, decode s), summed over the prompts.")
      .def("generate", &model_generate, "tokenizer"_a, "prompt"_a, "steps"_a, "temperature"_a, "top_p"_a,
           "top_k"_a, "seed"_a, "kv_dtype"_a, "llama2.c's generation: (text bytes, prompt tokens, generated, prefill s, decode s).");

  nb::class_<PyEncoder>(m, "Encoder", "A BERT-family sentence encoder (use qkv.Encoder).")
      .def("__init__",
           [](PyEncoder* self, const std::string& dir, const std::string& dtype, int num_threads) {
             qkv::EncoderOptions o;
             if (dtype == "bf16") o.dtype = qkv::DType::bf16;
             else if (dtype != "f32")
               throw nb::value_error(("[qkv.Encoder.load] dtype: must be 'f32' or 'bf16', got '" + dtype + "'").c_str());
             o.num_threads = num_threads;
             nb::gil_scoped_release unlocked;
             new (self) PyEncoder(qkv::Encoder::load(dir, o));
           },
           "dir"_a, "dtype"_a, "num_threads"_a, "Loads a sentence-transformers folder.")
      .def("embed", &encoder_embed, "texts"_a, "batch"_a, "Embeddings [N, dim] float32, row i = texts[i].")
      .def("tokenize", [](const PyEncoder& self, const std::string& text) { return self.enc.tokenize(text); },
           "text"_a, "[CLS] WordPiece ids [SEP], cut to max_seq_length.")
      .def("config_json", [](const PyEncoder& self) { return qkv::config_to_json(self.enc.config(), false); })
      .def_prop_ro("dim", [](const PyEncoder& self) { return self.enc.dim(); })
      .def_prop_ro("max_seq_length", [](const PyEncoder& self) { return self.enc.max_seq_length(); })
      .def_prop_ro("pooling", [](const PyEncoder& self) {
        return std::string(self.enc.pooling() == qkv::Pooling::mean ? "mean"
                           : self.enc.pooling() == qkv::Pooling::cls ? "cls" : "max");
      })
      .def_prop_ro("normalize", [](const PyEncoder& self) { return self.enc.normalize(); });

  using Report = qkv::inspect::Report;
  nb::class_<Report>(m, "InspectReport", "What `qkv inspect` shows, computed in this process (use qkv.inspect).")
      .def_ro("S", &Report::S)
      .def_ro("L", &Report::L)
      .def_ro("H", &Report::H)
      .def_ro("prompt", &Report::prompt)
      .def_ro("bidirectional", &Report::bidirectional)
      .def("tokens", [](const Report& r) {
             nb::list out;
             for (const auto& t : r.tokens) out.append(nb::make_tuple(t.id, nb::bytes(t.text.data(), t.text.size()), t.special));
             return out;
           }, "[(id, piece bytes, special)] per position.")
      .def("next_tokens", [](const Report& r) {
             nb::list out;
             for (const auto& t : r.next_tokens)
               out.append(nb::make_tuple(t.id, nb::bytes(t.text.data(), t.text.size()), t.prob, t.logit));
             return out;
           }, "[(id, piece bytes, prob, logit)], the ten likeliest next tokens.")
      .def("pattern", [](const Report& r, std::int64_t l) { return report_matrix(r, r.pattern, l, "pattern"); }, "layer"_a,
           "Layer l's weights [H, S, S] float32, row = query.")
      .def("scores", [](const Report& r, std::int64_t l) { return report_matrix(r, r.scores, l, "scores"); }, "layer"_a,
           "Layer l's raw scores [H, S, S] float32, -inf where masked.")
      .def("baseline_pattern", [](const Report& r, std::int64_t l) -> std::optional<nb::ndarray<nb::numpy, float>> {
             if (r.baseline_pattern.empty()) return std::nullopt;
             return report_matrix(r, r.baseline_pattern, l, "baseline_pattern");
           }, "layer"_a, "With heads ablated: layer l's weights [H, S, S] without the ablation; else None.")
      .def("delta_norm", [](const Report& r) {
             std::vector<double> v;
             for (const auto& layer : r.heads)
               for (const auto& h : layer) v.insert(v.end(), h.delta_norm.begin(), h.delta_norm.end());
             return vector_to_numpy(std::move(v), {static_cast<size_t>(r.L), static_cast<size_t>(r.H), static_cast<size_t>(r.S)});
           }, "|Δe_h| per token [L, H, S].")
      .def("block_delta_norm", [](const Report& r) {
             std::vector<double> v;
             for (const auto& layer : r.block_delta_norm) v.insert(v.end(), layer.begin(), layer.end());
             return vector_to_numpy(std::move(v), {static_cast<size_t>(r.L), static_cast<size_t>(r.S)});
           }, "|Σ_h Δe_h| per token [L, S].")
      .def("attribution", [](const Report& r) -> std::optional<nb::ndarray<nb::numpy, double>> {
             if (!r.attribution) return std::nullopt;
             std::vector<double> v;
             for (const auto& t : r.attribution->tokens) v.insert(v.end(), t.heads.begin(), t.heads.end());
             return vector_to_numpy(std::move(v), {r.attribution->tokens.size(), static_cast<size_t>(r.L), static_cast<size_t>(r.H)});
           }, "[T, L, H] each head's push on next token t's logit, or None (an encoder).")
      .def("has_ablation", [](const Report& r) { return r.ablation.has_value(); })
      .def("ablation", &report_ablation, "kind"_a, "key"_a, "[L, H] of the ablation table: p_predicted, loss or top (ids).")
      .def("json", [](const Report& r) { return qkv::inspect::to_json(r, qkv::inspect::Encoding::kJson); },
           "The JSON document `qkv inspect --format json` writes (docs/inspect.md).")
      .def("html", [](const Report& r) {
             nb::gil_scoped_release unlocked;
             return qkv::inspect::render_page(r);
           }, "The page `qkv inspect` writes as index.html (self-contained).")
      .def("write_page", [](const Report& r, const std::string& dir) {
             nb::gil_scoped_release unlocked;
             return qkv::inspect::write_page(r, dir);
           }, "dir"_a, "Writes dir/index.html and dir/layer_<l>.png as `qkv inspect` does; returns the page's path.");
  m.def("inspect", &inspect_run, "model"_a, "tokenizer"_a, "config"_a, "text"_a, "tokens"_a, "ablate"_a,
        "ablation_table"_a, "One `qkv inspect` run in this process (src/inspect/run.hpp).");

  m.def("set_num_threads", &qkv::set_num_threads, "n"_a,
        "Threads the kernels use when a call does not say (default: QKV_NUM_THREADS, else all cores).");
  m.def("num_threads", &qkv::num_threads, "Threads the kernels use when a call does not say.");
  m.def(
      "cpu_isa", [] { return std::string(qkv::isa_name(qkv::cpu_isa())); },
      "The best instruction set this CPU supports, lowest first: 'scalar', 'avx2', 'avx512', 'avx512_vnni' (AVX-512 "
      "with VNNI: the int8 KV-cache decode) or 'avx512_bf16' (also AVX512-BF16: the bf16 kernels).");
  m.def(
      "active_isa", [] { return std::string(qkv::isa_name(qkv::active_isa())); },
      "The instruction set the kernels use (cpu_isa() unless QKV_ISA or set_isa() chose a lower one).");
  m.def(
      "set_isa", [](const std::string& isa) { qkv::set_isa(to_isa(isa)); }, "isa"_a,
      "Restricts the kernels to `isa` ('scalar', 'avx2', 'avx512', 'avx512_vnni', 'avx512_bf16'); raises if the CPU "
      "lacks it.");
}
