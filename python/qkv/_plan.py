"""Checking the arguments of an attention call, for every entry point (qkv.functional for NumPy, torch and
DLPack arrays; qkv.torch for its autograd ops; qkv.mha, qkv.distributed): scalar options, dropout, the
score variants, masks, memory, and the shapes of a torch-style SDPA call mapped onto qkv's [B, H, S, D].

It imports neither qkv.functional nor qkv.torch, so both import it at the top (before it, each imported
the other's private helpers inside functions). Errors start with "[fn]", the name of the public function.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _arrays as A
from . import _qkv

# Anything the package accepts as an array: numpy.ndarray, torch.Tensor, or a DLPack producer.
Array = Any


def check_window(fn: str, name: str, w: Optional[int]) -> int:
    if w is None:
        return -1
    if isinstance(w, bool) or not isinstance(w, int) or w < 0:
        raise ValueError(f"[{fn}] {name}: must be None (unbounded) or an int >= 0, got {w!r}")
    return w


def check_keep_first(fn: str, n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"[{fn}] keep_first: must be an int >= 0, got {n!r}")
    return n


def check_scale(fn: str, scale: Optional[float]) -> Optional[float]:
    if scale is None:
        return None
    try:
        return float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"[{fn}] scale: must be None or a float, got {type(scale).__name__}") from None


SCORE_STAGES = ("scaled", "softcapped", "masked")  # ONNX Attention's qk_matmul_output modes 0, 1, 2


def check_return_scores(fn: str, mode: Any) -> None:
    """return_scores: None (no scores) or one of SCORE_STAGES."""
    if mode is not None and mode not in SCORE_STAGES:
        raise ValueError(f"[{fn}] return_scores: must be None, 'scaled', 'softcapped' or 'masked', got {mode!r}")


def check_dropout_p(fn: str, p: Any) -> float:
    if isinstance(p, bool):
        raise TypeError(f"[{fn}] dropout_p: must be a float in [0, 1), got {p!r}")
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise TypeError(f"[{fn}] dropout_p: must be a float in [0, 1), got {type(p).__name__}") from None
    if not 0.0 <= p < 1.0:
        raise ValueError(f"[{fn}] dropout_p: must be in [0, 1), got {p!r}")
    return p


def check_u64(fn: str, name: str, x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) < 2**64:
        raise ValueError(f"[{fn}] {name}: must be an int in [0, 2**64), got {x!r}")
    return int(x)


def dropout_args(fn: str, dropout_p: Any, seed: Any, offset: Any) -> Tuple[float, int, int]:
    """(p, seed, offset) for the native call; seed is required when p > 0 (the backward needs it)."""
    p = check_dropout_p(fn, dropout_p)
    if p == 0.0:
        return 0.0, 0, 0
    if seed is None:
        raise ValueError(f"[{fn}] seed: required with dropout_p = {p} (an int in [0, 2**64); attention_backward "
                         f"regenerates the mask from the same seed and offset)")
    return p, check_u64(fn, "seed", seed), check_u64(fn, "offset", offset)


def dropout_mask(shape: Sequence[int], dropout_p: float, seed: int, offset: int = 0) -> np.ndarray:
    """The keep mask of attention dropout: bool [B, H, Sq, Skv], True where p_ij is kept.

    It is the mask :func:`attention` (and every qkv entry point) applies with this ``dropout_p``,
    ``seed`` and ``offset``: element (b, h, i, j) depends on (seed, offset, b, h, i, j) alone, so
    the mask of a smaller call is a corner of a larger one; in packed (varlen) calls b is the
    sequence index and i, j positions within the sequence. For checking qkv's dropout or
    reproducing it in other code (e.g. ``torch.where(mask, p / (1 - dropout_p), 0) @ v``)."""
    fn = "qkv.dropout_mask"
    shape = tuple(int(d) for d in shape)
    if len(shape) != 4 or min(shape) < 0:
        raise ValueError(f"[{fn}] shape: expected [B, H, Sq, Skv] of sizes >= 0, got {list(shape)}")
    p = check_dropout_p(fn, dropout_p)
    mask = np.empty(shape, dtype=np.bool_)
    if mask.size:
        _qkv.dropout_mask(mask, p, check_u64(fn, "seed", seed), check_u64(fn, "offset", offset))
    return mask

class Variants(NamedTuple):
    """The score variants of one call, ready for the native layer (None: not used)."""

    softcap: Optional[float]
    alibi_slopes: Optional[Array]   # float [H] or [B, H]
    sinks: Optional[Array]          # float [H]


def head_vector(fn: str, name: str, x: Any, H: int, B: Optional[int] = None):
    """A float [H] array (numpy or torch, or a sequence of numbers) for the native layer; with B,
    [B, H] is taken too (one row per batch row)."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.float64)
    kind, a = A.kind_of(x, name, fn)
    a = kind.prepare(a)
    d = kind.dtype_name(a)
    if d not in A.FLOAT_DTYPES:
        raise TypeError(f"[{fn}] {name}: dtype must be float32, bfloat16 or float64, got {d}")
    if tuple(A.shape_of(a)) != (H,) and (B is None or tuple(A.shape_of(a)) != (B, H)):
        want = f"[H] = [{H}]" + ("" if B is None else f" or [B, H] = [{B}, {H}]")
        raise ValueError(f"[{fn}] {name}: expected shape {want}, got {list(A.shape_of(a))}")
    return kind.native(a)


