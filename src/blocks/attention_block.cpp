// One attention block (attention_block.hpp): projections by a backend → rotary → cache append →
// qkv::attention on strided views → W_O by the backend, with the taps a trace or a backward reads.
#include "blocks/attention_block.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "blocks/dense.hpp"
#include "blocks/linear.hpp"
#include "blocks/rope.hpp"
#include "core/parallel.hpp"

namespace qkv::blocks {
namespace {

// Heads [h0, h0 + n) of an i8 slot, rows [0, rows), as qkv's cache of one sequence (KvSlot).
KvCacheView i8_heads(const KvSlot& s, std::int64_t h0, std::int64_t n, std::int64_t D, std::int64_t rows) {
  const std::int64_t cap = s.cap;
  KvCacheView c;
  c.k = View::strided(static_cast<std::int8_t*>(s.k) + h0 * cap * D, DType::i8, {1, rows, n, D}, {n * cap * D, D, cap * D, 1});
  c.v = View::strided(static_cast<std::int8_t*>(s.v) + h0 * cap * D, DType::i8, {1, rows, n, D}, {n * cap * D, D, cap * D, 1});
  c.k_scale = View::strided(s.k_scale + h0 * cap, DType::f32, {1, rows, n}, {n * cap, 1, cap});
  c.v_scale = View::strided(s.v_scale + h0 * cap, DType::f32, {1, rows, n}, {n * cap, 1, cap});
  return c;
}

// Appends rows [len, len + n) of heads [h0, h0 + nh) of an i8 slot: k row (s, h) at k + s·ld_k + h·D,
// v row at v + s·ld_v + h·D (f32), quantised by qkv::kvcache_append. It refuses non-finite values
// (an int8 row cannot hold them), yet a model whose activations overflow must reach NaN logits
// (generate's NonFiniteError names the position), as it does with an f32 cache's NaN rows. So a
// (row, head) whose k or v holds one is appended as zeros and its scales then set to NaN: every
// attention that reads it (score k_scale · q·k, weight p · v_scale) is NaN. The zeroed rows are
// the caller's scratch, read no more.
void append_i8(const KvSlot& slot, std::int64_t h0, std::int64_t nh, std::int64_t D, float* k, std::int64_t ld_k,
               float* v, std::int64_t ld_v, std::int64_t n) {
  std::vector<std::int64_t> bad;  // s · nh + h of each non-finite row (allocated only if there is one)
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t h = 0; h < nh; ++h) {
      float *kr = k + s * ld_k + h * D, *vr = v + s * ld_v + h * D;
      float finite = 0.0f;  // x − x: 0 for finite x, NaN otherwise
      for (std::int64_t e = 0; e < D; ++e) finite += (kr[e] - kr[e]) + (vr[e] - vr[e]);
      if (finite == 0.0f) continue;
      std::fill(kr, kr + D, 0.0f), std::fill(vr, vr + D, 0.0f);
      bad.push_back(s * nh + h);
    }
  std::int64_t pos = slot.len;
  kvcache_append(i8_heads(slot, h0, nh, D, slot.cap),
                 View::strided(k, DType::f32, {1, n, nh, D}, {n * ld_k, ld_k, D, 1}),
                 View::strided(v, DType::f32, {1, n, nh, D}, {n * ld_v, ld_v, D, 1}), View::contiguous(&pos, DType::i64, {1}));
  for (std::int64_t i : bad) {
    const std::int64_t at = (h0 + i % nh) * slot.cap + slot.len + i / nh;
    slot.k_scale[at] = slot.v_scale[at] = std::numeric_limits<float>::quiet_NaN();
  }
}

}  // namespace

