// qkv::AttentionKvCache (qkv/kv_cache.hpp): the storage, the lengths and the checks at its
// boundary; the rows are written by kvcache_append and read by attention_kvcache (attention.cpp).
#include "qkv/kv_cache.hpp"

#include <cstring>
#include <string>

#include "qkv/memory.hpp"

namespace qkv {
namespace {

std::string dims(const View& t) { return t.shape_str(); }

void zero(const Buffer& b) {
  if (b.data()) std::memset(b.data(), 0, b.bytes());
}

}  // namespace

AttentionKvCache::AttentionKvCache(std::int64_t batch, std::int64_t max_len, std::int64_t kv_heads,
                                   std::int64_t head_dim, DType dtype, std::int64_t value_dim, std::int64_t block_size)
    : batch_(batch), max_len_(max_len), block_size_(block_size) {
  const char* fn = "qkv::AttentionKvCache";
  for (auto [name, x] : {std::pair{"batch", batch}, std::pair{"max_len", max_len}, std::pair{"kv_heads", kv_heads},
                         std::pair{"head_dim", head_dim}})
    if (x < 1) fail(fn, std::string(name) + ": must be ≥ 1, got " + std::to_string(x));
  if (value_dim < 0) fail(fn, "value_dim: must be ≥ 0 (0: head_dim), got " + std::to_string(value_dim));
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16 && dtype != DType::i8)
    fail(fn, std::string("dtype: must be f32, bf16, f16 or i8, got ") + dtype_name(dtype));
  if (block_size < 0 || (block_size & (block_size - 1)) != 0)
    fail(fn, "block_size: must be 0 (contiguous) or a power of two, got " + std::to_string(block_size));
  const std::int64_t Dv = value_dim == 0 ? head_dim : value_dim;
  // Rows of the storage: one sequence of max_len rows per batch row, or the pool's blocks.
  const std::int64_t max_blocks = block_size ? (max_len + block_size - 1) / block_size : 0;
  const std::int64_t n0 = block_size ? batch * max_blocks : batch, n1 = block_size ? block_size : max_len;
  if (block_size) max_len_ = max_blocks * block_size;  // a sequence holds whole blocks
  const bool i8 = dtype == DType::i8;
  const std::uint64_t bytes = bytes_of({n0, n1, kv_heads, head_dim + Dv}, dtype_size(dtype)) +
                              (i8 ? bytes_of({n0, n1, kv_heads, 2}, sizeof(float)) : 0);
  check_memory(fn, "k, v (and the i8 scales)", bytes);
  k_ = Buffer(dtype, {n0, n1, kv_heads, head_dim});
  v_ = Buffer(dtype, {n0, n1, kv_heads, Dv});
  zero(k_), zero(v_);
  if (i8) {
    k_scale_ = Buffer(DType::f32, {n0, n1, kv_heads});
    v_scale_ = Buffer(DType::f32, {n0, n1, kv_heads});
    zero(k_scale_), zero(v_scale_);
  }
  if (block_size) {
    block_table_ = Buffer(DType::i32, {batch, max_blocks});
    auto* t = block_table_.ptr<std::int32_t>();
    if (batch * max_blocks > INT32_MAX)
      fail(fn, "batch · max_blocks = " + std::to_string(batch * max_blocks) + ": the block table holds i32 entries");
    for (std::int64_t e = 0; e < batch * max_blocks; ++e) t[e] = static_cast<std::int32_t>(e);
  }
  lengths_ = Buffer(DType::i64, {batch});
  zero(lengths_);
}

KvCacheView AttentionKvCache::view() const {
  KvCacheView c{k_.view(), v_.view(), std::nullopt, std::nullopt, std::nullopt};
  if (block_size_) c.block_table = block_table_.view();
  if (k_.dtype() == DType::i8) c.k_scale = k_scale_.view(), c.v_scale = v_scale_.view();
  return c;
}

std::int64_t AttentionKvCache::length(std::int64_t b) const {
  if (b < 0 || b >= batch_)
    fail("qkv::AttentionKvCache::length",
         "b = " + std::to_string(b) + ": must be in [0, batch = " + std::to_string(batch_) + ")");
  return lengths_.ptr<std::int64_t>()[b];
}