def variants(fn: str, H: int, softcap: Optional[float], alibi_slopes: Any, sinks: Any,
             B: Optional[int] = None) -> Variants:
    """softcap: None or a float > 0; alibi_slopes: None, True (the standard slopes for H heads) or
    a float [H] array, or [B, H] (per batch row, as FlashAttention) when B is given; sinks: None or
    a float [H] array of sink logits."""
    cap = None
    if softcap is not None:
        if isinstance(softcap, bool):
            raise TypeError(f"[{fn}] softcap: must be None or a float > 0, got {softcap!r}")
        try:
            cap = float(softcap)
        except (TypeError, ValueError):
            raise TypeError(f"[{fn}] softcap: must be None or a float > 0, got {type(softcap).__name__}") from None
        if not math.isfinite(cap) or cap <= 0:
            raise ValueError(f"[{fn}] softcap: must be a finite float > 0, got {softcap!r}")
    slopes = None
    if alibi_slopes is True:
        slopes = np.asarray(_qkv.alibi_standard_slopes(H), dtype=np.float64)
    elif alibi_slopes is not None and alibi_slopes is not False:
        slopes = head_vector(fn, "alibi_slopes", alibi_slopes, H, B)
    return Variants(cap, slopes, None if sinks is None else head_vector(fn, "sinks", sinks, H))



def check_mask(fn: str, kind, mask: Array, name: str):
    mk, m = A.kind_of(mask, name, fn)
    if mk is not kind:
        raise TypeError(f"[{fn}] {name}: must be of the same kind as the inputs ({kind.name}), got {mk.name}")
    m = mk.prepare(m)
    d = mk.dtype_name(m)
    if d != "bool" and d not in A.FLOAT_DTYPES:
        raise TypeError(f"[{fn}] {name}: dtype must be bool (True = may attend) or float32/bfloat16/float64 "
                        f"(added to the scores), got {d} (shape {list(A.shape_of(m))})")
    return m


def reserve(fn: str, what: str, like: Any, *arrays: Tuple[Sequence[int], Optional[str]]) -> None:
    """Raises MemoryError (naming fn, what, the bytes asked and available) unless result arrays of
    these (shape, dtype) fit in the memory available now (dtype None: like's). Without it NumPy
    and torch grant any size on Linux, and the process is killed when the kernel writes it."""
    total = 0
    for shape, dtype in arrays:
        size = np.dtype(dtype).itemsize if dtype is not None else (
            like.element_size() if hasattr(like, "element_size") else like.dtype.itemsize)
        total += math.prod(int(d) for d in shape) * size
    _qkv.check_memory(fn, what, min(total, 2**64 - 1))


