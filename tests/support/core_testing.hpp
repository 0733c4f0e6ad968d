// Helpers for the attention and block suites: deterministic random tensors, error measures,
// and the golden-file reader (format written by tools/make_golden_walkthrough.py).
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "qkv/types.hpp"

namespace qkv::testing {

// Fills every element a view can reach (through its strides) with N(0, std²) from `seed`.
inline void fill_normal(const View& v, std::uint64_t seed, double std = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, std);
  const std::int64_t n0 = v.rank > 0 ? v.dim(0) : 1, n1 = v.rank > 1 ? v.dim(1) : 1, n2 = v.rank > 2 ? v.dim(2) : 1,
                     n3 = v.rank > 3 ? v.dim(3) : 1;
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c)
        for (std::int64_t d = 0; d < n3; ++d) v.store(v.offset(a, b, c, d), dist(rng));
}
inline void fill_normal(const Buffer& b, std::uint64_t seed, double std = 1.0) { fill_normal(b.view(), seed, std); }

// Max |a − b| over two views of the same shape (any strides, any float dtype).
inline double max_abs_diff(const View& a, const View& b) {
  if (a.rank != b.rank) throw std::logic_error("max_abs_diff: ranks differ");
  for (int i = 0; i < a.rank; ++i)
    if (a.dim(i) != b.dim(i)) throw std::logic_error("max_abs_diff: shapes differ " + a.shape_str() + " " + b.shape_str());
  const std::int64_t n0 = a.rank > 0 ? a.dim(0) : 1, n1 = a.rank > 1 ? a.dim(1) : 1, n2 = a.rank > 2 ? a.dim(2) : 1,
                     n3 = a.rank > 3 ? a.dim(3) : 1;
  double m = 0.0;
  for (std::int64_t i = 0; i < n0; ++i)
    for (std::int64_t j = 0; j < n1; ++j)
      for (std::int64_t k = 0; k < n2; ++k)
        for (std::int64_t l = 0; l < n3; ++l) {
          const double x = a.load(a.offset(i, j, k, l)), y = b.load(b.offset(i, j, k, l));
          const double d = (std::isinf(x) && x == y) ? 0.0 : std::abs(x - y);
          m = std::max(m, std::isnan(d) ? INFINITY : d);
        }
  return m;
}

// A golden file: "NAME ROWS COLS" then ROWS lines of COLS numbers ('-inf' allowed); '#' lines are comments.
struct Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> data;  // row-major
  double at(std::int64_t r, std::int64_t c) const { return data[static_cast<std::size_t>(r * cols + c)]; }
};

inline std::map<std::string, Matrix> read_golden(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open golden file " + path);
  std::map<std::string, Matrix> out;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream head(line);
    std::string name;
    Matrix m;
    if (!(head >> name >> m.rows >> m.cols) || m.rows <= 0 || m.cols <= 0)
      throw std::runtime_error(path + ": bad header '" + line + "'");
    for (std::int64_t r = 0; r < m.rows; ++r) {
      if (!std::getline(f, line)) throw std::runtime_error(path + ": " + name + " is truncated");
      std::istringstream row(line);
      std::string tok;
      for (std::int64_t c = 0; c < m.cols; ++c) {
        if (!(row >> tok)) throw std::runtime_error(path + ": " + name + " row " + std::to_string(r) + " is short");
        m.data.push_back(tok == "-inf" ? -INFINITY : std::stod(tok));
      }
    }
    out[name] = std::move(m);
  }
  return out;
}

}  // namespace qkv::testing
