// inspect/png.hpp — the per-layer picture of the attention patterns (encoded by core/png.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/png.hpp"
#include "inspect/report.hpp"

namespace qkv::inspect {

using Image = detail::RgbImage;

// Layer l's attention patterns as the seeds draw them: one panel per head, laid out left to
// right and top to bottom (4 per row); in each panel keys run down the left and queries across
// the top, so every column is a distribution. A dot's area is proportional to its weight;
// masked cells are filled light grey. Cells are 1–24 px, chosen so a panel is about 256 px.
Image render_layer(const Report& r, std::int64_t l);

}  // namespace qkv::inspect
