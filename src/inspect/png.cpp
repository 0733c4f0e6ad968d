// The per-layer picture of the attention patterns.
#include "inspect/png.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace qkv::inspect {
namespace {

struct Rgb { std::uint8_t r, g, b; };
constexpr Rgb kPaper{255, 255, 255}, kInk{31, 78, 154}, kMasked{228, 228, 234}, kFrame{200, 200, 208};

Rgb mix(Rgb a, Rgb b, double t) {  // a·(1−t) + b·t
  const auto m = [t](std::uint8_t x, std::uint8_t y) {
    return static_cast<std::uint8_t>(std::lround(x + (y - x) * t));
  };
  return {m(a.r, b.r), m(a.g, b.g), m(a.b, b.b)};
}

}  // namespace

Image render_layer(const Report& r, std::int64_t l) {
  if (l < 0 || l >= r.L) {
    fail("qkv::inspect::render_layer", "l: layer out of range (got " + std::to_string(l) + " of " +
                                           std::to_string(r.L) + ")");
  }
  const std::int64_t S = r.S, H = r.H;
  const int cell = static_cast<int>(std::clamp<std::int64_t>(256 / S, 1, 24));
  const int panel = static_cast<int>(S) * cell, gap = 8, border = 1;
  const int cols = static_cast<int>(std::min<std::int64_t>(H, 4));
  const int rows = static_cast<int>((H + cols - 1) / cols);
  Image img;
  img.width = gap + cols * (panel + 2 * border + gap);
  img.height = gap + rows * (panel + 2 * border + gap);
  img.rgb.assign(static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3, 255);
  const auto put = [&](int x, int y, Rgb c) {
    auto* p = &img.rgb[(static_cast<std::size_t>(y) * static_cast<std::size_t>(img.width) + static_cast<std::size_t>(x)) * 3];
    p[0] = c.r; p[1] = c.g; p[2] = c.b;
  };
  // Supersampling grid for the coverage of a dot: 4×4 samples per pixel.
  constexpr int kSub = 4;
  for (std::int64_t h = 0; h < H; ++h) {
    const int x0 = gap + static_cast<int>(h % cols) * (panel + 2 * border + gap);
    const int y0 = gap + static_cast<int>(h / cols) * (panel + 2 * border + gap);
    for (int i = 0; i < panel + 2 * border; ++i) {
      put(x0 + i, y0, kFrame);
      put(x0 + i, y0 + panel + 2 * border - 1, kFrame);
      put(x0, y0 + i, kFrame);
      put(x0 + panel + 2 * border - 1, y0 + i, kFrame);
    }
    for (std::int64_t key = 0; key < S; ++key) {      // row of the picture
      for (std::int64_t q = 0; q < S; ++q) {          // column of the picture
        const int cx = x0 + border + static_cast<int>(q) * cell;
        const int cy = y0 + border + static_cast<int>(key) * cell;
        const bool masked = r.score(l, h, q, key) == -std::numeric_limits<float>::infinity();
        const double w = r.weight(l, h, q, key);
        if (masked) {
          for (int dy = 0; dy < cell; ++dy)
            for (int dx = 0; dx < cell; ++dx) put(cx + dx, cy + dy, kMasked);
          continue;
        }
        if (cell < 4) {  // too small for a disc: the ink a dot of this area would leave
          for (int dy = 0; dy < cell; ++dy)
            for (int dx = 0; dx < cell; ++dx) put(cx + dx, cy + dy, mix(kPaper, kInk, w));
          continue;
        }
        // Area ∝ weight: radius = R·√w with R just inside the cell.
        const double R = 0.46 * cell, rad = R * std::sqrt(w), c = 0.5 * cell;
        for (int dy = 0; dy < cell; ++dy) {
          for (int dx = 0; dx < cell; ++dx) {
            int inside = 0;
            for (int sy = 0; sy < kSub; ++sy) {
              for (int sx = 0; sx < kSub; ++sx) {
                const double px = dx + (sx + 0.5) / kSub - c, py = dy + (sy + 0.5) / kSub - c;
                inside += px * px + py * py <= rad * rad;
              }
            }
            if (inside) put(cx + dx, cy + dy, mix(kPaper, kInk, inside / double(kSub * kSub)));
          }
        }
      }
    }
  }
  return img;
}

}  // namespace qkv::inspect
