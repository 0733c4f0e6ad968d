"""qkv's attention functions in Python.

``scaled_dot_product_attention`` is a drop-in for ``torch.nn.functional.scaled_dot_product_attention``
on the CPU; ``attention`` and ``attention_backward`` expose the whole qkv API in its own layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple, Union

import numpy as np

from . import _arrays as A
from . import _plan as P
from . import _qkv
from ._plan import dropout_mask

# Anything the package accepts as an array: numpy.ndarray, torch.Tensor, or a DLPack producer.
Array = Any


@dataclass(frozen=True)
class KernelInfo:
    """Which implementation ran: ``kernel`` ('reference', 'flash', 'flash_decode'), the instruction
    set it was compiled for (``isa``) and a printable ``name`` such as 'flash_avx512_f32'."""

    kernel: str
    isa: str
    name: str


class AttentionResult(NamedTuple):
    """What :func:`attention` returns. ``lse`` and ``pattern`` are None unless requested."""

    out: Array
    lse: Optional[Array]
    pattern: Optional[Array]
    kernel: KernelInfo


class AttentionResultScores(NamedTuple):
    """What :func:`attention` returns when ``return_scores`` is given: also the scores [B, H, Sq, Skv]."""

    out: Array
    lse: Optional[Array]
    pattern: Optional[Array]
    scores: Array
    kernel: KernelInfo


class AttentionGrads(NamedTuple):
    """What :func:`attention_backward` returns."""

    dq: Array
    dk: Array
    dv: Array
    kernel: KernelInfo


class AttentionGradsSinks(NamedTuple):
    """What :func:`attention_backward` returns when ``sinks`` are given: also dL/dsinks [H] (float64)."""

    dq: Array
    dk: Array
    dv: Array
    dsinks: Array
    kernel: KernelInfo


def _draw_seed(kind_is_torch: bool) -> int:
    """A dropout seed in [0, 2**63) from torch's default generator (torch inputs: torch.manual_seed
    makes the runs reproducible) or NumPy's global one (np.random.seed)."""
    if kind_is_torch:
        import torch

        return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    return int(np.random.randint(0, 2**63 - 1, dtype=np.int64))


