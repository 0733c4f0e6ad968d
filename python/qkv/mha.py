"""qkv.MultiHeadAttention: the attention block as the seeds describe it, over qkv's C++ block.

Each head h has a query map W_Q^h and a key map W_K^h (width -> d_head) and a value map factored
into value-down W_V^h (d_source -> d_value) and value-up W_O^h (d_value -> d_model). The value-ups
of all heads are stapled side by side into one output matrix W_O, so the block's proposed change
to every embedding is  delta = W_O · concat_h(attention of head h) + b_o,  and head h's own share
is  delta^h = W_O^h · (attention of head h).

Weights, in torch.nn.Linear's layout (y = x W^T + b), float32:
    w_q [H·Dh, d_model]   w_k [Hkv·Dh, d_source]   w_v [Hkv·Dv, d_source]   w_o [d_model, H·Dv]
    b_q [H·Dh]            b_k [Hkv·Dh]             b_v [Hkv·Dv]             b_o [d_model]   (bias=True)
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, NamedTuple, Optional

import numpy as np

from . import _arrays as A
from . import _plan as P
from . import _qkv
from ._qkv import FormatError
from . import safetensors as st

Array = Any
_FORMAT = "qkv.MultiHeadAttention"
_CONFIG_KEYS = ("d_model", "d_source", "n_heads", "n_kv_heads", "d_head", "d_value", "bias")


class MhaResult(NamedTuple):
    """What :meth:`MultiHeadAttention.forward` returns; head_delta and pattern only when asked for."""

    delta: Array              # [B, S, d_model]
    head_delta: Optional[Array]  # [B, H, S, d_model]; sums over heads (plus b_o) to delta
    pattern: Optional[Array]  # [B, H, S, Skv], one row per query


class MultiHeadAttention:
    """Multi-head attention with per-head value-down/value-up maps (see the module docstring).

    Args:
        d_model: width of the embeddings x (queries, and the output delta).
        n_heads: H, query heads.
        d_head: Dh, query/key size per head; default d_model // n_heads.
        n_kv_heads: Hkv, key/value heads (grouped-query attention); default n_heads.
        d_value: Dv, value size per head; default d_head.
        d_source: width of the key/value input (cross-attention); default d_model.
        bias: whether the four maps have biases.
        seed: weights drawn N(0, 1/fan_in) (biases N(0, 0.01^2)) from this seed; None leaves zeros.

    The block runs forward only (no autograd: torch inputs are read, not recorded).
    """

    def __init__(self, d_model: int, n_heads: int, *, d_head: Optional[int] = None, n_kv_heads: Optional[int] = None,
                 d_value: Optional[int] = None, d_source: Optional[int] = None, bias: bool = False,
                 seed: Optional[int] = 0):
        fn = "qkv.MultiHeadAttention"
        for name, x in (("d_model", d_model), ("n_heads", n_heads)):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x <= 0:
                raise ValueError(f"[{fn}] {name}: must be a positive integer, got {x!r}")
        if d_head is None:
            if d_model % n_heads:
                raise ValueError(f"[{fn}] n_heads: d_model = {d_model} is not a multiple of n_heads = {n_heads} "
                                 f"(each head gets d_model / n_heads dims unless d_head is given); pass d_head, "
                                 f"or an n_heads that divides d_model")
            d_head = d_model // n_heads
        self._native = _qkv.MultiHeadAttention(d_model, d_source or 0, n_heads, n_kv_heads or 0, d_head,
                                               d_value or 0, bool(bias))
        if seed is not None:
            self._native.init_random(seed)
        self._weights = self._native.weights()

    @property
    def config(self) -> Dict[str, Any]:
        """d_model, d_source, n_heads, n_kv_heads, d_head, d_value, bias (defaults resolved)."""
        return dict(zip(_CONFIG_KEYS, self._native.config()))

    def __repr__(self) -> str:
        return "MultiHeadAttention(" + ", ".join(f"{k}={v}" for k, v in self.config.items()) + ")"

    # ---- weights: writable NumPy views of the block's own memory
    def _weight_names(self):
        return ("w_q", "w_k", "w_v", "w_o") + (("b_q", "b_k", "b_v", "b_o") if self.config["bias"] else ())

    def state_dict(self) -> Dict[str, np.ndarray]:
        """Copies of the weights by name (w_q, w_k, w_v, w_o, and b_* when bias)."""
        return {k: self._weights[k].copy() for k in self._weight_names()}

    def load_state_dict(self, weights: Mapping[str, Any]) -> None:
        """Sets every weight from `weights` (NumPy arrays or torch tensors); names and shapes must match."""
        fn = "qkv.MultiHeadAttention.load_state_dict"
        want = set(self._weight_names())
        if set(weights) != want:
            raise ValueError(f"[{fn}] weights: expected names {sorted(want)}, got {sorted(weights)}")
        arrays = {}
        for k in sorted(want):
            kind, a = A.kind_of(weights[k], k, fn)
            a = np.asarray(a.detach().cpu().float() if kind is A.TorchKind else a)
            if a.shape != self._weights[k].shape:
                raise ValueError(f"[{fn}] {k}: expected shape {list(self._weights[k].shape)}, got {list(a.shape)}")
            if a.dtype.kind != "f" and a.dtype.name != "bfloat16":
                raise TypeError(f"[{fn}] {k}: expected a float array, got {a.dtype}")
            arrays[k] = a
        for k, a in arrays.items():   # all checked before any is written
            self._weights[k][...] = a

    @property
    def w_q(self) -> np.ndarray:
        """[H·Dh, d_model] query maps of all heads (rows h·Dh … (h+1)·Dh are head h's)."""
        return self._weights["w_q"]

    @property
    def w_k(self) -> np.ndarray:
        """[Hkv·Dh, d_source] key maps."""
        return self._weights["w_k"]

    @property
    def w_v(self) -> np.ndarray:
        """[Hkv·Dv, d_source] value-down maps."""
        return self._weights["w_v"]

    @property
    def w_o(self) -> np.ndarray:
        """[d_model, H·Dv] the stapled value-up maps (columns h·Dv … (h+1)·Dv are head h's)."""
        return self._weights["w_o"]

    def head_weights(self, h: int) -> Dict[str, np.ndarray]:
        """Head h's own maps (views): query [Dh, d_model], key, value_down [Dv, d_source], value_up [d_model, Dv]."""
        c = self.config
        if not 0 <= h < c["n_heads"]:
            raise ValueError(f"[qkv.MultiHeadAttention.head_weights] h: must be in [0, {c['n_heads']}), got {h}")
        g = h // (c["n_heads"] // c["n_kv_heads"])
        Dh, Dv = c["d_head"], c["d_value"]
        return {"query": self.w_q[h * Dh:(h + 1) * Dh], "key": self.w_k[g * Dh:(g + 1) * Dh],
                "value_down": self.w_v[g * Dv:(g + 1) * Dv], "value_up": self.w_o[:, h * Dv:(h + 1) * Dv]}

    # ---- the forward
    def forward(self, x: Array, source: Optional[Array] = None, *, mask: Optional[Array] = None,
                key_lengths: Optional[Array] = None, scale: Optional[float] = None, causal: bool = False,
                align: str = "top_left", window_left: Optional[int] = None, window_right: Optional[int] = None,
                return_head_delta: bool = False, return_pattern: bool = False, num_threads: int = 0,
                kernel: str = "automatic") -> MhaResult:
        """delta = W_O · attention(W_Q x, W_K s, W_V s) + b_o, with s = source (cross-attention) or x.

        x [B, S, d_model] (or [S, d_model]) and source [B, Skv, d_source], float32, NumPy or torch,
        any strides. The attention options are those of :func:`qkv.attention`. Returns
        MhaResult(delta [B, S, d_model], head_delta [B, H, S, d_model] | None,
        pattern [B, H, S, Skv] | None) in the framework of x.
        """
        fn = "qkv.MultiHeadAttention"
        named = [("x", x)] + ([("source", source)] if source is not None else [])
        kind, arrays = A.common_kind(fn, named)
        for (name, _), a in zip(named, arrays):
            d = kind.dtype_name(a)
            if d != "float32":
                raise TypeError(f"[{fn}] {name}: dtype must be float32, got {d} (shape {list(A.shape_of(a))})")
        unbatched = len(A.shape_of(arrays[0])) == 2
        if unbatched:
            arrays = [a[None] for a in arrays]
        xs = A.shape_of(arrays[0])
        if len(xs) != 3:
            raise ValueError(f"[{fn}] x: expected [B, S, d_model] or [S, d_model], got {list(A.shape_of(x))}")
        src = arrays[1] if source is not None else None
        B, S, H = xs[0], xs[1], self.config["n_heads"]
        Skv = A.shape_of(src)[1] if src is not None and len(A.shape_of(src)) == 3 else S
        C = self.config["d_model"]
        P.reserve(fn, "results", arrays[0], ((B, S, C), None), ((B, H, S, C) if return_head_delta else (0,), None),
                 ((B, H, S, Skv) if return_pattern else (0,), None))
        delta = kind.empty((B, S, self.config["d_model"]), arrays[0])
        head_delta = kind.empty((B, H, S, self.config["d_model"]), arrays[0]) if return_head_delta else None
        pattern = kind.empty((B, H, S, Skv), arrays[0]) if return_pattern else None
        n = kind.native
        m = None if mask is None else n(P.check_mask(fn, kind, mask, "mask"))
        kl = None if key_lengths is None else A.index_array(fn, "key_lengths", key_lengths)
        self._native.forward(n(arrays[0]), None if src is None else n(src), delta, head_delta, pattern, m, kl,
                             P.check_scale(fn, scale), bool(causal), align, P.check_window(fn, "window_left", window_left),
                             P.check_window(fn, "window_right", window_right), int(num_threads), kernel)
        if unbatched:
            delta, head_delta, pattern = (None if t is None else t[0] for t in (delta, head_delta, pattern))
        return MhaResult(delta, head_delta, pattern)

    def __call__(self, x: Array, source: Optional[Array] = None, **options) -> Array:
        """delta only: ``forward(x, source, **options).delta``."""
        return self.forward(x, source, **options).delta

    # ---- files
    def save(self, path: str) -> None:
        """Writes the configuration (as metadata) and the weights to a safetensors file."""
        meta = {"format": _FORMAT, **{k: str(v) for k, v in self.config.items()}}
        st.save_file(self.state_dict(), path, meta)

    @classmethod
    def load(cls, path: str) -> "MultiHeadAttention":
        """A block read from a safetensors file written by :meth:`save` (configuration and weights)."""
        fn = "qkv.MultiHeadAttention.load"
        tensors, meta = st.load_file(path)
        if meta.get("format") != _FORMAT or not all(k in meta for k in _CONFIG_KEYS):
            raise FormatError(f"[{fn}] {path}: metadata must hold format={_FORMAT!r} and {', '.join(_CONFIG_KEYS)}; "
                             f"got {meta}")
        try:
            c = {k: int(meta[k]) for k in _CONFIG_KEYS if k != "bias"}
        except ValueError:
            raise FormatError(f"[{fn}] {path}: configuration values must be integers, got {meta}") from None
        if meta["bias"] not in ("True", "False"):
            raise FormatError(f"[{fn}] {path}: bias must be 'True' or 'False', got {meta['bias']!r}")
        block = cls(c["d_model"], c["n_heads"], d_head=c["d_head"], n_kv_heads=c["n_kv_heads"], d_value=c["d_value"],
                    d_source=c["d_source"], bias=meta["bias"] == "True", seed=None)
        block.load_state_dict(tensors)
        return block
