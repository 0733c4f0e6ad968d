// Internal: the fast CPU attention backward (FlashAttention-2 style), shared between its portable
// driver and the per-ISA tile loops. Its parts, one file each, in the order a call runs them:
//   attention_backward_prepass.cpp   Prepass: Q and dO rows as the tasks read them; L and delta per row
//   attention_backward_plan.cpp      ChunkPlan: key chunks, their cuts, the tasks' order, dQ partials
//   attention_backward_impl.hpp      backward_task: the per-task tile loop, compiled per ISA by
//                                    attention_backward_<isa>.cpp (attention_backward_avx512bf16.cpp: vdpbf16ps)
//   attention_backward.cpp           the driver (attention_backward_flash), the row helpers, reduce_dq
//
// Dimensions: B, H, Hkv, Sq, Skv, D, Dv as everywhere; G = H / Hkv query heads per kv head.
// Dp, Dvp: D and Dv rounded up to 16 (one V16); padded columns of packed rows are zero.
//
// Algorithm (nothing of size Sq × Skv is ever stored):
//   prepass, per (b, h, i):  delta_i = dout_i · out_i,   L_i = lse_i · log2(e)
//   tasks, one per (b, hk, key chunk c), each owning dK, dV of its keys, per pass over up to
//   kPassBlocks key blocks of Bk keys (Q, dO and dQ rows of a query block serve all of them):
//     for each query head h of the group, each query block of Bq rows, each key block of the
//     pass that these rows may see:
//       S  = Q·Kᵀ                       [Bq, Bk]
//       P  = 2^(S·scale·log2e + mask − L)   (0 where masked or outside the row's keys, which with
//            keep_first are [0, min(n, hi)) ∪ [lo, hi), params.hpp; softcap / ALiBi before − L)
//       dP = dO·Vᵀ                       [Bq, Bk]
//       with dropout (W = keep / (1 − p), regenerated from the seed, kernels/dropout.hpp):
//         dP ∘= W, and Z = P ∘ W takes P's place in dV (the forward's out = Z·V)
//       dS = P ∘ (dP − delta) · scale    (∘ (1 − tanh²) with softcap)
//       dV += Pᵀ·dO (Zᵀ·dO),  dK += dSᵀ·Q,  dQ_c += dS·K
//     (none of dV, dK, dQ_c is zeroed first: the first tile to reach a row stores its sum there,
//     the later ones add to it, and rows no tile reaches are zeroed)
//   reduce, per (b, h, i): dq_i = Σ_c dQ_c,i in increasing c.
// Without a dense mask, score variants or dropout, P and dS are formed in the epilogues of the S
// and dP products (in registers), and every product runs only on the register tiles that hold
// allowed keys: the diagonal tiles of causal attention compute their lower part.
// The key chunks, blocks and every loop order depend only on the shapes, never on the thread
// count, so the result is bit-identical for any number of threads.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/scratch.hpp"
#include "kernels/params.hpp"
#include "qkv/runtime.hpp"

namespace qkv::kernels::bwd {

inline constexpr std::int64_t kBq = 64;  // query rows per tile
inline constexpr std::int64_t kBk = 64;  // keys per tile (a multiple of 16)

inline constexpr std::int64_t pad16(std::int64_t n) { return (n + 15) / 16 * 16; }

// Everything a task needs, resolved once by the driver. Pointers are f32 and contiguous unless
// said otherwise; the caller's strided / bf16 tensors are reached through the functions below.
struct Context {
  const AttnBwdParams* p = nullptr;
  std::int64_t B = 0, H = 0, Hkv = 0, G = 1, Sq = 0, Skv = 0, D = 0, Dv = 0, Dp = 0, Dvp = 0;
  float scale = 1.0f;
  float scale_log2e = 1.0f;  // scale · log2(e)
  KeyRange rule;
  const std::int64_t* key_len = nullptr;  // [B]
  bool has_mask = false;
  bool dropout = false;          // the forward's dropout (p->fwd.dropout); the factors below
  std::uint32_t dropout_t = 0;   // keep ⟺ bits ≥ dropout_t
  float dropout_rs = 1.0f;       // 1 / (1 − p)
  // Score variants (score_mod.hpp): softcap · log2(e) (0: none), ALiBi slopes [H] (null: none).
  float softcap_log2 = 0.0f;
  const double* alibi = nullptr;  // slope of (b, h): alibi[b · alibi_sb + h]
  std::int64_t alibi_sb = 0;

