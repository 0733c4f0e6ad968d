"""qkv as a Hugging Face transformers attention implementation: ``attn_implementation="qkv"``.

    import qkv.transformers                      # registers "qkv" (attention and mask functions)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="qkv")
    model.set_attn_implementation("qkv")         # or switch a loaded model

Every attention call of the model then runs qkv's kernels: through ``qkv.torch.attention`` (the
``qkv::attention`` custom op, differentiable) when gradients are recorded or torch.compile traces,
and straight into the kernel otherwise (inference: the op's dispatch would cost ~50 us per call). Tested with transformers 5.x (5.24); the attention
function follows the ``AttentionInterface`` signature of that line:

    fn(module, query [B, H, L, D], key [B, Hkv, S, D], value [B, Hkv, S, Dv], attention_mask,
       dropout=0.0, scaling=None, is_causal=None, **kwargs) -> (out [B, L, H, Dv], weights | None)

Masks. Without a mask function registered for "qkv", transformers builds no mask at all and the
padding (and, for some cache layouts, the causal rule) would be silently lost; ``mask`` below is
registered with ``AttentionMaskInterface`` for that reason. It returns:
  - for an encoder's padding mask (bidirectional, no overlay): a bool [B, 1, 1, S] key mask,
    never an N×N one; qkv runs it as key lengths when it is a prefix (right padding, BERT's);
  - for anything else: transformers' own bool [B, 1, L, S] mask (sdpa_mask, never skipped).
The attention function then maps a bool mask onto qkv's structured options when that is exact:
bottom-right causal, with a sliding window when the model has one, key lengths for right
padding; it checks the whole mask against the structure it chose (once per mask object, not per
layer) and otherwise passes the bool mask itself. Either way the result is exact.

Attention dropout runs as eager's does: with the layer's probability in training mode (the seed
drawn from torch's default generator, so ``torch.manual_seed`` reproduces a step), p = 0 in eval
mode. Gemma 2's logit softcap (``softcap``) and gpt-oss's attention sinks (``s_aux``, with their gradient)
run in qkv's kernels. What qkv cannot do raises NotImplementedError naming the model, the layer and
the feature: position biases (T5), flex BlockMasks.
``output_attentions=True`` returns qkv's pattern (float32 softmax rows, detached from the graph).

A query row with no allowed key (left padding) gives zeros here; eager gives a uniform average
there. Those rows are padding: they are attended by no real token, so no real output differs.
"""

from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor
from transformers import AttentionInterface
from transformers.masking_utils import (AttentionMaskInterface, bidirectional_mask_function, prepare_padding_mask,
                                        sdpa_mask)

from . import _qkv
from . import functional as _functional
from . import torch as _qtorch

try:  # transformers 5's collector of outputs (output_attentions), read to know whether weights are wanted
    from transformers.utils.output_capturing import _active_collector
except ImportError:
    _active_collector = None

NAME = "qkv"


def _where(module) -> str:
    cfg = getattr(module, "config", None)
    model = getattr(cfg, "model_type", None) or getattr(cfg, "_name_or_path", None) or "?"
    return f"model {model!r}, layer {getattr(module, 'layer_idx', '?')} ({type(module).__name__})"


def _unsupported(module, feature: str) -> NotImplementedError:
    return NotImplementedError(f"[qkv.transformers] {_where(module)}: {feature} is not available in qkv's attention; "
                               f"use attn_implementation='eager' or 'sdpa' for this model")


# ---------------------------------------------------------------------------------------------
# The mask function (AttentionMaskInterface)
# ---------------------------------------------------------------------------------------------

def mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
         mask_function=None, attention_mask: Optional[Tensor] = None, allow_is_bidirectional_skip: bool = False,
         use_vmap: bool = False, device="cpu", **kwargs) -> Optional[Tensor]:
    """The mask qkv's attention function reads (see the module docstring): bool, True = may attend."""
    if mask_function is bidirectional_mask_function and allow_is_bidirectional_skip:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        if padding is None:
            return None
        padding = padding[:, kv_offset:kv_offset + kv_length]
        if bool(padding.all()):
            return None
        return padding[:, None, None, :]                           # [B, 1, 1, S]
    kw = dict(kwargs)
    kw.pop("allow_is_causal_skip", None)
    kw.pop("dtype", None)
    if mask_function is not None:
        kw["mask_function"] = mask_function
    return sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask=attention_mask,
                     allow_is_causal_skip=False, allow_is_bidirectional_skip=allow_is_bidirectional_skip,
                     use_vmap=use_vmap, device=device, **kw)


# ---------------------------------------------------------------------------------------------
# From a bool mask to qkv's options
# ---------------------------------------------------------------------------------------------

class _Plan:
    """qkv options equivalent to one bool mask: mask (None or the bool mask), key_lengths, causal, window."""

    __slots__ = ("mask", "key_lengths", "causal", "window_left")

    def __init__(self, mask=None, key_lengths=None, causal=False, window_left=None):
        self.mask, self.key_lengths, self.causal, self.window_left = mask, key_lengths, causal, window_left


_last: Tuple = (None, None, None)   # (weakref to the mask, key, _Plan): layers share one mask object


def _plan(m: Tensor, B: int, L: int, S: int, causal: bool, window: Optional[int]) -> _Plan:
    """The structured form of bool mask m [B|1, 1|H, L|1, S] when one reproduces it exactly, else m itself."""
    global _last
    key = (m._version, tuple(m.shape), B, L, S, causal, window)
    ref, k, p = _last
    if ref is not None and ref() is m and k == key:
        return p
    p = _analyse(m, B, L, S, causal, window)
    _last = (weakref.ref(m), key, p)
    return p


