// Kernel choice. The reference runs anything; the fast CPU kernels take f32/bf16 calls that do
// not ask for the N×N pattern, on the instruction set active_isa() names (chosen once from the
// CPU, overridable by QKV_ISA / set_isa).
#include "attention/dispatch.hpp"

#include <string>

#include "kernels/cpu/attention_backward.hpp"
#include "kernels/cpu/flash.hpp"

namespace qkv::detail {
namespace {

KernelInfo run_reference(const kernels::AttnParams& p) {
  kernels::attention_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

// "flash[_decode]_<isa>_<dtype>": the names KernelInfo reports, as static strings.
const char* flash_name(Kernel k, Isa isa, bool bf16) {
  if (k == Kernel::flash && isa == Isa::avx512_bf16) return "flash_avx512_bf16_bf16";
  static const char* const names[2][3][2] = {
      {{"flash_scalar_f32", "flash_scalar_bf16"}, {"flash_avx2_f32", "flash_avx2_bf16"},
       {"flash_avx512_f32", "flash_avx512_bf16"}},
      {{"flash_decode_scalar_f32", "flash_decode_scalar_bf16"}, {"flash_decode_avx2_f32", "flash_decode_avx2_bf16"},
       {"flash_decode_avx512_f32", "flash_decode_avx512_bf16"}}};
  const int ki = k == Kernel::flash_decode ? 1 : 0;
  const int ii = isa == Isa::scalar ? 0 : isa == Isa::avx2 ? 1 : 2;
  return names[ki][ii][bf16 ? 1 : 0];
}

}  // namespace

KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested) {
  if (requested == Kernel::reference) return run_reference(p);
  if (!kernels::cpu::flash_supports(p)) {
    if (requested == Kernel::automatic) return run_reference(p);
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) +
                 " takes f32 or bf16 tensors, 1 ≤ D, Dv ≤ 512 and no pattern output (got " +
                 dtype_name(p.q.dtype) + ", D = " + std::to_string(p.D) + ", Dv = " + std::to_string(p.Dv) +
                 (p.pattern.data ? ", pattern requested)" : ")"));
  }
  // A few queries against many keys: split the keys (flash-decoding) so that every core works
  // even at batch 1. The choice depends on the shape only, so results do not depend on threads.
  Kernel k = requested;
  if (k == Kernel::automatic) k = p.Sq <= 8 && p.Skv >= 1024 ? Kernel::flash_decode : Kernel::flash;
  // AVX-512 BF16 changes only the bf16 flash forward (dot-product instructions); everything
  // else runs the AVX-512 code there.
  const bool bf16 = p.q.dtype == DType::bf16;
  const Isa isa = active_isa() == Isa::avx512_bf16 && bf16 && k == Kernel::flash ? Isa::avx512_bf16
                  : active_isa() >= Isa::avx512                                  ? Isa::avx512
                                                                                 : active_isa();
  const KernelInfo info{k, isa, flash_name(k, isa, bf16)};
  if (p.B == 0 || p.H == 0 || p.Sq == 0) return info;  // nothing to write

  const kernels::cpu::FlashArgs a = kernels::cpu::make_flash_args(p);
  namespace c = kernels::cpu;
  if (k == Kernel::flash_decode) {
    if (isa == Isa::avx512) c::flash_decode_avx512(a);
    else if (isa == Isa::avx2) c::flash_decode_avx2(a);
    else c::flash_decode_scalar(a);
  } else {
    if (isa == Isa::avx512_bf16) c::flash_forward_avx512_bf16(a);
    else if (isa == Isa::avx512) c::flash_forward_avx512(a);
    else if (isa == Isa::avx2) c::flash_forward_avx2(a);
    else c::flash_forward_scalar(a);
  }
  return info;
}

// Backward: the flash backward (FlashAttention-2 style, src/kernels/cpu/attention_backward*)
// takes f32 and bf16 with head dims up to 256; the reference takes the rest (f64, larger dims).
KernelInfo run_backward(const char* fn, const kernels::AttnBwdParams& p, Kernel requested) {
  if (requested != Kernel::automatic && requested != Kernel::reference && requested != Kernel::flash)
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) + " has no backward; use automatic, flash or reference");
  if (requested != Kernel::reference) {
    const char* why = nullptr;
    if (kernels::attention_backward_flash_supports(p, &why)) return kernels::attention_backward_flash(p, active_isa());
    if (requested == Kernel::flash) fail(fn, std::string("opt.kernel: flash cannot run this call: ") + why);
  }
  kernels::attention_backward_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

}  // namespace qkv::detail
