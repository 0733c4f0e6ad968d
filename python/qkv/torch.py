"""qkv attention inside torch models, with gradients and torch.compile.

    import qkv.torch
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)   # differentiable
    out.sum().backward()
    out = qkv.torch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=True)  # packed [T, H, D]
    torch.compile(model, fullgraph=True)   # a model calling the above compiles without a graph break

qkv's attention is registered with ``torch.library`` as custom operators:

    qkv::attention(q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], mask?, key_lengths?, scale?,
                   causal, align, window_left, window_right, dropout_p, seed?, softcap?, alibi_slopes? [H],
                   sinks? [H])
                   -> (out [B, H, L, Ev], lse [B, H, L])
    qkv::attention_backward(q, k, v, mask?, key_lengths?, out, lse, dout, ...same options)
                   -> (dq, dk, dv, dsinks)   (dk, dv summed over the query heads of each key/value
                      head; dsinks [H] float64 with sinks, else empty)

and their packed twins ``qkv::attention_varlen(q [Tq, H, E], k [Tk, Hkv, E], v [Tk, Hkv, Ev],
cu_seqlens_q, cu_seqlens_k, ...)`` -> (out [Tq, H, Ev], lse [H, Tq]) and
``qkv::attention_varlen_backward``; each with a fake (meta) kernel for shape inference, and the
forwards with an autograd formula (the backwards too, so that double backward raises instead of
returning nothing). The forward keeps the log-sum-exp of every row; the backward recomputes the
pattern from it instead of storing it.

Dropout (``dropout_p > 0``): the mask's seed is an int64 tensor [] drawn from a torch generator
(the default one unless ``generator=`` is given, so ``torch.manual_seed`` makes runs reproducible,
also under torch.compile, where the draw is a graph op) and saved for the backward, which
regenerates the same mask tile by tile (qkv.dropout_mask shows it; nothing N×N is stored).

Gradients: broadcast inputs receive gradients summed over the dimensions they were broadcast
along, as in torch. A float ``attn_mask`` that requires grad receives dL/dS (the gradient of the
scores, P ∘ (dP − rowsum(dO ∘ O))), formed with torch ops from q, k, v and the saved lse: it costs
one [B, H, L, S] pattern, as large as the mask itself (and with dropout the bool keep mask). Double backward raises RuntimeError.

float16 inputs are computed in float32 (exact conversion of the inputs, f32 accumulation) and the
result is rounded to float16 once; gradients come back in float16 the same way.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _arrays as A
from . import _plan as P
from . import _qkv

_FN = "qkv.torch.scaled_dot_product_attention"


def _seed_tensor(fn: str, dropout_p: float, generator: Optional[torch.Generator], seed: Optional[int]) -> Optional[Tensor]:
    """The dropout seed as an int64 tensor [] (None without dropout): `seed` if given, else drawn
    from `generator` (torch's default generator when None)."""
    if dropout_p == 0.0:
        return None
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"[{fn}] seed: must be an int in [0, 2**63), got {seed!r}")
        return torch.tensor(seed, dtype=torch.int64)
    return torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=generator)


def _seed_int(seed: Optional[Tensor]) -> int:
    return 0 if seed is None else int(seed)


