// Internal: the loss curve as a PNG image (core/png.hpp encodes it): a few drawing primitives
// with a 5×7 pixel font.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/trainer.hpp"

namespace qkv::train {

// 800×480: training loss per step (light blue), validation loss (orange, dots), axes with step and
// loss ticks, a legend. Rows without a value of a kind are skipped; returns a valid PNG even for
// an empty curve.
std::string loss_curve_png(const std::vector<LossRow>& rows);

}  // namespace qkv::train
