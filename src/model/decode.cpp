// Model's decoding step: one token for each of B sequences in one parallel region. See model_impl.hpp.
#include <algorithm>
#include <atomic>
#include <cmath>

#include "blocks/activation.hpp"
#include "blocks/attention_block.hpp"
#include "blocks/dense.hpp"
#include "blocks/embedding.hpp"
#include "blocks/norm.hpp"
#include "blocks/rope.hpp"
#include "core/parallel.hpp"
#include "model/model_impl.hpp"

namespace qkv {

// The counters of one decoding step (Model::decode), kept between calls: step s hands out the
// chunks of segment g from next[s·T + g] and counts its finished units in done[s]. Each counter
// has its own cache line (threads bump them concurrently).
struct Model::Impl::DecodeSync {
  struct alignas(64) Next {
    std::atomic<std::int64_t> v{0};
  };
  struct alignas(64) Done {
    WaitWord v;
  };
  std::unique_ptr<Next[]> next;
  std::unique_ptr<Done[]> done;
  int steps = 0, threads = 0;
};

void Model::Impl::DecodeSyncDeleter::operator()(DecodeSync* s) const { delete s; }

// Decoding: one token for each of B sequences (B = 1: Model::forward of one token), each with its
// own cache and position. A step reads every weight once for all B sequences (gemv_batch_rows: each
// weight row once, for the B rows of activations) in one parallel call (run_shared) whose threads
// go through the stages below in order; a stage starts once the one before it has finished all its
// units (done[s], a WaitWord: spin, then sleep):
//   A  per chunk of KV heads: their rows of W_Q, W_K, W_V → q, k, v of their G query heads each,
//      then the attention block's decode entry on the chunk's run of heads (one call:
//      blocks::attention_block_decode_head): for each sequence rotary at its position, k, v appended
//      to its cache, the G heads' attention of each kv head
//   B  rows of x += att·W_Oᵀ + b_O
//   C  rows of hb = xb·W1ᵀ (+ W3) and the activation on them
//   D  rows of x += hb·W2ᵀ + b2
// then rows of the logits from norm_f(x). Stages A, C and the logits read the norm of x, which each
// thread computes into its own xb_t (C·B values, cheaper than another stage) once it has taken its
// first chunk of the stage: x cannot change then (the next writer of x waits for that chunk), and
// a thread that takes no chunk reads nothing. So a thread that wakes late or is preempted on a busy
// machine is not waited for: the others take its share, and it skips the stages already handed
// out (run_shared lets no thread join after the caller's part is done). Rows are handed out in
// chunks of half what a thread's segment has left, down to ≈ 64 KiB of weights (see `share`).
// Every row's sum and every head's attention is computed by the same code whichever thread, chunk
// and B, so the logits are the same bits on any number of threads and in any batch
// (tests/model/test_model.cpp). With one thread the caller runs the stages alone: no thread is
// woken, no counter waited on.
void Model::Impl::decode(std::span<const int> tokens, std::span<KvCache* const> caches, float* logits, int T) {
  using i64 = std::int64_t;
  const Config& c = w_.config;
  const i64 B = static_cast<i64>(tokens.size());
  const i64 C = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim(), Hd = c.hidden_dim, V = c.vocab_size;
  const i64 G = H / Hkv, HD = H * D, KD = Hkv * D;
  const Isa isa = active_isa();
  const bool bf16 = !layers_bf16_.empty();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  reserve(B);
  // Per thread: xb_t [B, C] (its norm output) and scores [P] (attend_one's scratch); then the rotary
  // angles of each sequence's position, cs [B, D] (blocks::rope_angles), computed once a step.
  const i64 per_thread = B * C + c.seq_len;
  if (decode_scratch_.numel() < T * per_thread + B * D) decode_scratch_ = Buffer(DType::f32, {T * per_thread + B * D});
  float* cs = decode_scratch_.ptr<float>() + T * per_thread;
  if (c.pos == PosEncoding::rotary)
    for (i64 b = 0; b < B; ++b) blocks::rope_angles(cs + b * D, D, caches[static_cast<std::size_t>(b)]->len, c.rope_theta);
  // Each sequence's cache of each layer as the attention block sees it: slots [n_layers, B].
  decode_slots_.resize(static_cast<std::size_t>(c.n_layers * B));
  blocks::KvSlot* slots = decode_slots_.data();
  for (i64 b = 0; b < B; ++b)
    for (i64 l = 0; l < c.n_layers; ++l) slots[l * B + b] = model_detail::layer_slot(*caches[static_cast<std::size_t>(b)], l);
  const int steps = 4 * static_cast<int>(c.n_layers) + 1;
  if (!decode_sync_ || decode_sync_->steps < steps || decode_sync_->threads < T) {
    decode_sync_.reset(new DecodeSync);
    decode_sync_->next = std::make_unique<DecodeSync::Next[]>(static_cast<std::size_t>(steps * T));
    decode_sync_->done = std::make_unique<DecodeSync::Done[]>(static_cast<std::size_t>(steps));
    decode_sync_->steps = steps;
    decode_sync_->threads = T;
  }
  DecodeSync::Next* next = decode_sync_->next.get();
  DecodeSync::Done* done = decode_sync_->done.get();
  for (int i = 0; i < steps * T; ++i) next[i].v.store(0, std::memory_order_relaxed);
  for (int s = 0; s < steps; ++s) done[s].v.store(0);  // no thread waits on them now: no wake-up
  for (i64 b = 0; b < B; ++b)
    blocks::embedding_forward(x_.ptr<float>() + b * C, &tokens[static_cast<std::size_t>(b)], w_.wte, w_.wpe, 1, C,
                              caches[static_cast<std::size_t>(b)]->len);
  float *x = x_.ptr<float>(), *q = q_.ptr<float>(), *k = k_.ptr<float>(), *v = v_.ptr<float>();
  float *att = att_.ptr<float>(), *hb = hb_.ptr<float>(), *hb2 = hb2_.ptr<float>();
  // y [b·ldy + o] (+)= xin [b, :] · W[o, :] + bias[o], rows [r0, r1) of W, f32 or bf16 weights; a
  // lone sequence walks W as the machine reads this model's weights fastest (blocks::gemv_walk: the
  // parameters as the bytes a step streams; the embedding table, read a row a step, is in the count).
  const i64 wbytes = bf16 ? 2 : 4;
  const blocks::GemvWalk walk = blocks::gemv_walk(params_ * wbytes);
  auto gemv = [&](const float* W, const std::uint16_t* Wb, const float* bias, float* y, i64 ldy, const float* xin,
                  i64 in, float beta, i64 r0, i64 r1) {
    blocks::gemv_batch_rows(xin, bf16 ? nullptr : W, bf16 ? Wb : nullptr, bias, y, ldy, B, in, beta, isa, r0, r1,
                            {0, B}, walk);
  };
  auto norm_rows = [&](float* out, const float* w, const float* bias) {
    if (c.norm == NormKind::rmsnorm) blocks::rmsnorm_forward(out, nullptr, x, w, B, C, c.norm_eps);
    else blocks::layernorm_forward(out, nullptr, nullptr, x, w, bias, B, C, c.norm_eps);
  };
  // The smallest chunk of n rows with `in` columns: ≈ 64 KiB of weights, a multiple of 8 rows (whole
  // blocks of gemv_batch_rows); all n on one thread (nothing to rebalance: each matrix is read as
  // one stream, W1 and W3 one after the other).
  auto rows_per_chunk = [&](i64 in, i64 n) {
    return T == 1 ? std::max<i64>(n, 1) : std::max<i64>(8, (i64{64} << 10) / (in * wbytes) / 8 * 8);
  };
  // Units of each step: A kv heads, B rows of W_O, C rows of W1, D rows of W2; the last: logits.
  auto units = [&](int step) -> i64 {
    if (step == steps - 1) return V;
    const int stage = step % 4;
    return stage == 0 ? Hkv : stage == 2 ? Hd : C;
  };
  // Step `step`: its n units, [0, n), are cut into T contiguous segments, each with its counter of
  // the units handed out: thread t takes the chunks of segment t in order, then helps with the other
  // segments' remaining chunks. A chunk is half of what its segment has left, rounded up to a
  // multiple of `chunk` (the least a chunk holds): the segment's owner reads it in few long runs
  // (gemv_batch_rows prefetches the rows ahead only inside one call: the first blocks of each call
  // wait on memory), and the last chunks are small enough to rebalance the threads. It first waits
  // for the step before to finish, and calls first() once before its first chunk (the norm of x,
  // when the step reads it).
  auto share = [&](int t, int step, i64 n, i64 chunk, auto&& first, auto&& fn) {
    if (T > 1 && step > 0) {
      const auto need = static_cast<std::uint32_t>(units(step - 1));
      for (std::uint32_t d = done[step - 1].v.load(); d < need;) d = done[step - 1].v.wait_change(d);
    }
    i64 mine = 0;  // units this thread finished, counted into done[step] once it finds no more
    for (int j = 0; j < T; ++j) {
      const int seg = (t + j) % T;
      const auto [a, b] = blocks::gemv_part_rows(n, seg, T);
      std::atomic<i64>& taken = next[step * T + seg].v;
      for (i64 r0 = a + taken.load(std::memory_order_relaxed); r0 < b;) {
        const i64 half = ((b - r0 + 1) / 2 + chunk - 1) / chunk * chunk;
        const i64 r1 = std::min(b, r0 + half);
        i64 seen = r0 - a;
        if (!taken.compare_exchange_weak(seen, r1 - a, std::memory_order_relaxed)) {
          r0 = a + seen;  // another thread took [r0, a + seen): go on from there
          continue;
        }
        if (mine == 0) first();
        fn(r0, r1);
        mine += r1 - r0;
        r0 = a + taken.load(std::memory_order_relaxed);
      }
    }
    // One add a thread a step, not one a chunk: every add wakes a thread sleeping on the word (a
    // system call), and the next step needs all n units anyway, so counting earlier would only
    // wake the waiter sooner to wait again.
    if (T > 1 && mine > 0) done[step].v.fetch_add(static_cast<std::uint32_t>(mine));
  };
  auto nothing = [] {};
  run_shared(T, [&](int t) {
    float* xb = decode_scratch_.ptr<float>() + t * per_thread;
    float* scores = xb + B * C;
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w_.layers[static_cast<std::size_t>(l)];
      const LayerBf16 Lb = bf16 ? layers_bf16_[static_cast<std::size_t>(l)] : LayerBf16{};
      const int s0 = 4 * l;
      // Kv heads in chunks of one (a late thread's share is taken by the others), all in one run on one
      // thread: an int8 cache costs one kvcache_append and one attention_kvcache call per sequence and run.
      share(t, s0, Hkv, T == 1 ? Hkv : 1, [&] { norm_rows(xb, L.norm1_w, L.norm1_b); }, [&](i64 k0, i64 k1) {
        // The rows of kv heads [k0, k1) (and of their query heads) are contiguous: one call a matrix.
        gemv(L.wq, Lb.wq, L.bq, q, HD, xb, C, 0.0f, k0 * G * D, k1 * G * D);
        gemv(L.wk, Lb.wk, L.bk, k, KD, xb, C, 0.0f, k0 * D, k1 * D);
        gemv(L.wv, Lb.wv, L.bv, v, KD, xb, C, 0.0f, k0 * D, k1 * D);
        blocks::DecodeHeadCall call;  // the run of kv heads [k0, k1)
        call.B = B;
        call.G = G;
        call.D = D;
        call.hk = k0;
        call.nh = k1 - k0;
        call.cache = slots + l * B;
        call.q = q + k0 * G * D;
        call.k = k + k0 * D;
        call.v = v + k0 * D;
        call.out = att + k0 * G * D;
        call.ld_q = HD;
        call.ld_kv = KD;
        call.cs = c.pos == PosEncoding::rotary ? cs : nullptr;
        call.scale = scale;
        call.scores = scores;
        blocks::attention_block_decode_head(call);
      });
      share(t, s0 + 1, C, rows_per_chunk(HD, C), nothing, [&](i64 r0, i64 r1) {
        gemv(L.wo, Lb.wo, L.bo, x, C, att, HD, 1.0f, r0, r1);  // residual: x += att·W_Oᵀ + b_O
      });
      share(t, s0 + 2, Hd, rows_per_chunk(C, Hd), [&] { norm_rows(xb, L.norm2_w, L.norm2_b); }, [&](i64 r0, i64 r1) {
        gemv(L.w1, Lb.w1, L.b1, hb, Hd, xb, C, 0.0f, r0, r1);
        if (c.mlp == MlpKind::swiglu) gemv(L.w3, Lb.w3, nullptr, hb2, Hd, xb, C, 0.0f, r0, r1);
        for (i64 b = 0; b < B; ++b) {
          float* h = hb + b * Hd + r0;
          if (c.mlp == MlpKind::swiglu) blocks::swiglu_forward(h, h, hb2 + b * Hd + r0, r1 - r0);  // per ISA, exp_f32
          else if (c.mlp == MlpKind::gelu_exact) blocks::gelu_exact_forward(h, h, r1 - r0);
          else blocks::gelu_fast(h, h, r1 - r0, 1, isa);
        }
      });
      share(t, s0 + 3, C, rows_per_chunk(Hd, C), nothing, [&](i64 r0, i64 r1) {
        gemv(L.w2, Lb.w2, L.b2, x, C, hb, Hd, 1.0f, r0, r1);  // residual: x += hb·W2ᵀ + b2
      });
    }
    share(t, steps - 1, V, rows_per_chunk(C, V), [&] { norm_rows(xb, w_.normf_w, w_.normf_b); },
          [&](i64 r0, i64 r1) { gemv(w_.wcls, wcls_bf16_, nullptr, logits, V, xb, C, 0.0f, r0, r1); });
  });
  for (KvCache* cache : caches) cache->len += 1;
}

}  // namespace qkv
