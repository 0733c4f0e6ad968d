// The attention floor: validates what the caller passed, resolves the options into an
// AttnParams, picks a kernel and runs it. This is the only place that throws; kernels assert.
#include "qkv/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "attention/dispatch.hpp"
#include "kernels/dropout.hpp"
#include "kernels/params.hpp"

namespace qkv {
namespace {

using kernels::AttnBwdParams;
using kernels::AttnParams;

std::string str(const char* what, const View& v) {
  return std::string(what) + " " + dtype_name(v.dtype) + v.shape_str();
}

// Checks rank, dtype family, non-negative dims and strides, a data pointer when non-empty,
// and that the largest byte offset fits in 63 bits.
void check_view(const char* fn, const char* name, const View& v, int rank, const char* layout) {
  if (v.rank != rank) {
    std::ostringstream m;
    m << name << ": expected rank " << rank << " " << layout << ", got rank " << v.rank << " "
      << v.shape_str();
    fail(fn, m.str());
  }
  std::int64_t max_off = 0;
  bool empty = false;
  for (int i = 0; i < rank; ++i) {
    if (v.dim(i) < 0) fail(fn, std::string(name) + ": negative dimension in " + v.shape_str());
    if (v.stride(i) < 0)
      fail(fn, std::string(name) + ": negative stride " + std::to_string(v.stride(i)) + " in dim " +
                   std::to_string(i));
    if (v.dim(i) == 0) empty = true;
  }
  if (empty) return;
  // With stride-0 (broadcast) dimensions the offsets stay small while the element count, which
  // the kernels use as a loop bound (B·H·Sq…), may not fit in 63 bits.
  checked_numel(fn, name, std::vector<std::int64_t>(v.shape.begin(), v.shape.begin() + rank), 16);
  for (int i = 0; i < rank; ++i) {
    const std::int64_t d = v.dim(i) - 1, s = v.stride(i);
    if (s != 0 && d > (std::numeric_limits<std::int64_t>::max() / 16 - max_off) / s)
      fail(fn, std::string(name) + ": shape " + v.shape_str() + " with its strides overflows 64-bit offsets");
    max_off += d * s;
  }
  if (!v.data) fail(fn, std::string(name) + ": null data pointer for non-empty " + v.shape_str());
}

// Byte range [lo, hi) a view touches (conservative: from its first to its last element).
void byte_range(const View& v, std::uintptr_t* lo, std::uintptr_t* hi) {
  std::int64_t last = 0;
  for (int i = 0; i < v.rank; ++i) last += (v.dim(i) - 1) * v.stride(i);
  *lo = reinterpret_cast<std::uintptr_t>(v.data);
  *hi = *lo + static_cast<std::uintptr_t>(last + 1) * dtype_size(v.dtype);
}

// An output's elements must be distinct memory: otherwise two of them are written through one
// address, and with threads the result depends on timing. Sufficient test: ordered by stride, each
// dimension of size > 1 steps past the whole extent of the ones inside it.
void check_writable(const char* fn, const char* name, const View& v) {
  if (v.numel() <= 1) return;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of dims with size > 1
  for (int i = 0; i < v.rank; ++i)
    if (v.dim(i) > 1) dims.emplace_back(v.stride(i), v.dim(i));
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 0;  // largest offset reached by the inner dimensions
  for (auto [stride, size] : dims) {
    if (stride <= extent)
      fail(fn, std::string(name) + ": output elements overlap each other (shape " + v.shape_str() + ", a stride of " +
                   std::to_string(stride) + " repeats memory)");
    extent += (size - 1) * stride;
  }
}

bool overlaps(const View& a, const View& b) {
  if (!a.data || !b.data || a.numel() == 0 || b.numel() == 0) return false;
  std::uintptr_t a0, a1, b0, b1;
  byte_range(a, &a0, &a1);
  byte_range(b, &b0, &b1);
  return a0 < b1 && b0 < a1;
}

void check_no_overlap(const char* fn, const char* out_name, const View& out,
                      std::initializer_list<std::pair<const char*, const View*>> inputs) {
  for (auto [name, in] : inputs)
    if (overlaps(out, *in))
      fail(fn, std::string(out_name) + ": output memory overlaps input " + name);
}

void expect_shape(const char* fn, const char* name, const View& v, std::initializer_list<std::int64_t> want,
                  const char* layout) {
  std::size_t i = 0;
  bool ok = static_cast<std::size_t>(v.rank) == want.size();
  for (auto w : want) ok = ok && v.dim(static_cast<int>(i++)) == w;
  if (!ok) {
    std::ostringstream m;
    m << name << ": expected " << layout << " = [";
    i = 0;
    for (auto w : want) m << (i++ ? ", " : "") << w;
    m << "], got " << v.shape_str();
    fail(fn, m.str());
  }
}

// A dropout probability must lie in [0, 1) (p = 1 would drop everything and divide by 0).
void check_dropout_p(const char* fn, const char* name, double p) {
  if (p >= 0.0 && p < 1.0) return;
  std::ostringstream m;
  m << name << ": must be in [0, 1), got " << p;
  fail(fn, m.str());
}

// A per-head vector option ([H], float, finite values) read into f64: the ALiBi slopes or sinks.
std::vector<double> per_head(const char* fn, const char* name, const View& t, std::int64_t H) {
  check_view(fn, name, t, 1, "[H]");
  if (!is_float(t.dtype))
    fail(fn, std::string(name) + ": dtype must be f32, bf16 or f64, got " + dtype_name(t.dtype));
  expect_shape(fn, name, t, {H}, "[H]");
  std::vector<double> r(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    r[static_cast<std::size_t>(h)] = t.load(t.offset(h));
    if (!std::isfinite(r[static_cast<std::size_t>(h)]))
      fail(fn, std::string(name) + "[" + std::to_string(h) + "]: must be finite, got " +
                   std::to_string(r[static_cast<std::size_t>(h)]));
  }
  return r;
}

// The score variants of the options (softcap, ALiBi, sinks) into p.
void resolve_score_variants(const char* fn, AttnParams& p, const AttentionOptions& opt) {
  if (opt.softcap) {
    if (!std::isfinite(*opt.softcap) || *opt.softcap <= 0.0)
      fail(fn, "opt.softcap: must be a finite number > 0, got " + std::to_string(*opt.softcap));
    p.softcap = *opt.softcap;
  }
  if (opt.alibi_slopes && opt.alibi_slopes->rank == 2) {
    // [B, H]: one row of slopes per batch row (FlashAttention's (batch_size, nheads)).
    const View& t = *opt.alibi_slopes;
    check_view(fn, "opt.alibi_slopes", t, 2, "[B, H]");
    expect_shape(fn, "opt.alibi_slopes", t, {p.B, p.H}, "[B, H]");
    for (std::int64_t b = 0; b < p.B; ++b) {
      View row = t;
      row.rank = 1;
      row.data = static_cast<char*>(t.data) + b * t.stride(0) * static_cast<std::int64_t>(dtype_size(t.dtype));
      row.shape = {p.H, 0, 0, 0};
      row.strides = {t.stride(1), 0, 0, 0};
      const auto r = per_head(fn, "opt.alibi_slopes", row, p.H);
      p.alibi.insert(p.alibi.end(), r.begin(), r.end());
    }
    p.alibi_sb = p.H;
  } else if (opt.alibi_slopes) {
    p.alibi = per_head(fn, "opt.alibi_slopes", *opt.alibi_slopes, p.H);
  }
  if (opt.sinks) p.sinks = per_head(fn, "opt.sinks", *opt.sinks, p.H);
}

// Validates q/k/v/out and the options; fills everything of AttnParams but lse/pattern.
// With `cache` (attention_kvcache: k, v are its logical [B, Hkv, Skv, D] views), k and v may be
// i8, and out is checked against the cache's own tensors.
AttnParams resolve(const char* fn, const View& q, const View& k, const View& v, const View& out,
                   const AttentionOptions& opt, const KvCacheView* cache = nullptr) {
  check_view(fn, "q", q, 4, "[B, H, Sq, D]");
  check_view(fn, "k", k, 4, "[B, Hkv, Skv, D]");
  check_view(fn, "v", v, 4, "[B, Hkv, Skv, Dv]");
  check_view(fn, "out", out, 4, "[B, H, Sq, Dv]");
  if (!is_float(q.dtype)) fail(fn, "q: dtype must be f32, bf16 or f64, got " + std::string(dtype_name(q.dtype)));
  for (auto [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"out", &out}})
    if (t->dtype != q.dtype && !(cache && t != &out && (t->dtype == DType::i8 || t->dtype == DType::f16)))
      fail(fn, std::string(name) + ": dtype " + dtype_name(t->dtype) + " differs from q's " + dtype_name(q.dtype));

