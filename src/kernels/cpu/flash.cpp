// Portable side of the fast forward kernels: which calls they take, and AttnParams → FlashArgs.
#include "kernels/cpu/flash.hpp"

#include "kernels/dropout.hpp"
#include "kernels/params.hpp"

namespace qkv::kernels::cpu {

bool flash_supports(const AttnParams& p) {
  // f64 is the reference's precision; the fast kernels never write the N×N pattern or scores.
  const bool dtype_ok = p.q.dtype == DType::f32 || p.q.dtype == DType::bf16;
  return dtype_ok && !p.pattern.data && !p.scores.data && p.D >= 1 && p.D <= 512 && p.Dv >= 1 && p.Dv <= 512;
}

FlashArgs make_flash_args(const AttnParams& p) {
  FlashArgs a{};
  a.q = p.q.data, a.k = p.k.data, a.v = p.v.data, a.out = p.out.data;
  a.bf16 = p.q.dtype == DType::bf16;
  a.B = p.B, a.H = p.H, a.Hkv = p.Hkv, a.Sq = p.Sq, a.Skv = p.Skv, a.D = p.D, a.Dv = p.Dv;
  for (int d = 0; d < 4; ++d) {
    a.sq[d] = p.q.stride(d), a.sk[d] = p.k.stride(d), a.sv[d] = p.v.stride(d), a.so[d] = p.out.stride(d);
    a.smask[d] = p.mask.data ? p.mask.stride(d) : 0;
  }
  if (p.lse.data) {
    if (p.lse.dtype == DType::f32) a.lse_f32 = p.lse.ptr<float>();
    else a.lse_f64 = p.lse.ptr<double>();
    for (int d = 0; d < 3; ++d) a.slse[d] = p.lse.stride(d);
  }
  a.mask = p.mask.data;
  a.mask_kind = MaskKind::none;
  if (p.mask.data) {
    switch (p.mask.dtype) {
      case DType::u8: a.mask_kind = MaskKind::u8; break;
      case DType::f32: a.mask_kind = MaskKind::f32; break;
      case DType::bf16: a.mask_kind = MaskKind::bf16; break;
      case DType::f64: a.mask_kind = MaskKind::f64; break;
      default: break;  // validation admits only these
    }
  }
  a.key_len = p.key_len.data();
  a.causal = p.rule.causal;
  a.diag_offset = p.rule.diag_offset;
  a.window_left = p.rule.window_left;
  a.window_right = p.rule.window_right;
  a.diag_from_key_len = p.rule.diag_from_key_len;
  a.keep_first = p.rule.keep_first;
  a.scale_log2 = static_cast<float>(p.scale * 1.4426950408889634);
  a.threads = p.threads;
  a.dropout = p.dropout.on();
  a.dropout_t = dropout_threshold(p.dropout.p);
  a.dropout_rs = static_cast<float>(1.0 / (1.0 - p.dropout.p));
  a.dropout_seed = p.dropout.seed, a.dropout_offset = p.dropout.offset, a.dropout_b0 = p.dropout.b0;
  a.softcap_log2 = static_cast<float>(p.softcap * 1.4426950408889634);
  a.alibi = p.alibi.empty() ? nullptr : p.alibi.data();
  a.alibi_sb = p.alibi_sb;
  a.sinks = p.sinks.empty() ? nullptr : p.sinks.data();
  a.block_table = p.cache.table, a.ldt = p.cache.ldt, a.page_shift = p.cache.page_shift;
  a.kv_i8 = p.cache.i8();
  a.kv_f16 = p.k.dtype == DType::f16;
  if (a.kv_i8) {
    a.k_scale = p.cache.k_scale.ptr<float>(), a.v_scale = p.cache.v_scale.ptr<float>();
    for (int d = 0; d < 3; ++d) a.sks[d] = p.cache.k_scale.stride(d), a.svs[d] = p.cache.v_scale.stride(d);
  }
  return a;
}

}  // namespace qkv::kernels::cpu
