// Model with bf16 weights: the bf16 copies of the weights, made once at construction, and the
// prefill layer for gemm_inputs = bf16 (block_gemm_bf16). See model_impl.hpp.
#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "blocks/activation.hpp"
#include "blocks/dense.hpp"
#include "core/parallel.hpp"
#include "model/model_impl.hpp"
#include "qkv/memory.hpp"

namespace qkv {

using model_detail::norm;

void Model::Impl::make_bf16_weights() {
  if (opt_.weights != DType::bf16) return;
  const Config& c = w_.config;
  const std::int64_t C = c.dim, D = c.head_dim(), Hd = c.hidden_dim;
  const std::int64_t per_layer = (c.n_heads + 2 * c.n_kv_heads) * D * C + C * c.n_heads * D +
                                 (c.mlp == MlpKind::swiglu ? 3 : 2) * Hd * C;
  check_memory("qkv::Model", "bf16 copy of the weights", bytes_of({c.n_layers * per_layer + c.vocab_size * C}, 2));
  bf16_ = Buffer(DType::bf16, {c.n_layers * per_layer + c.vocab_size * C});
  std::uint16_t* at = bf16_.ptr<std::uint16_t>();
  std::int64_t largest = 0;
  auto take = [&](const float* src, std::int64_t rows, std::int64_t cols) -> const std::uint16_t* {
    if (!src) return nullptr;
    blocks::f32_to_bf16(at, src, rows * cols);
    largest = std::max(largest, rows * cols);
    const std::uint16_t* p = at;
    at += rows * cols;
    return p;
  };
  for (const LayerWeights& L : w_.layers) {
    LayerBf16 b;
    b.wq = take(L.wq, c.n_heads * D, C);
    b.wk = take(L.wk, c.n_kv_heads * D, C);
    b.wv = take(L.wv, c.n_kv_heads * D, C);
    b.wo = take(L.wo, C, c.n_heads * D);
    b.w1 = take(L.w1, Hd, C);
    b.w2 = take(L.w2, C, Hd);
    b.w3 = take(L.w3, Hd, C);
    layers_bf16_.push_back(b);
  }
  wcls_bf16_ = take(w_.wcls, c.vocab_size, C);
  if (opt_.gemm_inputs == DType::f32) {
    wide_ = Buffer(DType::f32, {largest});
    return;
  }
  // gemm_inputs = bf16: block_gemm_bf16 multiplies by [W_Q; W_K; W_V] in one GEMM: take() laid the
  // three out one after the other, which is that [(H + 2·Hkv)·D, C] matrix; its bias is the three
  // concatenated (zeros where one is missing), or none when all three are.
  const std::int64_t HD = c.n_heads * c.head_dim(), KD = c.n_kv_heads * c.head_dim(), N3 = HD + 2 * KD;
  bool bias = false;
  for (const LayerWeights& L : w_.layers) bias = bias || L.bq || L.bk || L.bv;
  if (bias) bqkv_ = Buffer(DType::f32, {c.n_layers, N3});
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
    const LayerBf16& b = layers_bf16_[static_cast<std::size_t>(l)];
    if (b.wk != b.wq + HD * c.dim || b.wv != b.wk + KD * c.dim)
      fail("qkv::Model", "internal: W_Q, W_K, W_V of a layer are not adjacent in the bf16 arena");
    PackedLayer p;
    p.wqkv = blocks::PackedBf16(b.wq, c.dim, N3);
    p.wo = blocks::PackedBf16(b.wo, HD, c.dim);
    p.w1 = blocks::PackedBf16(b.w1, c.dim, c.hidden_dim);
    p.w2 = blocks::PackedBf16(b.w2, c.hidden_dim, c.dim);
    if (b.w3) p.w3 = blocks::PackedBf16(b.w3, c.dim, c.hidden_dim);
    packed_.push_back(std::move(p));
    if (!bias) continue;
    float* row = bqkv_.ptr<float>() + l * N3;
    const std::pair<const float*, std::int64_t> parts[] = {{L.bq, HD}, {L.bk, KD}, {L.bv, KD}};
    for (const auto& [src, n] : parts) {
      if (src) std::copy_n(src, n, row);
      else std::fill_n(row, n, 0.0f);
      row += n;
    }
  }
}

