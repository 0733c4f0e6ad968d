// The encoder's forward on packed texts, its pooling, and the sentence-transformers folder loader
// (qkv/encoder.hpp). Dimension letters: T tokens of the batch, B texts, C = dim, H heads,
// D = C / H, Hd = hidden_dim.
//
//   x = norm_e(wte[t] + wpe[pos] + wtt[0])                       x [T, C]
//   for each layer l:
//     qkv = x · [W_Q; W_K; W_V]ᵀ + b                             qkv [T, 3C]  (q | k | v per row)
//     h = x + W_O · attention_varlen(q, k, v, cu_seqlens) + b_O   h [T, C]     (the attention block,
//                                                                              bidirectional)
//     x = norm1(h)
//     ff = gelu(x · W1ᵀ + b1)                                     ff [T, Hd]
//     h = x + ff · W2ᵀ + b2;  x = norm2(h)
#include "qkv/encoder.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>

#include <nlohmann/json.hpp>

#include "blocks/attention_block.hpp"
#include "blocks/dense.hpp"
#include "blocks/embedding.hpp"
#include "blocks/norm.hpp"
#include "core/parallel.hpp"
#include "model/input_file.hpp"
#include "model/layer_trace.hpp"
#include "qkv/attention.hpp"
#include "qkv/memory.hpp"