void attention_block(AttentionProjections& proj, const AttentionBlockCall& a) {
  constexpr const char* fn = "qkv::blocks::attention_block";
  const std::int64_t B = a.B, S = a.S, H = a.shape.n_heads, Hkv = a.shape.n_kv_heads, D = a.shape.d_head;
  const std::int64_t Dv = a.shape.d_value, C = a.shape.d_model, n = S - a.r0;
  if ((a.cache || a.r0 > 0) && B != 1) fail(fn, "internal: a cache or r0 > 0 needs B = 1");
  if (a.cache && Dv != D) fail(fn, "internal: a cache holds keys and values of one size D = Dv");
  KvSlot* cache = a.cache;
  const std::int64_t pos0 = cache ? cache->len : 0, Skv = cache ? pos0 + S : a.Skv;
  // Conversions and appends over S rows: shared over the threads when the call is a prefill.
  const int threads = S > kGemvMaxRows ? max_threads() : 1;
  const Isa isa = active_isa();
  const DType preferred = cache && cache->dtype == DType::bf16 && a.rope_theta <= 0.0f ? DType::bf16 : DType::f32;
  const QkvRows r = proj.qkv(preferred);
  if (r.dtype != DType::f32 && r.dtype != preferred) fail(fn, "internal: the backend returned q, k, v in another dtype");
  const bool i8 = cache && cache->dtype == DType::i8;
  if (i8 && (r.dtype != DType::f32 || a.taps.pattern.data)) fail(fn, "internal: an i8 cache takes f32 q, k, v and no pattern tap");
  // The attention runs in the keys' dtype (q and its output too), an i8 cache's on f32 q and output.
  const DType kv_dt = i8 ? DType::f32 : cache ? cache->dtype : r.dtype;
  const std::size_t es = dtype_size(r.dtype);

  if (a.rope_theta > 0.0f) {
    auto* q = static_cast<float*>(r.q);
    auto* k = static_cast<float*>(r.k);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t s = 0; s < S; ++s) {
        rope_forward(q + (b * S + s) * r.ld_q, 1, H, D, pos0 + s, a.rope_theta);
        rope_forward(k + (b * S + s) * r.ld_k, 1, Hkv, D, pos0 + s, a.rope_theta);
      }
  }

  View kview, vview;
  std::optional<KvCacheView> kv_i8;
  if (i8) {
    append_i8(*cache, 0, Hkv, D, static_cast<float*>(r.k), r.ld_k, static_cast<float*>(r.v), r.ld_v, S);
    kv_i8 = i8_heads(*cache, 0, Hkv, D, Skv);
  } else if (cache) {
    // Append this call's keys and values: cache.k[h, pos0 + s, :] = k[s, h·D : (h+1)·D].
    const bool round = cache->dtype == DType::bf16 && r.dtype == DType::f32;
    const std::size_t ce = dtype_size(cache->dtype);
    auto* kc = static_cast<char*>(cache->k);
    auto* vc = static_cast<char*>(cache->v);
    const auto* kr = static_cast<const char*>(r.k);
    const auto* vr = static_cast<const char*>(r.v);
    const std::int64_t cap = cache->cap;
    parallel_for(Hkv, threads, [&](std::int64_t h) {
      for (std::int64_t s = 0; s < S; ++s) {
        const std::int64_t dst = (h * cap + pos0 + s) * D;
        const std::int64_t ks = s * r.ld_k + h * D, vs = s * r.ld_v + h * Dv;
        if (round) {
          f32_to_bf16(reinterpret_cast<std::uint16_t*>(kc) + dst, reinterpret_cast<const float*>(kr) + ks, D, isa);
          f32_to_bf16(reinterpret_cast<std::uint16_t*>(vc) + dst, reinterpret_cast<const float*>(vr) + vs, D, isa);
        } else {
          std::memcpy(kc + dst * ce, kr + ks * es, ce * static_cast<std::size_t>(D));
          std::memcpy(vc + dst * ce, vr + vs * es, ce * static_cast<std::size_t>(Dv));
        }
      }
    });
    kview = View::strided(cache->k, kv_dt, {1, Hkv, Skv, D}, {Hkv * cap * D, cap * D, D, 1});
    vview = View::strided(cache->v, kv_dt, {1, Hkv, Skv, Dv}, {Hkv * cap * D, cap * D, D, 1});
  } else {
    kview = View::strided(r.k, kv_dt, {B, Hkv, Skv, D}, {Skv * r.ld_k, D, r.ld_k, 1});
    vview = View::strided(r.v, kv_dt, {B, Hkv, Skv, Dv}, {Skv * r.ld_v, Dv, r.ld_v, 1});
  }

  // The queries asked for, rows r0 … S − 1, in the keys' dtype (a bf16 cache and f32 q: rounded).
  void* q = static_cast<char*>(r.q) + a.r0 * r.ld_q * static_cast<std::int64_t>(es);
  std::int64_t ld_q = r.ld_q;
  if (kv_dt != r.dtype) {
    std::uint16_t* qb = a.scratch.q_bf16;
    const auto* qf = static_cast<const float*>(q);
    parallel_for(n, threads, [&](std::int64_t s) { f32_to_bf16(qb + s * H * D, qf + s * r.ld_q, H * D, isa); });
    q = qb;
    ld_q = H * D;
  }
  const View qview = View::strided(q, kv_dt, {B, H, n, D}, {n * ld_q, D, ld_q, 1});

  // The output goes where out() reads it when the dtypes agree; else to att_kv, then converted once.
  const DType att_dt = proj.att_dtype();
  void* att = proj.att();
  void* out = kv_dt == att_dt ? att : a.scratch.att_kv;
  const View oview = View::strided(out, kv_dt, {B, H, n, Dv}, {n * H * Dv, Dv, H * Dv, 1});
  const std::optional<View> lse = a.taps.lse.data ? std::optional<View>(a.taps.lse) : std::nullopt;
  if (kv_i8) attention_kvcache(qview, *kv_i8, oview, a.opt, lse);
  else attention(qview, kview, vview, oview, a.opt, lse,
                 a.taps.pattern.data ? std::optional<View>(a.taps.pattern) : std::nullopt);
  const std::int64_t N = B * n * H * Dv;
  if (kv_dt == DType::bf16 && att_dt == DType::f32)
    bf16_to_f32(static_cast<float*>(att), static_cast<const std::uint16_t*>(out), N, threads);
  else if (kv_dt == DType::f32 && att_dt == DType::bf16)
    f32_to_bf16(static_cast<std::uint16_t*>(att), static_cast<const float*>(out), N, threads, isa);

  if ((a.taps.before_out || a.taps.head_delta) && att_dt != DType::f32)
    fail(fn, "internal: taps need the attention's output in f32");
  if (a.taps.before_out)
    a.taps.before_out(r.dtype == DType::f32 ? static_cast<const float*>(r.q) : nullptr, static_cast<float*>(att));
  if (a.y) proj.out(B * n, a.y, a.beta);
  if (a.taps.head_delta)
    for (std::int64_t b = 0; b < B; ++b)
      head_delta_forward(a.taps.head_delta + b * H * n * C, static_cast<const float*>(att) + b * n * H * Dv,
                         a.taps.wo, n, H, Dv, C, a.taps.block_delta ? a.taps.block_delta + b * n * C : nullptr);
}