// block_gemm_bf16()'s projections: xbb_ (bf16(norm1(x))) → qkv_ by one GEMM with [W_Q; W_K; W_V]
// (f32 rows, or bf16 rounded in its epilogue when attention_block prefers them), and xbb_ (the
// attention's output, bf16) → x by the W_O GEMM with a sum epilogue.
struct Model::Impl::GemmBf16Projections final : blocks::AttentionProjections {
  Impl& m;
  int l;
  std::int64_t S;
  GemmBf16Projections(Impl& impl, int layer, std::int64_t rows) : m(impl), l(layer), S(rows) {}
  blocks::QkvRows qkv(DType preferred) override {
    const Config& c = m.w_.config;
    const std::int64_t HD = c.n_heads * c.head_dim(), KD = c.n_kv_heads * c.head_dim(), N3 = HD + 2 * KD;
    const float* bqkv = m.bqkv_.numel() > 0 ? m.bqkv_.ptr<float>() + l * N3 : nullptr;
    blocks::gemm_bf16_in(m.xbb_.ptr<std::uint16_t>(), m.layers_bf16_[static_cast<std::size_t>(l)].wq, bqkv, m.qkv_.data(),
                         preferred, S, c.dim, N3, 0.0f, blocks::GemmAct::none, &m.packed_[static_cast<std::size_t>(l)].wqkv);
    // q, k, v: column blocks of qkv's rows [S, N3], in elements of the dtype written.
    auto* base = static_cast<char*>(m.qkv_.data());
    const auto es = static_cast<std::int64_t>(dtype_size(preferred));
    return {base, base + HD * es, base + (HD + KD) * es, N3, N3, N3, preferred};
  }
  void* att() override { return m.xbb_.data(); }
  DType att_dtype() const override { return DType::bf16; }
  void out(std::int64_t n, float* y, float beta) override {
    const Config& c = m.w_.config;
    const auto li = static_cast<std::size_t>(l);
    blocks::gemm_bf16_in(m.xbb_.ptr<std::uint16_t>(), m.layers_bf16_[li].wo, m.w_.layers[li].bo, y, DType::f32, n,
                         c.n_heads * c.head_dim(), c.dim, beta, blocks::GemmAct::none, &m.packed_[li].wo);
  }
};

// block() for gemm_inputs = bf16 and S > 4 rows: the same layer with every GEMM input made bf16
// where it is produced, so nothing is converted on its own pass and the GEMMs do the rest in
// their epilogues (blocks::gemm_bf16_in):
//   xbb = bf16(norm1(x))                                  (in the norm's own loop)
//   qkv = xbb·[W_Q; W_K; W_V]ᵀ + [b_Q; b_K; b_V]         qkv [S, (H + 2·Hkv)·D] f32, one GEMM
//   att = attention(q, k, v)  (q, k, v: column blocks of qkv's rows)
//   x += bf16(att)·W_Oᵀ + b_O                             (sum epilogue)
// With a bf16 cache and no rotary the GEMM writes qkv in bf16 (rounding in its epilogue), its k, v
// rows are copied into the cache, and the bf16 attention reads q in place and writes bf16(att)
// straight into W_O's input rows; with rotary, qkv stays f32 and attention_block rotates and
// rounds. Either way no pass converts att (with an f32 cache: one rounding of att into xbb).
//   xbb = bf16(norm2(x));  hbb = bf16(gelu(xbb·W1ᵀ + b1)) (bias, GELU, rounding in the epilogue)
//   x += hbb·W2ᵀ + b2
// Every GEMM sees the same bf16 inputs as block()'s per-projection rounding; only the GELU is
// oneDNN's (f32, same form) instead of gelu_fast. SwiGLU keeps two GEMMs and the gate in f32.
// After the attention's projection only rows r0 … S − 1 go on, as in block().
void Model::Impl::block_gemm_bf16(int l, std::int64_t S, std::int64_t r0, KvCache& cache) {
  using blocks::GemmAct;
  const Config& c = w_.config;
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const LayerBf16& Lb = layers_bf16_[static_cast<std::size_t>(l)];
  const std::int64_t C = c.dim, Hd = c.hidden_dim;
  const int threads = max_threads();
  float *x = x_.ptr<float>(), *xb = xb_.ptr<float>();
  std::uint16_t *xbb = xbb_.ptr<std::uint16_t>(), *hbb = hbb_.ptr<std::uint16_t>();
  const PackedLayer& P = packed_[static_cast<std::size_t>(l)];

  // ---- attention: x += W_O · attention(q, k, v)
  norm(c, xb, x, L.norm1_w, L.norm1_b, S, xbb);
  GemmBf16Projections proj(*this, l, S);
  attention_block(l, S, r0, cache, proj);
  const std::int64_t n = S - r0;
  float* xo = x + r0 * C;  // the rows of x this block updates

  // ---- MLP: x += W2 · act(W1 · norm2(x))
  norm(c, xb, xo, L.norm2_w, L.norm2_b, n, xbb);
  if (c.mlp == MlpKind::swiglu) {
    float *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();
    blocks::gemm_bf16_in(xbb, Lb.w1, L.b1, hb, DType::f32, n, C, Hd, 0.0f, GemmAct::none, &P.w1);
    blocks::gemm_bf16_in(xbb, Lb.w3, nullptr, hb2, DType::f32, n, C, Hd, 0.0f, GemmAct::none, &P.w3);
    blocks::swiglu_forward(hb, hb, hb2, n * Hd);
    blocks::f32_to_bf16(hbb, hb, n * Hd, threads, active_isa());
  } else {
    const GemmAct act = c.mlp == MlpKind::gelu_exact ? GemmAct::gelu_erf : GemmAct::gelu_tanh;
    blocks::gemm_bf16_in(xbb, Lb.w1, L.b1, hbb, DType::bf16, n, C, Hd, 0.0f, act, &P.w1);
  }
  blocks::gemm_bf16_in(hbb, Lb.w2, L.b2, xo, DType::f32, n, Hd, C, 1.0f, GemmAct::none, &P.w2);
}

}  // namespace qkv
