"""KV caches for decoding: contiguous, paged (a block table into a pool, as vLLM and FlashAttention's
``flash_attn_with_kvcache(block_table=...)``) and int8 (a float32 scale per token and head).

:class:`KVCache` is the C++ qkv::AttentionKvCache (include/qkv/kv_cache.hpp), which owns the storage
and the lengths; :func:`attention_kvcache` is the functional form over caller-owned arrays in
FlashAttention's layout. Both run qkv::attention_kvcache
(include/qkv/attention.hpp): the flash-decode kernel on every instruction set, or the float64
reference with ``kernel='reference'``.
"""

from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from . import _arrays as A
from . import _qkv
from . import _plan as P
from .functional import AttentionResult, KernelInfo

Array = Any


def attention_kvcache(q: Array, k_cache: Array, v_cache: Array, *, cache_seqlens: Optional[Array] = None,
                      block_table: Optional[Array] = None, k_scale: Optional[Array] = None,
                      v_scale: Optional[Array] = None, scale: Optional[float] = None, causal: bool = False,
                      align: str = "bottom_right_key_lengths", window_left: Optional[int] = None,
                      window_right: Optional[int] = None, return_lse: bool = False, num_threads: int = 0,
                      kernel: str = "automatic", softcap: Optional[float] = None, alibi_slopes: Any = None,
                      sinks: Optional[Array] = None, keep_first: int = 0) -> AttentionResult:
    """Attention of q [B, H, Sq, D] against a KV cache; returns AttentionResult(out [B, H, Sq, Dv], lse, None, kernel).

    Layout (FlashAttention's flash_attn_with_kvcache, token-major):
        k_cache [B, Skv, Hkv, D], v_cache [B, Skv, Hkv, Dv] without block_table;
        with block_table int32 [B, max_blocks]: a pool k_cache [num_blocks, block_size, Hkv, D]
        (block_size a power of two), key j of sequence b in block block_table[b, j // block_size],
        row j % block_size; Skv = max_blocks * block_size.
        int8 caches: k_cache, v_cache int8 with k_scale, v_scale float32 [num_blocks | B, block_size | Skv, Hkv]:
        the key is k_scale * k_cache (q float32 or bfloat16).
        float16 caches: k_cache, v_cache float16, widened exactly to float32 in the kernel (q float32 or bfloat16).
    cache_seqlens: ints [B], the keys each sequence holds (only those blocks are read); default all.
    align: default 'bottom_right_key_lengths', the last query of sequence b sits at key
        cache_seqlens[b] - 1 (FlashAttention's cache_seqlens, ONNX's nonpad_kv_seqlen).
    keep_first with window_left: StreamingLLM's cache reading, the first keep_first tokens (attention
        sinks) and the last window_left + 1 (the fast kernel reads no key between them).
    The other options are :func:`qkv.attention`'s. No gradients (inference).
    """
    fn = "qkv.attention_kvcache"
    named = [("q", q), ("k_cache", k_cache), ("v_cache", v_cache)]
    kind, (q_, k_, v_) = A.common_kind(fn, named)
    dtype = A.check_float(fn, [("q", q_)], kind)
    qs, ks, vs = A.shape_of(q_), A.shape_of(k_), A.shape_of(v_)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise ValueError(f"[{fn}] q [B, H, Sq, D], k_cache and v_cache [B|blocks, Skv|block_size, Hkv, D] must have "
                         f"rank 4, got q {list(qs)}, k_cache {list(ks)}, v_cache {list(vs)}")
    n = kind.native
    aux = "float64" if dtype == "float64" else "float32"
    out = kind.empty((qs[0], qs[1], qs[2], vs[3]), q_)
    lse = kind.empty(qs[:3], q_, aux) if return_lse else None

    def opt(name, x, dt=None):
        if x is None:
            return None
        if isinstance(x, (list, tuple)):
            x = np.asarray(x, dtype=dt)
        xk, xa = A.kind_of(x, name, fn)
        return xk.native(xk.prepare(xa))

    kl = None if cache_seqlens is None else A.index_array(fn, "cache_seqlens", cache_seqlens)
    var = P.variants(fn, qs[1], softcap, alibi_slopes, sinks, qs[0])
    info = _qkv.attention_kvcache(
        n(q_), n(k_), n(v_), n(out), opt("block_table", block_table, np.int32), opt("k_scale", k_scale),
        opt("v_scale", v_scale), kl, lse, P.check_scale(fn, scale), bool(causal), align,
        P.check_window(fn, "window_left", window_left), P.check_window(fn, "window_right", window_right),
        int(num_threads), kernel, *var, keep_first=P.check_keep_first(fn, keep_first))
    return AttentionResult(out, lse, None, KernelInfo(*info))


