// qkv/attention.hpp — scaled dot-product attention: the public C++ API.
//
// Dimension letters (used everywhere in qkv):
//   B    batch                    H    query heads          Hkv  key/value heads (H % Hkv == 0)
//   Sq   query positions          Skv  key/value positions  D    query/key head dim  Dv  value head dim
//
// Layout contract of attention():
//
//   argument      dtype                 shape                 notes
//   q             f32 | bf16 | f64      [B, H,   Sq,  D ]     any strides ≥ 0
//   k             same as q             [B, Hkv, Skv, D ]     query head h reads kv head h / (H / Hkv)
//   v             same as q             [B, Hkv, Skv, Dv]     (grouped-query attention, nothing copied)
//   out           same as q             [B, H,   Sq,  Dv]     written; must not overlap the inputs
//   lse           f32 | f64  (opt.)     [B, H,   Sq]          log Σ_j exp(score_ij) over allowed keys
//   pattern       f32 | f64  (opt.)     [B, H,   Sq,  Skv]    softmax probabilities; each row sums to 1
//   scores.scores f32 | f64  (opt.)     [B, H,   Sq,  Skv]    the scores at scores.stage (below)
//   opt.mask      u8 | f32 | bf16 | f64 [Bm, Hm, Sq, Skv]     Bm ∈ {1, B}, Hm ∈ {1, H} (stride 0 also ok)
//   opt.key_lengths  i32 | i64          [B]                   0 ≤ len ≤ Skv
//   opt.alibi_slopes f32 | bf16 | f64   [H] or [B, H]         finite; alibi_standard_slopes(H) for the usual ones
//   opt.sinks        f32 | bf16 | f64   [H]                   finite sink logits (natural units, not scaled)
//   dsinks (bwd)     f32 | f64          [H]                   written: ∂L/∂sinks, summed over batch and rows
//
// The computation, for every (b, h, i), in ONNX Attention's order (opsets 23–24: scale, softcap,
// add mask, softmax; also FlashAttention's and Gemma 2's):
//   score_ij = scale · q_i · k_j                               scale defaults to 1/√D
//   score_ij → c · tanh(score_ij / c)                          opt.softcap = c > 0
//   score_ij → score_ij (+ additive mask_ij) − slopes[(b,) h] · |diag(i) − j|   opt.alibi_slopes (diag: below)
//   allowed(i, j) = causal/window rule below ∧ j < key_lengths[b] ∧ bool mask_ij
//   p_ij = exp(score_ij) / (exp(sink_h) + Σ_{allowed j'} exp(score_ij'))  on allowed j, 0 elsewhere
//   out_i = Σ_j p_ij · v_j            lse_i = log (exp(sink_h) + Σ_{allowed j} exp(score_ij))
// sink_h = opt.sinks[h] (gpt-oss's learned sink: a key with a logit and no value); without
// opt.sinks exp(sink_h) = 0. A query row with no allowed key (or whose additive mask is −∞
// everywhere) gives out_i = 0 and lse_i = −∞ (sink_h with opt.sinks), never NaN.
// ALiBi is a bias like the additive mask, after softcap as in FlashAttention (ONNX has no ALiBi).
// Masked keys stay masked: a −∞ mask entry is added after the cap, never turned into −c.
//
// Non-finite values (one policy, every kernel, ISA and dtype; as torch, so divergence shows):
//   - An additive mask entry of −∞ denies the key like a false bool mask entry.
//   - With opt.softcap a +∞ score becomes c (tanh(+∞) = 1), as ONNX computes it.
//   - A NaN or +∞ score_ij on an allowed key (from NaN/±∞ in q_i or k_j, or a NaN/+∞ mask
//     entry) makes row i NaN: out_i and lse_i are NaN (pattern_ij NaN on its allowed keys).
//     A score of −∞ on an allowed key counts as p_ij = 0.
//   - Masked keys stay ignored even if their K is NaN, and a row with no allowed key stays
//     zeros even if its q is NaN. (torch, which adds −∞ and multiplies full matrices, gives NaN
//     in both cases.)
//   - V is used as IEEE arithmetic does: a NaN in v_j reaches every row with p_ij > 0, and may
//     reach rows that mask key j (0 · NaN) in the fast kernels, as in torch.
//   - Backward: a NaN row has a NaN dq_i and makes dk_j, dv_j NaN for the keys j it may attend;
//     the keys it masks and the other rows are untouched (torch: NaN for every key of the head).
//
// Dropout (opt.dropout_p = p > 0; training), as torch's SDPA and FlashAttention apply it:
//   keep_ij ∈ {0, 1}, P(keep_ij = 1) = 1 − p (to within 2⁻³³), a counter-based hash of
//           (opt.dropout_seed, opt.dropout_offset, b, h, i, j): the same mask for every kernel,
//           ISA, dtype, tiling and thread count, regenerated tile by tile (never stored N×N);
//           in attention_varlen b is the sequence index and i, j positions within it
//   out_i = Σ_j p_ij · keep_ij / (1 − p) · v_j    lse_i: the softmax's, before dropout
//   pattern_ij = p_ij · keep_ij / (1 − p)  (the weights that multiplied V, as torch's math path
//           returns them; rows no longer sum to 1)
// attention_backward with the same options regenerates the same mask. p = 0 runs exactly the
// code (and gives the bits) of a call without dropout. dropout_mask() below writes the mask.
// A NaN row stays NaN whatever its mask.
//
// The seeds draw the attention pattern with keys down the left and queries across the top, so
// each *column* sums to 1. qkv stores it the PyTorch way, one *row* per query: pattern[b,h,i,:]
// is the distribution of query i over the keys; transpose to get the seeds' picture.
//
// Causal masks, windows and ALiBi distances are measured from a diagonal whose placement
// depends on `align` when Sq ≠ Skv:
//
//   align                      diag(i)                    as
//   top_left (default)         i                          PyTorch is_causal
//   bottom_right               i + Skv − Sq               FlashAttention (padded length Skv)
//   bottom_right_key_lengths   i + key_lengths[b] − Sq    ONNX Attention (nonpad_kv_seqlen),
//                                                         FlashAttention's cache_seqlens
//   (without opt.key_lengths, bottom_right_key_lengths is bottom_right)
//
//   causal                 : j ≤ diag(i)
//   window_left  = L ≥ 0   : j ≥ diag(i) − L, or j < keep_first (below)
//   window_right = R ≥ 0   : j ≤ diag(i) + R
//   keep_first   = n ≥ 0   : the first n keys stay allowed whatever window_left says (StreamingLLM's
//                            attention-sink tokens beside a sliding window; causal, window_right,
//                            key_lengths and masks still apply to them). n = 0: none kept.
//
//   Sq = 1, Skv = 10, causal bottom_right, window_left = 3, keep_first = 2:
//     key j → 0 1 2 3 4 5 6 7 8 9
//     q 0     x x . . . . x x x x
//
//   Sq = 3, Skv = 5, causal        (x = may attend, . = masked)
//
//     top_left (PyTorch is_causal)     bottom_right (FlashAttention; KV-cache decoding)
//            key j →                          key j →
//            0 1 2 3 4                        0 1 2 3 4
//     q 0    x . . . .                 q 0    x x x . .
//     q 1    x x . . .                 q 1    x x x x .
//     q 2    x x x . .                 q 2    x x x x x
//
// With bottom_right and Sq > Skv the first Sq − Skv queries see no key and give zeros.
//
// Score outputs (ONNX Attention's qk_matmul_output; the pattern is its mode 3). scores[b,h,i,j] is
//   stage        value                                         ONNX qk_matmul_output_mode (onnx ≥ 1.23)
//   scaled       scale · q_i · k_j, every (i, j)               0
//   softcapped   c · tanh(scaled / c) (scaled without softcap) 1
//   masked       what the softmax sees: softcapped + additive  2 (plus ALiBi, which ONNX lacks)
//                mask − ALiBi bias on allowed keys, −∞ on the others
// The first two are computed for masked keys too (as a matmul would); they run on the reference.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/runtime.hpp"
#include "qkv/types.hpp"

