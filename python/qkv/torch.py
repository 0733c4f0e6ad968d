"""qkv attention inside torch models, with gradients.

    import qkv.torch
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # differentiable
    out.sum().backward()
    out = qkv.torch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)  # packed [T, H, D]

The forward is qkv's forward (it also keeps the log-sum-exp of every row), the backward is
qkv::attention_backward, which recomputes the attention pattern from it instead of storing it.
Broadcast inputs receive gradients summed over the dimensions they were broadcast along, as in
torch. No gradient flows into ``attn_mask``.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _arrays as A
from . import _qkv
from .functional import _plan_sdpa

_FN = "qkv.torch.scaled_dot_product_attention"


class ScaledDotProductAttention(torch.autograd.Function):
    """torch.autograd.Function over qkv's forward and backward kernels (see the module docstring)."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, is_causal, scale, enable_gqa):
        p = _plan_sdpa(_FN, query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa)
        B, H, L, Ev = p.q4.shape[0], p.q4.shape[1], p.q4.shape[2], p.v4.shape[3]
        out = torch.empty(p.out_shape, dtype=query.dtype)
        out4 = out.view(B, H, L, Ev)
        # Rows' log-sum-exp [B, H, L], what the backward needs to recompute the pattern.
        lse = torch.empty((B, H, L), dtype=torch.float64 if query.dtype == torch.float64 else torch.float32)
        _qkv.attention(p.q4, p.k4, p.v4, out4, p.mask4, None, lse, None, p.scale, p.causal, "top_left",
                              -1, -1, 0, "automatic")
        ctx.plan = p._replace(q4=None, k4=None, v4=None, mask4=None)
        ctx.has_mask = p.mask4 is not None
        ctx.in_shapes = (tuple(query.shape), tuple(key.shape), tuple(value.shape))
        saved = [p.q4, p.k4, p.v4, out4, lse] + ([p.mask4] if ctx.has_mask else [])
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q4, k4, v4, out4, lse, *rest = ctx.saved_tensors
        mask4 = rest[0] if ctx.has_mask else None
        p = ctx.plan
        lead = p.q_full[:-3]
        B, H, L, Ev = out4.shape
        g4 = A.to_rank4(A.TorchKind, grad_out, lead, (H, L, Ev))
        dq4, dk4, dv4 = (torch.empty(t.shape, dtype=t.dtype) for t in (q4, k4, v4))
        _qkv.attention_backward(q4, k4, v4, out4, g4, lse, dq4, dk4, dv4, mask4, None, p.scale, p.causal,
                                "top_left", -1, -1, 0, "automatic")
        qs, ks, vs = ctx.in_shapes
        dq = _reduce(dq4.reshape(p.q_full), qs)
        dk = _reduce(dk4.reshape(p.k_full), ks)
        dv = _reduce(dv4.reshape(p.v_full), vs)
        return dq, dk, dv, None, None, None, None


_FN_VARLEN = "qkv.torch.attention_varlen"


class AttentionVarlen(torch.autograd.Function):
    """Packed variable-length attention (FlashAttention's varlen layout) with qkv's backward."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, align, window_left, window_right):
        fn = _FN_VARLEN
        cq = A.index_array(fn, "cu_seqlens_q", cu_seqlens_q)
        ck = A.index_array(fn, "cu_seqlens_k", cu_seqlens_k)
        out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)
        lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        _qkv.attention_varlen(q, k, v, out, cq, ck, lse, scale, causal, align, window_left, window_right, 0,
                              "automatic")
        ctx.opts = (scale, causal, align, window_left, window_right)
        ctx.cu = (cq, ck)  # int arrays of any kind (not necessarily tensors): kept on ctx
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        cq, ck = ctx.cu
        scale, causal, align, wl, wr = ctx.opts
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
        _qkv.attention_varlen_backward(q, k, v, out, grad_out, lse, dq, dk, dv, cq, ck, scale, causal, align, wl, wr,
                                       0, "automatic")
        return dq, dk, dv, None, None, None, None, None, None, None


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k, *,
                     scale: Optional[float] = None, causal: bool = False, align: str = "top_left",
                     window_left: Optional[int] = None, window_right: Optional[int] = None) -> torch.Tensor:
    """Packed variable-length attention, differentiable (FlashAttention's ``flash_attn_varlen_func``).

    q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> out [Tq, H, Dv]; sequence b owns rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v.
    Options as :func:`qkv.attention` (``align='bottom_right'`` is FlashAttention's causal
    convention when Sq != Skv). Gradients flow to q, k and v.
    """
    from .functional import _scale, _window
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"[{_FN_VARLEN}] {name}: expected a torch.Tensor, got {type(t).__name__}")
    return AttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, _scale(_FN_VARLEN, scale), bool(causal), align,
                                 _window(_FN_VARLEN, "window_left", window_left),
                                 _window(_FN_VARLEN, "window_right", window_right))


def _reduce(g: torch.Tensor, shape) -> torch.Tensor:
    """g [*lead, Hg, S, D] summed to an input's own `shape` (its broadcast and repeated heads undone)."""
    if len(shape) >= 3 and shape[-3] not in (1, g.shape[-3]):
        # Heads were repeated (GQA with different key and value head counts): sum each group.
        g = g.unflatten(-3, (shape[-3], g.shape[-3] // shape[-3])).sum(-3)
    return g.sum_to_size(shape) if tuple(g.shape) != tuple(shape) else g


def scaled_dot_product_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                 attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on qkv's kernels, differentiable.

    Same arguments and semantics as :func:`qkv.scaled_dot_product_attention` (torch tensors on the
    CPU only; ``dropout_p`` must be 0). Gradients flow to query, key and value; ``attn_mask`` is a
    constant. Double backward is not supported.
    """
    if dropout_p != 0.0:
        raise ValueError(f"[{_FN}] dropout_p: qkv computes attention exactly and has no dropout; pass "
                         f"dropout_p=0.0 (as in eval mode), got {dropout_p!r}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"[{_FN}] {name}: expected a torch.Tensor, got {type(t).__name__}")
    return ScaledDotProductAttention.apply(query, key, value, attn_mask, is_causal, scale, enable_gqa)
