// Kernel choice. The reference runs anything; fast kernels are registered here as they land.
#include "attention/dispatch.hpp"

#include <string>

#include "kernels/cpu/attention_backward.hpp"

namespace qkv::detail {

KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested) {
  if (requested != Kernel::automatic && requested != Kernel::reference)
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) + " is not available in this build");
  kernels::attention_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
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