def _aux_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of lse: float64 for float64 inputs, else float32 (what qkv's kernels write)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---------------------------------------------------------------------------------------------
# The custom operators (rank-4 layout, every option of qkv's C++ API but varlen)
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("qkv::attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], key_lengths: Optional[Tensor],
                  scale: Optional[float], causal: bool, align: str, window_left: int,
                  window_right: int, dropout_p: float, seed: Optional[Tensor], softcap: Optional[float] = None,
                  alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                  keep_first: int = 0) -> Tuple[Tensor, Tensor]:
    B, H, L, _ = q.shape
    out = torch.empty((B, H, L, v.shape[3]), dtype=q.dtype)
    lse = torch.empty((B, H, L), dtype=_aux_dtype(q.dtype))
    _qkv.attention(q, k, v, out, mask, key_lengths, lse, None, scale, causal, align, window_left, window_right, 0,
                   "automatic", dropout_p, _seed_int(seed), 0, softcap, _detached(alibi_slopes), _detached(sinks),
                   keep_first=keep_first)
    return out, lse


def _detached(t: Optional[Tensor]) -> Optional[Tensor]:
    """A [H] option tensor as the native layer reads it (no autograd history, float32/64 as given)."""
    return None if t is None else t.detach()


@_attention_op.register_fake
def _(q, k, v, mask, key_lengths, scale, causal, align, window_left, window_right, dropout_p, seed, softcap=None,
      alibi_slopes=None, sinks=None, keep_first=0):
    B, H, L, _ = q.shape
    return q.new_empty((B, H, L, v.shape[3])), q.new_empty((B, H, L), dtype=_aux_dtype(q.dtype))


@torch.library.custom_op("qkv::attention_backward", mutates_args=())
def _attention_backward_op(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], key_lengths: Optional[Tensor],
                           out: Tensor, lse: Tensor, dout: Tensor, scale: Optional[float], causal: bool, align: str,
                           window_left: int, window_right: int, dropout_p: float, seed: Optional[Tensor],
                           softcap: Optional[float] = None, alibi_slopes: Optional[Tensor] = None,
                           sinks: Optional[Tensor] = None, keep_first: int = 0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
    dsinks = torch.empty((0 if sinks is None else q.shape[1],), dtype=torch.float64)
    _qkv.attention_backward(q, k, v, out, dout, lse, dq, dk, dv, mask, key_lengths, scale, causal, align, window_left,
                            window_right, 0, "automatic", dropout_p, _seed_int(seed), 0, softcap, _detached(alibi_slopes),
                            _detached(sinks), None if sinks is None else dsinks, keep_first=keep_first)
    return dq, dk, dv, dsinks


@_attention_backward_op.register_fake
def _(q, k, v, mask, key_lengths, out, lse, dout, scale, causal, align, window_left, window_right, dropout_p, seed,
      softcap=None, alibi_slopes=None, sinks=None, keep_first=0):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0 if sinks is None else q.shape[1],), dtype=torch.float64))


def _no_double_backward(ctx, *grads):
    raise RuntimeError("[qkv.torch] double backward (a gradient of qkv's attention gradients, e.g. "
                       "torch.autograd.grad(..., create_graph=True) followed by another backward) is not "
                       "implemented; use torch.nn.functional.scaled_dot_product_attention for Hessian-vector "
                       "products")


def _setup_backward_op(ctx, inputs, output):
    pass


torch.library.register_autograd("qkv::attention_backward", _no_double_backward, setup_context=_setup_backward_op)


def _diag(L: int, S: int, key_lengths: Optional[Tensor], align: str) -> Tensor:
    """diag(i) of qkv/attention.hpp, [L, 1] or [B, 1, L, 1] (bottom_right_key_lengths with key_lengths)."""
    i = torch.arange(L).unsqueeze(1)
    if align == "bottom_right_key_lengths" and key_lengths is not None:
        return i + (key_lengths.to(torch.int64).view(-1, 1, 1, 1) - L)
    return i + (S - L if align in ("bottom_right", "bottom_right_key_lengths") else 0)


def _allowed(L: int, S: int, key_lengths: Optional[Tensor], causal: bool, align: str, wl: int,
             wr: int, keep_first: int = 0) -> Optional[Tensor]:
    """Bool [B|1, 1, L, S]: which keys each query may attend under qkv's rules (None = every key);
    keys j < keep_first escape window_left only."""
    j = torch.arange(S).unsqueeze(0)
    diag = _diag(L, S, key_lengths, align)
    rules = []
    if causal:
        rules.append(j <= diag)
    if wl >= 0:
        rules.append((j >= diag - wl) | (j < keep_first))
    if wr >= 0:
        rules.append(j <= diag + wr)
    if key_lengths is not None:
        rules.append(j < key_lengths.view(-1, 1, 1, 1))
    ok = None
    for r in rules:
        ok = r if ok is None else ok & r
    return ok


@torch.library.custom_op("qkv::dropout_keep", mutates_args=())
def _dropout_keep_op(like: Tensor, dropout_p: float, seed: Tensor) -> Tensor:
    """qkv.dropout_mask as an op (traceable by torch.compile): bool, shaped like `like` [B, H, L, S]."""

    return torch.from_numpy(P.dropout_mask(tuple(like.shape), dropout_p, int(seed)))


@_dropout_keep_op.register_fake
def _(like, dropout_p, seed):
    return like.new_empty(like.shape, dtype=torch.bool)


