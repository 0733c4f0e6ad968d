"""ONNX's Attention operator (opsets 23-25) on qkv: :func:`onnx_attention` takes the operator's inputs
and attributes by their ONNX names and returns its four outputs, computed by :func:`qkv.attention`.

What maps to what (include/qkv/attention.hpp has qkv's side):

    ONNX                                   qkv
    Q, K, V 4-D [B, H, S, D]               q, k, v as they are
    Q, K, V 3-D [B, S, H*D] with           views [B, H, S, D] of the same memory (reshape + transpose,
      q_num_heads / kv_num_heads             nothing copied); Y comes back [B, Sq, H*Dv]
    kv_num_heads < q_num_heads             grouped-query attention (query head h reads kv head h // (H/Hkv))
    attn_mask bool / float, rank 2-4       mask (True = may attend / added), last dim padded to the
                                             total key length with False / -inf as ONNX pads it
    past_key, past_value                   present = past ++ new along the sequence; the causal
                                             diagonal offset by the past length
    nonpad_kv_seqlen                       key_lengths with align='bottom_right_key_lengths'
    is_causal                              causal
    scale                                  scale: float32(sqrt(float32(scale)))², as ONNX scales Q and K each
    softcap (0: none)                      softcap
    left_window_size, right_window_size    window_left, window_right (opset 25; -1: unbounded)
    qk_matmul_output_mode 0 / 1 / 2        return_scores 'scaled' / 'softcapped' / 'masked'
    qk_matmul_output_mode 3                return_pattern
    softmax_precision                      DOUBLE (11): the float64 reference kernel; otherwise qkv's
                                             softmax runs in float32 (float64 for float64 inputs)
    float16 inputs                         computed in float32, outputs rounded to float16
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import numpy as np

from . import _arrays as A
from .functional import attention

Array = Any

_DOUBLE = 11  # onnx.TensorProto.DOUBLE
_PRECISIONS = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_SCORE_MODES = {0: "scaled", 1: "softcapped", 2: "masked"}


class OnnxAttentionOutputs(NamedTuple):
    """The operator's outputs: Y ([B, Sq, H*Dv] for 3-D inputs, else [B, H, Sq, Dv]), present_key
    [B, Hkv, P+Skv, D], present_value [B, Hkv, P+Skv, Dv] (4-D always, as ONNX), qk_matmul_output
    [B, H, Sq, P+Skv] (None unless asked for)."""

    Y: Array
    present_key: Array
    present_value: Array
    qk_matmul_output: Optional[Array]


def _is_torch(x) -> bool:
    t = A._torch()
    return t is not None and isinstance(x, t.Tensor)


def _heads(x, heads: int, name: str, fn: str):
    """[B, S, heads*D] -> a [B, heads, S, D] view."""
    B, S, hidden = x.shape
    if hidden % heads:
        raise ValueError(f"[{fn}] {name}: hidden size {hidden} is not a multiple of the head count {heads}")
    x = x.reshape(B, S, heads, hidden // heads)
    return x.permute(0, 2, 1, 3) if _is_torch(x) else x.transpose(0, 2, 1, 3)


def _cat(a, b, axis: int):
    if _is_torch(a):
        return A._torch().cat([a, b], axis)
    return np.concatenate([a, b], axis)


def _like(x, shape, value, dtype=None):
    """An array of x's kind filled with value, of x's dtype unless dtype (numpy name) is given."""
    if _is_torch(x):
        t = A._torch()
        return t.full(shape, value, dtype=getattr(t, dtype) if dtype else x.dtype)
    return np.full(shape, value, dtype=dtype or x.dtype)


def _where(cond, a, b):
    if _is_torch(a):
        return A._torch().where(cond, a, b)
    return np.where(cond, a, b)


def onnx_attention(Q: Array, K: Array, V: Array, attn_mask: Optional[Array] = None, past_key: Optional[Array] = None,
                   past_value: Optional[Array] = None, nonpad_kv_seqlen: Optional[Array] = None, *,
                   is_causal: int = 0, q_num_heads: Optional[int] = None, kv_num_heads: Optional[int] = None,
                   qk_matmul_output_mode: int = 0, scale: Optional[float] = None, softcap: float = 0.0,
                   softmax_precision: Optional[int] = None, left_window_size: int = -1, right_window_size: int = -1,
                   return_qk_matmul_output: bool = False, num_threads: int = 0) -> OnnxAttentionOutputs:
    """ONNX Attention (opsets 23-25) with its inputs and attributes by name; the table at the top of
    this module says how each maps onto :func:`qkv.attention`. Arrays: NumPy or torch, float16,
    float32, bfloat16 or float64. Returns :class:`OnnxAttentionOutputs`."""
    fn = "qkv.onnx_attention"
    rank = len(A.shape_of(Q))
    if rank not in (3, 4) or len(A.shape_of(K)) != rank or len(A.shape_of(V)) != rank:
        raise ValueError(f"[{fn}] Q, K, V: must all be 3-D [B, S, H*D] or all 4-D [B, H, S, D], got Q "
                         f"{list(A.shape_of(Q))}, K {list(A.shape_of(K))}, V {list(A.shape_of(V))}")
    if rank == 3:
        for name, x in (("q_num_heads", q_num_heads), ("kv_num_heads", kv_num_heads)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"[{fn}] {name}: 3-D inputs need an int >= 1, got {x!r}")
        Q, K, V = _heads(Q, q_num_heads, "Q", fn), _heads(K, kv_num_heads, "K", fn), _heads(V, kv_num_heads, "V", fn)
    elif q_num_heads is not None or kv_num_heads is not None:
        raise ValueError(f"[{fn}] q_num_heads and kv_num_heads: only for 3-D inputs (ONNX refuses them with 4-D)")
    if (past_key is None) != (past_value is None):
        raise ValueError(f"[{fn}] past_key and past_value: give both or neither")
    if nonpad_kv_seqlen is not None and past_key is not None:
        raise ValueError(f"[{fn}] nonpad_kv_seqlen: cannot be combined with past_key / past_value (as ONNX)")
    if qk_matmul_output_mode not in (0, 1, 2, 3):
        raise ValueError(f"[{fn}] qk_matmul_output_mode: must be 0, 1, 2 or 3, got {qk_matmul_output_mode!r}")
    if softmax_precision is not None and softmax_precision not in _PRECISIONS:
        raise ValueError(f"[{fn}] softmax_precision: must be a TensorProto float type (1, 10, 11, 16), "
                         f"got {softmax_precision!r}")
    for name, w in (("left_window_size", left_window_size), ("right_window_size", right_window_size)):
        if isinstance(w, bool) or not isinstance(w, int) or w < -1:
            raise ValueError(f"[{fn}] {name}: must be -1 (unbounded) or an int >= 0, got {w!r}")

    present_key = K if past_key is None else _cat(past_key, K, 2)
    present_value = V if past_value is None else _cat(past_value, V, 2)
    half = A.is_float16(Q)
    q, k, v = (A.float16_to(x, "float32") if half else x for x in (Q, present_key, present_value))
    Sq, Skv = A.shape_of(q)[2], A.shape_of(k)[2]
    past = 0 if past_key is None else A.shape_of(past_key)[2]

    mask = attn_mask
    if mask is not None:
        ms = tuple(A.shape_of(mask))
        if not 2 <= len(ms) <= 4:
            raise ValueError(f"[{fn}] attn_mask: rank must be 2, 3 or 4, got {list(ms)}")
        boolean = A.kind_of(mask, "attn_mask", fn)[0].dtype_name(mask) == "bool"
        if half and not boolean:
            mask = A.float16_to(mask, "float32")
        if ms[-1] < Skv:  # ONNX pads a short mask over the total key length: False / -inf
            pad = _like(mask, ms[:-1] + (Skv - ms[-1],), False if boolean else -np.inf)
            mask = _cat(mask, pad, -1)
        mask = mask.reshape((1,) * (4 - len(ms)) + tuple(A.shape_of(mask)))

    # The causal and window diagonal: i + past (internal cache), i + nonpad[b] - Sq (external cache),
    # or i. qkv's alignments express the first when past + Sq = Skv, the second always, the third
    # always; otherwise the rule is written as a bool mask [Sq, Skv] and joined with attn_mask.
    causal, wl, wr = bool(is_causal), left_window_size, right_window_size
    align = "top_left"
    if nonpad_kv_seqlen is not None:
        align = "bottom_right_key_lengths"
    elif past and past + Sq == Skv:
        align = "bottom_right"
    elif past and (causal or wl >= 0 or wr >= 0):
        i, j = np.arange(Sq)[:, None] + past, np.arange(Skv)[None, :]
        allowed = np.ones((Sq, Skv), bool)
        if causal:
            allowed &= j <= i
        if wl >= 0:
            allowed &= j >= i - wl
        if wr >= 0:
            allowed &= j <= i + wr
        rule = A._torch().from_numpy(allowed) if _is_torch(q) else allowed
        rule = rule.reshape(1, 1, Sq, Skv)
        if mask is None:
            mask = rule
        elif A.kind_of(mask, "attn_mask", fn)[0].dtype_name(mask) == "bool":
            mask = mask & rule
        else:
            mask = _where(rule, mask, _like(mask, (1,), -np.inf))
        causal, wl, wr = False, -1, -1

    # ONNX's float attributes are 32-bit, and the operator multiplies Q and K each by sqrt(scale),
    # taken in the attribute's float32 (onnx.reference, and the function body's Sqrt): the product
    # of the two is this scale.
    if scale is not None:
        root = float(np.sqrt(np.float32(scale)))
        scale = root * root
    softcap = float(np.float32(softcap))
    want = return_qk_matmul_output
    r = attention(q, k, v, mask=mask, key_lengths=nonpad_kv_seqlen, scale=scale, causal=causal, align=align,
                  window_left=None if wl < 0 else wl, window_right=None if wr < 0 else wr,
                  softcap=softcap if softcap > 0 else None, num_threads=num_threads,
                  kernel="reference" if softmax_precision == _DOUBLE else "automatic",
                  return_pattern=want and qk_matmul_output_mode == 3,
                  return_scores=_SCORE_MODES.get(qk_matmul_output_mode) if want else None)
    y = r.out
    if rank == 3:  # [B, H, Sq, Dv] -> [B, Sq, H*Dv]
        B, H, _, Dv = A.shape_of(y)
        y = (y.permute(0, 2, 1, 3) if _is_torch(y) else y.transpose(0, 2, 1, 3)).reshape(B, Sq, H * Dv)
    qk = None
    if want:
        qk = r.pattern if qk_matmul_output_mode == 3 else r.scores
        qk = qk.to(Q.dtype) if _is_torch(qk) else qk.astype(Q.dtype)  # ONNX: the input's type
    if half:
        y = A.float16_to(y, "float16")
    return OnnxAttentionOutputs(y, present_key, present_value, qk)
