// Kernel choice. The reference runs anything; the fast CPU kernels take f32/bf16 calls that do
// not ask for the N×N pattern or scores, on the instruction set active_isa() names (chosen once from the
// CPU, overridable by QKV_ISA / set_isa).
#include "attention/dispatch.hpp"

#include <string>
#include <vector>

#include "kernels/cpu/attention_backward.hpp"
#include "kernels/cpu/flash.hpp"

namespace qkv::detail {
namespace {

KernelInfo run_reference(const kernels::AttnParams& p) {
  kernels::attention_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

// "flash[_decode]_<isa>_<dtype>": the names KernelInfo reports, as static strings (avx512_vnni:
// the int8 cache's decode only, see run_forward).
const char* flash_name(Kernel k, Isa isa, bool bf16) {
  if (isa == Isa::avx512_bf16)  // bf16 calls only (flash_isa)
    return k == Kernel::flash ? "flash_avx512_bf16_bf16" : "flash_decode_avx512_bf16_bf16";
  if (k == Kernel::flash_decode && isa == Isa::avx512_vnni)
    return bf16 ? "flash_decode_avx512_vnni_bf16" : "flash_decode_avx512_vnni_f32";
  static const char* const names[2][3][2] = {
      {{"flash_scalar_f32", "flash_scalar_bf16"}, {"flash_avx2_f32", "flash_avx2_bf16"},
       {"flash_avx512_f32", "flash_avx512_bf16"}},
      {{"flash_decode_scalar_f32", "flash_decode_scalar_bf16"}, {"flash_decode_avx2_f32", "flash_decode_avx2_bf16"},
       {"flash_decode_avx512_f32", "flash_decode_avx512_bf16"}}};
  const int ki = k == Kernel::flash_decode ? 1 : 0;
  const int ii = isa >= Isa::avx512 ? 2 : isa == Isa::avx2 ? 1 : 0;
  return names[ki][ii][bf16 ? 1 : 0];
}

// The ISA a flash kernel runs on: AVX-512 BF16 changes only the bf16 kernels (dot-product
// instructions); f32 runs the AVX-512 code there, and everything does on avx512_vnni (which
// changes the int8 cache's decode only).
Isa flash_isa(bool bf16) {
  const Isa active = active_isa();
  if (active == Isa::avx512_bf16 && bf16) return Isa::avx512_bf16;
  return active >= Isa::avx512 ? Isa::avx512 : active;
}

// The flash backward runs on flash_isa() as the forward: AVX-512 BF16 runs bf16 on its dot-product
// tiles, f32 on the AVX-512 code (and under QKV_ISA=avx512, bf16 converted to f32 tiles). Its name
// is "flash_backward_<isa>_<dtype>".
const char* flash_backward_name(Isa isa, bool bf16) {
  if (isa == Isa::avx512_bf16) return "flash_backward_avx512_bf16_bf16";
  static const char* const names[3][2] = {{"flash_backward_scalar_f32", "flash_backward_scalar_bf16"},
                                          {"flash_backward_avx2_f32", "flash_backward_avx2_bf16"},
                                          {"flash_backward_avx512_f32", "flash_backward_avx512_bf16"}};
  return names[isa >= Isa::avx512 ? 2 : isa == Isa::avx2 ? 1 : 0][bf16 ? 1 : 0];
}

void run_flash_forward(Isa isa, const kernels::cpu::FlashArgs* list, std::int64_t n) {
  namespace c = kernels::cpu;
  if (isa == Isa::avx512_bf16) c::flash_forward_avx512_bf16(list, n);
  else if (isa == Isa::avx512) c::flash_forward_avx512(list, n);
  else if (isa == Isa::avx2) c::flash_forward_avx2(list, n);
  else c::flash_forward_scalar(list, n);
}

// Throws unless the fast kernels take p (called when one was explicitly requested).
void require_flash(const char* fn, const kernels::AttnParams& p, Kernel requested) {
  if (kernels::cpu::flash_supports(p)) return;
  fail(fn, std::string("opt.kernel: ") + kernel_name(requested) +
               " takes f32 or bf16 tensors, 1 ≤ D, Dv ≤ 512 and no pattern or scores output (got " +
               dtype_name(p.q.dtype) +
               ", D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) +
               (p.pattern.data ? ", pattern requested)" : p.scores.data ? ", scores requested)" : ")"));
}

}  // namespace

KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested) {
  if (requested == Kernel::reference) return run_reference(p);
  if (!kernels::cpu::flash_supports(p)) {
    if (requested == Kernel::automatic) return run_reference(p);
    require_flash(fn, p, requested);
  }
  // A few queries against many keys: split the keys (flash-decoding) so that every core works
  // even at batch 1. The choice depends on the shape only, so results do not depend on threads.
  // Measured (B = 1, H = 16, D = 128, 2 threads, medians): with Sq ≤ 2 the decode kernel wins at
  // every Skv from 16 up (0.3–0.6× the flash time: flash pads one query to a 6-row strip and a
  // 192-row block); with Sq ≤ 8 it wins from Skv ≈ 384 and ties below.
  Kernel k = requested;
  if (k == Kernel::automatic)
    k = p.Sq <= 2 || (p.Sq <= 8 && p.Skv >= 512) ? Kernel::flash_decode : Kernel::flash;
  // A paged, int8 or f16 KV cache is read by the decode kernel only (its rows, one at a time), prefill too.
  if (p.cache.paged() || p.cache.i8() || p.k.dtype == DType::f16) {
    if (requested == Kernel::flash)
      fail(fn, "opt.kernel: flash does not read a paged, int8 or f16 KV cache; use automatic, flash_decode or reference");
    k = Kernel::flash_decode;
  }
  const bool bf16 = p.q.dtype == DType::bf16;
  // An int8 cache runs on the VNNI dot products wherever the CPU has them, for f32 and bf16
  // queries: avx512_vnni and avx512_bf16 run the same kernel (flash_avx512vnni.cpp).
  const Isa isa = p.cache.i8() && active_isa() >= Isa::avx512_vnni ? Isa::avx512_vnni : flash_isa(bf16);
  const KernelInfo info{k, isa, flash_name(k, isa, bf16)};
  if (p.B == 0 || p.H == 0 || p.Sq == 0) return info;  // nothing to write

  const kernels::cpu::FlashArgs a = kernels::cpu::make_flash_args(p);
  if (k == Kernel::flash) {
    run_flash_forward(isa, &a, 1);
  } else if (isa == Isa::avx512_bf16) {
    kernels::cpu::flash_decode_avx512_bf16(a);
  } else if (isa == Isa::avx512_vnni) {
    kernels::cpu::flash_decode_avx512_vnni(a);
  } else if (isa == Isa::avx512) {
    kernels::cpu::flash_decode_avx512(a);
  } else if (isa == Isa::avx2) {
    kernels::cpu::flash_decode_avx2(a);
  } else {
    kernels::cpu::flash_decode_scalar(a);
  }
  return info;
}

KernelInfo run_forward_varlen(const char* fn, const std::vector<kernels::AttnParams>& seqs, Kernel requested) {
  if (seqs.empty()) return {};
  bool fast = requested == Kernel::automatic || requested == Kernel::flash;
  for (const auto& p : seqs) fast = fast && kernels::cpu::flash_supports(p);
  if (!fast) {
    KernelInfo info;
    for (const auto& p : seqs) info = run_forward(fn, p, requested);
    return info;
  }
  // One parallel loop over (sequence, head, query block) of every sequence, so that many short
  // sequences keep all threads busy (flash kernel for all of them; no per-sequence decode split).
  const bool bf16 = seqs.front().q.dtype == DType::bf16;
  const Isa isa = flash_isa(bf16);
  std::vector<kernels::cpu::FlashArgs> args;
  args.reserve(seqs.size());
  for (const auto& p : seqs) args.push_back(kernels::cpu::make_flash_args(p));
  run_flash_forward(isa, args.data(), static_cast<std::int64_t>(args.size()));
  return {Kernel::flash, isa, flash_name(Kernel::flash, isa, bf16)};
}

// Backward: the flash backward (FlashAttention-2 style, src/kernels/cpu/attention_backward*)
// takes f32 and bf16 with head dims up to 256; the reference takes the rest (f64, larger dims).
KernelInfo run_backward(const char* fn, const kernels::AttnBwdParams& p, Kernel requested) {
  if (requested != Kernel::automatic && requested != Kernel::reference && requested != Kernel::flash)
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) + " has no backward; use automatic, flash or reference");
  if (requested != Kernel::reference) {
    const char* why = nullptr;
    if (kernels::attention_backward_flash_supports(p, &why)) {
      const bool bf16 = p.fwd.q.dtype == DType::bf16;
      const Isa isa = flash_isa(bf16);
      kernels::attention_backward_flash(p, isa);
      return {Kernel::flash, isa, flash_backward_name(isa, bf16)};
    }
    if (requested == Kernel::flash) fail(fn, std::string("opt.kernel: flash cannot run this call: ") + why);
  }
  kernels::attention_backward_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

}  // namespace qkv::detail

namespace qkv {

const char* kernel_name(Kernel k) {
  switch (k) {
    case Kernel::automatic: return "automatic";
    case Kernel::reference: return "reference";
    case Kernel::flash: return "flash";
    case Kernel::flash_decode: return "flash_decode";
  }
  return "?";
}

}  // namespace qkv
