// One layer's attention recorded for the inspector (qkv::LayerTrace), shared by the decoder's trace
// (Model::forward_trace, trace.cpp) and the encoder's (Encoder::forward_trace, encoder.cpp): the
// attention block's taps write the pattern (the kernel) and each head's Δe (the block); the trace's
// before_out records scores, q and k with record_scores. Letters: S tokens, H query heads, Hkv kv
// heads, D head size, C model width.
#pragma once

#include <cstdint>

#include "blocks/attention_block.hpp"
#include "qkv/model.hpp"

namespace qkv::model_detail {

// Allocates t's pattern and scores [H, S, S], head_delta [H, S, C], block_delta [S, C], q [H, S, D]
// and k [Hkv, S, D]; returns the taps through which the block fills pattern, head_delta
// (Δe_h = W_O[:, h·D:(h+1)·D] · att_h, wo = W_O [C, H·D] f32) and block_delta (Σ_h Δe_h in f64:
// one definition for both models, whatever dtype the model keeps W_O in). before_out is left to
// the caller.
blocks::AttentionBlockTaps layer_trace_taps(LayerTrace& t, std::int64_t S, std::int64_t H, std::int64_t Hkv,
                                            std::int64_t D, std::int64_t C, const float* wo);

// t.q [H, S, D] and t.k [Hkv, S, D] copied from the block's rows, and t.scores [H, S, S] =
// q_i · k_j / √D in f64 (query head h reads kv head h / (H / Hkv)); causal: −inf for j > i.
// Query i of head h: q + i·ld_q + h·D; key j of kv head g: k + j·k_pos + g·k_head.
void record_scores(LayerTrace& t, const float* q, std::int64_t ld_q, const float* k, std::int64_t k_pos,
                   std::int64_t k_head, bool causal);

}  // namespace qkv::model_detail
