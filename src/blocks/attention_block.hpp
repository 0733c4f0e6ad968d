// Internal: one attention block, the seeds' multi-head attention as every caller runs it. The
// model's prefill (f32 or bf16 weights, bf16 GEMM inputs), its trace for the inspector and
// qkv::MultiHeadAttention all call attention_block; they differ only in how the projections are
// computed (an AttentionProjections backend) and where keys and values live (a KV cache or not).
// The decoding step (src/model/decode.cpp) runs the same block one KV head at a time inside its
// parallel region: its row-split GEMVs compute the head's q, k, v rows, attention_block_decode_head
// (the section at the end of this file) does rotary → cache append → attention, and its W_O stage
// follows once every head is done.
//
// The block's own configuration is qkv::MhaConfig (a model's comes from Config::attention()).
// Dimension letters: B sequences, S query rows of each, Skv key/value rows of each, H query heads,
// Hkv kv heads (H % Hkv == 0), D query/key size, Dv value size, C model width, n = S − r0 output rows.
//
//   q, k, v = proj.qkv()                             q [B·S, H·D], k [B·Skv, Hkv·D], v [B·Skv, Hkv·Dv]
//   rotary(q, k) at positions pos0 + s               (rope_theta > 0; pos0 = cache->len, else 0)
//   cache ← k, v at positions pos0 … pos0 + S − 1    (cache given: B = 1, Skv = pos0 + S after it;
//                                                    i8: quantised by qkv::kvcache_append, a row
//                                                    with a non-finite value stored as NaN)
//   att = attention(q rows r0 … S − 1, k, v, opt)    att [B·n, H·Dv], in the keys' dtype (i8 cache:
//                                                    qkv::attention_kvcache, q and att f32), then in
//                                                    proj.att_dtype() (rounded or widened once)
//   taps.before_out(q, att)                          (f32 att: knock heads out, record a trace)
//   y = beta·y + att · W_Oᵀ + b_O                    y [B·n, C]   (proj.out; y null: not run)
//   head_delta[b, h] = att_h · (W_O^h)ᵀ              optional [B, H, n, C] (f32 att)
//   block_delta[b] = Σ_h head_delta[b, h]            optional [B, n, C], summed in f64
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "qkv/attention.hpp"
#include "qkv/mha.hpp"
#include "qkv/types.hpp"