  AttnParams p;
  p.B = q.dim(0), p.H = q.dim(1), p.Sq = q.dim(2), p.D = q.dim(3);
  p.Hkv = k.dim(1), p.Skv = k.dim(2), p.Dv = v.dim(3);
  if (k.dim(0) != p.B || v.dim(0) != p.B)
    fail(fn, "batch sizes differ: " + str("q", q) + ", " + str("k", k) + ", " + str("v", v));
  if (k.dim(3) != p.D) fail(fn, "k: head dim D differs from q's: " + str("q", q) + ", " + str("k", k));
  if (v.dim(1) != p.Hkv || v.dim(2) != p.Skv)
    fail(fn, "v: [B, Hkv, Skv] must match k's: " + str("k", k) + ", " + str("v", v));
  if (p.Hkv == 0) fail(fn, "k: Hkv must be ≥ 1, got " + str("k", k));
  if (p.H % p.Hkv != 0)
    fail(fn, "k: query heads H = " + std::to_string(p.H) + " must be a multiple of key/value heads Hkv = " +
                 std::to_string(p.Hkv));
  expect_shape(fn, "out", out, {p.B, p.H, p.Sq, p.Dv}, "[B, H, Sq, Dv]");
  check_writable(fn, "out", out);
  if (cache) check_no_overlap(fn, "out", out, {{"q", &q}, {"cache.k", &cache->k}, {"cache.v", &cache->v}});
  else check_no_overlap(fn, "out", out, {{"q", &q}, {"k", &k}, {"v", &v}});
  p.q = q, p.k = k, p.v = v, p.out = out;

  if (opt.scale) {
    if (!std::isfinite(*opt.scale)) fail(fn, "opt.scale: must be finite, got " + std::to_string(*opt.scale));
    p.scale = *opt.scale;
  } else {
    p.scale = p.D > 0 ? 1.0 / std::sqrt(static_cast<double>(p.D)) : 1.0;
  }
  if (opt.window_left < -1) fail(fn, "opt.window_left: must be ≥ 0 or -1 (unbounded), got " + std::to_string(opt.window_left));
  if (opt.window_right < -1) fail(fn, "opt.window_right: must be ≥ 0 or -1 (unbounded), got " + std::to_string(opt.window_right));
  if (opt.keep_first < 0) fail(fn, "opt.keep_first: must be ≥ 0, got " + std::to_string(opt.keep_first));
  if (opt.num_threads < 0) fail(fn, "opt.num_threads: must be ≥ 0, got " + std::to_string(opt.num_threads));
  if (opt.align != Align::top_left && opt.align != Align::bottom_right && opt.align != Align::bottom_right_key_lengths)
    fail(fn, "opt.align: unknown value " + std::to_string(static_cast<int>(opt.align)));
  p.rule.causal = opt.causal;
  p.rule.diag_offset = opt.align == Align::bottom_right ? p.Skv - p.Sq
                       : opt.align == Align::bottom_right_key_lengths ? -p.Sq
                                                                       : 0;
  p.rule.diag_from_key_len = opt.align == Align::bottom_right_key_lengths;
  p.rule.window_left = opt.window_left;
  p.rule.window_right = opt.window_right;
  p.rule.keep_first = opt.keep_first;
  p.threads = opt.num_threads > 0 ? opt.num_threads : num_threads();
  check_dropout_p(fn, "opt.dropout_p", opt.dropout_p);
  p.dropout.p = opt.dropout_p;
  p.dropout.seed = opt.dropout_seed;
  p.dropout.offset = opt.dropout_offset;

