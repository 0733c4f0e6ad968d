// inspect/encoder_trace.hpp — one text through a BERT-style encoder, recorded for `qkv inspect`.
//
// Dimension letters: S tokens of the text ([CLS] … [SEP]), L layers, H heads, D = C / H, C = d_model.
#pragma once

#include <vector>

#include "qkv/encoder.hpp"
#include "qkv/model.hpp"  // LayerTrace

namespace qkv::inspect {

// Runs `tokens` (one text) through the encoder and fills, per layer, what LayerTrace documents
// except resid: scores and pattern [H, S, S] (bidirectional: nothing masked), head_delta
// [H, S, C] = W_O[:, head h] · att_h, block_delta [S, C] = Σ_h Δe_h, q [H, S, D] and k [H, S, D].
// The pattern comes from qkv::attention (non-causal) on the layer's own q, k, v; scores are
// q_i · k_j / √D in f64. Also returns hidden [S, C], the last layer's output.
std::vector<LayerTrace> trace_encoder(Encoder& e, const std::vector<int>& tokens, std::vector<float>& hidden);

}  // namespace qkv::inspect