namespace qkv::blocks {

// Rows of q, k, v as a backend wrote them: row r of q starts at q + r·ld_q elements of dtype.
struct QkvRows {
  void *q = nullptr, *k = nullptr, *v = nullptr;
  std::int64_t ld_q = 0, ld_k = 0, ld_v = 0;
  DType dtype = DType::f32;  // f32, or bf16 (only for a bf16 cache and no rotary: no rounding left to do)
};

// How one block's projections are computed (f32 GEMM/GEMV, bf16 weights, bf16 GEMM inputs, …).
// The backend holds its input rows and weights; attention_block calls qkv() once, then out() once.
class AttentionProjections {
 public:
  virtual ~AttentionProjections() = default;
  // q, k, v of every row. `preferred` is bf16 when the keys go to a bf16 cache without rotary: a
  // backend that can round in its GEMM's epilogue returns bf16 rows then; f32 is always accepted.
  virtual QkvRows qkv(DType preferred) = 0;
  // The rows [B·S, H·Dv] (row length H·Dv) that out() reads as the attention's output, in att_dtype().
  virtual void* att() = 0;
  virtual DType att_dtype() const = 0;
  // y [n, C] = beta·y + att [n, H·Dv] · W_Oᵀ + b_O, att the rows of att().
  virtual void out(std::int64_t n, float* y, float beta) = 0;
};

// Layer l's keys and values in a KV cache: k, v [Hkv, cap, D] (elements of dtype: f32, bf16 or
// i8), positions 0 … len − 1 held; this call's S rows are appended at len (the caller advances len
// after). i8: k_scale, v_scale [Hkv, cap], row (h, p) = scale[h, p] · k[h, p, :]; the rows are
// written by qkv::kvcache_append and read by qkv::attention_kvcache, which see heads [h0, h0 + n)
// of the slot as a cache of one sequence [1, rows, n, D] with strides (·, D, cap·D, 1) and scales
// [1, rows, n] with strides (·, 1, cap): the heads-first layout as a strided view, nothing copied.
struct KvSlot {
  void *k = nullptr, *v = nullptr;
  DType dtype = DType::f32;
  std::int64_t cap = 0, len = 0;
  float *k_scale = nullptr, *v_scale = nullptr;  // i8 only
};

struct AttentionBlockTaps {
  View pattern;                  // [B, H, n, Skv] f32 or f64: each head's pattern (null data: none)
  View lse;                      // [B, H, n] f32: each query's logsumexp, for a backward (null data: none)
  float* head_delta = nullptr;   // [B, H, n, C]: Δe^h of each head, without b_O
  float* block_delta = nullptr;  // [B, n, C]: Σ_h Δe^h summed in f64 (needs head_delta)
  const float* wo = nullptr;     // W_O [C, H·Dv] f32, for head_delta
  // Called after the attention with the rotated q rows [B·S, H·D] (f32 q only, else null) and the
  // f32 att rows [B·n, H·Dv], which it may change (ablation) before W_O reads them.
  std::function<void(const float* q, float* att)> before_out;
};

// Scratch for a bf16 cache and f32 q rows: q_bf16 [n, H·D]; and when the keys' dtype differs from
// proj.att_dtype(): att_kv [n, H·Dv] in the keys' dtype (the attention writes there first).
struct AttentionScratch {
  std::uint16_t* q_bf16 = nullptr;
  void* att_kv = nullptr;
};

struct AttentionBlockCall {
  std::int64_t B = 1, S = 0, Skv = 0;  // Skv: without a cache (with one it is cache->len + S)
  std::int64_t r0 = 0;                 // first query row whose output is wanted (> 0 only with B = 1)
  MhaConfig shape;                     // H = n_heads, Hkv, D = d_head, Dv = d_value, C = d_model (all
                                       // resolved: no 0 defaults); d_source is the backend's business
  KvSlot* cache = nullptr;             // null: attention reads k, v where the projections wrote them
  float rope_theta = 0.0f;             // > 0: rotary on q and k
  AttentionOptions opt;                // as for qkv::attention (with a cache: causal, bottom-right)
  float* y = nullptr;                  // [B·n, C]; null: stop before W_O
  float beta = 0.0f;                   // 1: y += …
  AttentionBlockTaps taps;
  AttentionScratch scratch;
};

// Runs the block (see the top of this file). Rows are handed to qkv::attention as strided views:
// nothing is transposed. Throws what qkv::attention throws for options that do not fit.
void attention_block(AttentionProjections& proj, const AttentionBlockCall& call);

// ---------------------------------------------------------------------------------------------
// Packed texts (the encoder): the same block over B texts of lengths S_b packed into T = Σ S_b rows,
// no cache and no rotary; each text's queries see only that text's keys (bidirectional with
// opt.causal = false), which is what a key-padding mask does to padded texts, without the padding.
//
//   q, k, v = proj.qkv(proj.att_dtype())     q [T, H·D], k [T, Hkv·D], v [T, Hkv·Dv], in att_dtype()
//   att = attention_varlen(q, k, v, cu)      att [T, H·Dv] = proj.att(), written in place
//   taps.before_out(q, att)                  (f32 only: a trace records, as attention_block's)
//   y = beta·y + att · W_Oᵀ + b_O            y [T, C] (proj.out(T, y, beta); y null: not run)
//   head_delta[h] = att_h · (W_O^h)ᵀ         optional [H, T, C] (f32 only)
// The taps are attention_block's with B = 1 and n = T, except lse (not offered: must be null).
// taps.pattern [1, H, T, T] needs one text (B = 1): the block then runs qkv::attention on
// [1, H, T, D] views of the same rows (what attention_varlen runs for each text), which writes it.
// ---------------------------------------------------------------------------------------------
struct VarlenBlockCall {
  std::span<const std::int32_t> cu_seqlens;  // [B + 1]: 0 = cu[0] ≤ … ≤ cu[B] = T
  MhaConfig shape;                           // resolved, as AttentionBlockCall::shape
  AttentionOptions opt;                      // as for qkv::attention_varlen
  float* y = nullptr;                        // [T, C]; null: stop before W_O
  float beta = 0.0f;                         // 1: y += …
  AttentionBlockTaps taps;                   // before_out gets q [T, H·D] (row stride ld_q), att [T, H·Dv]
};

// Runs the packed block (see above). Throws what qkv::attention_varlen throws.
void attention_block_varlen(AttentionProjections& proj, const VarlenBlockCall& call);

// ---------------------------------------------------------------------------------------------
// The decoding step: a run of KV heads hk … hk + nh − 1, one new token of each of B sequences.
// Model::decode computes the run's rows of q, k, v with its row-split GEMVs, then calls
// attention_block_decode_head on the thread that took the run; W_O runs in the step's next stage.
// For each sequence b and KV head hk' of the run (G = H / Hkv query heads share it):
//   rotary(q_b [G, D], k_b [D]) at position cache[b].len  (cs non-null: cs [B, D], rope_angles of it)
//   cache[b].k[hk', len, :] ← k_b, cache[b].v[hk', len, :] ← v_b
//   out_b [G, D] = softmax(scale · q_b · K_bᵀ) · V_b                 over positions 0 … len
// attend_one (two passes, any D) on the cache's rows: f32, or bf16 (k_b, v_b rounded to bf16 when
// appended, the cache's rows widened as they are read; q_b, out_b and the sums stay f32). An i8
// cache: per sequence the run's k, v rows appended by one qkv::kvcache_append (a row with a
// non-finite value as zeros with NaN scales: see attention_block.cpp's append_i8) and its nh · G query
// rows attended by one qkv::attention_kvcache on this thread (the int8 contract: q_b and the
// probabilities quantised inside the kernel; out_b f32; scale: attention's default 1/√D). The caller
// advances each len after the whole step. Per sequence and head the result does not depend on B,
// on the thread, on the run or on the other heads (the step's bit-identity across batches and thread
// counts).
// ---------------------------------------------------------------------------------------------
struct DecodeHeadCall {
  std::int64_t B = 1, G = 1, D = 0, hk = 0, nh = 1;  // hk … hk + nh − 1: KV heads in [0, Hkv)
  const KvSlot* cache = nullptr;  // [B]: layer l's k, v [Hkv, cap, D] of each sequence (one dtype)
  float* q = nullptr;             // row b: q + b·ld_q, the run's nh·G·D values (rotated in place)
  float* k = nullptr;             // row b: k + b·ld_kv, nh·D values (rotated in place)
  float* v = nullptr;             // row b: v + b·ld_kv, nh·D values (i8: zeroed if not finite)
  float* out = nullptr;           // row b: out + b·ld_q, nh·G·D values
  std::int64_t ld_q = 0, ld_kv = 0;
  const float* cs = nullptr;      // [B, D] rotary angles, or null: no rotary
  float scale = 0.0f;             // 1 / √D (f32 and bf16 caches)
  float* scores = nullptr;        // scratch [max len + 1] (f32 and bf16 caches)
};

void attention_block_decode_head(const DecodeHeadCall& call);

}  // namespace qkv::blocks
