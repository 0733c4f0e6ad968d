// Internal: choice of kernel for a validated call.
#pragma once

#include "kernels/params.hpp"

namespace qkv::detail {

// Runs the kernel `requested` asks for (automatic: the fastest one that supports p).
// Throws std::invalid_argument, naming `fn`, if an explicitly requested kernel cannot run p.
KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested);
KernelInfo run_backward(const char* fn, const kernels::AttnBwdParams& p, Kernel requested);

}  // namespace qkv::detail
