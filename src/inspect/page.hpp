// inspect/page.hpp — the files `qkv inspect` writes.
//
//   write_page(r, dir): dir/index.html (one self-contained file: inline CSS and JS, the data
//                       embedded as JSON; opens from disk with no network) and dir/layer_<l>.png
//                       for every layer. Returns the page's path.
//   write_json(r, dir): dir/inspect.json, the same numbers for other tools. Returns its path.
// Every file is written to a temporary name in `dir` and renamed into place.
#pragma once

#include <string>

#include "inspect/report.hpp"

namespace qkv::inspect {

// exact_bytes: see to_json (above it, the page stores the patterns compactly).
std::string write_page(const Report& r, const std::string& dir, double exact_bytes = kExactPageBytes);
std::string write_json(const Report& r, const std::string& dir);

// The page's HTML for `r` (what write_page puts in index.html).
std::string render_page(const Report& r, double exact_bytes = kExactPageBytes);

}  // namespace qkv::inspect
