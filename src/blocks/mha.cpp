// The multi-head attention block (include/qkv/mha.hpp): blocks::attention_block with its
// projections on blocks::linear_forward (the core on qkv::attention, each head's Δe^h from its own
// column block of W_O); the backward on qkv::attention_backward.
//
// Scratch, all f32 row-major (N = B·S, Nkv = B·Skv):
//   qp  [N,   H·Dh]    = x · w_qᵀ + b_q      read by attention as [B, H, S, Dh] through strides
//   kp  [Nkv, Hkv·Dh]  = s · w_kᵀ + b_k      read as [B, Hkv, Skv, Dh]
//   vp  [Nkv, Hkv·Dv]  = s · w_vᵀ + b_v      read as [B, Hkv, Skv, Dv]   (value-down)
//   ao  [N,   H·Dv]    attention output, written as [B, H, S, Dv] through strides, so that row n
//                      is the concatenation over heads that W_O (the stapled value-ups) expects
#include "qkv/mha.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "blocks/attention_block.hpp"
#include "blocks/embedding.hpp"  // residual_forward
#include "blocks/linear.hpp"
#include "qkv/memory.hpp"

namespace qkv {
namespace {

constexpr const char* kCtor = "qkv::MultiHeadAttention";
constexpr const char* kFwd = "qkv::MultiHeadAttention::forward";
constexpr const char* kBwd = "qkv::MultiHeadAttention::backward";

std::int64_t mul(std::int64_t a, std::int64_t b, const char* what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) fail(kCtor, std::string(what) + ": size overflows 64 bits");
  return r;
}

void require_positive(std::int64_t v, const char* what) {
  if (v <= 0) fail(kCtor, std::string("config.") + what + ": must be > 0 (got " + std::to_string(v) + ")");
}

// A contiguous f32 copy of a rank-3 view (or the view itself when already contiguous).
const float* packed(const View& v, std::vector<float>& scratch) {
  if (v.is_contiguous()) return v.ptr<const float>();
  scratch.resize(static_cast<std::size_t>(v.numel()));
  std::size_t n = 0;
  for (std::int64_t a = 0; a < v.dim(0); ++a)
    for (std::int64_t b = 0; b < v.dim(1); ++b)
      for (std::int64_t c = 0; c < v.dim(2); ++c) scratch[n++] = v.ptr<const float>()[v.offset(a, b, c)];
  return scratch.data();
}

std::string dims(std::initializer_list<std::int64_t> d) {
  std::string s = "[";
  for (auto x : d) s += (s.size() > 1 ? ", " : "") + std::to_string(x);
  return s + "]";
}

// Conservative byte span [first element, last element] of a view, for overlap checks.
bool overlaps(const View& a, const View& b) {
  if (!a.data || !b.data || a.numel() == 0 || b.numel() == 0) return false;
  auto span = [](const View& v, std::uintptr_t* lo, std::uintptr_t* hi) {
    std::int64_t last = 0;
    for (int i = 0; i < v.rank; ++i) last += (v.dim(i) - 1) * v.stride(i);
    *lo = reinterpret_cast<std::uintptr_t>(v.data);
    *hi = *lo + static_cast<std::uintptr_t>(last + 1) * dtype_size(v.dtype);
  };
  std::uintptr_t a0, a1, b0, b1;
  span(a, &a0, &a1);
  span(b, &b0, &b1);
  return a0 < b1 && b0 < a1;
}

// Validation of one call, shared by forward and backward (fn names which).
struct Call {
  const char* fn = nullptr;
  std::int64_t B = 0, S = 0, Skv = 0, N = 0, Nkv = 0;
  View s;  // the key/value input: source, or x itself

