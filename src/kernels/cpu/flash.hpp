// Internal: the fast CPU attention forward kernels (flash and flash-decode), one set per ISA.
//
// The portable side (flash.cpp) turns a validated AttnParams into a FlashArgs of plain
// pointers, sizes and strides and calls the entry point of the ISA the dispatcher chose. The
// ISA translation units (flash_avx512bf16.cpp, flash_avx512vnni.cpp, flash_avx512.cpp,
// flash_avx2.cpp, flash_scalar.cpp) are compiled with their own -m flags and share one template
// body: flash_forward_impl.hpp and flash_decode_impl.hpp, built from the pieces of flash_tile.hpp
// (decode_i8_avx512.hpp for an int8 cache).
#pragma once

#include <cstdint>

namespace qkv::kernels {
struct AttnParams;
}

namespace qkv::kernels::cpu {

enum class MaskKind : std::uint8_t { none, u8, f32, bf16, f64 };

// Everything a forward kernel reads. Strides are in elements of the tensor's own dtype.
struct FlashArgs {
  const void* q;  // [B, H, Sq, D]     f32 or bf16 (all four tensors share the dtype)
  const void* k;  // [B, Hkv, Skv, D]
  const void* v;  // [B, Hkv, Skv, Dv]
  void* out;      // [B, H, Sq, Dv]
  bool bf16;
  std::int64_t B, H, Hkv, Sq, Skv, D, Dv;
  std::int64_t sq[4], sk[4], sv[4], so[4];
  float* lse_f32;     // [B, H, Sq] or null
  double* lse_f64;    // [B, H, Sq] or null (at most one of the two is set)
  std::int64_t slse[3];
  const void* mask;   // [B, H, Sq, Skv] with stride 0 on broadcast dims, or null
  MaskKind mask_kind;
  std::int64_t smask[4];
  const std::int64_t* key_len;  // [B] valid keys per batch
  bool causal;
  std::int64_t diag_offset, window_left, window_right;  // as KeyRange
  bool diag_from_key_len;                               // as KeyRange
  std::int64_t keep_first;                              // as KeyRange: keys below it escape window_left
  float scale_log2;   // scale · log2(e): scores are kept in log2 units
  int threads;
  // Dropout (kernels/dropout.hpp), when `dropout`: the probabilities of row (b, h, i) are multiplied
  // by keep / (1 − p) = 0 or dropout_rs after the softmax summed them, before P·V.
  bool dropout;
  std::uint32_t dropout_t;  // keep ⟺ bits ≥ dropout_t
  float dropout_rs;         // 1 / (1 − p)
  std::uint64_t dropout_seed, dropout_offset;
  std::int64_t dropout_b0;  // the mask's batch index of b = 0
  // Score variants (AttnParams; score_mod.hpp): softcap in log2 units (0: none), ALiBi slopes
  // and sink logits [H] in natural units (null: none).
  float softcap_log2;
  const double* alibi;  // slope of (b, h): alibi[b · alibi_sb + h]
  std::int64_t alibi_sb;
  const double* sinks;
  // KV caches (attention_kvcache; flash_decode only). Paged when block_table is set: key row j of
  // (b, hk) is row j & (2^page_shift − 1) of block block_table[b·ldt + (j >> page_shift)], and
  // sk[0] / sv[0] step blocks. kv_i8: k and v are int8, row (b|block, hk, row) scaled by
  // k_scale / v_scale at strides sks / svs (in the order of sk's first three).
  const std::int32_t* block_table;
  std::int64_t ldt;
  int page_shift;
  bool kv_i8;
  bool kv_f16;  // k and v are IEEE binary16 (q and out f32 or bf16), widened row by row
  const float* k_scale;
  const float* v_scale;
  std::int64_t sks[3], svs[3];
};

FlashArgs make_flash_args(const AttnParams& p);

// Whether the fast kernels take p at all (dtype f32/bf16, no pattern output, 1 ≤ D, Dv ≤ 512);
// a paged or int8 KV cache only flash_decode takes.
bool flash_supports(const AttnParams& p);

// Entry points, one per ISA. flash_forward: parallel over (call, b, h, query block of 192 rows)
// for list[0, n), calls that share D, Dv, dtype and threads (the sequences of a varlen batch).
// flash_decode: keys split into fixed chunks, parallel over (b, kv head, row group, chunk),
// partial results merged by logsumexp. Both give the same bits for every thread count.
void flash_forward_avx512(const FlashArgs* list, std::int64_t n);
void flash_forward_avx512_bf16(const FlashArgs* list, std::int64_t n);  // bf16 tensors only: vdpbf16ps
void flash_forward_avx2(const FlashArgs* list, std::int64_t n);
void flash_forward_scalar(const FlashArgs* list, std::int64_t n);
void flash_decode_avx512(const FlashArgs& a);
void flash_decode_avx512_vnni(const FlashArgs& a);  // int8 KV caches only (kv_i8): vpdpbusd, vpdpwssd
void flash_decode_avx512_bf16(const FlashArgs& a);  // bf16 tensors only, no int8 cache: scores by vdpbf16ps
void flash_decode_avx2(const FlashArgs& a);
void flash_decode_scalar(const FlashArgs& a);

}  // namespace qkv::kernels::cpu