// ---------------------------------------------------------------------------------------------
// Packed texts (the encoder).
// ---------------------------------------------------------------------------------------------
void attention_block_varlen(AttentionProjections& proj, const VarlenBlockCall& a) {
  constexpr const char* fn = "qkv::blocks::attention_block_varlen";
  const std::int64_t H = a.shape.n_heads, Hkv = a.shape.n_kv_heads, D = a.shape.d_head, Dv = a.shape.d_value;
  const std::int64_t C = a.shape.d_model;
  const auto B = static_cast<std::int64_t>(a.cu_seqlens.size()) - 1;
  if (B < 1) fail(fn, "internal: cu_seqlens needs B + 1 >= 2 offsets");
  if (a.taps.lse.data) fail(fn, "internal: the packed block offers no lse tap");
  if (a.taps.pattern.data && B != 1) fail(fn, "internal: the pattern tap needs one text (B = 1)");
  const std::int64_t T = a.cu_seqlens.back();
  // q, k, v in the dtype the attention's output goes to W_O in: nothing to convert on either side.
  const DType dt = proj.att_dtype();
  const QkvRows r = proj.qkv(dt);
  if (r.dtype != dt) fail(fn, "internal: the backend returned q, k, v in another dtype than att()");
  if ((a.taps.before_out || a.taps.head_delta) && dt != DType::f32)
    fail(fn, "internal: taps need the attention's output in f32");
  void* att = proj.att();
  if (a.taps.pattern.data) {
    attention(View::strided(r.q, dt, {1, H, T, D}, {T * r.ld_q, D, r.ld_q, 1}),
              View::strided(r.k, dt, {1, Hkv, T, D}, {T * r.ld_k, D, r.ld_k, 1}),
              View::strided(r.v, dt, {1, Hkv, T, Dv}, {T * r.ld_v, Dv, r.ld_v, 1}),
              View::strided(att, dt, {1, H, T, Dv}, {T * H * Dv, Dv, H * Dv, 1}), a.opt, std::nullopt, a.taps.pattern);
  } else {
    const View cu = View::strided(const_cast<std::int32_t*>(a.cu_seqlens.data()), DType::i32, {B + 1}, {1});
    attention_varlen(View::strided(r.q, dt, {T, H, D}, {r.ld_q, D, 1}), View::strided(r.k, dt, {T, Hkv, D}, {r.ld_k, D, 1}),
                     View::strided(r.v, dt, {T, Hkv, Dv}, {r.ld_v, Dv, 1}),
                     View::strided(att, dt, {T, H, Dv}, {H * Dv, Dv, 1}), cu, cu, a.opt);
  }
  if (a.taps.before_out) a.taps.before_out(static_cast<const float*>(r.q), static_cast<float*>(att));
  if (a.y) proj.out(T, a.y, a.beta);
  if (a.taps.head_delta)
    head_delta_forward(a.taps.head_delta, static_cast<const float*>(att), a.taps.wo, T, H, Dv, C, a.taps.block_delta);
}