  void expect(bool ok, const char* name, const std::string& want, const View& got) const {
    if (!ok) fail(fn, std::string(name) + ": expected " + want + ", got " + dtype_name(got.dtype) + got.shape_str());
  }
  // Negative strides or dims are rejected before any offset is computed.
  void check_sane(const char* name, const View& v) const {
    for (int i = 0; i < v.rank; ++i)
      if (v.dim(i) < 0 || v.stride(i) < 0)
        fail(fn, std::string(name) + ": negative dimension or stride in " + v.shape_str());
    if (v.numel() > 0 && !v.data) fail(fn, std::string(name) + ": null data pointer for " + v.shape_str());
  }
  // A contiguous f32 output of exactly `want`, overlapping none of `inputs`.
  void check_output(const char* name, const View& v, std::initializer_list<std::int64_t> want,
                    std::initializer_list<const View*> inputs) const {
    check_sane(name, v);
    checked_numel(fn, name, std::vector<std::int64_t>(want), 4);
    bool ok = v.rank == static_cast<int>(want.size()) && v.dtype == DType::f32 && v.is_contiguous();
    int i = 0;
    for (auto w : want) ok = ok && v.dim(i++) == w;
    expect(ok, name, "contiguous f32 " + dims(want), v);
    for (const View* in : inputs)
      if (overlaps(v, *in)) fail(fn, std::string(name) + ": output memory overlaps an input or another output");
  }
};

Call check_inputs(const char* fn, const MhaConfig& c, const View& x, const std::optional<View>& source) {
  Call k;
  k.fn = fn;
  k.check_sane("x", x);
  k.expect(x.rank == 3 && x.dtype == DType::f32 && x.dim(2) == c.d_model, "x",
           "f32 [B, S, d_model = " + std::to_string(c.d_model) + "]", x);
  k.B = x.dim(0), k.S = x.dim(1);
  if (!source && c.d_source != c.d_model)
    fail(fn, "source: required, because d_source " + std::to_string(c.d_source) + " differs from d_model " +
                 std::to_string(c.d_model) + " (a cross-attention block)");
  k.s = source ? *source : x;
  if (source) {
    k.check_sane("source", k.s);
    k.expect(k.s.rank == 3 && k.s.dtype == DType::f32 && k.s.dim(0) == k.B && k.s.dim(2) == c.d_source, "source",
             "f32 [B = " + std::to_string(k.B) + ", Skv, d_source = " + std::to_string(c.d_source) + "]", k.s);
  }
  k.Skv = k.s.dim(1);
  // Every scratch buffer is [N or Nkv, ≤ max width]: their element counts must fit.
  const std::int64_t wide = std::max({c.d_model, c.d_source, c.n_heads * std::max(c.d_head, c.d_value)});
  k.N = checked_numel(fn, "x", {k.B, k.S, wide}, 4) / wide;
  k.Nkv = checked_numel(fn, "source", {k.B, k.Skv, wide}, 4) / wide;
  return k;
}

// The forward's intermediate tensors (see the scratch table at the top of this file).
struct Activations {
  std::vector<float> xs, ss;  // packed copies of strided x / source
  const float* xp = nullptr;  // x, contiguous [N, d_model]
  const float* sp = nullptr;  // source, contiguous [Nkv, d_source]
  Buffer qp, kp, vp, ao, lse;
};

// The block's projections on blocks::linear_forward (oneDNN's sgemm), f32 throughout: q from x,
// k and v from the source (x itself for self-attention), W_O from ao into delta.
struct LinearProjections final : blocks::AttentionProjections {
  const MultiHeadAttention& m;
  const Call& k;
  Activations& a;
  LinearProjections(const MultiHeadAttention& mha, const Call& call, Activations& act) : m(mha), k(call), a(act) {}
  blocks::QkvRows qkv(DType) override {
    const MhaConfig& c = m.config();
    const std::int64_t H = c.n_heads, Hkv = c.n_kv_heads, Dh = c.d_head, Dv = c.d_value;
    blocks::linear_forward(a.xp, m.w_q.ptr<float>(), c.bias ? m.b_q.ptr<float>() : nullptr, a.qp.ptr<float>(), k.N,
                           c.d_model, H * Dh);
    if (k.Nkv > 0) {
      blocks::linear_forward(a.sp, m.w_k.ptr<float>(), c.bias ? m.b_k.ptr<float>() : nullptr, a.kp.ptr<float>(), k.Nkv,
                             c.d_source, Hkv * Dh);
      blocks::linear_forward(a.sp, m.w_v.ptr<float>(), c.bias ? m.b_v.ptr<float>() : nullptr, a.vp.ptr<float>(), k.Nkv,
                             c.d_source, Hkv * Dv);
    }
    return {a.qp.data(), a.kp.data(), a.vp.data(), H * Dh, Hkv * Dh, Hkv * Dv, DType::f32};
  }
  void* att() override { return a.ao.data(); }
  DType att_dtype() const override { return DType::f32; }
  // ---- value-up: Δe = ao · W_Oᵀ + b_o, the stapled value-ups of all heads in one product
  void out(std::int64_t n, float* y, float beta) override {
    const MhaConfig& c = m.config();
    blocks::linear_forward(a.ao.ptr<float>(), m.w_o.ptr<float>(), c.bias ? m.b_o.ptr<float>() : nullptr, y, n,
                           c.n_heads * c.d_value, c.d_model, beta);
  }
};

// The block (blocks::attention_block) on x and the source: the forward writes delta (and each
// head's Δe^h into head_delta, the pattern); the backward's recomputation stops before W_O
// (delta null) and keeps the logsumexp.
void run_block(const MultiHeadAttention& m, const Call& k, const View& x, bool has_source, const AttentionOptions& opt,
               float* delta, float* head_delta, const std::optional<View>& pattern, bool want_lse, Activations& a) {
  const MhaConfig& c = m.config();
  const std::int64_t H = c.n_heads, Hkv = c.n_kv_heads, Dh = c.d_head, Dv = c.d_value;
  a.xp = packed(x, a.xs);
  a.sp = has_source ? packed(k.s, a.ss) : a.xp;
  check_memory(k.fn, "projections q, k, v and the attention output",
               bytes_of({k.N, H * (Dh + Dv)}, 4) + bytes_of({k.Nkv, Hkv * (Dh + Dv)}, 4));
  a.qp = Buffer(DType::f32, {k.N, H * Dh});
  a.kp = Buffer(DType::f32, {k.Nkv, Hkv * Dh});
  a.vp = Buffer(DType::f32, {k.Nkv, Hkv * Dv});
  a.ao = Buffer(DType::f32, {k.N, H * Dv});
  blocks::AttentionBlockCall call;
  call.B = k.B;
  call.S = k.S;
  call.Skv = k.Skv;
  call.shape = c;
  call.opt = opt;
  call.y = delta;
  if (want_lse) {
    a.lse = Buffer(DType::f32, {k.B, H, k.S});
    call.taps.lse = a.lse.view();
  }
  if (pattern) call.taps.pattern = *pattern;
  call.taps.head_delta = head_delta;
  call.taps.wo = m.w_o.ptr<float>();
  LinearProjections proj(m, k, a);
  try {
    blocks::attention_block(proj, call);
  } catch (const std::invalid_argument& e) {
    // An option that does not fit (a mask of the wrong shape, …): say which block call it was.
    fail(k.fn, std::string("opt: ") + e.what());
  }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MhaConfig& config) : cfg_(config) {
  require_positive(cfg_.d_model, "d_model");
  require_positive(cfg_.n_heads, "n_heads");
  require_positive(cfg_.d_head, "d_head");
  for (auto [v, name] : {std::pair{cfg_.d_source, "d_source"}, std::pair{cfg_.n_kv_heads, "n_kv_heads"},
                         std::pair{cfg_.d_value, "d_value"}})
    if (v < 0) fail(kCtor, std::string("config.") + name + ": must be ≥ 0 (0 = default), got " + std::to_string(v));
  if (cfg_.d_source == 0) cfg_.d_source = cfg_.d_model;
  if (cfg_.n_kv_heads == 0) cfg_.n_kv_heads = cfg_.n_heads;
  if (cfg_.d_value == 0) cfg_.d_value = cfg_.d_head;
  if (cfg_.n_heads % cfg_.n_kv_heads != 0)
    fail(kCtor, "config.n_kv_heads: must divide n_heads (got n_heads " + std::to_string(cfg_.n_heads) +
                    ", n_kv_heads " + std::to_string(cfg_.n_kv_heads) + ")");
  const std::int64_t hq = mul(cfg_.n_heads, cfg_.d_head, "n_heads·d_head");
  const std::int64_t hk = mul(cfg_.n_kv_heads, cfg_.d_head, "n_kv_heads·d_head");
  const std::int64_t hv = mul(cfg_.n_kv_heads, cfg_.d_value, "n_kv_heads·d_value");
  const std::int64_t ho = mul(cfg_.n_heads, cfg_.d_value, "n_heads·d_value");
  mul(mul(hq, cfg_.d_model, "w_q"), 4, "w_q");
  mul(mul(hk, cfg_.d_source, "w_k"), 4, "w_k");
  mul(mul(hv, cfg_.d_source, "w_v"), 4, "w_v");
  mul(mul(ho, cfg_.d_model, "w_o"), 4, "w_o");
  // Sized by the caller's config: d_model = 40000 asks for 25.6 GB; refused, not killed.
  const std::int64_t nb = cfg_.bias ? 1 : 0;
  check_memory(kCtor, nb ? "weights w_q, w_k, w_v, w_o and biases" : "weights w_q, w_k, w_v, w_o", weight_bytes());
  w_q = Buffer(DType::f32, {hq, cfg_.d_model});
  w_k = Buffer(DType::f32, {hk, cfg_.d_source});
  w_v = Buffer(DType::f32, {hv, cfg_.d_source});
  w_o = Buffer(DType::f32, {cfg_.d_model, ho});
  b_q = Buffer(DType::f32, {nb * hq});
  b_k = Buffer(DType::f32, {nb * hk});
  b_v = Buffer(DType::f32, {nb * hv});
  b_o = Buffer(DType::f32, {nb * cfg_.d_model});
}

void MultiHeadAttention::init_random(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto fill = [&rng](Buffer& b, double std) {
    std::normal_distribution<float> dist(0.0f, static_cast<float>(std));
    for (std::int64_t i = 0; i < b.numel(); ++i) b.ptr<float>()[i] = dist(rng);
  };
  fill(w_q, 1.0 / std::sqrt(static_cast<double>(cfg_.d_model)));
  fill(w_k, 1.0 / std::sqrt(static_cast<double>(cfg_.d_source)));
  fill(w_v, 1.0 / std::sqrt(static_cast<double>(cfg_.d_source)));
  fill(w_o, 1.0 / std::sqrt(static_cast<double>(cfg_.n_heads * cfg_.d_value)));
  for (Buffer* b : {&b_q, &b_k, &b_v, &b_o}) fill(*b, 0.01);
}

std::uint64_t MultiHeadAttention::weight_bytes() const {
  const std::int64_t hq = cfg_.n_heads * cfg_.d_head, hk = cfg_.n_kv_heads * cfg_.d_head;
  const std::int64_t hv = cfg_.n_kv_heads * cfg_.d_value, ho = cfg_.n_heads * cfg_.d_value;
  return bytes_of({hq, cfg_.d_model}, 4) + bytes_of({hk + hv, cfg_.d_source}, 4) + bytes_of({cfg_.d_model, ho}, 4) +
         (cfg_.bias ? bytes_of({hq + hk + hv + cfg_.d_model}, 4) : 0);
}

MhaGrads MultiHeadAttention::make_grads() const {
  check_memory("qkv::MultiHeadAttention::make_grads", "gradients shaped like the weights", weight_bytes());
  MhaGrads g;
  g.w_q = Buffer(DType::f32, w_q.shape());
  g.w_k = Buffer(DType::f32, w_k.shape());
  g.w_v = Buffer(DType::f32, w_v.shape());
  g.w_o = Buffer(DType::f32, w_o.shape());
  g.b_q = Buffer(DType::f32, b_q.shape());
  g.b_k = Buffer(DType::f32, b_k.shape());
  g.b_v = Buffer(DType::f32, b_v.shape());
  g.b_o = Buffer(DType::f32, b_o.shape());
  return g;
}

void MultiHeadAttention::forward(const View& x, const std::optional<View>& source, const AttentionOptions& opt,
                                 const View& delta, const std::optional<View>& head_delta,
                                 const std::optional<View>& pattern) const {
  const std::int64_t dm = cfg_.d_model, H = cfg_.n_heads;
  // ---- validation: everything the caller passed, before any work
  const Call k = check_inputs(kFwd, cfg_, x, source);
  const std::int64_t B = k.B, S = k.S, Skv = k.Skv;
  k.check_output("delta", delta, {B, S, dm}, {&x, &k.s});
  if (head_delta) k.check_output("head_delta", *head_delta, {B, H, S, dm}, {&x, &k.s, &delta});
  if (pattern) {
    k.check_sane("pattern", *pattern);
    k.expect(pattern->rank == 4 && (pattern->dtype == DType::f32 || pattern->dtype == DType::f64) && pattern->dim(0) == B &&
                 pattern->dim(1) == H && pattern->dim(2) == S && pattern->dim(3) == Skv,
             "pattern", "f32 or f64 " + dims({B, H, S, Skv}), *pattern);
    if (overlaps(*pattern, x) || overlaps(*pattern, k.s) || overlaps(*pattern, delta) ||
        (head_delta && overlaps(*pattern, *head_delta)))
      fail(kFwd, "pattern: output memory overlaps x, source, delta or head_delta");
  }
  if (k.N == 0) return;

  // Δe, and each head's own Δe^h = ao[:, h·Dv:(h+1)·Dv] · (W_O^h)ᵀ (W_O^h = columns h·Dv … (h+1)·Dv of W_O)
  Activations a;
  run_block(*this, k, x, source.has_value(), opt, delta.ptr<float>(), head_delta ? head_delta->ptr<float>() : nullptr,
            pattern, false, a);
}

// In the forward pass Δe = ao·W_Oᵀ + b_o, ao = attention(q, k, v), q = x·W_Qᵀ + b_Q, k = s·W_Kᵀ + b_K,
// v = s·W_Vᵀ + b_V. So, walking back from d_delta:
//   dao = d_delta·W_O,  dW_O += d_deltaᵀ·ao,  db_o += Σ_n d_delta
//   dq, dk, dv = attention_backward(…, dao)
//   dx = dq·W_Q (+ dk·W_K + dv·W_V when s is x);  d_source = dk·W_K + dv·W_V
//   dW_Q += dqᵀ·x,  dW_K += dkᵀ·s,  dW_V += dvᵀ·s,  and each bias collects its column sums.
void MultiHeadAttention::backward(const View& x, const std::optional<View>& source, const AttentionOptions& opt,
                                  const View& d_delta, const View& dx, const std::optional<View>& d_source,
                                  MhaGrads& grads) const {
  const std::int64_t dm = cfg_.d_model, ds = cfg_.d_source, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads, Dh = cfg_.d_head,
                     Dv = cfg_.d_value;
  const Call k = check_inputs(kBwd, cfg_, x, source);
  const std::int64_t B = k.B, S = k.S, Skv = k.Skv;
  k.check_sane("d_delta", d_delta);
  k.expect(d_delta.rank == 3 && d_delta.dtype == DType::f32 && d_delta.dim(0) == B && d_delta.dim(1) == S && d_delta.dim(2) == dm,
           "d_delta", "f32 " + dims({B, S, dm}), d_delta);
  k.check_output("dx", dx, {B, S, dm}, {&x, &k.s, &d_delta});
  if (source.has_value() != d_source.has_value())
    fail(kBwd, std::string("d_source: ") + (source ? "required with a source (cross-attention)" : "given without a source"));
  if (d_source) k.check_output("d_source", *d_source, {B, Skv, ds}, {&x, &k.s, &d_delta, &dx});
  const std::pair<const char*, std::pair<const Buffer*, const Buffer*>> pairs[] = {
      {"grads.w_q", {&grads.w_q, &w_q}}, {"grads.w_k", {&grads.w_k, &w_k}}, {"grads.w_v", {&grads.w_v, &w_v}},
      {"grads.w_o", {&grads.w_o, &w_o}}, {"grads.b_q", {&grads.b_q, &b_q}}, {"grads.b_k", {&grads.b_k, &b_k}},
      {"grads.b_v", {&grads.b_v, &b_v}}, {"grads.b_o", {&grads.b_o, &b_o}}};
  for (const auto& [name, gw] : pairs)
    if (gw.first->dtype() != DType::f32 || gw.first->shape() != gw.second->shape())
      fail(kBwd, std::string(name) + ": expected f32 " + gw.second->view().shape_str() + " (use make_grads()), got " +
                     dtype_name(gw.first->dtype()) + (gw.first->shape().empty() ? "[]" : gw.first->view().shape_str()));
  if (k.N == 0) {
    if (d_source) std::fill_n(d_source->ptr<float>(), k.Nkv * ds, 0.0f);
    return;
  }

  Activations a;
  run_block(*this, k, x, source.has_value(), opt, nullptr, nullptr, std::nullopt, true, a);
  std::vector<float> dds;
  const float* dd = packed(d_delta, dds);
  float* gb_q = cfg_.bias ? grads.b_q.ptr<float>() : nullptr;
  float* gb_k = cfg_.bias ? grads.b_k.ptr<float>() : nullptr;
  float* gb_v = cfg_.bias ? grads.b_v.ptr<float>() : nullptr;
  float* gb_o = cfg_.bias ? grads.b_o.ptr<float>() : nullptr;

  // value-up
  Buffer dao(DType::f32, {k.N, H * Dv});
  blocks::linear_backward(a.ao.ptr<float>(), w_o.ptr<float>(), dd, dao.ptr<float>(), grads.w_o.ptr<float>(), gb_o, k.N,
                          H * Dv, dm);
  // attention, through the same [B, H, S, ·] views as the forward
  Buffer dqp(DType::f32, {k.N, H * Dh}), dkp(DType::f32, {k.Nkv, Hkv * Dh}), dvp(DType::f32, {k.Nkv, Hkv * Dv});
  const View dao4 = View::strided(dao.data(), DType::f32, {B, H, S, Dv}, {S * H * Dv, Dv, H * Dv, 1});
  const View dq4 = View::strided(dqp.data(), DType::f32, {B, H, S, Dh}, {S * H * Dh, Dh, H * Dh, 1});
  const View dk4 = View::strided(dkp.data(), DType::f32, {B, Hkv, Skv, Dh}, {Skv * Hkv * Dh, Dh, Hkv * Dh, 1});
  const View dv4 = View::strided(dvp.data(), DType::f32, {B, Hkv, Skv, Dv}, {Skv * Hkv * Dv, Dv, Hkv * Dv, 1});
  const View q4 = View::strided(a.qp.data(), DType::f32, {B, H, S, Dh}, {S * H * Dh, Dh, H * Dh, 1});
  const View k4 = View::strided(a.kp.data(), DType::f32, {B, Hkv, Skv, Dh}, {Skv * Hkv * Dh, Dh, Hkv * Dh, 1});
  const View v4 = View::strided(a.vp.data(), DType::f32, {B, Hkv, Skv, Dv}, {Skv * Hkv * Dv, Dv, Hkv * Dv, 1});
  const View o4 = View::strided(a.ao.data(), DType::f32, {B, H, S, Dv}, {S * H * Dv, Dv, H * Dv, 1});
  attention_backward(q4, k4, v4, o4, dao4, a.lse.view(), dq4, dk4, dv4, opt);
  // projections: queries into dx; keys and values into dx (self-attention) or d_source
  blocks::linear_backward(a.xp, w_q.ptr<float>(), dqp.ptr<float>(), dx.ptr<float>(), grads.w_q.ptr<float>(), gb_q, k.N, dm,
                          H * Dh);
  float* ds_out = d_source ? d_source->ptr<float>() : dx.ptr<float>();
  const bool add_into = !d_source;  // self-attention: keys and values add to the queries' dx
  if (k.Nkv > 0) {
    blocks::linear_backward(a.sp, w_k.ptr<float>(), dkp.ptr<float>(), ds_out, grads.w_k.ptr<float>(), gb_k, k.Nkv, ds,
                            Hkv * Dh, add_into);
    blocks::linear_backward(a.sp, w_v.ptr<float>(), dvp.ptr<float>(), ds_out, grads.w_v.ptr<float>(), gb_v, k.Nkv, ds,
                            Hkv * Dv, true);
  }
}

void add_residual(const View& e, const View& delta, const View& out) {
  constexpr const char* fn = "qkv::add_residual";
  for (auto [name, v] : {std::pair{"e", &e}, std::pair{"delta", &delta}, std::pair{"out", &out}}) {
    if (v->dtype != DType::f32 || v->rank < 1 || v->rank > kMaxRank || !v->is_contiguous())
      fail(fn, std::string(name) + ": expected a contiguous f32 tensor, got " + dtype_name(v->dtype) + v->shape_str());
    for (int i = 0; i < v->rank; ++i)
      if (v->dim(i) < 0) fail(fn, std::string(name) + ": negative dimension in " + v->shape_str());
    if (v->numel() > 0 && !v->data) fail(fn, std::string(name) + ": null data pointer");
  }
  auto same = [](const View& a, const View& b) {
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.dim(i) != b.dim(i)) return false;
    return true;
  };
  if (!same(e, delta) || !same(e, out))
    fail(fn, "shapes differ: e " + e.shape_str() + ", delta " + delta.shape_str() + ", out " + out.shape_str());
  // In place is fine (out is e or delta); a shifted overlap would read what it already wrote.
  if ((out.data != e.data && overlaps(out, e)) || (out.data != delta.data && overlaps(out, delta)))
    fail(fn, "out: overlaps e or delta without being the same memory");
  const std::int64_t n = checked_numel(fn, "e", std::vector<std::int64_t>(e.shape.begin(), e.shape.begin() + e.rank), 4);
  blocks::residual_forward(out.ptr<float>(), e.ptr<const float>(), delta.ptr<const float>(), n);
}

}  // namespace qkv