  p.key_len.assign(static_cast<std::size_t>(p.B), p.Skv);
  if (opt.key_lengths) {
    const View& kl = *opt.key_lengths;
    check_view(fn, "opt.key_lengths", kl, 1, "[B]");
    if (kl.dtype != DType::i32 && kl.dtype != DType::i64)
      fail(fn, "opt.key_lengths: dtype must be i32 or i64, got " + std::string(dtype_name(kl.dtype)));
    expect_shape(fn, "opt.key_lengths", kl, {p.B}, "[B]");
    for (std::int64_t b = 0; b < p.B; ++b) {
      const auto len = static_cast<std::int64_t>(kl.load(kl.offset(b)));
      if (len < 0 || len > p.Skv)
        fail(fn, "opt.key_lengths[" + std::to_string(b) + "] = " + std::to_string(len) + " outside [0, Skv = " +
                     std::to_string(p.Skv) + "]");
      p.key_len[static_cast<std::size_t>(b)] = len;
    }
  }

  if (opt.mask) {
    const View& m = *opt.mask;
    if (m.rank < 2 || m.rank > 4)
      fail(fn, "opt.mask: expected rank 2..4, broadcastable to [B, H, Sq, Skv], got " + m.shape_str());
    if (m.dtype != DType::u8 && !is_float(m.dtype))
      fail(fn, "opt.mask: dtype must be u8 (boolean) or f32/bf16/f64 (additive), got " + std::string(dtype_name(m.dtype)));
    check_view(fn, "opt.mask", m, m.rank, "[.., Sq, Skv]");
    // Right-align to [B, H, Sq, Skv]; a size-1 dimension broadcasts (stride 0).
    const std::int64_t full[4] = {p.B, p.H, p.Sq, p.Skv};
    View m4 = m;
    m4.rank = 4;
    const int shift = 4 - m.rank;
    for (int d = 3; d >= 0; --d) {
      const int src = d - shift;
      const std::int64_t size = src >= 0 ? m.dim(src) : 1;
      const std::int64_t stride = src >= 0 ? m.stride(src) : 0;
      if (size != full[d] && size != 1)
        fail(fn, "opt.mask: shape " + m.shape_str() + " does not broadcast to [B, H, Sq, Skv] = [" +
                     std::to_string(p.B) + ", " + std::to_string(p.H) + ", " + std::to_string(p.Sq) + ", " +
                     std::to_string(p.Skv) + "]");
      m4.shape[static_cast<std::size_t>(d)] = full[d];
      m4.strides[static_cast<std::size_t>(d)] = size == 1 ? 0 : stride;
    }
    p.mask = m4;
    p.mask_is_bool = m.dtype == DType::u8;
    // An additive mask entry may be anything: −∞ denies the key, NaN or +∞ on an allowed key
    // makes the row NaN (the non-finite policy of qkv/attention.hpp, as torch does).
  }
  resolve_score_variants(fn, p, opt);
  return p;
}

void attach_lse(const char* fn, AttnParams& p, const std::optional<View>& lse) {
  if (!lse) return;
  check_view(fn, "lse", *lse, 3, "[B, H, Sq]");
  if (lse->dtype != DType::f32 && lse->dtype != DType::f64)
    fail(fn, "lse: dtype must be f32 or f64, got " + std::string(dtype_name(lse->dtype)));
  expect_shape(fn, "lse", *lse, {p.B, p.H, p.Sq}, "[B, H, Sq]");
  check_writable(fn, "lse", *lse);
  check_no_overlap(fn, "lse", *lse, {{"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"out", &p.out}});
  p.lse = *lse;
}

// dsinks: f32|f64 [H], given only with opt.sinks, not overlapping the other arguments.
void check_dsinks(const char* fn, const std::optional<View>& dsinks, const AttentionOptions& opt, std::int64_t H,
                  std::initializer_list<std::pair<const char*, const View*>> others) {
  if (!dsinks) return;
  if (!opt.sinks) fail(fn, "dsinks: given without opt.sinks (the gradient of sinks the forward did not use)");
  check_view(fn, "dsinks", *dsinks, 1, "[H]");
  if (dsinks->dtype != DType::f32 && dsinks->dtype != DType::f64)
    fail(fn, "dsinks: dtype must be f32 or f64, got " + std::string(dtype_name(dsinks->dtype)));
  expect_shape(fn, "dsinks", *dsinks, {H}, "[H]");
  check_writable(fn, "dsinks", *dsinks);
  check_no_overlap(fn, "dsinks", *dsinks, others);
}

}  // namespace

std::vector<double> alibi_standard_slopes(std::int64_t H) {
  if (H < 1) fail("qkv::alibi_standard_slopes", "H: must be ≥ 1, got " + std::to_string(H));
  std::int64_t n = 1;  // the largest power of two ≤ H
  while (n * 2 <= H) n *= 2;
  std::vector<double> s;
  for (std::int64_t h = 0; h < n; ++h) s.push_back(std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(n)));
  for (std::int64_t m = 0; static_cast<std::int64_t>(s.size()) < H; ++m)
    s.push_back(std::exp2(-4.0 * static_cast<double>(2 * m + 1) / static_cast<double>(n)));
  return s;
}

KernelInfo attention(const View& q, const View& k, const View& v, const View& out, const AttentionOptions& opt,
                     const std::optional<View>& lse, const std::optional<View>& pattern,
                     const std::optional<ScoresOutput>& scores) {
  const char* fn = "qkv::attention";
  AttnParams p = resolve(fn, q, k, v, out, opt);
  attach_lse(fn, p, lse);
  // pattern and scores: f32|f64 [B, H, Sq, Skv], apart from the inputs, out, lse and each other.
  auto check_square = [&](const char* name, const View& t) {
    check_view(fn, name, t, 4, "[B, H, Sq, Skv]");
    if (t.dtype != DType::f32 && t.dtype != DType::f64)
      fail(fn, std::string(name) + ": dtype must be f32 or f64, got " + dtype_name(t.dtype));
    expect_shape(fn, name, t, {p.B, p.H, p.Sq, p.Skv}, "[B, H, Sq, Skv]");
    check_writable(fn, name, t);
    check_no_overlap(fn, name, t, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &p.lse}});
  };
  if (pattern) {
    check_square("pattern", *pattern);
    p.pattern = *pattern;
  }
  if (scores) {
    check_square("scores.scores", scores->scores);
    if (scores->stage != ScoreStage::scaled && scores->stage != ScoreStage::softcapped &&
        scores->stage != ScoreStage::masked)
      fail(fn, "scores.stage: unknown value " + std::to_string(static_cast<int>(scores->stage)));
    if (pattern && overlaps(*pattern, scores->scores)) fail(fn, "scores.scores: output memory overlaps pattern");
    p.scores = scores->scores;
    p.scores_masked = scores->stage == ScoreStage::masked;
    p.scores_softcap = scores->stage == ScoreStage::softcapped;
  }
  return detail::run_forward(fn, p, opt.kernel);
}