class SdpaShapes(NamedTuple):
    """A torch-style SDPA call (query [..., L, E], key [..., S, E], value [..., S, Ev]) in qkv's layout:
    q [*lead, H, L, E], k [*lead, Hkv, S, E], v [*lead, Hkv, S, Ev], the batch dims `lead` merged into B.
    With enable_gqa and different key and value head counts, qkv (which pairs key head j with value head
    j) takes both repeated to H heads, as torch.repeat_interleave(x, repeat, -3) gives them."""

    lead: Tuple[int, ...]       # the broadcast batch dimensions before the heads
    H: int                      # query heads
    Hkv: int                    # key/value heads after any repeat (H without enable_gqa)
    L: int
    S: int
    E: int
    Ev: int
    repeat_k: int               # 1, or H // key heads when key and value head counts differ
    repeat_v: int
    out_batch: Tuple[int, ...]  # torch's output is out_batch + (L, Ev)
    described: str              # "query [..], key [..], value [..]" for error messages


def sdpa_shapes(fn: str, qs: Sequence[int], ks: Sequence[int], vs: Sequence[int], has_mask: bool, is_causal: bool,
                enable_gqa: bool) -> SdpaShapes:
    """The layout of an SDPA call, or a ValueError naming fn and the three shapes (torch's rules)."""
    qs, ks, vs = tuple(qs), tuple(ks), tuple(vs)
    shapes = f"query {list(qs)}, key {list(ks)}, value {list(vs)}"
    if min(len(qs), len(ks), len(vs)) < 2:
        raise ValueError(f"[{fn}] query, key and value must have rank >= 2 (..., L, E), got {shapes}")
    L, E = qs[-2:]
    S, Ev = ks[-2], vs[-1]
    if ks[-1] != E:
        raise ValueError(f"[{fn}] key: last dimension must equal query's E = {E}, got {shapes}")
    if vs[-2] != S:
        raise ValueError(f"[{fn}] value: dimension -2 must equal key's S = {S}, got {shapes}")
    if has_mask and is_causal:
        raise ValueError(f"[{fn}] attn_mask and is_causal=True together are ambiguous (as in torch); "
                         f"fold the causal rule into the mask")
    if enable_gqa:
        if min(len(qs), len(ks), len(vs)) < 3:
            raise ValueError(f"[{fn}] enable_gqa needs a head dimension (-3) on query, key and value, got {shapes}")
        H, Hk, Hv = qs[-3], ks[-3], vs[-3]
        if Hk == 0 or Hv == 0 or H % Hk or H % Hv:
            raise ValueError(f"[{fn}] enable_gqa: query heads ({H}) must be a multiple of key heads ({Hk}) "
                             f"and value heads ({Hv}), got {shapes}")
        lead = A.broadcast_shapes(fn, [("query", qs[:-3]), ("key", ks[:-3]), ("value", vs[:-3])])
        rk, rv = (H // Hk, H // Hv) if Hk != Hv else (1, 1)
        return SdpaShapes(lead, H, H if Hk != Hv else Hk, L, S, E, Ev, rk, rv, lead + (H,), shapes)
    out_batch = A.broadcast_shapes(fn, [("query", qs[:-2]), ("key", ks[:-2]), ("value", vs[:-2])])
    lead, H = (out_batch[:-1], out_batch[-1]) if out_batch else ((), 1)
    return SdpaShapes(lead, H, H, L, S, E, Ev, 1, 1, out_batch, shapes)


def check_mask_shape(fn: str, ms: Sequence[int], sh: SdpaShapes) -> None:
    """attn_mask's shape must broadcast to the scores' (*out_batch, L, S)."""
    target = sh.out_batch + (sh.L, sh.S)
    if not A.broadcasts_to(tuple(ms), target):
        raise ValueError(f"[{fn}] attn_mask: shape {list(ms)} does not broadcast to the scores' shape "
                         f"{list(target)} ({sh.described})")
