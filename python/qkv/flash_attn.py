"""FlashAttention 2's Python functions on qkv's CPU kernels (torch tensors, differentiable).

    from qkv import flash_attn_func, flash_attn_varlen_func
    out = flash_attn_func(q, k, v, causal=True)                          # q [B, Sq, H, D] -> [B, Sq, H, Dv]
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)        # lse [B, H, Sq], float32
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k)       # packed q [Tq, H, D]

Same signatures, layouts and conventions as ``flash_attn`` 2.x: k and v may have fewer heads
(GQA, H % Hkv == 0); causal and sliding windows are aligned bottom-right (query i of Sq sits at
key position i + Sk - Sq), window_size = (left, right) with -1 for unbounded; the lse is the
natural-log log-sum-exp of each row's scaled scores (-inf on a row with no allowed key, before
dropout) and does not carry gradients, as FlashAttention's does not. The third value of
``return_attn_probs`` is None: FlashAttention returns a debugging dropout pattern there
(``qkv.dropout_mask`` gives qkv's mask).

``dropout_p`` > 0 applies attention dropout as FlashAttention does (its callers pass 0 in eval
mode), with a seed drawn from torch's default generator (``torch.manual_seed`` reproduces it); the
backward regenerates the same mask. ``softcap`` (> 0: scores capped to softcap · tanh(score /
softcap)) and ``alibi_slopes`` ([H] or [B, H]: bias −slope · |i + Sk − Sq − j|) work as in
FlashAttention. ``block_table`` (a paged KV cache) raises NotImplementedError here: qkv reads paged
caches in qkv.attention_kvcache and qkv.KVCache. ``deterministic`` is accepted: qkv's backward is
deterministic for a given thread count.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from . import torch as _qtorch


def _check_variant(fn: str, softcap, alibi_slopes, block_table=None):
    """The (softcap, alibi_slopes) qkv takes: None for FlashAttention's 0.0 and None."""
    if softcap < 0:
        raise ValueError(f"[{fn}] softcap: must be >= 0 (0 = none), got {softcap}")
    if alibi_slopes is not None and (not isinstance(alibi_slopes, Tensor) or alibi_slopes.dim() not in (1, 2)):
        shape = list(alibi_slopes.shape) if isinstance(alibi_slopes, Tensor) else type(alibi_slopes).__name__
        raise ValueError(f"[{fn}] alibi_slopes: expected a tensor [H] or [B, H]; got {shape}")
    if block_table is not None:
        raise NotImplementedError(f"[{fn}] block_table: a paged cache is read by qkv.attention_kvcache "
                                  f"(or qkv.KVCache), not by the varlen call; pass None")
    return (float(softcap) if softcap else None), alibi_slopes


def _window(fn: str, window_size: Sequence[int], causal: bool):
    """(window_left, window_right) for qkv: None = unbounded (FlashAttention's -1)."""
    try:
        left, right = (int(w) for w in window_size)
    except (TypeError, ValueError):
        raise ValueError(f"[{fn}] window_size: expected a pair (left, right) of ints, -1 = unbounded, got "
                         f"{window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"[{fn}] window_size: each side must be >= -1 (-1 = unbounded), got {window_size!r}")
    # Causal already bounds the right side at the diagonal (FlashAttention sets right = 0 then).
    return (None if left == -1 else left), (None if right == -1 or causal else right)


def _check_tensors(fn: str, names: Sequence[str], ts: Sequence[Tensor], rank: int) -> None:
    for n, t in zip(names, ts):
        if not isinstance(t, Tensor):
            raise TypeError(f"[{fn}] {n}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            layout = "[B, S, H, D]" if rank == 4 else "[T, H, D] (packed)"
            raise ValueError(f"[{fn}] {n}: expected rank {rank} {layout}, got shape {list(t.shape)}")


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                    causal: bool = False, window_size=(-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                    return_attn_probs: bool = False):
    """q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv] -> out [B, Sq, H, Dv] (see the module docstring)."""
    fn = "qkv.flash_attn_func"
    cap, slopes = _check_variant(fn, softcap, alibi_slopes)
    _check_tensors(fn, ("q", "k", "v"), (q, k, v), 4)
    if k.shape[0] != q.shape[0] or v.shape[:3] != k.shape[:3] or k.shape[3] != q.shape[3]:
        raise ValueError(f"[{fn}] shapes must be q [B, Sq, H, D], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv], got "
                         f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}")
    wl, wr = _window(fn, window_size, causal)
    out, lse = _qtorch.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale,
                                 causal=bool(causal), align="bottom_right", window_left=wl, window_right=wr,
                                 dropout_p=dropout_p, softcap=cap, alibi_slopes=slopes)
    out = out.transpose(1, 2).contiguous()
    return (out, lse, None) if return_attn_probs else out


def flash_attn_varlen_func(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0,
                           softmax_scale: Optional[float] = None, causal: bool = False, window_size=(-1, -1),
                           softcap: float = 0.0, alibi_slopes: Optional[Tensor] = None, deterministic: bool = False,
                           return_attn_probs: bool = False, block_table: Optional[Tensor] = None):
    """Packed q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> out [Tq, H, Dv]; with return_attn_probs
    (out, lse [H, Tq], None). Sequence b owns rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and
    cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v; max_seqlen_q/k must bound those lengths."""
    fn = "qkv.flash_attn_varlen_func"
    cap, slopes = _check_variant(fn, softcap, alibi_slopes, block_table)
    _check_tensors(fn, ("q", "k", "v"), (q, k, v), 3)
    for name, cu, mx in (("q", cu_seqlens_q, max_seqlen_q), ("k", cu_seqlens_k, max_seqlen_k)):
        cu_t = torch.as_tensor(cu)
        longest = int((cu_t[1:] - cu_t[:-1]).max()) if cu_t.numel() > 1 else 0
        if longest > int(mx):
            raise ValueError(f"[{fn}] max_seqlen_{name} = {mx} is less than the longest sequence in "
                             f"cu_seqlens_{name} ({longest})")
    wl, wr = _window(fn, window_size, causal)
    out, lse = _qtorch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=softmax_scale, causal=bool(causal),
                                        align="bottom_right", window_left=wl, window_right=wr, return_lse=True,
                                        dropout_p=dropout_p, softcap=cap, alibi_slopes=slopes)
    return (out, lse, None) if return_attn_probs else out
