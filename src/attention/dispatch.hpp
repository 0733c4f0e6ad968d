// Internal: choice of kernel for a validated call.
#pragma once

#include <vector>

#include "kernels/params.hpp"
#include "qkv/attention.hpp"

namespace qkv::detail {

// Runs the kernel `requested` asks for (automatic: the fastest one that supports p).
// Throws std::invalid_argument, naming `fn`, if an explicitly requested kernel cannot run p.
KernelInfo run_forward(const char* fn, const kernels::AttnParams& p, Kernel requested);
// The sequences of a varlen batch (each a validated [1, H, S, D] call): one parallel loop over
// all of them when the flash kernel takes them, else run_forward on each in turn.
KernelInfo run_forward_varlen(const char* fn, const std::vector<kernels::AttnParams>& seqs, Kernel requested);
KernelInfo run_backward(const char* fn, const kernels::AttnBwdParams& p, Kernel requested);

}  // namespace qkv::detail
