// An independent oracle for attention tests: the definition of include/qkv/attention.hpp written
// again, as plainly as possible, sharing no code with src/ (not the KeyRange rule, not the mask
// broadcasting). Everything in f64; results in row-major std::vectors.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "qkv/attention.hpp"

namespace qkv::testing {

struct NaiveResult {
  std::vector<double> out;      // [B, H, Sq, Dv]
  std::vector<double> lse;      // [B, H, Sq]
  std::vector<double> pattern;  // [B, H, Sq, Skv]
};

// The mask entry for (b, h, i, j): the mask's own shape is right-aligned to [B, H, Sq, Skv] and
// a size-1 dimension repeats.
inline double naive_mask_at(const View& m, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const std::int64_t idx[4] = {b, h, i, j};
  std::int64_t off = 0;
  for (int d = 0; d < m.rank; ++d) {
    const std::int64_t full_dim = 4 - m.rank + d;
    const std::int64_t at = m.dim(d) == 1 ? 0 : idx[full_dim];
    off += at * m.stride(d);
  }
  return m.load(off);
}

inline NaiveResult naive_attention(const View& q, const View& k, const View& v, const AttentionOptions& opt) {
  const std::int64_t B = q.dim(0), H = q.dim(1), Sq = q.dim(2), D = q.dim(3), Hkv = k.dim(1), Skv = k.dim(2),
                     Dv = v.dim(3);
  const double scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(static_cast<double>(D));
  const bool bool_mask = opt.mask && opt.mask->dtype == DType::u8;
  NaiveResult r;
  r.out.assign(static_cast<std::size_t>(B * H * Sq * Dv), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * H * Sq), -std::numeric_limits<double>::infinity());
  r.pattern.assign(static_cast<std::size_t>(B * H * Sq * Skv), 0.0);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = opt.key_lengths ? static_cast<std::int64_t>(opt.key_lengths->load(opt.key_lengths->offset(b))) : Skv;
    for (std::int64_t h = 0; h < H; ++h) {
      const std::int64_t g = h / (H / Hkv);
      for (std::int64_t i = 0; i < Sq; ++i) {
        const std::int64_t diag = opt.align == Align::bottom_right ? i + Skv - Sq : i;
        std::vector<double> s(static_cast<std::size_t>(Skv));
        std::vector<bool> ok(static_cast<std::size_t>(Skv));
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Skv; ++j) {
          bool allowed = j < len;
          if (opt.causal && j > diag) allowed = false;
          if (opt.window_left >= 0 && j < diag - opt.window_left) allowed = false;
          if (opt.window_right >= 0 && j > diag + opt.window_right) allowed = false;
          double add = 0.0;
          if (opt.mask) {
            const double m = naive_mask_at(*opt.mask, b, h, i, j);
            if (bool_mask) {
              if (m == 0.0) allowed = false;
            } else {
              add = m;
            }
          }
          double dot = 0.0;
          for (std::int64_t d = 0; d < D; ++d) dot += q.load(q.offset(b, h, i, d)) * k.load(k.offset(b, g, j, d));
          s[static_cast<std::size_t>(j)] = dot * scale + add;
          ok[static_cast<std::size_t>(j)] = allowed && s[static_cast<std::size_t>(j)] != -INFINITY;
          if (ok[static_cast<std::size_t>(j)]) mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        if (mx == -INFINITY) continue;  // nothing allowed: zeros and lse = −∞
        double sum = 0.0;
        for (std::int64_t j = 0; j < Skv; ++j)
          if (ok[static_cast<std::size_t>(j)]) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
        const std::size_t row = static_cast<std::size_t>((b * H + h) * Sq + i);
        r.lse[row] = mx + std::log(sum);
        for (std::int64_t j = 0; j < Skv; ++j) {
          if (!ok[static_cast<std::size_t>(j)]) continue;
          const double p = std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
          r.pattern[row * static_cast<std::size_t>(Skv) + static_cast<std::size_t>(j)] = p;
          for (std::int64_t e = 0; e < Dv; ++e)
            r.out[row * static_cast<std::size_t>(Dv) + static_cast<std::size_t>(e)] += p * v.load(v.offset(b, g, j, e));
        }
      }
    }
  }
  return r;
}

// Max |got − want| over a view (any strides) and a row-major vector of its shape; −∞ = −∞ counts as 0.
inline double max_err(const View& got, const std::vector<double>& want) {
  const std::int64_t n0 = got.dim(0), n1 = got.rank > 1 ? got.dim(1) : 1, n2 = got.rank > 2 ? got.dim(2) : 1,
                     n3 = got.rank > 3 ? got.dim(3) : 1;
  double m = 0.0;
  std::size_t n = 0;
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c)
        for (std::int64_t d = 0; d < n3; ++d, ++n) {
          const double x = got.load(got.offset(a, b, c, d)), y = want[n];
          if (x == y) continue;  // covers −∞ = −∞
          const double e = std::abs(x - y);
          m = std::max(m, std::isnan(e) ? INFINITY : e);
        }
  return m;
}

}  // namespace qkv::testing
