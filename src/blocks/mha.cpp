// The multi-head attention block (include/qkv/mha.hpp): projections on blocks::linear_forward,
// the core on qkv::attention, each head's Δe^h from its own column block of W_O.
//
// Scratch, all f32 row-major (N = B·S, Nkv = B·Skv):
//   qp  [N,   H·Dh]    = x · w_qᵀ + b_q      read by attention as [B, H, S, Dh] through strides
//   kp  [Nkv, Hkv·Dh]  = s · w_kᵀ + b_k      read as [B, Hkv, Skv, Dh]
//   vp  [Nkv, Hkv·Dv]  = s · w_vᵀ + b_v      read as [B, Hkv, Skv, Dv]   (value-down)
//   ao  [N,   H·Dv]    attention output, written as [B, H, S, Dv] through strides, so that row n
//                      is the concatenation over heads that W_O (the stapled value-ups) expects
#include "qkv/mha.hpp"

#include <cmath>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "blocks/linear.hpp"

namespace qkv {
namespace {

constexpr const char* kCtor = "qkv::MultiHeadAttention";
constexpr const char* kFwd = "qkv::MultiHeadAttention::forward";

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

void expect(bool ok, const char* name, const std::string& want, const View& got) {
  if (!ok)
    fail(kFwd, std::string(name) + ": expected " + want + ", got " + dtype_name(got.dtype) + got.shape_str());
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

// Negative strides or dims are rejected before any offset is computed.
void check_sane(const char* name, const View& v) {
  for (int i = 0; i < v.rank; ++i)
    if (v.dim(i) < 0 || v.stride(i) < 0)
      fail(kFwd, std::string(name) + ": negative dimension or stride in " + v.shape_str());
  if (v.numel() > 0 && !v.data) fail(kFwd, std::string(name) + ": null data pointer for " + v.shape_str());
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
  w_q = Buffer(DType::f32, {hq, cfg_.d_model});
  w_k = Buffer(DType::f32, {hk, cfg_.d_source});
  w_v = Buffer(DType::f32, {hv, cfg_.d_source});
  w_o = Buffer(DType::f32, {cfg_.d_model, ho});
  const std::int64_t nb = cfg_.bias ? 1 : 0;
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

void MultiHeadAttention::forward(const View& x, const std::optional<View>& source, const AttentionOptions& opt,
                                 const View& delta, const std::optional<View>& head_delta,
                                 const std::optional<View>& pattern) const {
  const std::int64_t dm = cfg_.d_model, ds = cfg_.d_source, H = cfg_.n_heads, Hkv = cfg_.n_kv_heads,
                     Dh = cfg_.d_head, Dv = cfg_.d_value;
  // ---- validation: everything the caller passed, before any work
  check_sane("x", x);
  expect(x.rank == 3 && x.dtype == DType::f32 && x.dim(2) == dm, "x", "f32 [B, S, d_model = " + std::to_string(dm) + "]",
         x);
  const std::int64_t B = x.dim(0), S = x.dim(1);
  if (!source && ds != dm)
    fail(kFwd, "source: required, because d_source " + std::to_string(ds) + " differs from d_model " +
                   std::to_string(dm) + " (a cross-attention block)");
  const View s = source ? *source : x;
  if (source) {
    check_sane("source", s);
    expect(s.rank == 3 && s.dtype == DType::f32 && s.dim(0) == B && s.dim(2) == ds, "source",
           "f32 [B = " + std::to_string(B) + ", Skv, d_source = " + std::to_string(ds) + "]", s);
  }
  const std::int64_t Skv = s.dim(1);
  const std::int64_t N = checked_numel(kFwd, "x", {B, S, H * Dv}, 4) / (H * Dv);
  const std::int64_t Nkv = checked_numel(kFwd, "source", {B, Skv, Hkv * (Dh + Dv)}, 4) / (Hkv * (Dh + Dv));
  checked_numel(kFwd, "x", {B, S, dm, 4}, 1);
  check_sane("delta", delta);
  expect(delta.rank == 3 && delta.dtype == DType::f32 && delta.dim(0) == B && delta.dim(1) == S && delta.dim(2) == dm &&
             delta.is_contiguous(),
         "delta", "contiguous f32 " + dims({B, S, dm}), delta);
  if (overlaps(delta, x) || overlaps(delta, s)) fail(kFwd, "delta: output memory overlaps x or source");
  if (head_delta) {
    check_sane("head_delta", *head_delta);
    checked_numel(kFwd, "head_delta", {B, H, S, dm}, 4);
    expect(head_delta->rank == 4 && head_delta->dtype == DType::f32 && head_delta->dim(0) == B &&
               head_delta->dim(1) == H && head_delta->dim(2) == S && head_delta->dim(3) == dm &&
               head_delta->is_contiguous(),
           "head_delta", "contiguous f32 " + dims({B, H, S, dm}), *head_delta);
    if (overlaps(*head_delta, x) || overlaps(*head_delta, s) || overlaps(*head_delta, delta))
      fail(kFwd, "head_delta: output memory overlaps x, source or delta");
  }
  if (pattern) {
    check_sane("pattern", *pattern);
    expect(pattern->rank == 4 && (pattern->dtype == DType::f32 || pattern->dtype == DType::f64) &&
               pattern->dim(0) == B && pattern->dim(1) == H && pattern->dim(2) == S && pattern->dim(3) == Skv,
           "pattern", "f32 or f64 " + dims({B, H, S, Skv}), *pattern);
    if (overlaps(*pattern, x) || overlaps(*pattern, s) || overlaps(*pattern, delta) ||
        (head_delta && overlaps(*pattern, *head_delta)))
      fail(kFwd, "pattern: output memory overlaps x, source, delta or head_delta");
  }
  if (N == 0) return;

  // ---- projections: queries from x, keys and values (value-down) from the source
  std::vector<float> xs, ss;
  const float* xp = packed(x, xs);
  const float* sp = source ? packed(s, ss) : xp;
  Buffer qp(DType::f32, {N, H * Dh}), kp(DType::f32, {Nkv, Hkv * Dh}), vp(DType::f32, {Nkv, Hkv * Dv}),
      ao(DType::f32, {N, H * Dv});
  const float* bias_q = cfg_.bias ? b_q.ptr<float>() : nullptr;
  const float* bias_k = cfg_.bias ? b_k.ptr<float>() : nullptr;
  const float* bias_v = cfg_.bias ? b_v.ptr<float>() : nullptr;
  const float* bias_o = cfg_.bias ? b_o.ptr<float>() : nullptr;
  blocks::linear_forward(xp, w_q.ptr<float>(), bias_q, qp.ptr<float>(), N, dm, H * Dh);
  if (Nkv > 0) {
    blocks::linear_forward(sp, w_k.ptr<float>(), bias_k, kp.ptr<float>(), Nkv, ds, Hkv * Dh);
    blocks::linear_forward(sp, w_v.ptr<float>(), bias_v, vp.ptr<float>(), Nkv, ds, Hkv * Dv);
  }

  // ---- attention of every head at once: [B, S, H·Dh] seen as [B, H, S, Dh], nothing copied
  const View q4 = View::strided(qp.data(), DType::f32, {B, H, S, Dh}, {S * H * Dh, Dh, H * Dh, 1});
  const View k4 = View::strided(kp.data(), DType::f32, {B, Hkv, Skv, Dh}, {Skv * Hkv * Dh, Dh, Hkv * Dh, 1});
  const View v4 = View::strided(vp.data(), DType::f32, {B, Hkv, Skv, Dv}, {Skv * Hkv * Dv, Dv, Hkv * Dv, 1});
  const View o4 = View::strided(ao.data(), DType::f32, {B, H, S, Dv}, {S * H * Dv, Dv, H * Dv, 1});
  try {
    attention(q4, k4, v4, o4, opt, std::nullopt, pattern);
  } catch (const std::invalid_argument& e) {
    // An option that does not fit (a mask of the wrong shape, …): say which block call it was.
    fail(kFwd, std::string("opt: ") + e.what());
  }

  // ---- value-up: Δe = ao · W_Oᵀ + b_o, the stapled value-ups of all heads in one product
  blocks::linear_forward(ao.ptr<float>(), w_o.ptr<float>(), bias_o, delta.ptr<float>(), N, H * Dv, dm);

  if (!head_delta) return;
  // ---- each head's own Δe^h = ao[:, h·Dv:(h+1)·Dv] · (W_O^h)ᵀ, W_O^h = columns h·Dv … (h+1)·Dv of W_O
  std::vector<float> wo_h(static_cast<std::size_t>(dm * Dv)), ao_h(static_cast<std::size_t>(S * Dv));
  for (std::int64_t h = 0; h < H; ++h) {
    for (std::int64_t r = 0; r < dm; ++r)
      for (std::int64_t c = 0; c < Dv; ++c)
        wo_h[static_cast<std::size_t>(r * Dv + c)] = w_o.ptr<float>()[r * H * Dv + h * Dv + c];
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t i = 0; i < S; ++i)
        for (std::int64_t c = 0; c < Dv; ++c)
          ao_h[static_cast<std::size_t>(i * Dv + c)] = ao.ptr<float>()[(b * S + i) * H * Dv + h * Dv + c];
      float* y = head_delta->ptr<float>() + head_delta->offset(b, h, 0, 0);
      blocks::linear_forward(ao_h.data(), wo_h.data(), nullptr, y, S, Dv, dm);
    }
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
  const float* a = e.ptr<const float>();
  const float* d = delta.ptr<const float>();
  float* o = out.ptr<float>();
  for (std::int64_t i = 0; i < n; ++i) o[i] = a[i] + d[i];
}

}  // namespace qkv
