// qkv/kv_cache.hpp — an owning KV cache for decoding: B sequences, each with its own length, kept
// contiguous or paged, in f32, bf16, f16 or i8, and attended through qkv::attention_kvcache.
// It owns what attention_kvcache's KvCacheView only points at (qkv/attention.hpp has the layout and
// the kernels' contract); python/qkv/kvcache.py's KVCache wraps it for Python.
//
//   member / argument     dtype                shape                            notes
//   view().k, view().v    dtype                [B, max_len, Hkv, D | Dv]        contiguous (block_size 0)
//                                              [B · max_blocks, block_size, Hkv, D | Dv]   paged
//   view().k_scale,       f32 (i8 only)        [.., .., Hkv]                    one scale per token and head
//     view().v_scale
//   view().block_table    i32 (paged only)     [B, max_blocks]                  [b, m] = b · max_blocks + m
//   lengths()             i64                  [B]                              tokens each sequence holds
//   append: k_new, v_new  f32 | bf16 | f64     [B, Snew, Hkv, D], [B, Snew, Hkv, Dv]   every sequence
//   append_to(b, …)       f32 | bf16 | f64     [Snew, Hkv, D], [Snew, Hkv, Dv]         sequence b only
//   attend: q             f32 cache: f32; bf16 cache: bf16; f16, i8: f32 or bf16   [B, H, Sq, D]
//   attend: out (, lse)   q's dtype (f32)      [B, H, Sq, Dv] ([B, H, Sq])
//
// An i8 cache is attended with q quantised to int8 per (row, head) and the probabilities to 15-bit
// fixed point, on every ISA: qkv/attention.hpp's int8 contract and its error bound against f64
// attention on the dequantised cache, (e^{2Δ} − 1) · V + 64 / 65534 · V.
//
// max_blocks = ceil(max_len / block_size); block_size is a power of two (vLLM and FlashAttention
// page in 16–256 rows). The blocks are handed to the sequences in order, so a sequence's rows are
// the blocks b · max_blocks … b · max_blocks + max_blocks − 1 of the pool.
// append writes each sequence's new rows after the ones it holds (kvcache_append: f32 and bf16 as
// given, rounded for bf16 and f16; i8 quantised per (token, head) with scale = max|x| / 127) and
// advances its length; a sequence may hold at most max_len tokens (paged: max_len rounded up to
// whole blocks, max_blocks · block_size, which max_len() reports). attend runs attention of the
// newest queries against every token each sequence holds: opt.key_lengths is the cache's lengths
// (setting it is an error), everything else is attention_kvcache's. causal_options() is what a
// decoder wants: causal, each sequence's diagonal at its own length (the last query sees all its
// keys; Align::bottom_right_key_lengths).
//
// Errors name "qkv::AttentionKvCache::<method>", the argument, the value and what was wrong
// (std::invalid_argument; qkv::OutOfMemory when the storage cannot fit), except those append passes
// on from kvcache_append, which name it: the dtypes and, for rows past max_len,
// "pos[b] = <length of b>: rows [pos, pos + Snew) must lie in [0, Skv = max_len)". A failed append
// changes nothing but the rows past the lengths.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/attention.hpp"
#include "qkv/types.hpp"

namespace qkv {

class AttentionKvCache {
 public:
  // batch, max_len, kv_heads, head_dim ≥ 1; value_dim 0: head_dim; dtype f32, bf16, f16 or i8;
  // block_size 0: contiguous, else a power of two (paged). The storage is zeroed, every length 0.
  AttentionKvCache(std::int64_t batch, std::int64_t max_len, std::int64_t kv_heads, std::int64_t head_dim,
                   DType dtype = DType::f32, std::int64_t value_dim = 0, std::int64_t block_size = 0);

  // New rows for every sequence (each after its own tokens), or for sequence b alone.
  void append(const View& k_new, const View& v_new);
  void append_to(std::int64_t b, const View& k_new, const View& v_new);

  // Forget the tokens of every sequence, or of sequence b (its rows are reused by later appends).
  void reset();
  void reset(std::int64_t b);

  // out ← attention of q against the cache (see above); opt.key_lengths must be unset.
  KernelInfo attend(const View& q, const View& out, const AttentionOptions& opt = causal_options(),
                    const std::optional<View>& lse = std::nullopt) const;
  static AttentionOptions causal_options();

  std::int64_t batch() const { return batch_; }
  std::int64_t max_len() const { return max_len_; }
  std::int64_t block_size() const { return block_size_; }  // 0: contiguous
  DType dtype() const { return k_.dtype(); }
  std::int64_t length(std::int64_t b) const;  // tokens sequence b holds
  View lengths() const { return lengths_.view(); }
  // The storage as attention_kvcache reads it (views into this object; valid while it lives).
  KvCacheView view() const;

 private:
  std::int64_t batch_, max_len_, block_size_;
  Buffer k_, v_, k_scale_, v_scale_, block_table_, lengths_;
};

}  // namespace qkv
