// Kernel choice. The reference runs anything; fast kernels are registered here as they land.
#include "attention/dispatch.hpp"

#include <string>

namespace qkv::detail {

KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested) {
  if (requested != Kernel::automatic && requested != Kernel::reference)
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) + " is not available in this build");
  kernels::attention_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

KernelInfo run_backward(const char* fn, const kernels::AttnBwdParams& p, Kernel requested) {
  if (requested != Kernel::automatic && requested != Kernel::reference)
    fail(fn, std::string("opt.kernel: ") + kernel_name(requested) + " is not available in this build");
  kernels::attention_backward_reference(p);
  return {Kernel::reference, Isa::scalar, "reference_f64"};
}

}  // namespace qkv::detail