  // Q and dO rows as f32: either the caller's own memory (f32, unit inner stride, D and Dv
  // multiples of 16) or packed copies [B, H, Sq, Dp] / [B, H, Sq, Dvp].
  const float* q = nullptr;
  const float* dout = nullptr;
  std::int64_t q_sb = 0, q_sh = 0, q_ld = 0;  // element strides of batch, head, row
  std::int64_t o_sb = 0, o_sh = 0, o_ld = 0;
  // The operands of the AVX-512 BF16 task (attention_backward_avx512bf16.cpp), as bf16 bits; it
  // reads these instead of q and dout above (both null then), and they are null on the f32 tiles:
  //   qb  [B, H, Sq, Dp]         Q rows, zero past D (pairs of adjacent d: the A operand of Q·Kᵀ)
  //   qb2 [B, H, Sq2, Dp, 2]     rows 2i and 2i + 1 interleaved element by element, Sq2 = ⌈Sq/2⌉,
  //                              a zero row past Sq (pairs of adjacent rows: the B operand of dSᵀ·Q)
  //   ob, ob2                    the same for dO with Dvp
  const std::uint16_t *qb = nullptr, *qb2 = nullptr, *ob = nullptr, *ob2 = nullptr;
  const float* L = nullptr;      // [B, H, Sq] lse · log2(e); +∞ for rows without allowed keys
  const float* delta = nullptr;  // [B, H, Sq]

  // dQ partial sums, one per key chunk. Chunk 0 accumulates straight into the caller's dq when
  // that is f32 with unit inner stride and D a multiple of 16 (dq0 ≠ nullptr); the other chunks
  // (all of them otherwise) in dq_part [C or C − 1, B, H, Sq, Dp].
  float* dq0 = nullptr;
  std::int64_t dq0_sb = 0, dq0_sh = 0, dq0_ld = 0;
  float* dq_part = nullptr;
  // dK and dV accumulate straight into the caller's dk, dv when both are usable_in_place (f32, unit
  // inner stride, D and Dv multiples of 16: dk0, dv0 ≠ nullptr), else in the arena and are copied
  // out (store_dkdv_block) after each pass.
  float *dk0 = nullptr, *dv0 = nullptr;
  std::int64_t dk0_sb = 0, dk0_sh = 0, dk0_ld = 0, dv0_sb = 0, dv0_sh = 0, dv0_ld = 0;
  std::int64_t chunks = 1;       // C
  std::int64_t key_blocks = 0;   // ceil(Skv / kBk)
  // Key blocks [chunk_begin[b·(C+1) + c], chunk_begin[b·(C+1) + c + 1]) form chunk c of batch b;
  // the cuts give every chunk about the same number of tiles that are not skipped.
  const std::int64_t* chunk_begin = nullptr;

  std::int64_t arena_floats = 0;  // per-thread scratch size, see arena layout in the ISA files