namespace qkv {

// Per layer: [W_Q; W_K; W_V] as one [3·C, C] matrix with its bias [3·C] (one GEMM for the three).
// dtype f32: the four matrices packed for oneDNN's f32 matmul. dtype bf16: rounded to bf16 (plain
// copies) and packed for its bf16 matmul.
struct Encoder::PackedLayer {
  Buffer bqkv;
  blocks::PackedF32 pqkv, po, p1, p2;
  Buffer wqkv_b, wo_b, w1_b, w2_b;
  blocks::PackedBf16 pqkv_b, po_b, p1_b, p2_b;
};

Encoder::Encoder(Weights w, Tokenizer tok, Pooling pooling, bool normalize, std::int64_t max_seq_length,
                 const EncoderOptions& options)
    : w_(std::move(w)), tok_(std::move(tok)), pooling_(pooling), normalize_(normalize), max_len_(max_seq_length),
      opt_(options) {
  const char* fn = "qkv::Encoder";
  const Config& c = w_.config;
  c.validate(fn);
  if (c.causal || !c.post_norm || c.norm != NormKind::layernorm || !c.bias || c.pos != PosEncoding::learned ||
      c.mlp == MlpKind::swiglu || c.n_kv_heads != c.n_heads)
    fail(fn, "w.config: not a BERT-style encoder (needs causal false, post_norm true, layernorm, bias, learned "
             "positions, a GELU MLP, n_kv_heads = n_heads), got " + config_to_json(c, false));
  if (!w_.wte || !w_.wpe || !w_.norme_w || static_cast<std::int64_t>(w_.layers.size()) != c.n_layers)
    fail(fn, "w: weights are incomplete for their config (use a loader or Weights::allocate)");
  if (tok_.format() != Tokenizer::Format::wordpiece || tok_.vocab_size() > c.vocab_size)
    fail(fn, "tok: a WordPiece tokenizer of at most vocab_size = " + std::to_string(c.vocab_size) +
                 " tokens is needed, got " + std::to_string(tok_.vocab_size()) + " tokens");
  if (max_len_ < 2 || max_len_ > c.seq_len)
    fail(fn, "max_seq_length: must be in [2, seq_len = " + std::to_string(c.seq_len) + "], got " +
                 std::to_string(max_len_));
  if (opt_.dtype != DType::f32 && opt_.dtype != DType::bf16)
    fail(fn, std::string("options.dtype: must be f32 or bf16, got ") + dtype_name(opt_.dtype));
  if (opt_.num_threads < 0)
    fail(fn, "options.num_threads: must be ≥ 0 (0: the library default), got " + std::to_string(opt_.num_threads));
  const std::int64_t C = c.dim, Hd = c.hidden_dim;
  for (const LayerWeights& L : w_.layers) {
    auto e = std::make_shared<PackedLayer>();
    Buffer wqkv(DType::f32, {3 * C, C});
    e->bqkv = Buffer(DType::f32, {3 * C});
    float* W = wqkv.ptr<float>();
    float* b = e->bqkv.ptr<float>();
    std::copy_n(L.wq, C * C, W);
    std::copy_n(L.wk, C * C, W + C * C);
    std::copy_n(L.wv, C * C, W + 2 * C * C);
    std::copy_n(L.bq, C, b);
    std::copy_n(L.bk, C, b + C);
    std::copy_n(L.bv, C, b + 2 * C);
    if (opt_.dtype == DType::bf16) {
      auto round = [](const float* src, std::int64_t rows, std::int64_t cols) {
        Buffer out(DType::bf16, {rows, cols});
        blocks::f32_to_bf16(out.ptr<std::uint16_t>(), src, rows * cols);
        return out;
      };
      e->wqkv_b = round(W, 3 * C, C);
      e->wo_b = round(L.wo, C, C);
      e->w1_b = round(L.w1, Hd, C);
      e->w2_b = round(L.w2, C, Hd);
      e->pqkv_b = blocks::PackedBf16(e->wqkv_b.ptr<std::uint16_t>(), C, 3 * C);
      e->po_b = blocks::PackedBf16(e->wo_b.ptr<std::uint16_t>(), C, C);
      e->p1_b = blocks::PackedBf16(e->w1_b.ptr<std::uint16_t>(), C, Hd);
      e->p2_b = blocks::PackedBf16(e->w2_b.ptr<std::uint16_t>(), Hd, C);
    } else {
      e->pqkv = blocks::PackedF32(W, C, 3 * C);
      e->po = blocks::PackedF32(L.wo, C, C);
      e->p1 = blocks::PackedF32(L.w1, C, Hd);
      e->p2 = blocks::PackedF32(L.w2, Hd, C);
    }
    layers_.push_back(std::move(e));
  }
}

std::vector<int> Encoder::tokenize(std::string_view text) const {
  std::vector<int> ids = tok_.encode(text, false, false);
  if (static_cast<std::int64_t>(ids.size()) > max_len_ - 2) ids.resize(static_cast<std::size_t>(max_len_ - 2));
  ids.insert(ids.begin(), tok_.bos_id());
  ids.push_back(tok_.eos_id());
  return ids;
}

void Encoder::reserve(std::int64_t Tp) {
  if (Tp <= rows_) return;
  const Config& c = w_.config;
  check_memory("qkv::Encoder::forward", "work buffers for " + std::to_string(Tp) + " tokens",
               bytes_of({Tp, 7 * c.dim + c.hidden_dim}, 4));
  x_ = Buffer(DType::f32, {Tp, c.dim});
  h_ = Buffer(DType::f32, {Tp, c.dim});
  att_ = Buffer(opt_.dtype, {Tp, c.dim});
  qkv_ = Buffer(opt_.dtype, {Tp, 3 * c.dim});
  ff_ = Buffer(DType::f32, {Tp, c.hidden_dim});
  xb_ = Buffer(DType::bf16, {Tp, c.dim});
  rows_ = Tp;
}

namespace {

// One row block of `rows` rows of a projection, on the calling thread (one oneDNN thread):
//   y = act(x · Wᵀ + b)   (beta 0)     or     y += x · Wᵀ + b   (beta 1)
// f32: oneDNN's f32 matmul on the packed W. bf16: x rounded to bf16 into xb's rows (nearest even),
// unless x is null and xb already holds them, then the bf16 matmul on the packed bf16 W (Wb, its
// plain copy, is read only if a primitive wants another layout); y is f32, or bf16 bits when
// y_bf16 (the MLP's hidden rows, handed to W2 as they are).
void project_block(DType dtype, const float* x, std::uint16_t* xb, const blocks::PackedF32& W, const Buffer& Wb,
                   const blocks::PackedBf16& Pb, const float* b, void* y, bool y_bf16, std::int64_t rows,
                   std::int64_t in, std::int64_t out, float beta, blocks::GemmAct act) {
  if (dtype == DType::bf16) {
    if (x) blocks::f32_to_bf16(xb, x, rows * in, active_isa());
    blocks::gemm_bf16_in(xb, Wb.ptr<std::uint16_t>(), b, y, y_bf16 ? DType::bf16 : DType::f32, rows, in, out, beta,
                         act, &Pb);
  } else {
    blocks::gemm_f32_packed(x, W, b, static_cast<float*>(y), rows, in, out, beta, act);
  }
}

}  // namespace

// Rows [r0, r0 + kRows) of qkv = x · [W_Q; W_K; W_V]ᵀ + b for layer l (bf16: rounded to bf16 by the
// GEMM's epilogue, the attention's inputs).
void Encoder::qkv_block(std::int64_t l, std::int64_t r0) {
  const std::int64_t C = w_.config.dim;
  const PackedLayer& P = *layers_[static_cast<std::size_t>(l)];
  const bool bf16 = opt_.dtype == DType::bf16;
  void* y = bf16 ? static_cast<void*>(qkv_.ptr<std::uint16_t>() + r0 * 3 * C) : qkv_.ptr<float>() + r0 * 3 * C;
  project_block(opt_.dtype, x_.ptr<float>() + r0 * C, xb_.ptr<std::uint16_t>() + r0 * C, P.pqkv, P.wqkv_b,
                P.pqkv_b, P.bqkv.ptr<float>(), y, bf16, kRows, C, 3 * C, 0.0f, blocks::GemmAct::none);
}

// Rows [r0, r0 + kRows) of y (h, which holds the residual x) += att · W_Oᵀ + b_O for layer l: the
// attention block's W_O, one GEMM per row block.
void Encoder::out_block(std::int64_t l, std::int64_t r0, float* y, float beta) {
  const std::int64_t C = w_.config.dim;
  const PackedLayer& P = *layers_[static_cast<std::size_t>(l)];
  const bool bf16 = opt_.dtype == DType::bf16;
  // The attention's output rows: f32, or bf16 (the W_O GEMM reads them as they are).
  const float* att = bf16 ? nullptr : att_.ptr<float>() + r0 * C;
  std::uint16_t* attb = bf16 ? att_.ptr<std::uint16_t>() + r0 * C : nullptr;
  project_block(opt_.dtype, att, attb, P.po, P.wo_b, P.po_b, w_.layers[static_cast<std::size_t>(l)].bo, y + r0 * C,
                false, kRows, C, C, beta, blocks::GemmAct::none);
}

// Rows [r0, r0 + kRows) of layer l after its attention block (h = x + att · W_Oᵀ + b_O): the rest is
// row by row, so one task runs it all on its block while the rows are in cache, ending with the
// next layer's qkv projection and residual h = x (or, after the last layer, the rows < T of `hidden`).
void Encoder::tail_block(std::int64_t l, std::int64_t r0, std::int64_t T, float* hidden) {
  const Config& c = w_.config;
  const std::int64_t C = c.dim, Hd = c.hidden_dim, n = std::min(kRows, T - r0);
  const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
  const PackedLayer& P = *layers_[static_cast<std::size_t>(l)];
  const bool bf16 = opt_.dtype == DType::bf16;
  float *x = x_.ptr<float>() + r0 * C, *h = h_.ptr<float>() + r0 * C;
  float* ff = ff_.ptr<float>() + r0 * Hd;
  std::uint16_t* xb = xb_.ptr<std::uint16_t>() + r0 * C;
  // bf16: the MLP's hidden rows are bf16 bits in ff's memory, [kRows, Hd] from the block's start.
  std::uint16_t* ffb = ff_.ptr<std::uint16_t>() + r0 * Hd;
  const blocks::GemmAct act = c.mlp == MlpKind::gelu_exact ? blocks::GemmAct::gelu_erf : blocks::GemmAct::gelu_tanh;

  blocks::layernorm_forward(x, nullptr, nullptr, h, L.norm1_w, L.norm1_b, kRows, C, c.norm_eps);
  project_block(opt_.dtype, x, xb, P.p1, P.w1_b, P.p1_b, L.b1, bf16 ? static_cast<void*>(ffb) : ff, bf16, kRows, C,
                Hd, 0.0f, act);
  std::copy_n(x, kRows * C, h);  // h = x + ff · W2ᵀ + b2
  project_block(opt_.dtype, bf16 ? nullptr : ff, ffb, P.p2, P.w2_b, P.p2_b, L.b2, h, false, kRows, Hd, C, 1.0f,
                blocks::GemmAct::none);
  if (l + 1 == c.n_layers) {
    if (n > 0) blocks::layernorm_forward(hidden + r0 * C, nullptr, nullptr, h, L.norm2_w, L.norm2_b, n, C, c.norm_eps);
    return;
  }
  blocks::layernorm_forward(x, nullptr, nullptr, h, L.norm2_w, L.norm2_b, kRows, C, c.norm_eps);
  qkv_block(l + 1, r0);
  std::copy_n(x, kRows * C, h);
}

// Layer l's projections as the attention block sees them: q, k, v are the column blocks of qkv_
// [Tp, 3C], already computed (the previous pass's last step, fused per row block); W_O is
// out_block over every row block.
class Encoder::Projections final : public blocks::AttentionProjections {
 public:
  Projections(Encoder& e, std::int64_t blocks_n, int threads) : e_(e), blocks_n_(blocks_n), threads_(threads) {}
  std::int64_t layer = 0;
  blocks::QkvRows qkv(DType) override {
    const std::int64_t C = e_.w_.config.dim, es = static_cast<std::int64_t>(dtype_size(e_.opt_.dtype));
    auto* p = static_cast<std::uint8_t*>(e_.qkv_.data());
    return {p, p + C * es, p + 2 * C * es, 3 * C, 3 * C, 3 * C, e_.opt_.dtype};
  }
  void* att() override { return e_.att_.data(); }
  DType att_dtype() const override { return e_.opt_.dtype; }
  // n is T; the blocks run kRows rows each, the padding rows [T, Tp) included.
  void out(std::int64_t, float* y, float beta) override {
    parallel_for(blocks_n_, threads_, [&](std::int64_t k) { e_.out_block(layer, k * kRows, y, beta); });
  }

