// llama2.c's checkpoint, the legacy (version 0) export written by export.py / model.export():
//
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len   (little-endian)
//   f32   token_embedding [V, C]
//         rms_att [L, C]  wq [L, H·D, C]  wk [L, Hkv·D, C]  wv [L, Hkv·D, C]  wo [L, C, H·D]
//         rms_ffn [L, C]  w1 [L, Hd, C]   w2 [L, C, Hd]     w3 [L, Hd, C]
//         rms_final [C]   freq_cis_real [P, D/2]  freq_cis_imag [P, D/2]   (unused: computed)
//         wcls [V, C]     only when the header's vocab_size is negative (untied classifier)
//
// The model is Llama-style: RMSNorm, rotary positions, SwiGLU, no biases. The file's size must be
// exactly what the header implies. The floats are placed by the loaders' one rule
// (weight_placement.hpp): read into a 2 MiB-aligned arena on transparent huge pages where the
// kernel offers them (the file is then not kept mapped), else used in place in the file's private
// mapping, as llama2.c does (there they start at byte 28 of a page: a 64-byte load of a row
// straddles two cache lines, which measured within the noise for weights streamed from memory).
#include <cstring>
#include <memory>
#include <string>

#include "model/mapped_file.hpp"
#include "model/weight_placement.hpp"
#include "model/weights.hpp"

namespace qkv {

Weights load_llama2c(const std::string& path) {
  const char* fn = "qkv::load_llama2c";
  auto file = std::make_shared<detail::MappedFile>(path, fn);
  const std::string where = "file '" + path + "'";
  constexpr std::size_t kHeader = 7 * sizeof(std::int32_t);
  if (file->size() < kHeader)
    fail_format(fn, where + ": " + std::to_string(file->size()) + " bytes is shorter than the 28-byte header");
  std::int32_t h[7];
  std::memcpy(h, file->data(), kHeader);
  Config c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.tied_embeddings = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : -static_cast<std::int64_t>(h[5]);
  c.seq_len = h[6];
  c.pos = PosEncoding::rotary;
  c.norm = NormKind::rmsnorm;
  c.mlp = MlpKind::swiglu;
  c.bias = false;
  const std::string header = "header (dim " + std::to_string(h[0]) + ", hidden_dim " + std::to_string(h[1]) +
                             ", n_layers " + std::to_string(h[2]) + ", n_heads " + std::to_string(h[3]) +
                             ", n_kv_heads " + std::to_string(h[4]) + ", vocab_size " + std::to_string(h[5]) +
                             ", seq_len " + std::to_string(h[6]) + ")";
  try {
    c.validate("header");
  } catch (const std::invalid_argument& e) {
    fail_format(fn, where + ": impossible " + header + ": " + e.what());
  }

  // Sizes are bounded by validate(), so these products fit comfortably in 64 bits.
  const std::int64_t C = c.dim, L = c.n_layers, D = c.head_dim(), H = c.n_heads, Hkv = c.n_kv_heads;
  const std::int64_t Hd = c.hidden_dim, V = c.vocab_size, P = c.seq_len;
  const std::int64_t floats = V * C + L * C + L * H * D * C + 2 * L * Hkv * D * C + L * C * H * D + L * C +
                              3 * L * Hd * C + C + P * D + (c.tied_embeddings ? 0 : V * C);
  const std::uint64_t want = kHeader + static_cast<std::uint64_t>(floats) * sizeof(float);
  if (file->size() != want)
    fail_format(fn, where + ": is " + std::to_string(file->size()) + " bytes but its " + header + " implies " +
                 std::to_string(want) + (file->size() < want ? " (truncated)" : " (trailing bytes)"));

  Weights w;
  w.config = c;
  detail::prepare_layout(w);
  const std::uint64_t bytes = static_cast<std::uint64_t>(floats) * sizeof(float);
  float* arena = nullptr;
  if (detail::weight_placement(fn) == detail::Placement::in_place) {
    arena = reinterpret_cast<float*>(file->data() + kHeader);
    w.storage = file;
  } else {
    // At byte 28 of the arena, as in the file (weight_placement.hpp: rows keep their offset in a line).
    detail::WeightArena a =
        detail::weight_arena(kHeader + bytes, fn, where + ": its " + std::to_string(floats) + " floats");
    arena = a.data + kHeader / sizeof(float);
    file->read(kHeader, bytes, arena, fn);
    w.storage = std::move(a.owner);  // `file` is unmapped on return: the floats are resident once
  }
  float* p = arena;
  auto take = [&p](std::int64_t n) {
    float* r = p;
    p += n;
    return r;
  };
  w.wte = take(V * C);
  auto per_layer = [&](std::int64_t n, float* LayerWeights::*field) {
    for (auto& lw : w.layers) lw.*field = take(n);
  };
  per_layer(C, &LayerWeights::norm1_w);
  per_layer(H * D * C, &LayerWeights::wq);
  per_layer(Hkv * D * C, &LayerWeights::wk);
  per_layer(Hkv * D * C, &LayerWeights::wv);
  per_layer(C * H * D, &LayerWeights::wo);
  per_layer(C, &LayerWeights::norm2_w);
  per_layer(Hd * C, &LayerWeights::w1);
  per_layer(C * Hd, &LayerWeights::w2);
  per_layer(Hd * C, &LayerWeights::w3);
  w.normf_w = take(C);
  take(P * D);  // the two legacy rotary tables, [P, D/2] each
  if (!c.tied_embeddings) w.wcls = take(V * C);
  detail::finish_layout(w);
  detail::check_finite(w, fn, where);
  return w;
}

}  // namespace qkv
