// Internal: the one PNG encoder (8-bit RGB, zlib deflate), for the inspect page's per-layer
// pictures and the trainer's loss curve.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::detail {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // [height, width, 3], row-major
};

// The bytes of a PNG file holding `img` (colour type 2, bit depth 8, no interlace, every scanline
// with filter 0). Throws std::invalid_argument naming the sizes unless width, height ≥ 1 and
// rgb holds width·height·3 bytes.
std::string encode_png(const RgbImage& img);

}  // namespace qkv::detail