 private:
  Encoder& e_;
  std::int64_t blocks_n_;
  int threads_;
};

void Encoder::forward(std::span<const int> tokens, std::span<const std::int32_t> cu, float* hidden) {
  run("qkv::Encoder::forward", tokens, cu, hidden, nullptr);
}

std::vector<LayerTrace> Encoder::forward_trace(std::span<const int> tokens, float* hidden) {
  const char* fn = "qkv::Encoder::forward_trace";
  const auto S = static_cast<std::int64_t>(tokens.size());
  if (S < 1) fail(fn, "tokens: need at least one token (got 0)");
  if (opt_.dtype != DType::f32)
    fail(fn, std::string("the trace reads f32 q, k and the attention's output; this encoder runs in ") +
                 dtype_name(opt_.dtype) + " (load it with dtype f32)");
  const Config& c = w_.config;
  // What the trace keeps: per layer scores and pattern [H, S, S], head_delta [H, S, C], block_delta
  // [S, C], q and k [H, S, D].
  check_memory(fn, "trace of " + std::to_string(S) + " tokens",
               c.n_layers * (2 * bytes_of({c.n_heads, S, S}, 4) + bytes_of({c.n_heads + 1, S, c.dim}, 4) +
                             bytes_of({2 * c.n_heads, S, c.head_dim()}, 4)));
  std::vector<LayerTrace> layers(static_cast<std::size_t>(c.n_layers));
  const std::vector<std::int32_t> cu = {0, static_cast<std::int32_t>(S)};
  run(fn, tokens, cu, hidden, &layers);
  return layers;
}

void Encoder::run(const char* fn, std::span<const int> tokens, std::span<const std::int32_t> cu, float* hidden,
                  std::vector<LayerTrace>* trace) {
  const Config& c = w_.config;
  const auto T = static_cast<std::int64_t>(tokens.size());
  const std::int64_t B = static_cast<std::int64_t>(cu.size()) - 1, C = c.dim;
  if (B < 1 || cu[0] != 0 || cu[static_cast<std::size_t>(B)] != T)
    fail(fn, "cu_seqlens: must hold B + 1 ≥ 2 offsets from 0 to T = " + std::to_string(T));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t len = cu[static_cast<std::size_t>(b + 1)] - cu[static_cast<std::size_t>(b)];
    if (len < 0 || len > c.seq_len)
      fail(fn, "cu_seqlens: text " + std::to_string(b) + " has " + std::to_string(len) +
                   " tokens, must be in [0, seq_len = " + std::to_string(c.seq_len) + "]");
  }
  for (std::int64_t i = 0; i < T; ++i)
    if (tokens[static_cast<std::size_t>(i)] < 0 || tokens[static_cast<std::size_t>(i)] >= c.vocab_size)
      fail(fn, "tokens[" + std::to_string(i) + "] = " + std::to_string(tokens[static_cast<std::size_t>(i)]) +
                   " outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  if (!hidden) fail(fn, "hidden: null output pointer");
  if (T == 0) return;
  const ScopedThreads scope(opt_.num_threads > 0 ? opt_.num_threads : max_threads());
  const int threads = max_threads();
  // Rows are padded up to whole blocks: rows [T, Tp) of x and att are zeros, and stay finite
  // through every layer (no token reads them: attention runs on cu_seqlens, pooling on T rows).
  const std::int64_t blocks_n = (T + kRows - 1) / kRows, Tp = blocks_n * kRows;
  reserve(Tp);
  float *x = x_.ptr<float>(), *h = h_.ptr<float>();
  std::fill(x + T * C, x + Tp * C, 0.0f);
  // Zero bits are 0 in f32 and in bf16.
  const auto es = static_cast<std::int64_t>(dtype_size(opt_.dtype));
  std::fill_n(static_cast<std::uint8_t*>(att_.data()) + T * C * es, (Tp - T) * C * es, std::uint8_t{0});

  // Embedding: each text's positions start at 0; every token has type 0 (one text per input).
  parallel_for(B, threads, [&](std::int64_t b) {
    const std::int64_t t0 = cu[static_cast<std::size_t>(b)], n = cu[static_cast<std::size_t>(b + 1)] - t0;
    blocks::embedding_forward(h + t0 * C, tokens.data() + t0, w_.wte, w_.wpe, n, C, 0);
    if (w_.wtt)
      for (std::int64_t i = 0; i < n; ++i) blocks::residual_forward(h + (t0 + i) * C, h + (t0 + i) * C, w_.wtt, C);
  });
  parallel_for(blocks_n, threads, [&](std::int64_t k) {
    const std::int64_t r0 = k * kRows, n = std::min(kRows, T - r0);
    blocks::layernorm_forward(x + r0 * C, nullptr, nullptr, h + r0 * C, w_.norme_w, w_.norme_b, n, C, c.norm_eps);
    qkv_block(0, r0);
    std::copy_n(x + r0 * C, kRows * C, h + r0 * C);  // the residual the attention block adds to
  });

  // Each layer: the attention block on the packed texts (bidirectional within each text; bf16: the
  // flash kernel's vdpbf16ps path, f32 accumulation, out rounded to bf16), h += att · W_Oᵀ + b_O,
  // then the rest of the layer row block by row block.
  Projections proj(*this, blocks_n, threads);
  blocks::VarlenBlockCall call;
  call.cu_seqlens = cu;
  call.shape = c.attention();
  call.opt.num_threads = threads;
  call.opt.causal = false;
  call.y = h;
  call.beta = 1.0f;
  const std::int64_t H = c.n_heads, D = c.head_dim();
  for (std::int64_t l = 0; l < c.n_layers; ++l) {
    proj.layer = l;
    if (trace) {
      // One text (B = 1, T = S): the kernel writes the pattern, the block each head's Δe; scores, q
      // and k come from the rows of qkv_ [T, 3C] (q | k | v, row stride 3C).
      LayerTrace& t = (*trace)[static_cast<std::size_t>(l)];
      call.taps = model_detail::layer_trace_taps(t, T, H, H, D, C, w_.layers[static_cast<std::size_t>(l)].wo);
      call.taps.before_out = [lt = &t, C, D](const float* q, float*) {
        model_detail::record_scores(*lt, q, 3 * C, q + C, 3 * C, D, false);
      };
    }
    blocks::attention_block_varlen(proj, call);
    parallel_for(blocks_n, threads, [&](std::int64_t k) { tail_block(l, k * kRows, T, hidden); });
  }
}

void Encoder::embed(std::span<const std::string> texts, float* out, std::int64_t batch,
                    const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const char* fn = "qkv::Encoder::embed";
  if (batch < 1) fail(fn, "batch: must be ≥ 1, got " + std::to_string(batch));
  const auto N = static_cast<std::int64_t>(texts.size());
  if (N > 0 && !out) fail(fn, "out: null output pointer");
  const std::int64_t C = dim();
  std::vector<std::vector<int>> ids(static_cast<std::size_t>(N));
  for (std::int64_t i = 0; i < N; ++i) {
    try {
      ids[static_cast<std::size_t>(i)] = tokenize(texts[static_cast<std::size_t>(i)]);
    } catch (const std::invalid_argument& e) {
      fail(fn, "texts[" + std::to_string(i) + "]: " + e.what());
    }
  }
  // Longest first: each batch packs texts of similar lengths, and the largest batch comes first,
  // so the work buffers are sized once.
  std::vector<std::int64_t> order(static_cast<std::size_t>(N));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return ids[static_cast<std::size_t>(a)].size() > ids[static_cast<std::size_t>(b)].size();
  });
  std::vector<int> tokens;
  std::vector<std::int32_t> cu;
  Buffer hidden;
  for (std::int64_t b0 = 0; b0 < N; b0 += batch) {
    const std::int64_t nb = std::min(batch, N - b0);
    tokens.clear();
    cu.assign(1, 0);
    for (std::int64_t j = 0; j < nb; ++j) {
      const auto& t = ids[static_cast<std::size_t>(order[static_cast<std::size_t>(b0 + j)])];
      tokens.insert(tokens.end(), t.begin(), t.end());
      cu.push_back(static_cast<std::int32_t>(tokens.size()));
    }
    const auto T = static_cast<std::int64_t>(tokens.size());
    if (hidden.numel() < T * C) hidden = Buffer(DType::f32, {T, C});
    forward(tokens, cu, hidden.ptr<float>());
    // Pooling over each text's rows (every token is real: nothing is padded), into its input row.
    const float* hs = hidden.ptr<float>();
    parallel_for(nb, opt_.num_threads > 0 ? opt_.num_threads : max_threads(), [&](std::int64_t j) {
      float* e = out + order[static_cast<std::size_t>(b0 + j)] * C;
      const std::int64_t t0 = cu[static_cast<std::size_t>(j)], n = cu[static_cast<std::size_t>(j + 1)] - t0;
      const float* rows = hs + t0 * C;
      if (pooling_ == Pooling::cls) {
        std::copy_n(rows, C, e);
      } else if (pooling_ == Pooling::max) {
        std::copy_n(rows, C, e);
        for (std::int64_t i = 1; i < n; ++i)
          for (std::int64_t k = 0; k < C; ++k) e[k] = std::max(e[k], rows[i * C + k]);
      } else {
        // The mean in f64, then rounded once.
        std::vector<double> sum(static_cast<std::size_t>(C), 0.0);
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t k = 0; k < C; ++k) sum[static_cast<std::size_t>(k)] += rows[i * C + k];
        for (std::int64_t k = 0; k < C; ++k) e[k] = static_cast<float>(sum[static_cast<std::size_t>(k)] / static_cast<double>(n));
      }
      if (normalize_) {
        // torch.nn.functional.normalize: e / max(‖e‖, 1e-12).
        double ss = 0.0;
        for (std::int64_t k = 0; k < C; ++k) ss += static_cast<double>(e[k]) * e[k];
        const double inv = 1.0 / std::max(std::sqrt(ss), 1e-12);
        for (std::int64_t k = 0; k < C; ++k) e[k] = static_cast<float>(e[k] * inv);
      }
    });
    if (progress) progress(b0 + nb, N);
  }
}

