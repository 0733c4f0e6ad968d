// Internal: the loss curve as a PNG image: a minimal PNG encoder on zlib and a few drawing
// primitives with a 5×7 pixel font. (inspect/png.hpp has an encoder too, but it lives a floor
// above training, in the qkv_inspect library that links this one.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer.hpp"

namespace qkv::train {

// An RGB image, row-major, 3 bytes per pixel.
struct Image {
  int w = 0, h = 0;
  std::vector<std::uint8_t> rgb;
};

std::string encode_png(const Image& img);

// 800×480: training loss per step (light blue), validation loss (orange, dots), axes with step and
// loss ticks, a legend. Rows without a value of a kind are skipped; returns a valid PNG even for
// an empty curve.
std::string loss_curve_png(const std::vector<LossRow>& rows);

}  // namespace qkv::train