def _analyse(m: Tensor, B: int, L: int, S: int, causal: bool, window: Optional[int]) -> _Plan:
    j = torch.arange(S)
    if m.shape[1] == 1 and m.shape[2] == 1:
        # One key row per batch (an encoder's padding): key lengths when every row is a prefix.
        rows = m[:, 0, 0, :]
        lengths = rows.sum(-1)
        if bool((rows == (j < lengths[:, None])).all()) and bool((lengths > 0).all()):
            if bool((lengths == S).all()):
                return _Plan()
            return _Plan(key_lengths=lengths.expand(B).contiguous())
        return _Plan(mask=m)
    if causal and m.shape[1] == 1 and m.shape[2] == L:
        # Bottom-right causal (queries are the last L of the S keys, as with a KV cache), with the
        # model's sliding window (transformers: key j > i - w, i.e. qkv's window_left = w - 1).
        i = torch.arange(L)[:, None] + (S - L)
        band = j[None, :] <= i
        wl = None
        if window is not None:
            wl = int(window) - 1
            band = band & (j[None, :] >= i - wl)
        if bool((m == band).all()):
            return _Plan(causal=True, window_left=wl)
    return _Plan(mask=m)


# ---------------------------------------------------------------------------------------------
# The attention function (AttentionInterface)
# ---------------------------------------------------------------------------------------------

def _attentions_requested(kwargs) -> bool:
    """Whether the model was called with output_attentions=True (transformers 5 collects the second
    value attention functions return through hooks; the flag itself is not passed down)."""
    if kwargs.get("output_attentions"):
        return True
    if _active_collector is None:
        return False
    collected = _active_collector.get()
    return isinstance(collected, dict) and "attentions" in collected


def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], dropout: float = 0.0, scaling: Optional[float] = None,
                      is_causal: Optional[bool] = None, **kwargs) -> Tuple[Tensor, Optional[Tensor]]:
    """transformers' attention interface on qkv (see the module docstring for shapes and masks)."""
    dropout_p = float(dropout) if module.training else 0.0   # eval mode: no dropout, as transformers does
    if kwargs.get("position_bias") is not None:
        raise _unsupported(module, "'position_bias'")
    # Gemma 2's logit softcap (scale, softcap, then the mask: qkv's order) and gpt-oss's sinks
    # (a per-head logit in every row's softmax, passed as s_aux; its gradient flows to the parameter).
    softcap = kwargs.get("softcap")
    sinks = kwargs.get("s_aux", kwargs.get("sinks"))
    B, H, L, _ = query.shape
    S = key.shape[2]
    if key.shape[1] == 0 or H % key.shape[1]:
        raise ValueError(f"[qkv.transformers] {_where(module)}: query heads ({H}) must be a multiple of key/value "
                         f"heads ({key.shape[1]})")
    causal_module = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = kwargs.get("sliding_window", getattr(module, "sliding_window", None))
    if attention_mask is None:
        # No mask at all: what sdpa does with none (top-left causal for L > 1; a single query row sees all).
        plan = _Plan(causal=bool(causal_module) and L > 1)
        align = "top_left"
    elif isinstance(attention_mask, Tensor) and attention_mask.dim() == 4:
        if attention_mask.dtype == torch.bool:
            plan = _plan(attention_mask, B, L, S, bool(causal_module), window)
        elif attention_mask.is_floating_point():
            plan = _Plan(mask=attention_mask)   # a custom additive 4-D mask, added to the scores as eager does
        else:
            raise _unsupported(module, f"an attention mask of dtype {attention_mask.dtype}")
        align = "bottom_right"
    else:
        raise _unsupported(module, f"an attention mask of type {type(attention_mask).__name__} "
                                   f"(shape {list(getattr(attention_mask, 'shape', []))})")
    m = plan.mask
    if m is not None:
        m = m.expand(B, H, L, S)
    wl = -1 if plan.window_left is None else plan.window_left
    # With attentions requested under dropout, the seed is drawn here so that the weights returned
    # below are the dropped ones that multiplied V, as eager returns them.
    seed = None
    if dropout_p > 0.0 and _attentions_requested(kwargs):
        seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    if (query.dtype != torch.float16 and not torch.compiler.is_compiling() and dropout_p == 0.0
            and not (torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad
                                                  or (sinks is not None and sinks.requires_grad)))):
        # Inference: the kernel directly (the custom op's dispatch costs ~50 us per call, a third of a
        # 600-key decode step); the same kernel and options as the op below.
        out = torch.empty((B, H, L, value.shape[3]), dtype=query.dtype)
        _qkv.attention(query, key, value, out, m, plan.key_lengths, None, None, scaling, plan.causal, align, wl, -1,
                       0, "automatic", softcap=softcap, sinks=None if sinks is None else sinks.detach())
    else:
        out, _ = _qtorch.attention(query, key, value, mask=m, key_lengths=plan.key_lengths, scale=scaling,
                                   causal=plan.causal, align=align, window_left=plan.window_left, dropout_p=dropout_p,
                                   seed=seed, softcap=softcap, sinks=sinks)
    weights = None
    if _attentions_requested(kwargs):
        q, k, v = (t.detach().float() if t.dtype == torch.float16 else t.detach() for t in (query, key, value))
        r = _functional.attention(q, k, v, mask=None if m is None else m.detach(), key_lengths=plan.key_lengths,
                                  scale=scaling, causal=plan.causal, align=align, window_left=plan.window_left,
                                  return_pattern=True, dropout_p=dropout_p, seed=seed, softcap=softcap,
                                  sinks=None if sinks is None else sinks.detach().float())
        weights = r.pattern.to(query.dtype)
    return out.transpose(1, 2).contiguous(), weights


AttentionInterface.register(NAME, attention_forward)
AttentionMaskInterface.register(NAME, mask)
