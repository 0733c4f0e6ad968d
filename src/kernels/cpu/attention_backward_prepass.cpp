// The fast attention backward, part 1: the prepass (attention_backward.hpp, Prepass). Per query
// row (b, h, i): the Q and dO rows in the form the tasks read, L_i = lse_i · log2(e) and
// delta_i = dout_i · out_i.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/parallel.hpp"
#include "kernels/cpu/attention_backward.hpp"
#include "qkv/memory.hpp"

namespace qkv::kernels::bwd {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// A Q row that is not finite belongs to a NaN row or to a row with no allowed key (lse NaN or
// −∞: any finite score needs a finite q). Those rows' P comes from L alone (NaN, or 0), so Q
// is packed with its non-finite values set to 0 (finite_or_zero): as the B operand of
// dK += dSᵀ·Q, a NaN in it would reach, by 0·NaN, the dk of keys that row masks. Only rows
// whose lse is not finite are scanned; when none has a non-finite q, Q is read as usual.
// With sinks a row without allowed keys has lse = its sink, finite: then every row is scanned.
bool q_needs_sanitizing(const AttnParams& p) {
  const std::int64_t rows = p.B * p.H * p.Sq;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t b = r / (p.H * p.Sq), h = r / p.Sq % p.H, i = r % p.Sq;
    if (p.sinks.empty() && std::isfinite(p.lse.load(p.lse.offset(b, h, i)))) continue;
    for (std::int64_t d = 0; d < p.D; ++d)
      if (!std::isfinite(p.q.load(p.q.offset(b, h, i, d)))) return true;
  }
  return false;
}

// Σ_e x[e]·y[e] in f64 (each product exact) for e < n, as four interleaved partial sums, s_l over
// e ≡ l (mod 4) in increasing e, added as (s0 + s1) + (s2 + s3): four independent chains instead of
// one, whose add latency made the prepass 1.4 % of a one-thread backward at S = 1024, D = 64, causal;
// 1.0–1.1 % now (perf; bench/results/bwd_zen4_2026-11-28.md).
double dot_f64(const float* x, const float* y, std::int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  std::int64_t e = 0;
  for (; e + 4 <= n; e += 4)
    for (int l = 0; l < 4; ++l) s[l] += static_cast<double>(x[e + l]) * y[e + l];
  for (int l = 0; e < n; ++e, ++l) s[l] += static_cast<double>(x[e]) * y[e];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

}  // namespace