void AttentionKvCache::append(const View& k_new, const View& v_new) {
  const char* fn = "qkv::AttentionKvCache::append";
  const std::int64_t Hkv = k_.shape()[2], D = k_.shape()[3], Dv = v_.shape()[3];
  if (k_new.rank != 4 || v_new.rank != 4 || k_new.dim(0) != batch_ || v_new.dim(0) != batch_ || k_new.dim(2) != Hkv ||
      v_new.dim(2) != Hkv || k_new.dim(3) != D || v_new.dim(3) != Dv || v_new.dim(1) != k_new.dim(1))
    fail(fn, "k_new, v_new: expected [B = " + std::to_string(batch_) + ", Snew, Hkv = " + std::to_string(Hkv) +
                 ", D = " + std::to_string(D) + "] and [B, Snew, Hkv, Dv = " + std::to_string(Dv) + "], got k_new " +
                 dims(k_new) + ", v_new " + dims(v_new));
  // kvcache_append refuses (before writing) rows past a sequence's storage, i.e. past max_len:
  // "pos[b] = <length of b>: rows [pos, pos + Snew) must lie in [0, Skv = max_len)".
  kvcache_append(view(), k_new, v_new, lengths_.view());
  auto* len = lengths_.ptr<std::int64_t>();
  for (std::int64_t b = 0; b < batch_; ++b) len[b] += k_new.dim(1);
}

void AttentionKvCache::append_to(std::int64_t b, const View& k_new, const View& v_new) {
  const char* fn = "qkv::AttentionKvCache::append_to";
  if (b < 0 || b >= batch_)
    fail(fn, "b = " + std::to_string(b) + ": must be in [0, batch = " + std::to_string(batch_) + ")");
  const std::int64_t Hkv = k_.shape()[2], D = k_.shape()[3], Dv = v_.shape()[3];
  if (k_new.rank != 3 || v_new.rank != 3 || k_new.dim(1) != Hkv || v_new.dim(1) != Hkv || k_new.dim(2) != D ||
      v_new.dim(2) != Dv || v_new.dim(0) != k_new.dim(0))
    fail(fn, "k_new, v_new: expected [Snew, Hkv = " + std::to_string(Hkv) + ", D = " + std::to_string(D) +
                 "] and [Snew, Hkv, Dv = " + std::to_string(Dv) + "], got k_new " + dims(k_new) + ", v_new " +
                 dims(v_new));
  const std::int64_t Snew = k_new.dim(0);
  std::int64_t& len = lengths_.ptr<std::int64_t>()[b];
  // Checked here: kvcache_append sees sequence b as a batch of one and would name it pos[0].
  if (len + Snew > max_len_)
    fail(fn, "k_new: " + std::to_string(Snew) + " new rows for sequence " + std::to_string(b) + ", which holds " +
                 std::to_string(len) + " of at most max_len = " + std::to_string(max_len_));
  // Sequence b as a batch of one: its own rows (contiguous) or its row of the block table (paged).
  KvCacheView one = view();
  auto row_b = [&](View& t) {
    t.data = static_cast<char*>(t.data) + b * t.stride(0) * static_cast<std::int64_t>(dtype_size(t.dtype));
    t.shape[0] = 1;
  };
  if (one.block_table) {
    row_b(*one.block_table);
  } else {
    row_b(one.k), row_b(one.v);
    if (one.k_scale) row_b(*one.k_scale), row_b(*one.v_scale);
  }
  auto batch_of_one = [](const View& t) {
    return View::strided(t.data, t.dtype, {1, t.dim(0), t.dim(1), t.dim(2)},
                         {0, t.stride(0), t.stride(1), t.stride(2)});
  };
  kvcache_append(one, batch_of_one(k_new), batch_of_one(v_new), View::contiguous(&len, DType::i64, {1}));
  len += Snew;
}

void AttentionKvCache::reset() { zero(lengths_); }

void AttentionKvCache::reset(std::int64_t b) {
  if (b < 0 || b >= batch_)
    fail("qkv::AttentionKvCache::reset",
         "b = " + std::to_string(b) + ": must be in [0, batch = " + std::to_string(batch_) + ")");
  lengths_.ptr<std::int64_t>()[b] = 0;
}

AttentionOptions AttentionKvCache::causal_options() {
  AttentionOptions o;
  o.causal = true;
  o.align = Align::bottom_right_key_lengths;
  return o;
}

KernelInfo AttentionKvCache::attend(const View& q, const View& out, const AttentionOptions& opt,
                                    const std::optional<View>& lse) const {
  const char* fn = "qkv::AttentionKvCache::attend";
  if (opt.key_lengths) fail(fn, "opt.key_lengths: must be unset (the cache's lengths are the key lengths)");
  if (q.rank != 4 || q.dim(0) != batch_)
    fail(fn, "q: expected [B = " + std::to_string(batch_) + ", H, Sq, D], got " + dims(q));
  AttentionOptions o = opt;
  o.key_lengths = lengths_.view();
  return attention_kvcache(q, view(), out, o, lse);
}

}  // namespace qkv