namespace qkv {

enum class Align : std::uint8_t { top_left, bottom_right, bottom_right_key_lengths };

// The stage of the score output (the table above).
enum class ScoreStage : std::uint8_t { scaled, softcapped, masked };

struct ScoresOutput {
  View scores;                      // f32 | f64 [B, H, Sq, Skv], written
  ScoreStage stage = ScoreStage::masked;
};

// Which implementation runs. `automatic` takes the fastest kernel that supports the call
// and falls back to the reference for anything the fast kernels do not take.
enum class Kernel : std::uint8_t { automatic, reference, flash, flash_decode };

struct AttentionOptions {
  std::optional<double> scale;      // default 1/√D
  bool causal = false;
  Align align = Align::top_left;    // placement of the causal/window diagonal when Sq ≠ Skv
  std::int64_t window_left = -1;    // -1: unbounded
  std::int64_t window_right = -1;   // -1: unbounded (causal implies 0)
  std::int64_t keep_first = 0;      // ≥ 0: keys j < keep_first escape window_left (StreamingLLM)
  std::optional<View> mask;         // boolean (u8) or additive (float) mask, see the table above
  std::optional<View> key_lengths;  // per-batch number of valid keys (key padding)
  // Score variants (see the computation above); none by default.
  std::optional<double> softcap;      // c > 0: scores capped to c · tanh(score / c)
  std::optional<View> alibi_slopes;   // [H] or [B, H] (per batch row, FlashAttention's): bias −slope · |diag(i) − j|
  std::optional<View> sinks;          // [H]: per-head sink logit in every row's softmax denominator
  int num_threads = 0;              // 0: the library default (set_num_threads / QKV_NUM_THREADS)
  Kernel kernel = Kernel::automatic;
  // Attention dropout, see "Dropout" above: each probability is dropped with chance dropout_p ∈ [0, 1);
  // the mask is a function of (dropout_seed, dropout_offset, b, h, i, j) alone.
  double dropout_p = 0.0;
  std::uint64_t dropout_seed = 0;
  std::uint64_t dropout_offset = 0;
};

// What ran: the kernel, the instruction set it was compiled for (at most active_isa(): f32 calls
// report avx512 on avx512_bf16, int8 KV caches avx512_vnni), and a printable name such as
// "flash_avx512_f32" or "reference_f64".
struct KernelInfo {
  Kernel kernel = Kernel::reference;
  Isa isa = Isa::scalar;
  const char* name = "reference";
};

// Forward attention. Throws std::invalid_argument on any inconsistent argument.
KernelInfo attention(const View& q, const View& k, const View& v, const View& out,
                     const AttentionOptions& opt = {}, const std::optional<View>& lse = std::nullopt,
                     const std::optional<View>& pattern = std::nullopt,
                     const std::optional<ScoresOutput>& scores = std::nullopt);

// Backward attention: given dout = ∂L/∂out, writes dq = ∂L/∂q, dk, dv.
//   q, k, v, out, dout: as in attention(); lse: f32 [B, H, Sq] from the forward of the same call.
//   dq [B, H, Sq, D], dk [B, Hkv, Skv, D], dv [B, Hkv, Skv, Dv], same dtype as q.
//   With grouped-query attention dk and dv are summed over the query heads of each group.
//   An additive float mask and the ALiBi slopes are treated as constants (no gradient).
//   Dropout: opt.dropout_* as in the forward regenerate its mask; with W = keep / (1 − p),
//   dv_j = Σ_i p_ij W_ij dout_i and ds_ij = p_ij (W_ij dout_i · v_j − dout_i · out_i) (FlashAttention's).
//   dsinks (only with opt.sinks): ∂L/∂sink_h = −Σ_{b,i} exp(sink_h − lse_i) · (dout_i · out_i).
KernelInfo attention_backward(const View& q, const View& k, const View& v, const View& out,
                              const View& dout, const View& lse, const View& dq, const View& dk,
                              const View& dv, const AttentionOptions& opt = {},
                              const std::optional<View>& dsinks = std::nullopt);

// Variable-length batches in the packed layout of FlashAttention's varlen API:
//   q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv], out [Tq, H, Dv], lse (opt.) [H, Tq];
//   cu_seqlens_q, cu_seqlens_k: i32 or i64 [B + 1], non-decreasing, starting at 0 and ending at
//   Tq and Tk. Sequence b owns rows [cu_q[b], cu_q[b+1]) of q and [cu_k[b], cu_k[b+1]) of k, v.
//   Causal/window alignment applies per sequence; opt.mask and opt.key_lengths must be empty.
KernelInfo attention_varlen(const View& q, const View& k, const View& v, const View& out,
                            const View& cu_seqlens_q, const View& cu_seqlens_k,
                            const AttentionOptions& opt = {},
                            const std::optional<View>& lse = std::nullopt);

// Backward of attention_varlen: dq [Tq, H, D], dk [Tk, Hkv, D], dv [Tk, Hkv, Dv] from
// dout [Tq, H, Dv] and the forward's out and lse [H, Tq] (f32), with the same offsets and options.
// Keys of a sequence without queries get zero gradients. Deterministic for any thread count.
KernelInfo attention_varlen_backward(const View& q, const View& k, const View& v, const View& out,
                                     const View& dout, const View& lse, const View& dq, const View& dk,
                                     const View& dv, const View& cu_seqlens_q, const View& cu_seqlens_k,
                                     const AttentionOptions& opt = {},
                                     const std::optional<View>& dsinks = std::nullopt);

// Attention against a KV cache in the layout of FlashAttention's flash_attn_with_kvcache and vLLM
// (token-major: one row per position holds every kv head):
//
//   argument          dtype                 shape                    notes
//   q                 f32 | bf16 | f64      [B, H, Sq, D]            as attention()
//   cache.k           q's dtype, i8 or f16  [Bc, Sc, Hkv, D]         any strides ≥ 0
//   cache.v           cache.k's dtype       [Bc, Sc, Hkv, Dv]
//   cache.block_table i32 (opt.)            [B, max_blocks]          paged: see below
//   cache.k_scale     f32 (with i8)         [Bc, Sc, Hkv]            key (c, s, hk) = k_scale · k
//   cache.v_scale     f32 (with i8)         [Bc, Sc, Hkv]            (per token and head)
//   out, lse                                as attention()
//
// Contiguous (no block_table): Bc = B, Sc = Skv; key j of sequence b is row (b, j).
// Paged (block_table): a pool of Bc blocks of Sc rows each (Sc a power of two, 16–256 as vLLM's
// and FlashAttention's page sizes); key j of sequence b is row j % Sc of block
// block_table[b, j / Sc], and Skv = max_blocks · Sc. opt.key_lengths (FlashAttention's
// cache_seqlens) says how many keys each sequence has. Only the blocks holding keys some query
// row may attend are read, and their entries must be in [0, Bc): keys [f, key_lengths[b]), where
// f is the first key of the earliest window (0 with keep_first). The rest of a row of the table
// (past the key length, or wholly below every row's window_left) is never read: vLLM pads it
// with anything, −1 included. kvcache_append reads only the entries of the blocks it writes.
// int8 (cache.k.dtype i8, q f32 or bf16): the K and V rows are read as int8 and scaled inside the
// kernel, by one arithmetic contract on every ISA (src/kernels/cpu/decode_i8.hpp; AVX-512 computes
// the same integers, with VNNI on the avx512_vnni and avx512_bf16 levels):
//   - each query row is quantised symmetrically to int8 with one f32 step (llama.cpp's q8_0
//     activations): d = max|q| / 127, q8 = round(q / d); score_j = scale · d · k_scale_j ·
//     Σ_d q8 · k8_j, the sum exact in int32;
//   - P·V: per tile of ≤ 64 keys and query row, the weights w_j = p_j · v_scale_j are rounded to
//     15-bit fixed point on the tile's largest, w16 = round(w · 32767 / w_max), and Σ_j w16 · v8_j
//     is exact in int32 (then scaled by w_max / 32767 into the f32 accumulators).
// Bound: each output row differs from attention() in f64 on the dequantised cache (k_scale · k8,
// v_scale · v8) and the exact q by at most
//   (e^{2Δ} − 1) · V + 64 / 65534 · V   (+ the f32 rounding of the sums),
//   Δ = scale · d / 2 · max_j ‖k_j‖₁, V = max_j ‖v_j‖_∞ over the row's keys (dequantised):
// q's rounding (≤ d / 2 per element) moves each score by ≤ Δ, so each probability by a factor in
// [e^{−2Δ}, e^{2Δ}]; each weight is off by ≤ half its tile's step w_max / 32767, ≤ 64 keys per
// tile, and Σ_tiles w_max ≤ Σ_j w_j. Both terms are worst cases: at D = 128 with q ~ N(0, 1) the
// first is ≈ 0.1 V where the error seen is ≈ 10^-3 V (tests/kernels/test_kvcache.cpp prints it).
// f16 (cache.k.dtype f16, q f32 or bf16): rows widened exactly to f32 inside the kernel (as int8,
// scale 1); kvcache_append rounds to nearest. Half the bytes of f32, finer steps than bf16.
// Every other option is attention()'s (causal alignments, masks [.., Sq, Skv], variants,
// dropout). The fast path is the flash_decode kernel (keys split into chunks, every ISA), for
// prefill too; Kernel::reference gathers the dequantised cache in f64 and runs the reference.
struct KvCacheView {
  View k, v;
  std::optional<View> block_table;
  std::optional<View> k_scale, v_scale;
};

KernelInfo attention_kvcache(const View& q, const KvCacheView& cache, const View& out, const AttentionOptions& opt = {},
                             const std::optional<View>& lse = std::nullopt);

// Writes new keys and values into a cache at each sequence's next positions: rows
// [pos[b], pos[b] + Snew) of sequence b ← k_new [B, Snew, Hkv, D], v_new [B, Snew, Hkv, Dv]
// (through the block table when paged; those blocks must be in the table). For an i8 cache each
// (row, head) is quantised symmetrically: scale = max|x| / 127 (1 for a zero row), q = round(x / scale),
// the scale written to k_scale / v_scale. pos: i32 | i64 [B], pos[b] + Snew ≤ Skv.
void kvcache_append(const KvCacheView& cache, const View& k_new, const View& v_new, const View& pos);

// The ALiBi slopes of the paper (Press et al., 2022) for H heads, as BLOOM and MPT build them:
// for H a power of two, slope_h = 2^(−8 (h + 1) / H); otherwise the slopes of the largest power
// of two n < H, then every other slope of 2n heads (2^(−4 (2m + 1) / n), m = 0, 1, …) for the rest.
std::vector<double> alibi_standard_slopes(std::int64_t H);

// The keep mask opt.dropout_* gives an attention call of these sizes: mask [B, H, Sq, Skv] u8 ← keep_ij
// (1 kept, 0 dropped), written through its strides. For tests and for users who check or reproduce
// qkv's dropout in their own code. Throws std::invalid_argument on a bad p or mask.
void dropout_mask(const View& mask, double dropout_p, std::uint64_t seed, std::uint64_t offset = 0);

// Threads and instruction set (set_num_threads, set_isa, active_isa …): qkv/runtime.hpp.
const char* kernel_name(Kernel k);

}  // namespace qkv