Prepass::Prepass(const AttnBwdParams& bp, Isa isa, Context& cx) {
  const AttnParams& p = bp.fwd;
  const std::int64_t rows = p.B * p.H * p.Sq;
  const bool q_sanitize = q_needs_sanitizing(p);
  const bool bf16_tiles = isa == Isa::avx512_bf16;
  const bool q_direct = !bf16_tiles && usable_in_place(p.q, p.D) && !q_sanitize;
  const bool o_direct = !bf16_tiles && usable_in_place(bp.dout, p.Dv);
  const bool out_direct = p.out.dtype == DType::f32 && (p.out.stride(3) == 1 || p.Dv == 1);
  const std::int64_t Sq2 = (p.Sq + 1) / 2;
  // bf16 copies: rows of Dp (Dvp) and pair rows of 2·Dp (2·Dvp) bf16, in floats (halves).
  const std::int64_t qb_floats = bf16_tiles ? (rows + p.B * p.H * Sq2 * 2) * cx.Dp / 2 : 0;
  const std::int64_t ob_floats = bf16_tiles ? (rows + p.B * p.H * Sq2 * 2) * cx.Dvp / 2 : 0;
  // Packed Q and dO, L and delta: sized by the caller's shapes, so refused (qkv::OutOfMemory)
  // rather than killed when they cannot fit.
  check_memory("qkv::attention_backward", "work copies of q and dout, lse and delta",
               bytes_of({qb_floats + ob_floats + rows * ((q_direct || bf16_tiles ? 0 : cx.Dp) +
                                                         (o_direct || bf16_tiles ? 0 : cx.Dvp) + 2)},
                        4));
  q_pack_.emplace(q_direct || bf16_tiles ? 0 : rows * cx.Dp);
  o_pack_.emplace(o_direct || bf16_tiles ? 0 : rows * cx.Dvp);
  qb_pack_.emplace(qb_floats);
  ob_pack_.emplace(ob_floats);
  L_.emplace(rows);
  delta_.emplace(rows);
  float* q_pack = q_pack_->get();
  float* o_pack = o_pack_->get();
  float* L = L_->get();
  float* delta = delta_->get();
  auto* qb = reinterpret_cast<std::uint16_t*>(qb_pack_->get());
  auto* ob = reinterpret_cast<std::uint16_t*>(ob_pack_->get());
  if (bf16_tiles) {
    cx.qb = qb, cx.qb2 = qb + rows * cx.Dp;
    cx.ob = ob, cx.ob2 = ob + rows * cx.Dvp;
  } else if (q_direct) {
    cx.q = p.q.ptr<float>(), cx.q_sb = p.q.stride(0), cx.q_sh = p.q.stride(1), cx.q_ld = p.q.stride(2);
  } else {
    cx.q = q_pack, cx.q_sb = p.H * p.Sq * cx.Dp, cx.q_sh = p.Sq * cx.Dp, cx.q_ld = cx.Dp;
  }
  if (o_direct) {
    cx.dout = bp.dout.ptr<float>(), cx.o_sb = bp.dout.stride(0), cx.o_sh = bp.dout.stride(1),
    cx.o_ld = bp.dout.stride(2);
  } else if (!bf16_tiles) {
    cx.dout = o_pack, cx.o_sb = p.H * p.Sq * cx.Dvp, cx.o_sh = p.Sq * cx.Dvp, cx.o_ld = cx.Dvp;
  }
  cx.L = L;
  cx.delta = delta;
  const Context& c = cx;
  parallel_for(p.B * p.H, p.threads, [&](std::int64_t bh) {
    const std::int64_t b = bh / p.H, h = bh % p.H;
    std::vector<float> orow(static_cast<std::size_t>(p.Dv)), dorow(static_cast<std::size_t>(c.Dvp), 0.0f);
    std::vector<double> dots(static_cast<std::size_t>(p.Sq));  // dout_i · out_i
    std::uint16_t* q2_head = bf16_tiles ? qb + rows * c.Dp + bh * Sq2 * 2 * c.Dp : nullptr;
    std::uint16_t* o2_head = bf16_tiles ? ob + rows * c.Dvp + bh * Sq2 * 2 * c.Dvp : nullptr;
    // The bf16 layouts by vector code when the rows are contiguous, else by the loop below.
    const bool vector_bf16 = bf16_tiles && prepass_head_avx512_bf16(bp, b, h, q_sanitize, qb + bh * p.Sq * c.Dp, q2_head,
                                                                    ob + bh * p.Sq * c.Dvp, o2_head, dots.data());
    if (bf16_tiles && !vector_bf16) {  // pair rows: zero padding (past D, Dv, and the row past an odd Sq)
      std::memset(q2_head, 0, static_cast<std::size_t>(Sq2 * 2 * c.Dp) * 2);
      std::memset(o2_head, 0, static_cast<std::size_t>(Sq2 * 2 * c.Dvp) * 2);
    }
    for (std::int64_t i = 0; i < p.Sq && !vector_bf16; ++i) {
      const std::int64_t r = bh * p.Sq + i;
      if (bf16_tiles) {
        const std::uint16_t* qs = p.q.ptr<std::uint16_t>() + p.q.offset(b, h, i, 0);
        const std::uint16_t* os = bp.dout.ptr<std::uint16_t>() + bp.dout.offset(b, h, i, 0);
        const std::int64_t qst = p.q.stride(3), ost = bp.dout.stride(3);
        std::uint16_t* qrow = qb + r * c.Dp;
        std::uint16_t* q2 = qb + rows * c.Dp + ((bh * Sq2 + i / 2) * c.Dp * 2) + (i & 1);
        for (std::int64_t d = 0; d < p.D; ++d) {
          const std::uint16_t x = q_sanitize ? finite_or_zero_bf16(qs[d * qst]) : qs[d * qst];
          qrow[d] = x, q2[2 * d] = x;
        }
        for (std::int64_t d = p.D; d < c.Dp; ++d) qrow[d] = 0;
        std::uint16_t* orow_b = ob + r * c.Dvp;
        std::uint16_t* o2 = ob + rows * c.Dvp + ((bh * Sq2 + i / 2) * c.Dvp * 2) + (i & 1);
        for (std::int64_t e = 0; e < p.Dv; ++e) orow_b[e] = o2[2 * e] = os[e * ost];
        for (std::int64_t e = p.Dv; e < c.Dvp; ++e) orow_b[e] = 0;
      } else if (!q_direct) {
        float* dst = q_pack + r * c.Dp;
        load_row(p.q, p.q.offset(b, h, i, 0), p.q.stride(3), p.D, dst);
        if (q_sanitize)
          for (std::int64_t d = 0; d < p.D; ++d) dst[d] = finite_or_zero(dst[d]);
        for (std::int64_t d = p.D; d < c.Dp; ++d) dst[d] = 0.0f;
      }
      // dO and O rows as f32: in place when they are f32 with unit stride (no memcpy call per row).
      const float* dor = dorow.data();
      if (o_direct) {
        dor = bp.dout.ptr<float>() + bp.dout.offset(b, h, i, 0);
      } else {
        load_row(bp.dout, bp.dout.offset(b, h, i, 0), bp.dout.stride(3), p.Dv, dorow.data());
        if (!bf16_tiles) std::memcpy(o_pack + r * c.Dvp, dorow.data(), static_cast<std::size_t>(c.Dvp) * sizeof(float));
      }
      const float* orw = orow.data();
      if (out_direct)
        orw = p.out.ptr<float>() + p.out.offset(b, h, i, 0);
      else
        load_row(p.out, p.out.offset(b, h, i, 0), p.out.stride(3), p.Dv, orow.data());
      dots[static_cast<std::size_t>(i)] = dot_f64(orw, dor, p.Dv);
    }
    for (std::int64_t i = 0; i < p.Sq; ++i) {
      const std::int64_t r = bh * p.Sq + i;
      // A row with no allowed key has lse = −∞ and P = 0: L = +∞ makes every 2^(s − L) zero.
      // A NaN row (lse NaN, the policy of qkv/attention.hpp) keeps L = NaN: P = 2^(s − L) is NaN
      // on its allowed keys, so its dq and their dk, dv come out NaN. Its delta (NaN, from the
      // NaN out) is set to 0 so that dS = P (dP − delta) stays 0 on the keys it masks (P = 0).
      const double lse = p.lse.load(p.lse.offset(b, h, i));
      L[r] = lse == -kInf ? kInf : static_cast<float>(lse * 1.4426950408889634);
      delta[r] = std::isnan(lse) ? 0.0f : static_cast<float>(dots[static_cast<std::size_t>(i)]);
    }
  });
}

}  // namespace qkv::kernels::bwd
