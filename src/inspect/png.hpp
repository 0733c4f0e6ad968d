// inspect/png.hpp — a minimal PNG encoder (8-bit RGB, zlib deflate) and the per-layer picture.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "inspect/report.hpp"

namespace qkv::inspect {

struct Image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // [height, width, 3], row-major
};

// The bytes of a PNG file holding `img` (colour type 2, bit depth 8, no interlace, filter 0).
std::string encode_png(const Image& img);

// Layer l's attention patterns as the seeds draw them: one panel per head, laid out left to
// right and top to bottom (4 per row); in each panel keys run down the left and queries across
// the top, so every column is a distribution. A dot's area is proportional to its weight;
// masked cells are filled light grey. Cells are 1–24 px, chosen so a panel is about 256 px.
Image render_layer(const Report& r, std::int64_t l);

}  // namespace qkv::inspect