KernelInfo attention_backward(const View& q, const View& k, const View& v, const View& out, const View& dout,
                              const View& lse, const View& dq, const View& dk, const View& dv,
                              const AttentionOptions& opt, const std::optional<View>& dsinks) {
  const char* fn = "qkv::attention_backward";
  AttnBwdParams bp;
  bp.fwd = resolve(fn, q, k, v, out, opt);
  const AttnParams& p = bp.fwd;
  attach_lse(fn, bp.fwd, lse);
  check_view(fn, "dout", dout, 4, "[B, H, Sq, Dv]");
  check_view(fn, "dq", dq, 4, "[B, H, Sq, D]");
  check_view(fn, "dk", dk, 4, "[B, Hkv, Skv, D]");
  check_view(fn, "dv", dv, 4, "[B, Hkv, Skv, Dv]");
  for (auto [name, t] : {std::pair{"dout", &dout}, std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    if (t->dtype != q.dtype)
      fail(fn, std::string(name) + ": dtype " + dtype_name(t->dtype) + " differs from q's " + dtype_name(q.dtype));
  expect_shape(fn, "dout", dout, {p.B, p.H, p.Sq, p.Dv}, "[B, H, Sq, Dv]");
  expect_shape(fn, "dq", dq, {p.B, p.H, p.Sq, p.D}, "[B, H, Sq, D]");
  expect_shape(fn, "dk", dk, {p.B, p.Hkv, p.Skv, p.D}, "[B, Hkv, Skv, D]");
  expect_shape(fn, "dv", dv, {p.B, p.Hkv, p.Skv, p.Dv}, "[B, Hkv, Skv, Dv]");
  for (auto [name, g] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}}) check_writable(fn, name, *g);
  for (auto [name, g] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    check_no_overlap(fn, name, *g, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"lse", &lse}});
  if (overlaps(dq, dk) || overlaps(dq, dv) || overlaps(dk, dv)) fail(fn, "dq, dk, dv: gradient outputs overlap each other");
  bp.dout = dout, bp.dq = dq, bp.dk = dk, bp.dv = dv;
  check_dsinks(fn, dsinks, opt, p.H, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"lse", &lse},
                                      {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  const KernelInfo info = detail::run_backward(fn, bp, opt.kernel);
  if (dsinks) {
    std::vector<double> acc(static_cast<std::size_t>(p.H), 0.0);
    kernels::sink_gradient(bp, acc.data());
    for (std::int64_t h = 0; h < p.H; ++h) dsinks->store(dsinks->offset(h), acc[static_cast<std::size_t>(h)]);
  }
  return info;
}