  const float* q_rows(std::int64_t b, std::int64_t h) const { return q + b * q_sb + h * q_sh; }
  const float* dout_rows(std::int64_t b, std::int64_t h) const { return dout + b * o_sb + h * o_sh; }
  float* dq_rows(std::int64_t c, std::int64_t b, std::int64_t h) const {
    if (dq0) return c == 0 ? dq0 + b * dq0_sb + h * dq0_sh : dq_part + (((c - 1) * B + b) * H + h) * Sq * Dp;
    return dq_part + ((c * B + b) * H + h) * Sq * Dp;
  }
  std::int64_t dq_ld(std::int64_t c) const { return dq0 && c == 0 ? dq0_ld : Dp; }
  std::int64_t tasks() const { return B * Hkv * chunks; }
};

// Portable helpers the ISA files call (defined in attention_backward.cpp).
//   KT [D, kBk] and VT [Dv, kBk]: keys / values of block [k0, k0 + nk) transposed, columns ≥ nk zero;
//   Kr [kBk, Dp]: the same keys row-major, padding zero.
void pack_kv_block(const Context& cx, std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk, float* KT,
                   float* Kr, float* VT);
// row[j] for j < nk: the dense mask at (b, h, i, k0 + j) in log2 units — 0 / −∞ for a boolean
// mask, mask · log2(e) for an additive one.
void load_mask_row(const Context& cx, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t k0,
                   std::int64_t nk, float* row);
// Writes dK [nk, Dp] and dV [nk, Dvp] accumulators to the caller's dk, dv rows [k0, k0 + nk).
void store_dkdv_block(const Context& cx, std::int64_t b, std::int64_t hk, std::int64_t k0, std::int64_t nk,
                      const float* dK, const float* dV);

// One task (b, hk, chunk) on `arena` (Context::arena_floats floats), per instruction set. The
// avx512_bf16 one takes bf16 tensors only (Context::qb…ob2 set) and multiplies on vdpbf16ps.
void backward_task_avx512_bf16(const Context& cx, float* arena, std::int64_t task);
void backward_task_avx512(const Context& cx, float* arena, std::int64_t task);
void backward_task_avx2(const Context& cx, float* arena, std::int64_t task);
void backward_task_scalar(const Context& cx, float* arena, std::int64_t task);
// The avx512_bf16 part of Prepass for head (b, h) of bf16 tensors: Q's rows [Sq, Dp] at qr and
// row pairs [⌈Sq/2⌉, Dp, 2] at q2 (not-finite values as 0 when q_sanitize), dO's likewise with Dvp
// at or_ and o2 (the layouts of Context::qb … ob2), and dots[i] = dout_i · out_i in f64 for i < Sq.
// False, with nothing written, unless the rows of q, dout and out are contiguous.
bool prepass_head_avx512_bf16(const AttnBwdParams& bp, std::int64_t b, std::int64_t h, bool q_sanitize,
                              std::uint16_t* qr, std::uint16_t* q2, std::uint16_t* or_, std::uint16_t* o2, double* dots);
// reduce_dq's sum for a bf16 row on the avx512_bf16 tiles: dst[e] = bf16(Σ_{c < C} src[c·cs + e]) for
// e < n, summed in f32 in increasing c and rounded as f32_to_bf16.
void sum_rows_bf16_avx512_bf16(const float* src, std::int64_t cs, std::int64_t C, std::int64_t n, std::uint16_t* dst);
// Scratch floats of the five products' operands after the common part of the arena (layouts in
// attention_backward_impl.hpp and attention_backward_avx512bf16.cpp).
inline constexpr std::int64_t ops_f32_floats(std::int64_t D, std::int64_t Dv) { return (D + pad16(D) + Dv) * kBk; }
inline constexpr std::int64_t ops_bf16_floats(std::int64_t D, std::int64_t Dv) {
  return (2 * pad16(D) + pad16(Dv)) * kBk / 2 + 3 * kBq * kBk / 2;
}
// Key blocks a task works on at once (backward_task), and the scratch floats of each: its dK, dV
// accumulators and the operands' scratch (the same for every ISA).
inline constexpr std::int64_t kPassBlocks = 4;
inline constexpr std::int64_t pass_block_floats(std::int64_t D, std::int64_t Dv) {
  const std::int64_t ops = ops_f32_floats(D, Dv) > ops_bf16_floats(D, Dv) ? ops_f32_floats(D, Dv) : ops_bf16_floats(D, Dv);
  return kBk * (pad16(D) + pad16(Dv)) + ops;
}
// Per-thread scratch floats the task functions need (the same for every ISA).
std::int64_t arena_size(std::int64_t D, std::int64_t Dv);

// ---- The driver's parts (attention_backward_flash runs them in this order) ----

// An uninitialised, 64-byte aligned float array leased from the scratch pool (core/scratch.hpp),
// so that the next call of a similar shape finds its work copies' pages mapped instead of
// faulting in fresh MiBs. Lease on the calling thread, outside parallel regions.
class Floats {
 public:
  explicit Floats(std::int64_t n) { p_ = scratch_lease(static_cast<std::size_t>(n > 0 ? n : 1) * sizeof(float), &size_); }
  ~Floats() { scratch_return(p_, size_); }
  Floats(const Floats&) = delete;
  Floats& operator=(const Floats&) = delete;
  float* get() const { return static_cast<float*>(p_); }

