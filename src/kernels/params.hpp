// Internal: the validated parameters every attention kernel receives.
//
// The attention floor (src/attention/) checks the user's Views and options once and fills an
// AttnParams; kernels below trust it (they assert, never throw). Views keep the caller's
// strides: kernels read through them, so nothing is copied or made contiguous.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qkv/types.hpp"

namespace qkv::kernels {

// The causal / window / key-padding rule reduces, for every query row, to one contiguous
// range of allowed keys [lo, hi), and with keep_first = n to [lo, hi) ∪ [0, min(n, hi)): the
// first n keys escape window_left only. (A dense mask, if any, is applied on top of it.)
struct KeyRange {
  bool causal = false;
  std::int64_t diag_offset = 0;  // diag(i) = i + diag_offset (0 top-left, Skv − Sq bottom-right)
  bool diag_from_key_len = false;  // bottom_right_key_lengths: diag(i) = i + diag_offset + key_len, diag_offset = −Sq
  std::int64_t window_left = -1;
  std::int64_t window_right = -1;
  std::int64_t keep_first = 0;  // keys j < keep_first are allowed below lo (up to hi)

  // The diagonal of query i in a batch row with key_len valid keys (causal, windows, ALiBi).
  std::int64_t diag(std::int64_t i, std::int64_t key_len) const {
    return i + diag_offset + (diag_from_key_len ? key_len : 0);
  }

  // Keys j with lo ≤ j < hi may be attended by query i when key_len keys are valid (and, with
  // keep_first, also j < min(keep_first, hi)). hi ≤ lo: no key of the window may.
  void range(std::int64_t i, std::int64_t key_len, std::int64_t* lo, std::int64_t* hi) const {
    const std::int64_t diag = this->diag(i, key_len);
    std::int64_t l = 0, h = key_len;
    if (window_left >= 0) l = std::max(l, diag - window_left);
    if (causal) h = std::min(h, diag + 1);
    if (window_right >= 0) h = std::min(h, diag + window_right + 1);
    *lo = l;
    *hi = h;
  }

  // The first key some query row i ∈ [0, Sq) may attend when key_len keys are valid (key_len when
  // none may): a paged cache's blocks wholly below it, like those from key_len on, are never read.
  // 0 whenever keep_first keeps a key; otherwise the first non-empty window's lo (lo grows with i).
  std::int64_t first_key(std::int64_t Sq, std::int64_t key_len) const {
    std::int64_t first = key_len;
    for (std::int64_t i = 0; i < Sq; ++i) {
      std::int64_t lo, hi;
      range(i, key_len, &lo, &hi);
      if (std::min(keep_first, hi) > 0) return 0;
      if (hi > lo) first = std::min(first, lo);
    }
    return first;
  }
};

// Attention dropout (kernels/dropout.hpp): the keep/drop decision of (b0 + b, h, i, j) is a hash of
// (seed, offset, b0 + b, h, i, j); p = 0 turns it off.
struct DropoutParams {
  double p = 0.0;                 // in [0, 1)
  std::uint64_t seed = 0, offset = 0;
  std::int64_t b0 = 0;            // the mask's batch index of b = 0 (the sequence index in varlen calls)
  bool on() const { return p > 0.0; }
};

// A paged and/or int8 KV cache (qkv::attention_kvcache). AttnParams::k, v then have the logical
// shape [B, Hkv, Skv, D] with the cache's strides, dim 0 stepping blocks when paged; their element
// (b, hk, j, d) is at kv_offset(k, b, hk, j) + d · stride(3).
struct KvCacheLayout {
  const std::int32_t* table = nullptr;  // [B, ldt] block ids; null: contiguous (dim 0 = sequence)
  std::int64_t ldt = 0;
  int page_shift = 0;                   // rows per block = 2^page_shift
  View k_scale, v_scale;                // f32 [Bc, Hkv, Sc] (permuted as k) for i8 k, v; else data null
  bool paged() const { return table != nullptr; }
  bool i8() const { return k_scale.data != nullptr; }
  // Offset of row (b, hk, j) in a view whose strides are k's or v's (or their scales', which
  // have k's first three dims).
  std::int64_t offset(const View& t, std::int64_t b, std::int64_t hk, std::int64_t j) const {
    if (!table) return b * t.stride(0) + hk * t.stride(1) + j * t.stride(2);
    const std::int64_t blk = table[b * ldt + (j >> page_shift)];
    return blk * t.stride(0) + hk * t.stride(1) + (j & ((std::int64_t{1} << page_shift) - 1)) * t.stride(2);
  }
};

struct AttnParams {
  View q, k, v, out;              // [B,H,Sq,D] [B,Hkv,Skv,D] [B,Hkv,Skv,Dv] [B,H,Sq,Dv]
  View lse;                       // f32|f64 [B,H,Sq]; data == nullptr when not requested
  View pattern;                   // f32|f64 [B,H,Sq,Skv]; data == nullptr when not requested
  View scores;                    // f32|f64 [B,H,Sq,Skv]; data == nullptr when not requested
  // The stage of scores (qkv::ScoreStage): what the softmax sees (masked), or else scale · q·k for
  // every key, softcapped when scores_softcap (ScoreStage::softcapped) and softcap > 0.
  bool scores_masked = true;
  bool scores_softcap = false;
  View mask;                      // [B,H,Sq,Skv] with stride 0 on broadcast dims; data == nullptr if none
  bool mask_is_bool = false;      // u8 mask (allow/deny) vs additive float mask
  std::vector<std::int64_t> key_len;  // [B]: valid keys per batch (Skv when no key_lengths given)
  std::int64_t B = 0, H = 0, Hkv = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  double scale = 1.0;
  KeyRange rule;
  DropoutParams dropout;
  int threads = 1;
  // Score variants (qkv/attention.hpp), resolved to f64 by the attention floor.
  double softcap = 0.0;           // > 0: scores → softcap · tanh(score / softcap); 0: none
  std::vector<double> alibi;      // [H] or [B·H] ALiBi slopes (alibi_sb = 0 or H), or empty
  std::int64_t alibi_sb = 0;      // the slope of (b, h) is alibi[b · alibi_sb + h]
  std::vector<double> sinks;      // [H] sink logits, or empty
  KvCacheLayout cache;            // paged / int8 KV cache; default: plain k, v

  bool has_score_mod() const { return softcap > 0.0 || !alibi.empty(); }
  std::int64_t group() const { return H / Hkv; }  // query heads per kv head
};

struct AttnBwdParams {
  AttnParams fwd;                 // q, k, v, out, lse (required), mask, rule, ...
  View dout;                      // [B,H,Sq,Dv]
  View dq, dk, dv;                // [B,H,Sq,D] [B,Hkv,Skv,D] [B,Hkv,Skv,Dv]
};

// The oracle: straightforward loops, f64 accumulation, any strides and dtypes. A paged or int8
// cache (p.cache) is first gathered and dequantised into f64 [B, Hkv, Skv, D] buffers.
void attention_reference(const AttnParams& p);
void attention_backward_reference(const AttnBwdParams& p);
// dsink[h] += −Σ_{b,i} exp(sink_h − lse_bhi) · (dout_bhi · out_bhi) over p's rows (f64; needs p.fwd.sinks).
// The same for every kernel: it reads only the forward's out, lse and dout.
void sink_gradient(const AttnBwdParams& p, double* dsink);

}  // namespace qkv::kernels