def alibi_slopes(H: int) -> np.ndarray:
    """The ALiBi paper's slopes for H heads, float64 [H], as BLOOM and MPT build them: 2^(-8 (h+1) / H)
    for H a power of two; otherwise those of the largest power of two n < H, then every other
    slope of 2n heads."""
    if isinstance(H, bool) or not isinstance(H, int) or H < 1:
        raise ValueError(f"[qkv.alibi_slopes] H: must be an int >= 1, got {H!r}")
    return np.asarray(_qkv.alibi_standard_slopes(H), dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# The PyTorch-compatible entry point
# ---------------------------------------------------------------------------------------------

class _SdpaPlan(NamedTuple):
    """An SDPA call mapped onto qkv's layout: rank-4 views and the shapes to map back."""

    kind: Any
    q4: Array                 # [B, H,   L, E ]
    k4: Array                 # [B, Hkv, S, E ]
    v4: Array                 # [B, Hkv, S, Ev]
    mask4: Optional[Array]    # [B, H,   L, S ] (broadcast dims have stride 0) or None
    out_shape: A.Shape        # (*batch, L, Ev), PyTorch's output shape
    k_full: A.Shape           # the shapes q, k, v were broadcast to before merging into B
    v_full: A.Shape
    q_full: A.Shape
    causal: bool
    scale: Optional[float]


def _plan_sdpa(fn: str, query, key, value, attn_mask, is_causal, scale, enable_gqa) -> _SdpaPlan:
    kind, (q, k, v) = A.common_kind(fn, [("query", query), ("key", key), ("value", value)])
    A.check_float(fn, [("query", q), ("key", k), ("value", v)], kind)
    sh = P.sdpa_shapes(fn, A.shape_of(q), A.shape_of(k), A.shape_of(v), attn_mask is not None, is_causal, enable_gqa)
    k, v = _repeat_heads(kind, k, sh.repeat_k), _repeat_heads(kind, v, sh.repeat_v)
    lead, H, Hk, L, S = sh.lead, sh.H, sh.Hkv, sh.L, sh.S
    q_full, k_full, v_full = lead + (H, L, sh.E), lead + (Hk, S, sh.E), lead + (Hk, S, sh.Ev)
    q4 = A.to_rank4(kind, q, lead, (H, L, sh.E))
    k4 = A.to_rank4(kind, k, lead, (Hk, S, sh.E))
    v4 = A.to_rank4(kind, v, lead, (Hk, S, sh.Ev))

    mask4 = None
    if attn_mask is not None:
        m = P.check_mask(fn, kind, attn_mask, "attn_mask")
        P.check_mask_shape(fn, A.shape_of(m), sh)
        mask4 = A.to_rank4(kind, m, lead, (H, L, S))
    return _SdpaPlan(kind, q4, k4, v4, mask4, sh.out_batch + (L, sh.Ev), k_full, v_full, q_full,
                     bool(is_causal), P.check_scale(fn, scale))


def _repeat_heads(kind, x, r: int):
    """x with every head (dim -3) repeated r times in place, as torch.repeat_interleave(x, r, -3)."""
    if r == 1:
        return x
    s = A.shape_of(x)
    st = kind.strides(x)
    # [..., Hk, r, S, E] with stride 0 on r, made contiguous and viewed as [..., Hk·r, S, E].
    rep = kind.contiguous(kind.strided(x, s[:-2] + (r,) + s[-2:], st[:-2] + (0,) + st[-2:]))
    return kind.strided(rep, s[:-3] + (s[-3] * r,) + s[-2:], A.contiguous_strides(s[:-3] + (s[-3] * r,) + s[-2:]))




def scaled_dot_product_attention(query: Array, key: Array, value: Array, attn_mask: Optional[Array] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Array:
    """Attention with the semantics of ``torch.nn.functional.scaled_dot_product_attention``.

    Args:
        query: (..., L, E) array; float32, bfloat16, float64, or float16 (computed in float32 and
            rounded to float16 once, as torch's CPU kernels accumulate in float32).
        key: (..., S, E), same dtype.
        value: (..., S, Ev), same dtype.
        attn_mask: None, a bool array (True = may attend) or a float array added to the scores,
            broadcastable to (..., L, S).
        dropout_p: attention dropout probability in [0, 1), applied whenever > 0 (as torch does;
            pass 0.0 in eval mode). The seed is drawn from torch's default generator for torch
            tensors (``torch.manual_seed`` reproduces a run), from NumPy's global one otherwise
            (``np.random.seed``); the mask is that of :func:`dropout_mask`.
        is_causal: top-left causal mask (query i sees keys j <= i, also when L != S). Not together
            with attn_mask.
        scale: score scale; None means 1/sqrt(E).
        enable_gqa: key and value may have fewer heads (dim -3) than query; query head h reads
            key/value head h // (H / Hkv), as torch's repeat_interleave does.

    Returns:
        (..., L, Ev) in the dtype and framework of ``query`` (NumPy in, NumPy out; torch in, torch out).
        The batch dimensions broadcast as in torch.

    Difference from torch: a query row that may attend to no key (all False, or an additive mask of
    -inf everywhere) gives zeros here, always. torch's documented reference implementation gives
    NaN there (softmax of an all -inf row); recent torch CPU kernels give zeros as well.

    Inputs are read in place through their strides (transposed, sliced and broadcast inputs are
    not copied). The GIL is released while the kernel runs. When torch is recording gradients for
    any input, the call goes through ``qkv.torch.scaled_dot_product_attention`` (qkv's backward).
    """
    fn = "qkv.scaled_dot_product_attention"
    t = A._torch()
    if t is not None and t.is_grad_enabled() and any(
            isinstance(x, t.Tensor) and x.requires_grad for x in (query, key, value, attn_mask)):
        # A torch graph is being recorded: keep it differentiable (qkv's backward kernel).
        from . import torch as qkv_torch

        return qkv_torch.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                      enable_gqa)
    halves = [A.is_float16(x) for x in (query, key, value)]
    if any(halves) and not all(halves):
        raise TypeError(f"[{fn}] query, key, value: float16 is accepted when all three are float16, got "
                        f"{[str(x.dtype).replace('torch.', '') for x in (query, key, value)]}")
    if all(halves):
        # float16 as torch takes it: widened exactly to float32, f32 accumulation, the result rounded once.
        w = [A.float16_to(x, "float32") if A.is_float16(x) else x for x in (query, key, value, attn_mask)]
        return A.float16_to(scaled_dot_product_attention(*w[:3], w[3], dropout_p, is_causal, scale, enable_gqa),
                            "float16")
    drop = P.check_dropout_p(fn, dropout_p)
    p = _plan_sdpa(fn, query, key, value, attn_mask, is_causal, scale, enable_gqa)
    seed = _draw_seed(p.kind.name == "torch") if drop > 0.0 else 0
    P.reserve(fn, "output", p.q4, (p.out_shape, None))
    out = p.kind.empty(p.out_shape, p.q4)
    B, H, L, Ev = p.q4.shape[0], p.q4.shape[1], p.q4.shape[2], p.v4.shape[3]
    out4 = out.reshape(B, H, L, Ev)  # a view: out is freshly allocated, contiguous
    n = p.kind.native
    _qkv.attention(n(p.q4), n(p.k4), n(p.v4), n(out4), None if p.mask4 is None else n(p.mask4), None, None, None,
                   p.scale, p.causal, "top_left", -1, -1, 0, "automatic", drop, seed, 0)
    return out


# ---------------------------------------------------------------------------------------------
# The whole qkv API, in qkv's layout
# ---------------------------------------------------------------------------------------------

def attention(q: Array, k: Array, v: Array, *, mask: Optional[Array] = None, key_lengths: Optional[Array] = None,
              cu_seqlens_q: Optional[Array] = None, cu_seqlens_k: Optional[Array] = None,
              scale: Optional[float] = None, causal: bool = False, align: str = "top_left",
              window_left: Optional[int] = None, window_right: Optional[int] = None, return_lse: bool = False,
              return_pattern: bool = False, num_threads: int = 0, kernel: str = "automatic",
              dropout_p: float = 0.0, seed: Optional[int] = None, offset: int = 0,
              softcap: Optional[float] = None, alibi_slopes: Any = None,
              sinks: Optional[Array] = None, keep_first: int = 0,
              return_scores: Optional[str] = None) -> Union[AttentionResult, AttentionResultScores]:
    """Attention with every option of qkv's C++ API.

    Layout (strides are free; nothing is copied):
        q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv] -> out [B, H, Sq, Dv];
        H % Hkv == 0 and query head h reads key/value head h // (H / Hkv).
        Packed variable-length batches (cu_seqlens_q and cu_seqlens_k given): q [Tq, H, D],
        k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> out [Tq, H, Dv]; sequence b owns rows
        cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k, v.

    Args:
        mask: bool [.., Sq, Skv] (True = may attend) or float (added to the scores), broadcastable
            to [B, H, Sq, Skv] over its leading dims of size 1 or equal.
        key_lengths: ints [B]: batch b attends only to its first key_lengths[b] keys.
        scale: None means 1/sqrt(D).
        causal: key j is allowed for query i iff j <= diag(i).
        align: where diag lies when Sq != Skv: 'top_left' (diag(i) = i, as torch's is_causal),
            'bottom_right' (diag(i) = i + Skv - Sq, as FlashAttention and KV-cache decoding), or
            'bottom_right_key_lengths' (diag(i) = i + key_lengths[b] - Sq: each batch row aligned
            to its own key length, as ONNX Attention and FlashAttention's cache_seqlens).
        window_left, window_right: sliding window diag(i) - left <= j <= diag(i) + right; None is
            unbounded.
        keep_first: n >= 0: keys j < n stay allowed whatever window_left says (StreamingLLM's
            attention-sink tokens beside a sliding window; causal, key_lengths and masks still apply).
            The backward runs on the float64 reference kernel.
        return_lse: also return log-sum-exp of the allowed scores, [B, H, Sq] ([H, Tq] packed),
            float32 (float64 for float64 inputs); -inf on rows with no allowed key.
        return_pattern: also return the softmax probabilities [B, H, Sq, Skv] (one row per query,
            rows sum to 1), float32 (float64 for float64 inputs). Not with packed sequences. With
            dropout, the weights that multiplied V: p_ij · keep_ij / (1 - dropout_p), as torch's
            math path returns them (rows no longer sum to 1).
        num_threads: threads for this call; 0 means qkv.num_threads().
        kernel: 'automatic' (the fastest that supports the call), 'reference', 'flash' or
            'flash_decode'.
        dropout_p: attention dropout in [0, 1): out_i = sum_j p_ij keep_ij / (1 - dropout_p) v_j
            with keep_ij = :func:`dropout_mask` (seed, offset)[b, h, i, j]; lse stays the softmax's.
        seed, offset: ints in [0, 2**64) choosing the mask; seed is required when dropout_p > 0.
            Pass the same three to :func:`attention_backward`.
        softcap: c > 0 caps every score to c * tanh(score / c), after the scale, before the additive
            mask (ONNX Attention's order; Gemma 2, FlashAttention); masked keys stay masked.
        alibi_slopes: float [H], or True for the standard slopes of H heads (qkv.alibi_slopes):
            score -= slope[h] * |diag(i) - j| (BLOOM, MPT; after softcap, as FlashAttention); or
            float [B, H], one row of slopes per batch row (per sequence when packed), as FlashAttention.
        sinks: float [H] sink logits (gpt-oss): each row's softmax denominator gains exp(sinks[h])
            for a key without a value; lse includes it.
        return_scores: also return the scores [B, H, Sq, Skv] (float32; float64 for float64 inputs)
            at one stage, ONNX Attention's qk_matmul_output (the pattern is its mode 3):
            'scaled' (scale * q_i . k_j for every pair, mode 0), 'softcapped' (after softcap, before
            the mask; 'scaled' without softcap; mode 1), 'masked' (what the softmax sees: softcapped,
            plus the additive mask and the ALiBi bias, -inf on keys the row may not attend; mode 2).
            Runs on the reference kernel; not with packed sequences. No gradient flows through them.

    Returns:
        AttentionResult(out, lse, pattern, kernel), or AttentionResultScores(out, lse, pattern,
        scores, kernel) with return_scores: arrays in the framework of q, and the KernelInfo of
        what ran. A row with no allowed key gives zeros. No autograd here: use
        :func:`attention_backward`, or ``qkv.torch.scaled_dot_product_attention`` inside torch models.

    Non-finite values (as torch, so that a diverging model shows NaN): a NaN or +inf score on a
    key the row may attend (from NaN/inf in q or k, or a NaN/+inf mask entry) makes that row's out
    and lse NaN, and in the backward its dq and the dk, dv of the keys it may attend. Masked keys
    (bool False, additive -inf, causal, window, key_lengths) stay ignored even if their k is NaN,
    and a row with no allowed key stays zeros. Details: include/qkv/attention.hpp.
    """
    fn = "qkv.attention"
    kind, (q_, k_, v_) = A.common_kind(fn, [("q", q), ("k", k), ("v", v)])
    dtype = A.check_float(fn, [("q", q_), ("k", k_), ("v", v_)], kind)
    qs, vs = A.shape_of(q_), A.shape_of(v_)
    aux = "float64" if dtype == "float64" else "float32"
    wl, wr = P.check_window(fn, "window_left", window_left), P.check_window(fn, "window_right", window_right)
    kf = P.check_keep_first(fn, keep_first)
    drop = P.dropout_args(fn, dropout_p, seed, offset)
    n = kind.native
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError(f"[{fn}] cu_seqlens_q and cu_seqlens_k: give both or neither")
    if cu_seqlens_q is not None:
        if len(qs) != 3 or len(vs) != 3:
            raise ValueError(f"[{fn}] packed q, k, v must have rank 3 [T, H, D], got q {list(qs)}, "
                             f"k {list(A.shape_of(k_))}, v {list(vs)}")
        if mask is not None or key_lengths is not None or return_pattern or return_scores is not None:
            raise ValueError(f"[{fn}] mask, key_lengths, return_pattern and return_scores are not available with "
                             f"packed sequences (cu_seqlens_q / cu_seqlens_k)")
        P.reserve(fn, "out and lse", q_, ((qs[0], qs[1], vs[2]), None), ((qs[1], qs[0]) if return_lse else (0,), aux))
        out = kind.empty((qs[0], qs[1], vs[2]), q_)
        lse = kind.empty((qs[1], qs[0]), q_, aux) if return_lse else None
        var = P.variants(fn, qs[1], softcap, alibi_slopes, sinks, len(cu_seqlens_q) - 1)
        info = _qkv.attention_varlen(
            n(q_), n(k_), n(v_), n(out), A.index_array(fn, "cu_seqlens_q", cu_seqlens_q),
            A.index_array(fn, "cu_seqlens_k", cu_seqlens_k), lse, P.check_scale(fn, scale), bool(causal), align,
            wl, wr, int(num_threads), kernel, *drop, *var, keep_first=kf)
        return AttentionResult(out, lse, None, KernelInfo(*info))
    if len(qs) != 4 or len(vs) != 4 or len(A.shape_of(k_)) != 4:
        raise ValueError(f"[{fn}] q, k, v must have rank 4 [B, H, S, D] (rank 3 with cu_seqlens), got "
                         f"q {list(qs)}, k {list(A.shape_of(k_))}, v {list(vs)}")
    P.check_return_scores(fn, return_scores)
    square = qs[:3] + (A.shape_of(k_)[2],)
    what = ["out", "lse"] + (["pattern"] if return_pattern else []) + (["scores"] if return_scores is not None else [])
    P.reserve(fn, ", ".join(what[:-1]) + " and " + what[-1], q_, ((qs[0], qs[1], qs[2], vs[3]), None),
              (qs[:3] if return_lse else (0,), aux), (square if return_pattern else (0,), aux),
              (square if return_scores is not None else (0,), aux))
    out = kind.empty((qs[0], qs[1], qs[2], vs[3]), q_)
    lse = kind.empty(qs[:3], q_, aux) if return_lse else None
    pattern = kind.empty(square, q_, aux) if return_pattern else None
    scores = kind.empty(square, q_, aux) if return_scores is not None else None
    m = None if mask is None else n(P.check_mask(fn, kind, mask, "mask"))
    kl = None if key_lengths is None else A.index_array(fn, "key_lengths", key_lengths)
    var = P.variants(fn, qs[1], softcap, alibi_slopes, sinks, qs[0])
    info = _qkv.attention(n(q_), n(k_), n(v_), n(out), m, kl, lse, pattern, P.check_scale(fn, scale), bool(causal),
                          align, wl, wr, int(num_threads), kernel, *drop, *var, scores, return_scores or "masked",
                          keep_first=kf)
    if scores is not None:
        return AttentionResultScores(out, lse, pattern, scores, KernelInfo(*info))
    return AttentionResult(out, lse, pattern, KernelInfo(*info))


def attention_backward(q: Array, k: Array, v: Array, out: Array, dout: Array, lse: Array, *,
                       mask: Optional[Array] = None, key_lengths: Optional[Array] = None,
                       cu_seqlens_q: Optional[Array] = None, cu_seqlens_k: Optional[Array] = None,
                       scale: Optional[float] = None, causal: bool = False, align: str = "top_left",
                       window_left: Optional[int] = None, window_right: Optional[int] = None,
                       num_threads: int = 0, kernel: str = "automatic", dropout_p: float = 0.0,
                       seed: Optional[int] = None, offset: int = 0,
                       softcap: Optional[float] = None, alibi_slopes: Any = None, sinks: Optional[Array] = None,
                       keep_first: int = 0) -> Union[AttentionGrads, AttentionGradsSinks]:
    """Gradients of :func:`attention`: given dout = dL/dout, returns dq, dk, dv (shaped as q, k, v).

    ``out`` and ``lse`` (float32) come from the forward call with the same options
    (``attention(..., return_lse=True)``), in either layout: rank 4, or packed sequences with
    ``cu_seqlens_q`` / ``cu_seqlens_k`` (lse [H, Tq]; keys of a sequence without queries get zero
    gradients). With grouped-query attention dk and dv are summed over the query heads of each
    group. No gradient flows into an additive mask or the ALiBi slopes. With dropout, the forward's ``dropout_p``,
    ``seed`` and ``offset`` regenerate its mask (FlashAttention's backward: nothing N×N is stored).
    With ``sinks`` it returns AttentionGradsSinks(dq, dk, dv, dsinks, kernel): dsinks = dL/dsinks [H],
    float64.
    """
    fn = "qkv.attention_backward"
    drop = P.dropout_args(fn, dropout_p, seed, offset)
    kf = P.check_keep_first(fn, keep_first)
    kind, arrs = A.common_kind(fn, [("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout), ("lse", lse)])
    q_, k_, v_, o_, g_, l_ = arrs
    A.check_float(fn, [("q", q_), ("k", k_), ("v", v_), ("out", o_), ("dout", g_)], kind)
    P.reserve(fn, "dq, dk and dv", q_, (A.shape_of(q_), None), (A.shape_of(k_), None), (A.shape_of(v_), None))
    dq, dk, dv = kind.empty(A.shape_of(q_), q_), kind.empty(A.shape_of(k_), k_), kind.empty(A.shape_of(v_), v_)
    n = kind.native
    if (cu_seqlens_q is None) != (cu_seqlens_k is None):
        raise ValueError(f"[{fn}] cu_seqlens_q and cu_seqlens_k: give both or neither")
    H = A.shape_of(q_)[-2 if cu_seqlens_q is not None else 1]
    var = P.variants(fn, H, softcap, alibi_slopes, sinks)
    dsinks = np.empty((H,), dtype=np.float64) if sinks is not None else None

    def result(info):
        if dsinks is None:
            return AttentionGrads(dq, dk, dv, KernelInfo(*info))
        t = A._torch()
        ds = t.from_numpy(dsinks) if t is not None and isinstance(q_, t.Tensor) else dsinks
        return AttentionGradsSinks(dq, dk, dv, ds, KernelInfo(*info))

    if cu_seqlens_q is not None:
        if mask is not None or key_lengths is not None:
            raise ValueError(f"[{fn}] mask and key_lengths are not available with packed sequences "
                             f"(cu_seqlens_q / cu_seqlens_k)")
        info = _qkv.attention_varlen_backward(
            n(q_), n(k_), n(v_), n(o_), n(g_), n(l_), n(dq), n(dk), n(dv),
            A.index_array(fn, "cu_seqlens_q", cu_seqlens_q), A.index_array(fn, "cu_seqlens_k", cu_seqlens_k),
            P.check_scale(fn, scale), bool(causal), align, P.check_window(fn, "window_left", window_left),
            P.check_window(fn, "window_right", window_right), int(num_threads), kernel, *drop, *var, dsinks,
            keep_first=kf)
        return result(info)
    m = None if mask is None else n(P.check_mask(fn, kind, mask, "mask"))
    kl = None if key_lengths is None else A.index_array(fn, "key_lengths", key_lengths)
    info = _qkv.attention_backward(
        n(q_), n(k_), n(v_), n(o_), n(g_), n(l_), n(dq), n(dk), n(dv), m, kl, P.check_scale(fn, scale), bool(causal),
        align, P.check_window(fn, "window_left", window_left), P.check_window(fn, "window_right", window_right),
        int(num_threads), kernel, *drop, *var, dsinks, keep_first=kf)
    return result(info)