def _mask_grad(q, k, v, mask, key_lengths, out, lse, dout, scale, causal, align, wl, wr, dropout_p, seed,
               softcap=None, alibi_slopes=None, keep_first=0) -> Tensor:
    """dL/dmask = dL/dS [B, H, L, S] = P ∘ (dP − rowsum(dO ∘ O)), P recomputed from lse (torch ops;
    the mask is added after softcap, so no tanh factor; with sinks lse includes them).

    q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev], dout and out [B, H, L, Ev], lse [B, H, L].
    With dropout dP = W ∘ (dO·Vᵀ), W = keep / (1 − p) the forward's mask (qkv.dropout_mask).
    """
    H, Hkv = q.shape[1], k.shape[1]
    if Hkv != H:
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    acc = _aux_dtype(q.dtype)
    qa, ka, va, oa, ga = (t.to(acc) for t in (q, k, v, out, dout))
    s = (qa @ ka.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if softcap is not None:   # before the mask: ONNX's, FlashAttention's and Gemma 2's order
        s = softcap * torch.tanh(s / softcap)
    s = s + mask.to(acc)
    if alibi_slopes is not None:
        dist = (_diag(q.shape[2], k.shape[2], key_lengths, align) - torch.arange(k.shape[2])).abs()
        s = s - alibi_slopes.detach().to(acc).reshape(-1, q.shape[1], 1, 1) * dist.to(acc)  # [H] or [B, H]
    finite = torch.isfinite(lse).unsqueeze(-1)     # rows with no allowed key: P = 0 there
    p = torch.where(finite, torch.exp(s - torch.where(finite, lse.unsqueeze(-1), 0.0)), 0.0)
    ok = _allowed(q.shape[2], k.shape[2], key_lengths, causal, align, wl, wr, keep_first)
    if ok is not None:
        p = torch.where(ok, p, 0.0)
    dp = ga @ va.transpose(-1, -2)
    if dropout_p > 0.0:
        keep = _dropout_keep_op(dp.detach(), dropout_p, seed)
        dp = torch.where(keep, dp / (1.0 - dropout_p), 0.0)
    delta = (ga * oa).sum(-1, keepdim=True)
    return (p * (dp - delta)).to(mask.dtype)


def _setup_attention(ctx, inputs, output):
    q, k, v, mask, key_lengths, scale, causal, align, wl, wr, dropout_p, seed, softcap, alibi_slopes, sinks, kf = inputs
    out, lse = output
    ctx.opts = (scale, causal, align, wl, wr, dropout_p, softcap, kf)
    ctx.save_for_backward(q, k, v, mask, key_lengths, out, lse, seed, alibi_slopes, sinks)


def _attention_grad(ctx, dout, dlse):
    # lse is returned detached by every public entry point (as FlashAttention's is): dlse carries nothing.
    q, k, v, mask, key_lengths, out, lse, seed, alibi_slopes, sinks = ctx.saved_tensors
    scale, causal, align, wl, wr, dropout_p, softcap, kf = ctx.opts
    dq, dk, dv, dsinks = _attention_backward_op(q, k, v, mask, key_lengths, out, lse, dout.contiguous(), scale, causal,
                                                align, wl, wr, dropout_p, seed, softcap, alibi_slopes, sinks, kf)
    dmask = None
    if ctx.needs_input_grad[3]:
        dmask = _mask_grad(q, k, v, mask, key_lengths, out, lse, dout, scale, causal, align, wl, wr, dropout_p, seed,
                           softcap, alibi_slopes, kf)
    dsink = dsinks.to(sinks.dtype) if sinks is not None and ctx.needs_input_grad[14] else None
    return dq, dk, dv, dmask, None, None, None, None, None, None, None, None, None, None, dsink, None


torch.library.register_autograd("qkv::attention", _attention_grad, setup_context=_setup_attention)


def attention(q: Tensor, k: Tensor, v: Tensor, *, mask: Optional[Tensor] = None,
              key_lengths: Optional[Tensor] = None, scale: Optional[float] = None, causal: bool = False,
              align: str = "top_left", window_left: Optional[int] = None,
              window_right: Optional[int] = None, dropout_p: float = 0.0,
              generator: Optional[torch.Generator] = None, seed: Optional[int] = None, softcap: Optional[float] = None,
              alibi_slopes=None, sinks: Optional[Tensor] = None, keep_first: int = 0) -> Tuple[Tensor, Tensor]:
    """qkv's attention in its own layout, differentiable, through the ``qkv::attention`` op.

    q [B, H, L, E], k [B, Hkv, S, E], v [B, Hkv, S, Ev] (H % Hkv == 0), mask [B, H, L, S] (bool:
    True = may attend; float: added to the scores; broadcast views are fine), key_lengths int [B].
    Options as :func:`qkv.attention` (softcap, alibi_slopes [H] or True, sinks [H], keep_first
    included; with keep_first > 0 the gradients come from the f64 reference backward).
    Returns (out [B, H, L, Ev], lse [B, H, L]); lse is detached. Gradients flow to q, k, v, a
    float mask and the sinks; float16 is computed in float32 and rounded once.
    Dropout: ``dropout_p`` in [0, 1) whenever > 0; the mask is ``qkv.dropout_mask(..., seed)`` with
    ``seed`` (an int in [0, 2**63)) if given, else one drawn from ``generator`` (torch's default
    generator when None); the backward reuses it.
    """
    fn = "qkv.torch.attention"
    dropout_p = P.check_dropout_p(fn, dropout_p)
    seed_t = _seed_tensor(fn, dropout_p, generator, seed)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise TypeError(f"[{fn}] {name}: expected a rank-4 torch.Tensor [B, H, S, D], got "
                            f"{type(t).__name__} {list(getattr(t, 'shape', []))}")
    half = q.dtype == torch.float16
    if half:
        q, k, v = q.float(), k.float(), v.float()
        if mask is not None and mask.dtype == torch.float16:
            mask = mask.float()
    var = P.variants(fn, q.shape[1], softcap, alibi_slopes, None if sinks is None else sinks.detach(),
                     q.shape[0])
    slopes = None if var.alibi_slopes is None else torch.as_tensor(var.alibi_slopes)
    if sinks is not None and sinks.dtype not in (torch.float32, torch.float64):
        sinks = sinks.float()   # differentiable; its gradient comes back in the caller's dtype
    out, lse = _attention_op(q, k, v, mask, key_lengths, P.check_scale(fn, scale), bool(causal), align,
                             P.check_window(fn, "window_left", window_left), P.check_window(fn, "window_right", window_right),
                             dropout_p, seed_t, var.softcap, slopes, sinks, P.check_keep_first(fn, keep_first))
    return (out.half() if half else out), lse.detach()


# ---------------------------------------------------------------------------------------------
# torch.nn.functional.scaled_dot_product_attention's signature on the op
# ---------------------------------------------------------------------------------------------

def _rank4(x: Tensor, lead: Tuple[int, ...], tail: Tuple[int, ...]) -> Tensor:
    """x broadcast to lead + tail and viewed as [prod(lead), *tail] (differentiable; copies only if it must)."""
    b = 1
    for n in lead:
        b *= n
    return x.expand(lead + tail).reshape((b,) + tail)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on qkv's kernels, differentiable.

    Same arguments and semantics as :func:`qkv.scaled_dot_product_attention` (torch tensors on the
    CPU only). float32, bfloat16, float64 and float16 (computed in float32, rounded once).
    Gradients flow to query, key, value and a float ``attn_mask``; double backward raises. Goes
    through the ``qkv::attention`` custom op, so ``torch.compile`` keeps it in one graph.
    ``dropout_p > 0`` applies dropout (as torch does, whatever the mode: pass 0 in eval) with a
    seed drawn from torch's default generator (``torch.manual_seed`` reproduces it).
    """
    dropout_p = P.check_dropout_p(_FN, dropout_p)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise TypeError(f"[{_FN}] {name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cpu":
            raise TypeError(f"[{_FN}] {name}: qkv runs on the CPU; got a tensor on {t.device} of shape "
                            f"{list(t.shape)}")
    dts = [query.dtype, key.dtype, value.dtype]
    if dts[0] not in (torch.float32, torch.bfloat16, torch.float64, torch.float16) or len(set(dts)) != 1:
        raise TypeError(f"[{_FN}] query, key, value: dtypes must be one of float32, bfloat16, float64, float16 "
                        f"and match, got {[str(d).replace('torch.', '') for d in dts]}")
    sh = P.sdpa_shapes(_FN, query.shape, key.shape, value.shape, attn_mask is not None, is_causal, enable_gqa)
    if sh.repeat_k > 1 or sh.repeat_v > 1:
        key, value = key.repeat_interleave(sh.repeat_k, -3), value.repeat_interleave(sh.repeat_v, -3)
    lead, H, Hk, L, S, E, Ev = sh.lead, sh.H, sh.Hkv, sh.L, sh.S, sh.E, sh.Ev
    mask4 = None
    if attn_mask is not None:
        if not isinstance(attn_mask, Tensor):
            raise TypeError(f"[{_FN}] attn_mask: expected a torch.Tensor, got {type(attn_mask).__name__}")
        md = attn_mask.dtype
        if md != torch.bool and md not in (torch.float32, torch.bfloat16, torch.float64, torch.float16):
            raise TypeError(f"[{_FN}] attn_mask: dtype must be bool (True = may attend) or float (added to the "
                            f"scores), got {str(md).replace('torch.', '')} (shape {list(attn_mask.shape)})")
        P.check_mask_shape(_FN, attn_mask.shape, sh)
        if md.is_floating_point and md != query.dtype:
            attn_mask = attn_mask.to(query.dtype)   # differentiable: the mask's gradient comes back in its dtype
        mask4 = _rank4(attn_mask, lead, (H, L, S))
    q4 = _rank4(query, lead, (H, L, E))
    k4 = _rank4(key, lead, (Hk, S, E))
    v4 = _rank4(value, lead, (Hk, S, Ev))
    out4, _ = attention(q4, k4, v4, mask=mask4, scale=scale, causal=bool(is_causal), dropout_p=dropout_p)
    return out4.reshape(sh.out_batch + (L, Ev))


# ---------------------------------------------------------------------------------------------
# Packed variable-length sequences
# ---------------------------------------------------------------------------------------------

_FN_VARLEN = "qkv.torch.attention_varlen"


@torch.library.custom_op("qkv::attention_varlen", mutates_args=())
def _attention_varlen_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         scale: Optional[float], causal: bool, align: str, window_left: int, window_right: int,
                         dropout_p: float, seed: Optional[Tensor], softcap: Optional[float] = None,
                         alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    out = torch.empty((q.shape[0], q.shape[1], v.shape[2]), dtype=q.dtype)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=_aux_dtype(q.dtype))
    _qkv.attention_varlen(q, k, v, out, cu_seqlens_q, cu_seqlens_k, lse, scale, causal, align, window_left,
                          window_right, 0, "automatic", dropout_p, _seed_int(seed), 0, softcap, _detached(alibi_slopes),
                          _detached(sinks))
    return out, lse


@_attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal, align, window_left, window_right, dropout_p, seed,
      softcap=None, alibi_slopes=None, sinks=None):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2])), q.new_empty((q.shape[1], q.shape[0]),
                                                                          dtype=_aux_dtype(q.dtype))


@torch.library.custom_op("qkv::attention_varlen_backward", mutates_args=())
def _attention_varlen_backward_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                                  out: Tensor, lse: Tensor, dout: Tensor, scale: Optional[float], causal: bool,
                                  align: str, window_left: int, window_right: int, dropout_p: float,
                                  seed: Optional[Tensor], softcap: Optional[float] = None,
                                  alibi_slopes: Optional[Tensor] = None,
                                  sinks: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
    dsinks = torch.empty((0 if sinks is None else q.shape[1],), dtype=torch.float64)
    _qkv.attention_varlen_backward(q, k, v, out, dout, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, scale, causal,
                                   align, window_left, window_right, 0, "automatic", dropout_p, _seed_int(seed), 0,
                                   softcap, _detached(alibi_slopes), _detached(sinks), None if sinks is None else dsinks)
    return dq, dk, dv, dsinks


@_attention_varlen_backward_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, dout, scale, causal, align, window_left, window_right, dropout_p,
      seed, softcap=None, alibi_slopes=None, sinks=None):
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0 if sinks is None else q.shape[1],), dtype=torch.float64))


torch.library.register_autograd("qkv::attention_varlen_backward", _no_double_backward,
                                setup_context=_setup_backward_op)


def _setup_attention_varlen(ctx, inputs, output):
    q, k, v, cq, ck, scale, causal, align, wl, wr, dropout_p, seed, softcap, alibi_slopes, sinks = inputs
    out, lse = output
    ctx.opts = (scale, causal, align, wl, wr, dropout_p, softcap)
    ctx.save_for_backward(q, k, v, cq, ck, out, lse, seed, alibi_slopes, sinks)


def _attention_varlen_grad(ctx, dout, dlse):
    # lse is returned detached by attention_varlen: dlse carries nothing.
    q, k, v, cq, ck, out, lse, seed, alibi_slopes, sinks = ctx.saved_tensors
    scale, causal, align, wl, wr, dropout_p, softcap = ctx.opts
    dq, dk, dv, dsinks = _attention_varlen_backward_op(q, k, v, cq, ck, out, lse, dout.contiguous(), scale, causal,
                                                       align, wl, wr, dropout_p, seed, softcap, alibi_slopes, sinks)
    dsink = dsinks.to(sinks.dtype) if sinks is not None and ctx.needs_input_grad[14] else None
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None, dsink


torch.library.register_autograd("qkv::attention_varlen", _attention_varlen_grad,
                                setup_context=_setup_attention_varlen)


def _offsets(fn: str, name: str, cu) -> Tensor:
    """cu_seqlens as an int32/int64 tensor [B + 1] (lists and NumPy arrays are converted)."""
    if isinstance(cu, Tensor):
        t = cu
    else:
        t = torch.as_tensor(A.index_array(fn, name, cu))
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
        raise TypeError(f"[{fn}] {name}: expected an int32 or int64 array [B + 1], got {t.dtype} "
                        f"{list(t.shape)}")
    return t


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q, cu_seqlens_k, *,
                     scale: Optional[float] = None, causal: bool = False, align: str = "top_left",
                     window_left: Optional[int] = None, window_right: Optional[int] = None,
                     return_lse: bool = False, dropout_p: float = 0.0, generator: Optional[torch.Generator] = None,
                     seed: Optional[int] = None, softcap: Optional[float] = None, alibi_slopes=None,
                     sinks: Optional[Tensor] = None):
    """Packed variable-length attention, differentiable (FlashAttention's ``flash_attn_varlen_func``).

    q [Tq, H, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv] -> out [Tq, H, Dv]; sequence b owns rows
    cu_seqlens_q[b]:cu_seqlens_q[b+1] of q and cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v.
    Options as :func:`qkv.attention` (``align='bottom_right'`` is FlashAttention's causal
    convention when Sq != Skv; softcap, alibi_slopes and sinks as there). Gradients flow to q, k, v
    and the sinks. With ``return_lse``, returns
    (out, lse [H, Tq]) with lse not differentiable. float16 is computed in float32, rounded once.
    Dropout as :func:`attention` (the mask of sequence b is ``qkv.dropout_mask`` at batch index b).
    """
    dropout_p = P.check_dropout_p(_FN_VARLEN, dropout_p)
    seed_t = _seed_tensor(_FN_VARLEN, dropout_p, generator, seed)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"[{_FN_VARLEN}] {name}: expected a torch.Tensor, got {type(t).__name__}")
    half = q.dtype == torch.float16
    if half:
        q, k, v = q.float(), k.float(), v.float()
    var = P.variants(_FN_VARLEN, q.shape[1], softcap, alibi_slopes, None if sinks is None else sinks.detach(),
                     len(cu_seqlens_q) - 1)  # per-batch slopes: one row per sequence
    slopes = None if var.alibi_slopes is None else torch.as_tensor(var.alibi_slopes)
    if sinks is not None and sinks.dtype not in (torch.float32, torch.float64):
        sinks = sinks.float()
    out, lse = _attention_varlen_op(q, k, v, _offsets(_FN_VARLEN, "cu_seqlens_q", cu_seqlens_q),
                                    _offsets(_FN_VARLEN, "cu_seqlens_k", cu_seqlens_k), P.check_scale(_FN_VARLEN, scale),
                                    bool(causal), align, P.check_window(_FN_VARLEN, "window_left", window_left),
                                    P.check_window(_FN_VARLEN, "window_right", window_right), dropout_p, seed_t,
                                    var.softcap, slopes, sinks)
    lse = lse.detach()
    if half:
        out = out.half()
    return (out, lse) if return_lse else out


__all__: List[str] = ["attention", "attention_varlen", "scaled_dot_product_attention"]
