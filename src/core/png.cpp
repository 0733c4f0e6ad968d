#include "core/png.hpp"

#include <zlib.h>

#include "qkv/types.hpp"

namespace qkv::detail {
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

std::string encode_png(const RgbImage& img) {
  if (img.width < 1 || img.height < 1 ||
      img.rgb.size() != static_cast<std::size_t>(img.width) * static_cast<std::size_t>(img.height) * 3) {
    fail("qkv::encode_png", "img: need width, height ≥ 1 and width·height·3 bytes (got " +
                                std::to_string(img.width) + "×" + std::to_string(img.height) + ", " +
                                std::to_string(img.rgb.size()) + " bytes)");
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
    fail("qkv::encode_png", "zlib compress2 failed");
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

}  // namespace qkv::detail