namespace {

// A packed variable-length batch, validated: the offsets of every sequence, read once.
struct Packed {
  std::vector<std::int64_t> oq, ok;  // [B + 1] row offsets into the packed q (and out) and k, v
};

// Checks q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv], out [Tq, H, Dv] and the offsets
// (shared by the forward and the backward of packed batches).
Packed check_packed(const char* fn, const View& q, const View& k, const View& v, const View& out,
                    const View& cu_seqlens_q, const View& cu_seqlens_k, const AttentionOptions& opt) {
  check_view(fn, "q", q, 3, "[Tq, H, D]");
  check_view(fn, "k", k, 3, "[Tk, Hkv, D]");
  check_view(fn, "v", v, 3, "[Tk, Hkv, Dv]");
  check_view(fn, "out", out, 3, "[Tq, H, Dv]");
  check_view(fn, "cu_seqlens_q", cu_seqlens_q, 1, "[B + 1]");
  check_view(fn, "cu_seqlens_k", cu_seqlens_k, 1, "[B + 1]");
  if (opt.mask || opt.key_lengths) fail(fn, "opt.mask / opt.key_lengths: not accepted with packed sequences");
  const std::int64_t n = cu_seqlens_q.dim(0);
  if (n < 1 || cu_seqlens_k.dim(0) != n)
    fail(fn, "cu_seqlens_q, cu_seqlens_k: need the same length B + 1 ≥ 1, got " + cu_seqlens_q.shape_str() + " and " +
                 cu_seqlens_k.shape_str());
  if (k.dim(0) != v.dim(0)) fail(fn, "k, v: token counts differ: " + str("k", k) + ", " + str("v", v));
  // The packed tensors as a whole, so that errors name their shapes (and hold when B = 0).
  if (!is_float(q.dtype)) fail(fn, "q: dtype must be f32, bf16 or f64, got " + std::string(dtype_name(q.dtype)));
  for (auto [name, t] : {std::pair{"k", &k}, std::pair{"v", &v}, std::pair{"out", &out}})
    if (t->dtype != q.dtype)
      fail(fn, std::string(name) + ": dtype " + dtype_name(t->dtype) + " differs from q's " + dtype_name(q.dtype));
  if (k.dim(2) != q.dim(2)) fail(fn, "k: head dim D differs from q's: " + str("q", q) + ", " + str("k", k));
  if (v.dim(1) != k.dim(1)) fail(fn, "v: Hkv differs from k's: " + str("k", k) + ", " + str("v", v));
  if (k.dim(1) == 0 || q.dim(1) % k.dim(1) != 0)
    fail(fn, "k: query heads H = " + std::to_string(q.dim(1)) + " must be a multiple of key/value heads Hkv = " +
                 std::to_string(k.dim(1)) + " ≥ 1");
  expect_shape(fn, "out", out, {q.dim(0), q.dim(1), v.dim(2)}, "[Tq, H, Dv]");
  auto read_offsets = [&](const char* name, const View& cu, std::int64_t total) {
    if (cu.dtype != DType::i32 && cu.dtype != DType::i64)
      fail(fn, std::string(name) + ": dtype must be i32 or i64, got " + dtype_name(cu.dtype));
    std::vector<std::int64_t> o(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) o[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(cu.load(cu.offset(i)));
    if (o.front() != 0 || o.back() != total)
      fail(fn, std::string(name) + ": must start at 0 and end at the token count " + std::to_string(total) +
                   ", got " + std::to_string(o.front()) + " … " + std::to_string(o.back()));
    for (std::int64_t i = 1; i < n; ++i)
      if (o[static_cast<std::size_t>(i)] < o[static_cast<std::size_t>(i - 1)])
        fail(fn, std::string(name) + ": must be non-decreasing, but entry " + std::to_string(i) + " < entry " +
                     std::to_string(i - 1));
    return o;
  };
  Packed pk;
  pk.oq = read_offsets("cu_seqlens_q", cu_seqlens_q, q.dim(0));
  pk.ok = read_offsets("cu_seqlens_k", cu_seqlens_k, k.dim(0));
  return pk;
}

// Rows [t0, t0 + len) of a packed [T, H, X] tensor as an ordinary [1, H, len, X] view (no copy).
View seq_window(const View& t, std::int64_t t0, std::int64_t len) {
  View w = t;
  w.data = static_cast<char*>(t.data) + t0 * t.stride(0) * static_cast<std::int64_t>(dtype_size(t.dtype));
  w.rank = 4;
  w.shape = {1, t.dim(1), len, t.dim(2)};
  w.strides = {0, t.stride(1), t.stride(0), t.stride(2)};
  return w;
}

// Columns [t0, t0 + len) of a packed lse [H, T] as the [1, H, len] view one sequence's call takes.
View lse_window(const View& lse, std::int64_t t0, std::int64_t len) {
  View l = lse;
  l.data = static_cast<char*>(lse.data) + t0 * lse.stride(1) * static_cast<std::int64_t>(dtype_size(lse.dtype));
  l.rank = 3;
  l.shape = {1, lse.dim(0), len, 0};
  l.strides = {0, lse.stride(0), lse.stride(1), 0};
  return l;
}

// The options of sequence b of a packed batch of n: per-batch ALiBi slopes [n, H] become its row [1, H].
AttentionOptions seq_options(const char* fn, const AttentionOptions& opt, std::size_t b, std::size_t n) {
  if (!opt.alibi_slopes || opt.alibi_slopes->rank != 2) return opt;
  const View& t = *opt.alibi_slopes;
  if (t.dim(0) != static_cast<std::int64_t>(n))
    fail(fn, "opt.alibi_slopes: expected [B = " + std::to_string(n) + ", H] (one row per sequence), got " + t.shape_str());
  AttentionOptions o = opt;
  View row = t;
  row.data = static_cast<char*>(t.data) + static_cast<std::int64_t>(b) * t.stride(0) * static_cast<std::int64_t>(dtype_size(t.dtype));
  row.shape[0] = 1;
  o.alibi_slopes = row;
  return o;
}

void check_packed_lse(const char* fn, const View& lse, const View& q) {
  check_view(fn, "lse", lse, 2, "[H, Tq]");
  if (lse.dtype != DType::f32 && lse.dtype != DType::f64)
    fail(fn, "lse: dtype must be f32 or f64, got " + std::string(dtype_name(lse.dtype)));
  expect_shape(fn, "lse", lse, {q.dim(1), q.dim(0)}, "[H, Tq]");
}

}  // namespace

KernelInfo attention_varlen(const View& q, const View& k, const View& v, const View& out, const View& cu_seqlens_q,
                            const View& cu_seqlens_k, const AttentionOptions& opt, const std::optional<View>& lse) {
  const char* fn = "qkv::attention_varlen";
  const Packed pk = check_packed(fn, q, k, v, out, cu_seqlens_q, cu_seqlens_k, opt);
  check_writable(fn, "out", out);
  check_no_overlap(fn, "out", out, {{"q", &q}, {"k", &k}, {"v", &v}});
  if (lse) {
    check_packed_lse(fn, *lse, q);
    check_writable(fn, "lse", *lse);
    check_no_overlap(fn, "lse", *lse, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}});
  }
  // Each sequence is an ordinary [1, H, S, D] call on a strided window of the packed tensors.
  std::vector<AttnParams> seqs;
  for (std::size_t b = 0; b + 1 < pk.oq.size(); ++b) {
    const auto q0 = pk.oq[b], lq = pk.oq[b + 1] - q0, k0 = pk.ok[b], lk = pk.ok[b + 1] - k0;
    if (lq == 0) continue;
    AttnParams p = resolve(fn, seq_window(q, q0, lq), seq_window(k, k0, lk), seq_window(v, k0, lk),
                           seq_window(out, q0, lq), seq_options(fn, opt, b, pk.oq.size() - 1));
    p.dropout.b0 = static_cast<std::int64_t>(b);  // the mask of sequence b (qkv/attention.hpp)
    attach_lse(fn, p, lse ? std::optional<View>(lse_window(*lse, q0, lq)) : std::nullopt);
    seqs.push_back(std::move(p));
  }
  return detail::run_forward_varlen(fn, seqs, opt.kernel);
}

