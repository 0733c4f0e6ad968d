// inspect_fixture OUTDIR S — writes OUTDIR/index.html, the layer PNGs and OUTDIR/inspect.json
// for a synthetic model (2 layers × 3 heads, S tokens) whose patterns are known exactly, so the
// browser test can check the page without a trained model.
//   layer 0: causal;  layer 1: causal with a window of 4 keys (j ≥ i − 3), so both masks appear.
//   scores ~ N(0, 2²); patterns are their softmax in f64, rounded to f32 (each row then sums to
//   1 within 2^-24 ≈ 6e-8); Δe_h random, the block's Δe their sum.
// Token texts include "</script>" and an invalid UTF-8 byte on purpose.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "inspect/page.hpp"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: inspect_fixture OUTDIR S [EXACT_PAGE_BYTES]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const std::int64_t S = std::atoll(argv[2]), L = 2, H = 3, d = 6, V = 20;
  if (S < 1 || S > 4096) {
    std::fprintf(stderr, "inspect_fixture: S must be in [1, 4096]\n");
    return 2;
  }
  std::mt19937 g(42);
  std::normal_distribution<double> nd(0.0, 2.0);
  const float ninf = -std::numeric_limits<float>::infinity();

  std::vector<std::vector<float>> sc(L), pa(L), hd(L), bd(L);
  std::vector<qkv::inspect::LayerInput> layers;
  for (std::int64_t l = 0; l < L; ++l) {
    sc[l].resize(H * S * S);
    pa[l].resize(H * S * S);
    hd[l].resize(H * S * d);
    bd[l].assign(S * d, 0.0f);
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t q = 0; q < S; ++q) {
        std::vector<double> x(S);
        double mx = -INFINITY;
        for (std::int64_t k = 0; k < S; ++k) {
          const bool allowed = k <= q && (l == 0 || k >= q - 3);
          x[k] = allowed ? static_cast<double>(static_cast<float>(nd(g))) : -INFINITY;
          mx = std::max(mx, x[k]);
        }
        double z = 0;
        for (std::int64_t k = 0; k < S; ++k) z += std::exp(x[k] - mx);
        for (std::int64_t k = 0; k < S; ++k) {
          const std::size_t i = (h * S + q) * S + k;
          sc[l][i] = std::isinf(x[k]) ? ninf : static_cast<float>(x[k]);
          pa[l][i] = static_cast<float>(std::exp(x[k] - mx) / z);
        }
        for (std::int64_t c = 0; c < d; ++c) {
          const float v = static_cast<float>(nd(g));
          hd[l][(h * S + q) * d + c] = v;
          bd[l][q * d + c] += v;
        }
      }
    }
    layers.push_back({qkv::View::contiguous(sc[l].data(), qkv::DType::f32, {H, S, S}),
                      qkv::View::contiguous(pa[l].data(), qkv::DType::f32, {H, S, S}),
                      qkv::View::contiguous(hd[l].data(), qkv::DType::f32, {H, S, d}),
                      qkv::View::contiguous(bd[l].data(), qkv::DType::f32, {S, d}), {}, {}});
  }
  std::vector<float> logits(V);
  for (auto& v : logits) v = static_cast<float>(nd(g));

  const auto piece = [](std::int32_t id) -> std::string {
    if (id == 1) return "<s>";
    if (id == 5) return "</script><b>";
    if (id == 6) return std::string(" caf\xff");
    return " t" + std::to_string(id);
  };
  std::vector<qkv::inspect::Token> tokens;
  for (std::int64_t i = 0; i < S; ++i) {
    const auto id = static_cast<std::int32_t>(i == 0 ? 1 : 2 + (i * 7) % (V - 2));
    tokens.push_back({id, piece(id)});
  }
  qkv::Config cfg;  // the shape of the synthetic layers (hidden_dim is not shown)
  cfg.dim = d; cfg.hidden_dim = 4 * d; cfg.n_layers = L; cfg.n_heads = H; cfg.n_kv_heads = H; cfg.vocab_size = V;
  cfg.seq_len = 4096;
  const qkv::inspect::ModelInfo info = qkv::inspect::ModelInfo::of("synthetic fixture", cfg);
  nlohmann::json params = {{"rows", {{{"name", "attention"}, {"count", 144}, {"detail", "synthetic"}}}},
                           {"total", 144}};
  try {
    auto report = qkv::inspect::make_report(info, "synthetic", tokens, layers,
                                            qkv::View::contiguous(logits.data(), qkv::DType::f32, {V}),
                                            piece, params);
    // An optional third argument: the exact-page budget in bytes (0: always the compact layout).
    const double exact = argc > 3 ? std::atof(argv[3]) : qkv::inspect::kExactPageBytes;
    std::printf("%s\n", qkv::inspect::write_page(report, dir, exact).c_str());
    std::printf("%s\n", qkv::inspect::write_json(report, dir).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
