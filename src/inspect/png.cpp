// PNG encoding on zlib, and the per-layer picture of the attention patterns.
#include "inspect/png.hpp"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace qkv::inspect {
namespace {

void put_u32(std::string& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
}

// A chunk is length, type, data, CRC-32 of type + data (PNG spec §5.3).
void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.append(type, 4);
  out += data;
  const auto* p = reinterpret_cast<const Bytef*>(out.data() + start);
  put_u32(out, static_cast<std::uint32_t>(crc32(0L, p, static_cast<uInt>(out.size() - start))));
}

}  // namespace

std::string encode_png(const Image& img) {
  if (img.width < 1 || img.height < 1 ||
      img.rgb.size() != static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3) {
    fail("qkv::inspect::encode_png", "img: need width, height ≥ 1 and width·height·3 bytes (got " +
                                         std::to_string(img.width) + "×" + std::to_string(img.height) +
                                         ", " + std::to_string(img.rgb.size()) + " bytes)");
  }
  // Each scanline is prefixed by its filter type, 0 (None).
  const std::size_t row = static_cast<std::size_t>(img.width) * 3;
  std::string raw;
  raw.reserve((row + 1) * static_cast<std::size_t>(img.height));
  for (int y = 0; y < img.height; ++y) {
    raw += '\0';
    raw.append(reinterpret_cast<const char*>(img.rgb.data()) + row * static_cast<std::size_t>(y), row);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::string z(zlen, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &zlen, reinterpret_cast<const Bytef*>(raw.data()),
                static_cast<uLong>(raw.size()), Z_BEST_COMPRESSION) != Z_OK) {
    fail("qkv::inspect::encode_png", "zlib compress2 failed");
  }
  z.resize(zlen);

  std::string ihdr;
  put_u32(ihdr, static_cast<std::uint32_t>(img.width));
  put_u32(ihdr, static_cast<std::uint32_t>(img.height));
  ihdr += '\x08';  // bit depth
  ihdr += '\x02';  // colour type: RGB
  ihdr += '\0';    // compression: deflate
  ihdr += '\0';    // filter method 0
  ihdr += '\0';    // no interlace
  std::string out("\x89PNG\r\n\x1a\n", 8);
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", "");
  return out;
}

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