KernelInfo attention_varlen_backward(const View& q, const View& k, const View& v, const View& out, const View& dout,
                                     const View& lse, const View& dq, const View& dk, const View& dv,
                                     const View& cu_seqlens_q, const View& cu_seqlens_k,
                                     const AttentionOptions& opt, const std::optional<View>& dsinks) {
  const char* fn = "qkv::attention_varlen_backward";
  const Packed pk = check_packed(fn, q, k, v, out, cu_seqlens_q, cu_seqlens_k, opt);
  check_packed_lse(fn, lse, q);
  check_view(fn, "dout", dout, 3, "[Tq, H, Dv]");
  check_view(fn, "dq", dq, 3, "[Tq, H, D]");
  check_view(fn, "dk", dk, 3, "[Tk, Hkv, D]");
  check_view(fn, "dv", dv, 3, "[Tk, Hkv, Dv]");
  for (auto [name, t] : {std::pair{"dout", &dout}, std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    if (t->dtype != q.dtype)
      fail(fn, std::string(name) + ": dtype " + dtype_name(t->dtype) + " differs from q's " + dtype_name(q.dtype));
  expect_shape(fn, "dout", dout, {q.dim(0), q.dim(1), v.dim(2)}, "[Tq, H, Dv]");
  expect_shape(fn, "dq", dq, {q.dim(0), q.dim(1), q.dim(2)}, "[Tq, H, D]");
  expect_shape(fn, "dk", dk, {k.dim(0), k.dim(1), k.dim(2)}, "[Tk, Hkv, D]");
  expect_shape(fn, "dv", dv, {v.dim(0), v.dim(1), v.dim(2)}, "[Tk, Hkv, Dv]");
  for (auto [name, g] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}}) check_writable(fn, name, *g);
  for (auto [name, g] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
    check_no_overlap(fn, name, *g, {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"lse", &lse}});
  if (overlaps(dq, dk) || overlaps(dq, dv) || overlaps(dk, dv)) fail(fn, "dq, dk, dv: gradient outputs overlap each other");
  // Validate every sequence before writing anything, then run them one after the other (each
  // call uses all threads and is deterministic, so the whole is too).
  std::vector<AttnBwdParams> seqs;
  std::vector<std::pair<std::int64_t, std::int64_t>> keys_without_queries;  // (k0, lk): their dk, dv are 0
  for (std::size_t b = 0; b + 1 < pk.oq.size(); ++b) {
    const auto q0 = pk.oq[b], lq = pk.oq[b + 1] - q0, k0 = pk.ok[b], lk = pk.ok[b + 1] - k0;
    if (lq == 0) {
      if (lk > 0) keys_without_queries.emplace_back(k0, lk);
      continue;
    }
    AttnBwdParams bp;
    bp.fwd = resolve(fn, seq_window(q, q0, lq), seq_window(k, k0, lk), seq_window(v, k0, lk), seq_window(out, q0, lq),
                     seq_options(fn, opt, b, pk.oq.size() - 1));
    bp.fwd.dropout.b0 = static_cast<std::int64_t>(b);
    attach_lse(fn, bp.fwd, lse_window(lse, q0, lq));
    bp.dout = seq_window(dout, q0, lq), bp.dq = seq_window(dq, q0, lq);
    bp.dk = seq_window(dk, k0, lk), bp.dv = seq_window(dv, k0, lk);
    seqs.push_back(std::move(bp));
  }
  for (auto [k0, lk] : keys_without_queries)
    for (const View* g : {&dk, &dv})
      for (std::int64_t t = k0; t < k0 + lk; ++t)
        for (std::int64_t h = 0; h < g->dim(1); ++h)
          for (std::int64_t d = 0; d < g->dim(2); ++d) g->store(g->offset(t, h, d), 0.0);
  check_dsinks(fn, dsinks, opt, q.dim(1), {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout},
                                          {"lse", &lse}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  KernelInfo info;  // what a batch of empty sequences reports (as the forward)
  std::vector<double> dsink_acc(static_cast<std::size_t>(q.dim(1)), 0.0);
  for (const AttnBwdParams& bp : seqs) {
    info = detail::run_backward(fn, bp, opt.kernel);
    if (dsinks) kernels::sink_gradient(bp, dsink_acc.data());
  }
  if (dsinks)
    for (std::int64_t h = 0; h < q.dim(1); ++h) dsinks->store(dsinks->offset(h), dsink_acc[static_cast<std::size_t>(h)]);
  return info;
}

namespace {

// [Bc, Sc, Hkv, X] (a cache tensor or, with X absent, its scales [Bc, Sc, Hkv]) as the kernels'
// [Bc, Hkv, Sc, X] view, no copy.
View heads_first(const View& t) {
  View r = t;
  std::swap(r.shape[1], r.shape[2]);
  std::swap(r.strides[1], r.strides[2]);
  return r;
}

// The checks shared by attention_kvcache and kvcache_append. Returns the pool's block count Bc,
// rows per block (or sequence) Sc, and the logical Skv; reads nothing but shapes and the table.
struct CacheShape {
  std::int64_t Bc, Sc, Hkv, D, Dv, Skv;
  int page_shift = 0;
};

CacheShape check_cache(const char* fn, const KvCacheView& c, std::int64_t B, DType q_dtype) {
  check_view(fn, "cache.k", c.k, 4, "[Bc, Sc, Hkv, D]");
  check_view(fn, "cache.v", c.v, 4, "[Bc, Sc, Hkv, Dv]");
  CacheShape s{c.k.dim(0), c.k.dim(1), c.k.dim(2), c.k.dim(3), c.v.dim(3), c.k.dim(1)};
  if (c.v.dim(0) != s.Bc || c.v.dim(1) != s.Sc || c.v.dim(2) != s.Hkv)
    fail(fn, "cache.v: [Bc, Sc, Hkv] must match cache.k's: " + str("cache.k", c.k) + ", " + str("cache.v", c.v));
  if (c.v.dtype != c.k.dtype)
    fail(fn, std::string("cache.v: dtype ") + dtype_name(c.v.dtype) + " differs from cache.k's " + dtype_name(c.k.dtype));
  const bool i8 = c.k.dtype == DType::i8, f16 = c.k.dtype == DType::f16;
  if (!i8 && !f16 && c.k.dtype != q_dtype)
    fail(fn, std::string("cache.k: dtype must be q's (") + dtype_name(q_dtype) + "), i8 or f16, got " + dtype_name(c.k.dtype));
  if ((i8 || f16) && q_dtype != DType::f32 && q_dtype != DType::bf16)
    fail(fn, std::string("q: an ") + dtype_name(c.k.dtype) + " cache takes f32 or bf16 queries, got " + dtype_name(q_dtype));
  if (i8 != (c.k_scale.has_value() && c.v_scale.has_value()) || c.k_scale.has_value() != c.v_scale.has_value())
    fail(fn, i8 ? "cache.k_scale, cache.v_scale: an i8 cache needs both scales [Bc, Sc, Hkv]"
                : "cache.k_scale, cache.v_scale: given for a cache that is not i8");
  if (i8)
    for (auto [name, t] : {std::pair{"cache.k_scale", &*c.k_scale}, std::pair{"cache.v_scale", &*c.v_scale}}) {
      check_view(fn, name, *t, 3, "[Bc, Sc, Hkv]");
      if (t->dtype != DType::f32) fail(fn, std::string(name) + ": dtype must be f32, got " + dtype_name(t->dtype));
      expect_shape(fn, name, *t, {s.Bc, s.Sc, s.Hkv}, "[Bc, Sc, Hkv]");
    }
  if (c.block_table) {
    const View& bt = *c.block_table;
    check_view(fn, "cache.block_table", bt, 2, "[B, max_blocks]");
    if (bt.dtype != DType::i32) fail(fn, std::string("cache.block_table: dtype must be i32, got ") + dtype_name(bt.dtype));
    if (bt.dim(0) != B)
      fail(fn, "cache.block_table: expected [B = " + std::to_string(B) + ", max_blocks], got " + bt.shape_str());
    if (bt.stride(1) != 1 && bt.dim(1) > 1)
      fail(fn, "cache.block_table: rows must be contiguous (stride 1 along max_blocks), got stride " +
                   std::to_string(bt.stride(1)));
    if (s.Sc < 1 || (s.Sc & (s.Sc - 1)) != 0)
      fail(fn, "cache.k: the block size Sc = " + std::to_string(s.Sc) + " must be a power of two");
    while ((std::int64_t{1} << s.page_shift) < s.Sc) ++s.page_shift;
    s.Skv = bt.dim(1) * s.Sc;
  } else if (s.Bc != B) {
    fail(fn, "cache.k: without a block table the cache holds one sequence per batch row: expected Bc = B = " +
                 std::to_string(B) + ", got " + c.k.shape_str());
  }
  return s;
}

// Every block holding some of sequence b's keys [from, len) (the keys read or written) must be a
// block of the pool; the table's other entries are never read and may hold anything.
void check_blocks(const char* fn, const KvCacheView& c, const CacheShape& s, std::int64_t b, std::int64_t from,
                  std::int64_t len) {
  if (!c.block_table) return;
  const View& bt = *c.block_table;
  for (std::int64_t blk = from / s.Sc; blk * s.Sc < len; ++blk) {
    const auto id = static_cast<std::int64_t>(bt.ptr<std::int32_t>()[bt.offset(b, blk)]);
    if (id < 0 || id >= s.Bc)
      fail(fn, "cache.block_table[" + std::to_string(b) + ", " + std::to_string(blk) + "] = " + std::to_string(id) +
                   " outside the pool [0, Bc = " + std::to_string(s.Bc) + ") (sequence " + std::to_string(b) + " holds " +
                   std::to_string(len) + " keys)");
  }
}

// kvcache_append's int8 quantiser for one row of n values x(e) (exact in double): symmetric, scale =
// max|x| / 127 rounded to f32 (1 for an all-zero row), q(e) = round(x(e) / scale) to nearest even,
// clamped to ±127, written through put(e, q). Returns the scale; a non-finite x(e) sets bad = e
// (the first one) and writes nothing. Branch-free loops, so that f32 rows read through a pointer
// vectorise: x − x is 0 for every finite x and NaN otherwise.
template <class Get, class Put>
float quantise_i8(std::int64_t n, Get x, Put put, std::int64_t& bad) {
  double amax = 0.0, nonfinite = 0.0;
  for (std::int64_t e = 0; e < n; ++e) {
    const double v = x(e);
    amax = std::max(amax, std::abs(v));
    nonfinite += v - v;
  }
  if (nonfinite != 0.0) {
    for (bad = 0; std::isfinite(x(bad)); ++bad) {
    }
    return 0.0f;
  }
  const float sc = amax > 0.0 ? static_cast<float>(amax / 127.0) : 1.0f;
  const double inv = 1.0 / static_cast<double>(sc);
  // Round to nearest even as std::nearbyint does in the default mode (|x · inv| ≤ 127 + ulps, far
  // below 2^51): adding and taking away 1.5 · 2^52 leaves the integer, without a libm call a value.
  constexpr double kRound = 6755399441055744.0;
  for (std::int64_t e = 0; e < n; ++e) put(e, std::min(std::max((x(e) * inv + kRound) - kRound, -127.0), 127.0));
  return sc;
}

// The logical [B, Hkv, Skv, X] view of a cache tensor the kernels read through KvCacheLayout.
View logical(const View& t, std::int64_t B, std::int64_t Skv) {
  View r = heads_first(t);
  r.shape[0] = B;
  r.shape[2] = Skv;
  return r;
}

}  // namespace

KernelInfo attention_kvcache(const View& q, const KvCacheView& cache, const View& out, const AttentionOptions& opt,
                             const std::optional<View>& lse) {
  const char* fn = "qkv::attention_kvcache";
  check_view(fn, "q", q, 4, "[B, H, Sq, D]");
  const CacheShape s = check_cache(fn, cache, q.dim(0), q.dtype);
  const bool i8 = cache.k.dtype == DType::i8;
  // A contiguous cache of q's dtype is ordinary strided attention.
  if (!cache.block_table && !i8 && cache.k.dtype != DType::f16) return attention(q, heads_first(cache.k), heads_first(cache.v), out, opt, lse);
  AttnParams p = resolve(fn, q, logical(cache.k, q.dim(0), s.Skv), logical(cache.v, q.dim(0), s.Skv), out, opt, &cache);
  attach_lse(fn, p, lse);
  if (p.lse.data) check_no_overlap(fn, "lse", p.lse, {{"cache.k", &cache.k}, {"cache.v", &cache.v}});
  for (std::int64_t b = 0; b < p.B; ++b) {
    const std::int64_t len = p.key_len[static_cast<std::size_t>(b)];
    check_blocks(fn, cache, s, b, p.rule.first_key(p.Sq, len), len);
  }
  if (cache.block_table) {
    p.cache.table = cache.block_table->ptr<std::int32_t>();
    p.cache.ldt = cache.block_table->stride(0);
    p.cache.page_shift = s.page_shift;
  }
  if (i8) p.cache.k_scale = heads_first(*cache.k_scale), p.cache.v_scale = heads_first(*cache.v_scale);
  return detail::run_forward(fn, p, opt.kernel);
}

void kvcache_append(const KvCacheView& cache, const View& k_new, const View& v_new, const View& pos) {
  const char* fn = "qkv::kvcache_append";
  check_view(fn, "k_new", k_new, 4, "[B, Snew, Hkv, D]");
  check_view(fn, "v_new", v_new, 4, "[B, Snew, Hkv, Dv]");
  check_view(fn, "pos", pos, 1, "[B]");
  const std::int64_t B = k_new.dim(0), Snew = k_new.dim(1);
  if (!is_float(k_new.dtype) || v_new.dtype != k_new.dtype)
    fail(fn, std::string("k_new, v_new: need one float dtype, got ") + dtype_name(k_new.dtype) + " and " +
                 dtype_name(v_new.dtype));
  const bool i8 = cache.k.dtype == DType::i8;
  const CacheShape s = check_cache(fn, cache, B, i8 || cache.k.dtype == DType::f16 ? DType::f32 : cache.k.dtype);
  expect_shape(fn, "k_new", k_new, {B, Snew, s.Hkv, s.D}, "[B, Snew, Hkv, D]");
  expect_shape(fn, "v_new", v_new, {B, Snew, s.Hkv, s.Dv}, "[B, Snew, Hkv, Dv]");
  if (pos.dtype != DType::i32 && pos.dtype != DType::i64)
    fail(fn, std::string("pos: dtype must be i32 or i64, got ") + dtype_name(pos.dtype));
  expect_shape(fn, "pos", pos, {B}, "[B]");
  std::vector<std::int64_t> p0(static_cast<std::size_t>(B));
  for (std::int64_t b = 0; b < B; ++b) {
    p0[static_cast<std::size_t>(b)] = static_cast<std::int64_t>(pos.load(pos.offset(b)));
    if (p0[static_cast<std::size_t>(b)] < 0 || p0[static_cast<std::size_t>(b)] + Snew > s.Skv)
      fail(fn, "pos[" + std::to_string(b) + "] = " + std::to_string(p0[static_cast<std::size_t>(b)]) + ": rows [pos, pos + " +
                   std::to_string(Snew) + ") must lie in [0, Skv = " + std::to_string(s.Skv) + ")");
    check_blocks(fn, cache, s, b, p0[static_cast<std::size_t>(b)], p0[static_cast<std::size_t>(b)] + Snew);
  }
  kernels::KvCacheLayout lay;
  if (cache.block_table) lay.table = cache.block_table->ptr<std::int32_t>(), lay.ldt = cache.block_table->stride(0),
                         lay.page_shift = s.page_shift;
  const View ck = logical(cache.k, B, s.Skv), cv = logical(cache.v, B, s.Skv);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < Snew; ++t) {
      const std::int64_t j = p0[static_cast<std::size_t>(b)] + t;
      for (std::int64_t hk = 0; hk < s.Hkv; ++hk)
        for (auto [src, dst, scale] : {std::tuple{&k_new, &ck, i8 ? &*cache.k_scale : nullptr},
                                       std::tuple{&v_new, &cv, i8 ? &*cache.v_scale : nullptr}}) {
          const std::int64_t n = src->dim(3), row = lay.offset(*dst, b, hk, j), from = src->offset(b, t, hk, 0);
          if (!scale) {
            for (std::int64_t e = 0; e < n; ++e) dst->store(row + e * dst->stride(3), src->load(from + e * src->stride(3)));
            continue;
          }
          // f32 rows with unit strides (the model's decoding step) are read and written through
          // pointers, others through the views: the same arithmetic (quantise_i8) either way.
          std::int64_t bad = -1;
          float sc;
          if (src->dtype == DType::f32 && src->stride(3) == 1 && dst->stride(3) == 1) {
            const float* x = src->ptr<float>() + from;
            std::int8_t* y = dst->ptr<std::int8_t>() + row;
            sc = quantise_i8(n, [&](std::int64_t e) { return static_cast<double>(x[e]); },
                             [&](std::int64_t e, double q) { y[e] = static_cast<std::int8_t>(q); }, bad);
          } else {
            sc = quantise_i8(n, [&](std::int64_t e) { return src->load(from + e * src->stride(3)); },
                             [&](std::int64_t e, double q) { dst->store(row + e * dst->stride(3), q); }, bad);
          }
          if (bad >= 0)
            fail(fn, std::string(src == &k_new ? "k_new" : "v_new") + "[" + std::to_string(b) + ", " + std::to_string(t) +
                         ", " + std::to_string(hk) + ", " + std::to_string(bad) + "] = " +
                         std::to_string(src->load(from + bad * src->stride(3))) + ": an i8 cache holds finite values only");
          const View sv = heads_first(*scale);
          sv.store(lay.offset(sv, b, hk, j), sc);
        }
    }
}

void dropout_mask(const View& mask, double dropout_p, std::uint64_t seed, std::uint64_t offset) {
  const char* fn = "qkv::dropout_mask";
  check_dropout_p(fn, "dropout_p", dropout_p);
  check_view(fn, "mask", mask, 4, "[B, H, Sq, Skv]");
  if (mask.dtype != DType::u8) fail(fn, "mask: dtype must be u8, got " + std::string(dtype_name(mask.dtype)));
  check_writable(fn, "mask", mask);
  const std::uint32_t t = kernels::dropout_threshold(dropout_p);
  for (std::int64_t b = 0; b < mask.dim(0); ++b)
    for (std::int64_t h = 0; h < mask.dim(1); ++h)
      for (std::int64_t i = 0; i < mask.dim(2); ++i) {
        const std::uint64_t key = kernels::dropout_row_key(seed, offset, b, h, i);
        auto* row = mask.ptr<std::uint8_t>() + mask.offset(b, h, i, 0);
        for (std::int64_t j = 0; j < mask.dim(3); ++j) row[j * mask.stride(3)] = kernels::dropout_bits(key, j) >= t ? 1 : 0;
      }
}

}  // namespace qkv