class KVCache:
    """A KV cache of ``batch`` sequences of up to ``max_len`` tokens: append, then attend.

    A thin wrapper over the C++ class qkv::AttentionKvCache (include/qkv/kv_cache.hpp), which owns
    the storage and the lengths, writes the rows and runs the attention.

    Args:
        batch, max_len, kv_heads, head_dim: sizes; ``value_dim`` defaults to head_dim.
        dtype: 'float32', 'bfloat16', 'float16' (rounded to nearest on append, widened exactly in the
            kernel; queries float32 or bfloat16) or 'int8' (symmetric per token and head: scale =
            max|x| / 127, dequantised in the decode kernel; queries float32 or bfloat16).
        block_size: None for one contiguous cache per sequence; a power of two (16-256 as vLLM
            and FlashAttention page) for a paged pool of batch * ceil(max_len / block_size)
            blocks, handed to the sequences in order through ``block_table`` [batch, max_blocks];
            a sequence then holds whole blocks (``max_len`` is rounded up to them).
        framework: 'numpy' or 'torch': the arrays the cache holds and :meth:`attend` returns.

    Attributes: ``k``, ``v`` (the storage, FlashAttention's layout), ``k_scale``, ``v_scale``
    (int8 only), ``block_table`` (paged only), ``lengths`` (NumPy int64 [batch], tokens held): views
    of the C++ cache's memory, no copies (writing them writes the cache).
    """

    def __init__(self, batch: int, max_len: int, kv_heads: int, head_dim: int, *, value_dim: Optional[int] = None,
                 dtype: str = "float32", block_size: Optional[int] = None, framework: str = "numpy"):
        fn = "qkv.KVCache"
        for name, x in (("batch", batch), ("max_len", max_len), ("kv_heads", kv_heads), ("head_dim", head_dim)):
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                raise ValueError(f"[{fn}] {name}: must be an int >= 1, got {x!r}")
        if value_dim is not None and (isinstance(value_dim, bool) or not isinstance(value_dim, int) or value_dim < 1):
            raise ValueError(f"[{fn}] value_dim: must be None or an int >= 1, got {value_dim!r}")
        if dtype not in ("float32", "bfloat16", "float16", "int8"):
            raise ValueError(f"[{fn}] dtype: must be 'float32', 'bfloat16', 'float16' or 'int8', got {dtype!r}")
        if framework not in ("numpy", "torch"):
            raise ValueError(f"[{fn}] framework: must be 'numpy' or 'torch', got {framework!r}")
        if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                       or block_size < 1 or block_size & (block_size - 1)):
            raise ValueError(f"[{fn}] block_size: must be None or a power of two, got {block_size!r}")
        if framework == "torch" and A._torch() is None:
            raise ImportError(f"[{fn}] framework='torch': import torch first")
        self._cache = _qkv.AttentionKvCache(batch, max_len, kv_heads, head_dim, dtype, value_dim or 0, block_size or 0)
        self.batch, self.max_len, self.dtype, self.block_size = batch, self._cache.max_len, dtype, block_size
        self.framework = framework
        storage = self._cache.storage()
        self.k, self.v = self._wrap(storage["k"]), self._wrap(storage["v"])
        self.k_scale, self.v_scale = (self._wrap(storage.get(n)) for n in ("k_scale", "v_scale"))
        self.block_table = self._wrap(storage.get("block_table"))
        self.lengths = storage["lengths"]  # NumPy for either framework, as the lengths a caller reads

    def _wrap(self, a: Optional[np.ndarray]):
        """The cache's memory in the cache's framework; bfloat16 arrives as its uint16 bits."""
        if a is None:
            return None
        bf16 = a.dtype == np.uint16
        if self.framework == "torch":
            t = A._torch()
            x = t.from_numpy(a)
            return x.view(t.bfloat16) if bf16 else x
        if bf16:
            import ml_dtypes  # NumPy's bfloat16, as the rest of qkv takes it

            return a.view(ml_dtypes.bfloat16)
        return a

    def append(self, k_new: Array, v_new: Array) -> None:
        """Writes k_new [batch, S, kv_heads, head_dim] and v_new [batch, S, kv_heads, value_dim]
        after each sequence's tokens (quantising them for an int8 cache) and advances ``lengths``."""
        fn = "qkv.KVCache.append"
        kind, (kn, vn) = A.common_kind(fn, [("k_new", k_new), ("v_new", v_new)])
        A.check_float(fn, [("k_new", kn), ("v_new", vn)], kind)
        self._cache.append(kind.native(kn), kind.native(vn))

    def append_to(self, seq: int, k_new: Array, v_new: Array) -> None:
        """Writes k_new [S, kv_heads, head_dim] and v_new [S, kv_heads, value_dim] after the tokens of
        sequence ``seq`` alone (quantising them for an int8 cache) and advances ``lengths[seq]``: the
        other sequences keep theirs (continuous batching: sequences arrive and grow on their own)."""
        fn = "qkv.KVCache.append_to"
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < self.batch:
            raise ValueError(f"[{fn}] seq: must be an int in [0, batch = {self.batch}), got {seq!r}")
        kind, (kn, vn) = A.common_kind(fn, [("k_new", k_new), ("v_new", v_new)])
        A.check_float(fn, [("k_new", kn), ("v_new", vn)], kind)
        self._cache.append_to(int(seq), kind.native(kn), kind.native(vn))

    def reset(self, seq: Optional[int] = None) -> None:
        """Forgets the tokens of every sequence, or of sequence ``seq`` alone (the next :meth:`append`
        writes its rows from position 0 again; the others keep theirs)."""
        if seq is None:
            self._cache.reset()
            return
        if isinstance(seq, bool) or not isinstance(seq, (int, np.integer)) or not 0 <= seq < self.batch:
            raise ValueError(f"[qkv.KVCache.reset] seq: must be None or an int in [0, batch = {self.batch}), got {seq!r}")
        self._cache.reset(int(seq))

    def attend(self, q: Array, *, causal: bool = True, scale: Optional[float] = None,
               align: str = "bottom_right_key_lengths", window_left: Optional[int] = None,
               window_right: Optional[int] = None, return_lse: bool = False, num_threads: int = 0,
               kernel: str = "automatic", softcap: Optional[float] = None, alibi_slopes: Any = None,
               sinks: Optional[Array] = None, keep_first: int = 0) -> Union[Array, AttentionResult]:
        """Attention of q [batch, H, Sq, head_dim] (the newest Sq tokens' queries) against every
        token held: causal by default, each sequence aligned to its own length (the last query sees
        all its keys). The options are :func:`attention_kvcache`'s; returns out [batch, H, Sq, value_dim],
        or the AttentionResult with ``return_lse=True``."""
        fn = "qkv.KVCache.attend"
        kind, (q_, _) = A.common_kind(fn, [("q", q), ("cache.k", self.k)])
        dtype = A.check_float(fn, [("q", q_)], kind)
        qs = A.shape_of(q_)
        if len(qs) != 4:
            raise ValueError(f"[{fn}] q: must be [batch, H, Sq, head_dim] (rank 4), got {list(qs)}")
        out = kind.empty((qs[0], qs[1], qs[2], A.shape_of(self.v)[3]), q_)
        lse = kind.empty(qs[:3], q_, "float64" if dtype == "float64" else "float32") if return_lse else None
        var = P.variants(fn, qs[1], softcap, alibi_slopes, sinks, qs[0])
        info = self._cache.attend(
            kind.native(q_), kind.native(out), lse, P.check_scale(fn, scale), bool(causal), align,
            P.check_window(fn, "window_left", window_left), P.check_window(fn, "window_right", window_right),
            int(num_threads), kernel, *var, keep_first=P.check_keep_first(fn, keep_first))
        return AttentionResult(out, lse, None, KernelInfo(*info)) if return_lse else out