// ---------------------------------------------------------------------------------------------
// The decoding step: a run of KV heads of B sequences (DecodeHeadCall).
// ---------------------------------------------------------------------------------------------
void attention_block_decode_head(const DecodeHeadCall& a) {
  const std::int64_t G = a.G, D = a.D, nh = a.nh;
  const Isa isa = active_isa();
  if (a.cache[0].dtype == DType::i8) {
    // Per sequence: the run's nh k, v rows appended in one call, and its nh · G query rows (heads
    // hk · G … of q, contiguous) against keys 0 … pos in one call.
    AttentionOptions opt;  // scale: the default 1/√D, as the prefill's
    opt.num_threads = 1;   // inside the step's parallel region: this thread alone
    for (std::int64_t b = 0; b < a.B; ++b) {
      const KvSlot& slot = a.cache[b];
      const std::int64_t pos = slot.len;
      float *qh = a.q + b * a.ld_q, *kh = a.k + b * a.ld_kv, *oh = a.out + b * a.ld_q;
      if (a.cs) {
        rope_apply(qh, nh * G, D, a.cs + b * D);
        rope_apply(kh, nh, D, a.cs + b * D);
      }
      append_i8(slot, a.hk, nh, D, kh, nh * D, a.v + b * a.ld_kv, nh * D, 1);
      const KvCacheView kv = i8_heads(slot, a.hk, nh, D, pos + 1);
      attention_kvcache(View::strided(qh, DType::f32, {1, nh * G, 1, D}, {nh * G * D, D, D, 1}), kv,
                        View::strided(oh, DType::f32, {1, nh * G, 1, D}, {nh * G * D, D, D, 1}), opt);
    }
    return;
  }
  for (std::int64_t hk = a.hk; hk < a.hk + nh; ++hk) {
    const std::int64_t h = hk - a.hk;  // the head's place in the run
    for (std::int64_t b = 0; b < a.B; ++b) {
      const KvSlot& slot = a.cache[b];
      const std::int64_t pos = slot.len, cap = slot.cap;
      float *qh = a.q + b * a.ld_q + h * G * D, *kh = a.k + b * a.ld_kv + h * D, *oh = a.out + b * a.ld_q + h * G * D;
      const float* vh = a.v + b * a.ld_kv + h * D;
      if (a.cs) {
        rope_apply(qh, G, D, a.cs + b * D);
        rope_apply(kh, 1, D, a.cs + b * D);
      }
      const std::int64_t at = hk * cap * D;  // this KV head's rows in the layer's cache
      // The rows attend_one reads next, the next sequence's of this head up to its new row: prefetched
      // during this one's (KvNext).
      KvNext next;
      if (b + 1 < a.B) {
        const KvSlot& n = a.cache[b + 1];
        const std::int64_t es = static_cast<std::int64_t>(dtype_size(n.dtype)), off = hk * n.cap * D * es;
        next = {static_cast<const char*>(n.k) + off, static_cast<const char*>(n.v) + off, (n.len + 1) * D * es};
      }
      if (slot.dtype == DType::f32) {
        float *kc = static_cast<float*>(slot.k) + at, *vc = static_cast<float*>(slot.v) + at;
        std::memcpy(kc + pos * D, kh, sizeof(float) * static_cast<std::size_t>(D));
        std::memcpy(vc + pos * D, vh, sizeof(float) * static_cast<std::size_t>(D));
        attend_one(qh, kc, vc, oh, a.scores, G, D, pos + 1, a.scale, isa, next);
        continue;
      }
      auto *kc = static_cast<std::uint16_t*>(slot.k) + at, *vc = static_cast<std::uint16_t*>(slot.v) + at;
      f32_to_bf16(kc + pos * D, kh, D, isa);
      f32_to_bf16(vc + pos * D, vh, D, isa);
      attend_one_bf16(qh, kc, vc, oh, a.scores, G, D, pos + 1, a.scale, isa, next);
    }
  }
}

}  // namespace qkv::blocks
