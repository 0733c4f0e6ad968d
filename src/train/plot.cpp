#include "train/plot.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/png.hpp"

namespace qkv::train {
namespace {

// 5×7 glyphs, one byte per row, bit 4 = leftmost pixel.
struct Glyph {
  char c;
  std::uint8_t rows[7];
};
constexpr Glyph kFont[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},     {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {31, 2, 4, 2, 1, 17, 14}},     {'4', {2, 6, 10, 18, 31, 2, 2}},    {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},      {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'.', {0, 0, 0, 0, 0, 12, 12}},     {'a', {0, 0, 14, 1, 15, 17, 15}},
    {'e', {0, 0, 14, 17, 31, 16, 14}},   {'i', {4, 0, 12, 4, 4, 4, 14}},     {'l', {12, 4, 4, 4, 4, 4, 14}},
    {'n', {0, 0, 22, 25, 17, 17, 17}},   {'o', {0, 0, 14, 17, 17, 17, 14}},  {'p', {0, 0, 30, 17, 30, 16, 16}},
    {'r', {0, 0, 22, 25, 16, 16, 16}},   {'s', {0, 0, 14, 16, 14, 1, 30}},   {'t', {8, 8, 28, 8, 8, 9, 6}},
    {'v', {0, 0, 17, 17, 17, 10, 4}},    {'k', {16, 16, 18, 20, 24, 20, 18}}, {'-', {0, 0, 0, 31, 0, 0, 0}},
};

struct Canvas {
  detail::RgbImage img;
  Canvas(int w, int h) { img.width = w, img.height = h, img.rgb.assign(static_cast<std::size_t>(w * h * 3), 255); }
  void px(int x, int y, std::array<std::uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
    std::memcpy(&img.rgb[static_cast<std::size_t>((y * img.width + x) * 3)], c.data(), 3);
  }
  void line(double x0, double y0, double x1, double y1, std::array<std::uint8_t, 3> c, int thick = 1) {
    const int n = static_cast<int>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      const int x = static_cast<int>(std::lround(x0 + t * (x1 - x0))), y = static_cast<int>(std::lround(y0 + t * (y1 - y0)));
      for (int dx = 0; dx < thick; ++dx)
        for (int dy = 0; dy < thick; ++dy) px(x + dx, y + dy, c);
    }
  }
  void text(int x, int y, const std::string& s, std::array<std::uint8_t, 3> c) {  // 2× scaled, top-left at (x, y)
    for (char ch : s) {
      for (const auto& g : kFont)
        if (g.c == ch)
          for (int r = 0; r < 7; ++r)
            for (int b = 0; b < 5; ++b)
              if (g.rows[r] & (16 >> b))
                for (int k = 0; k < 4; ++k) px(x + 2 * b + k % 2, y + 2 * r + k / 2, c);
      x += 12;
    }
  }
};

std::string fmt(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

std::string loss_curve_png(const std::vector<LossRow>& rows) {
  const int W = 800, H = 480, left = 80, right = 20, top = 40, bottom = 50;
  Canvas cv(W, H);
  const std::array<std::uint8_t, 3> black{0, 0, 0}, grid{225, 225, 225}, blue{120, 170, 230}, orange{230, 110, 20};
  double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
  for (const auto& r : rows) {
    xmax = std::max(xmax, static_cast<double>(r.step));
    if (r.has_train) ymin = std::min(ymin, r.train_loss), ymax = std::max(ymax, r.train_loss);
    if (r.has_val) ymin = std::min(ymin, r.val_loss), ymax = std::max(ymax, r.val_loss);
  }
  if (!(ymin < ymax)) ymin = std::isfinite(ymin) ? ymin - 1 : 0, ymax = std::isfinite(ymax) ? ymax + 1 : 1;
  const double pw = W - left - right, ph = H - top - bottom;
  auto X = [&](double s) { return left + pw * s / xmax; };
  auto Y = [&](double l) { return top + ph * (1.0 - (l - ymin) / (ymax - ymin)); };
  for (int i = 0; i <= 5; ++i) {
    const double yv = ymin + (ymax - ymin) * i / 5.0, xv = xmax * i / 5.0;
    cv.line(left, Y(yv), W - right, Y(yv), grid);
    cv.line(X(xv), top, X(xv), H - bottom, grid);
    cv.text(8, static_cast<int>(Y(yv)) - 7, fmt(yv, 2), black);
    const std::string xs = fmt(xv, 0);
    cv.text(static_cast<int>(X(xv)) - 6 * static_cast<int>(xs.size()), H - bottom + 8, xs, black);
  }
  cv.line(left, top, left, H - bottom, black);
  cv.line(left, H - bottom, W - right, H - bottom, black);
  cv.text(W / 2 - 24, H - 20, "step", black);
  const LossRow* prev = nullptr;
  for (const auto& r : rows)
    if (r.has_train) {
      if (prev) cv.line(X(static_cast<double>(prev->step)), Y(prev->train_loss), X(static_cast<double>(r.step)), Y(r.train_loss), blue);
      prev = &r;
    }
  prev = nullptr;
  for (const auto& r : rows)
    if (r.has_val) {
      const double x = X(static_cast<double>(r.step)), y = Y(r.val_loss);
      if (prev) cv.line(X(static_cast<double>(prev->step)), Y(prev->val_loss), x, y, orange, 2);
      for (int dx = -3; dx <= 3; ++dx)
        for (int dy = -3; dy <= 3; ++dy) cv.px(static_cast<int>(x) + dx, static_cast<int>(y) + dy, orange);
      prev = &r;
    }
  cv.line(W - 250, 16, W - 220, 16, blue, 2);
  cv.text(W - 212, 10, "train loss", black);
  cv.line(W - 110, 16, W - 80, 16, orange, 2);
  cv.text(W - 72, 10, "val", black);
  return detail::encode_png(cv.img);
}

}  // namespace qkv::train