 private:
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

// Row helpers of every part. load_row: dst[e] = t[off + e·stride] for e < n, as f32. store_row:
// t[off + e·stride] = src[e], rounded to t's dtype.
void load_row(const View& t, std::int64_t off, std::int64_t stride, std::int64_t n, float* dst);
void store_row(const View& t, std::int64_t off, std::int64_t stride, std::int64_t n, const float* src);
// x, or 0 for NaN and ±∞ (the packed Q and K operands of the gradient products; see pack_kv_block
// and Prepass on why).
inline float finite_or_zero(float x) { return x - x == 0.0f ? x : 0.0f; }
inline std::uint16_t finite_or_zero_bf16(std::uint16_t x) { return (x & 0x7f80u) == 0x7f80u ? 0 : x; }
// A [B, H, Sq, n] tensor's rows usable in place: f32, unit inner stride, n a multiple of 16 (so the
// padded row is the row itself).
bool usable_in_place(const View& t, std::int64_t n);

// 1. Prepass (attention_backward_prepass.cpp), per (b, h, i): Q and dO rows as the tasks read them
// — the caller's f32 rows in place when usable_in_place, else packed f32 copies, or the bf16
// layouts of Context::qb…ob2 for the avx512_bf16 tiles — and L_i = lse_i · log2(e), delta_i =
// dout_i · out_i. Sets those pointers of cx (whose shapes and options must be set) and owns the
// copies for as long as it lives. Throws qkv::OutOfMemory when the copies cannot fit.
class Prepass {
 public:
  Prepass(const AttnBwdParams& bp, Isa isa, Context& cx);

 private:
  std::optional<Floats> q_pack_, o_pack_;    // [B, H, Sq, Dp] / [.., Dvp] f32, when not read in place
  std::optional<Floats> qb_pack_, ob_pack_;  // Context::qb + qb2, ob + ob2 (bf16 tiles only)
  std::optional<Floats> L_, delta_;          // [B, H, Sq]
};

// 2. Chunk plan (attention_backward_plan.cpp): the number of key chunks C, the cut of every batch
// row's key blocks into C chunks of about equal work (tiles the mask rule does not skip), the
// order of the tasks (largest first), and the dQ partial sums. Depends on the shapes only, never
// on the thread count (determinism). Sets cx.key_blocks, chunks, chunk_begin, dq0…, dq_part, dk0…, dv0….
class ChunkPlan {
 public:
  ChunkPlan(const AttnBwdParams& bp, Context& cx);
  const std::vector<std::int64_t>& order() const { return order_; }  // [tasks] task ids, largest first

 private:
  std::vector<std::int64_t> cuts_;   // [B, C + 1] Context::chunk_begin
  std::vector<std::int64_t> order_;
  std::optional<Floats> dq_part_;    // Context::dq_part
};

// 3. Tasks: backward_task_<isa> (above) on every task of plan.order(), one arena per thread.
// 4. Reduce (attention_backward.cpp), per (b, h, i): dq_i = Σ_c dQ_c,i in increasing c, rounded once
// to dq's dtype (isa: the tasks' instruction set; avx512_bf16 sums bf16 rows on vectors).
void reduce_dq(const AttnBwdParams& bp, const Context& cx, Isa isa);

}  // namespace qkv::kernels::bwd

namespace qkv::kernels {

// Whether the fast backward takes p (f32 or bf16, 1 ≤ D, Dv ≤ 256); `why` gets the reason if not.
bool attention_backward_flash_supports(const AttnBwdParams& p, const char** why);
// Runs it with the task code of instruction set `isa` (≤ cpu_isa(); the dispatcher,
// attention/dispatch.cpp, chooses it and names the kernel): scalar, avx2 or avx512 on f32 tiles
// (bf16 tensors converted), or avx512_bf16 for bf16 tensors only: the products on vdpbf16ps, P and
// dS rounded to bf16 for the three gradient products, every sum in f32.
void attention_backward_flash(const AttnBwdParams& p, Isa isa);

}  // namespace qkv::kernels