// ---------------------------------------------------------------------------------------------
// The sentence-transformers folder.
// ---------------------------------------------------------------------------------------------
namespace {

const char* const kLoad = "qkv::Encoder::load";

nlohmann::json read_json(const std::filesystem::path& p, const std::string& what) {
  if (!std::filesystem::exists(p)) fail(kLoad, "dir: the folder has no " + what + " ('" + p.string() + "')");
  const std::string text = detail::read_input_file(p.string(), kLoad, what, std::size_t{1} << 24);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail_format(kLoad, "file '" + p.string() + "': not valid JSON (" + e.what() + ")");
  }
}

}  // namespace

Encoder Encoder::load(const std::string& dir, const EncoderOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail(kLoad, "dir '" + dir + "': not a folder");
  const fs::path root(dir);
  const nlohmann::json modules = read_json(root / "modules.json", "modules.json");
  std::string transformer, pooling_dir;
  bool normalize = false;
  try {
    for (const auto& m : modules) {
      const std::string type = m.at("type").get<std::string>(), path = m.at("path").get<std::string>();
      if (type == "sentence_transformers.models.Transformer" && transformer.empty() && pooling_dir.empty())
        transformer = path.empty() ? "." : path;
      else if (type == "sentence_transformers.models.Pooling" && !transformer.empty() && pooling_dir.empty())
        pooling_dir = path;
      else if (type == "sentence_transformers.models.Normalize" && !pooling_dir.empty() && !normalize)
        normalize = true;
      else
        fail(kLoad, "file '" + (root / "modules.json").string() + "': module " + m.dump() +
                        " is not supported (qkv runs Transformer, Pooling, then optionally Normalize)");
    }
  } catch (const nlohmann::json::exception& e) {
    fail_format(kLoad, "file '" + (root / "modules.json").string() + "': " + e.what());
  }
  if (transformer.empty() || pooling_dir.empty())
    fail(kLoad, "file '" + (root / "modules.json").string() + "': needs a Transformer module and a Pooling module");
  const fs::path tdir = root / transformer;

  const nlohmann::json pcfg = read_json(root / pooling_dir / "config.json", pooling_dir + "/config.json");
  Pooling pooling = Pooling::mean;
  int modes = 0;
  for (const auto& [key, value] : pcfg.items()) {
    if (key.rfind("pooling_mode_", 0) != 0 || !value.is_boolean() || !value.get<bool>()) continue;
    if (key == "pooling_mode_mean_tokens") pooling = Pooling::mean;
    else if (key == "pooling_mode_cls_token") pooling = Pooling::cls;
    else if (key == "pooling_mode_max_tokens") pooling = Pooling::max;
    else fail(kLoad, "file '" + (root / pooling_dir / "config.json").string() + "': \"" + key +
                         "\" is not supported (qkv pools by mean, CLS or max)");
    ++modes;
  }
  if (modes != 1)
    fail(kLoad, "file '" + (root / pooling_dir / "config.json").string() + "': exactly one pooling mode must be "
                    "true, got " + std::to_string(modes));

  const nlohmann::json sbert = read_json(tdir / "sentence_bert_config.json", "sentence_bert_config.json");
  std::int64_t max_len = 0;
  try {
    max_len = sbert.at("max_seq_length").get<std::int64_t>();
    if (sbert.value("do_lower_case", false))
      fail(kLoad, "file '" + (tdir / "sentence_bert_config.json").string() +
                      "': \"do_lower_case\" true is not supported (the tokenizer's own settings lower-case)");
  } catch (const nlohmann::json::exception& e) {
    fail_format(kLoad, "file '" + (tdir / "sentence_bert_config.json").string() + "': " + e.what());
  }
  for (const char* f : {"config.json", "model.safetensors"})
    if (!fs::exists(tdir / f)) fail(kLoad, "dir: the folder has no " + std::string(f) + " ('" + (tdir / f).string() + "')");
  const Config config = load_config((tdir / "config.json").string());
  if (config.causal || !config.post_norm)
    fail(kLoad, "file '" + (tdir / "config.json").string() + "': not an encoder (qkv embeds with model_type \"bert\")");
  fs::path tok_path = tdir / "tokenizer.json";
  if (!fs::exists(tok_path)) tok_path = tdir / "vocab.txt";
  if (!fs::exists(tok_path))
    fail(kLoad, "dir: the folder has no tokenizer.json or vocab.txt ('" + tdir.string() + "')");
  Tokenizer tok = Tokenizer::load_wordpiece(tok_path.string());
  Weights w = load_safetensors((tdir / "model.safetensors").string(), config);
  if (pcfg.contains("word_embedding_dimension") && pcfg.at("word_embedding_dimension") != config.dim)
    fail(kLoad, "file '" + (root / pooling_dir / "config.json").string() + "': word_embedding_dimension " +
                    pcfg.at("word_embedding_dimension").dump() + " differs from the model's hidden_size " +
                    std::to_string(config.dim));
  return Encoder(std::move(w), std::move(tok), pooling, normalize, std::min(max_len, config.seq_len), options);
}

}  // namespace qkv
