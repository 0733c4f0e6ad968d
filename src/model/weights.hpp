// Internal: the canonical list of a config's parameters, shared by every loader.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "qkv/model.hpp"

namespace qkv::detail {

// Calls f(name, shape, slot) for every distinct parameter of w.config, in a fixed order, where
// slot is the field of `w` that points at it (wcls only when untied).
void for_each_param(Weights& w,
                    const std::function<void(const std::string&, const std::vector<std::int64_t>&, float*&)>& f);

// Sets wcls = wte when tied, and sizes w.layers from the config.
void prepare_layout(Weights& w);
void finish_layout(Weights& w);

// Throws (naming `function` and `where`, the file) at the first parameter holding a NaN or ±inf.
void check_finite(const Weights& w, const char* function, const std::string& where);

}  // namespace qkv::detail
