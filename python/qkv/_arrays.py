"""Array plumbing under every qkv entry point.

Three kinds of input are accepted: NumPy arrays (float32, float64, bfloat16 from ml_dtypes,
bool), torch CPU tensors, and any other DLPack producer (read as NumPy, or as torch for
bfloat16). Outputs are allocated in the framework of the inputs.

The kernels take rank-4 strided views [B, H, S, D] with element strides >= 0. This module maps
PyTorch's broadcasting rules onto that layout without copying: a broadcast dimension becomes a
stride-0 dimension, and the leading "batch" dimensions are merged into the single B dimension
whenever their strides allow it (a contiguous or uniformly strided batch always does). Only when
they do not (e.g. two independently broadcast batch dimensions) is that one input materialised.
A NumPy array with negative strides (x[::-1]) is copied, since qkv reads forward only.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence, Tuple

import numpy as np

Shape = Tuple[int, ...]

FLOAT_DTYPES = ("float32", "bfloat16", "float64")


def _torch():
    """The torch module if it has been imported by anyone (qkv never imports it just to look)."""
    return sys.modules.get("torch")


class NumpyKind:
    """NumPy arrays (ml_dtypes.bfloat16 included)."""

    name = "numpy"

    @staticmethod
    def dtype_name(x: np.ndarray) -> str:
        return "bool" if x.dtype == np.bool_ else x.dtype.name

    @staticmethod
    def strides(x: np.ndarray) -> Shape:
        return tuple(s // x.itemsize for s in x.strides)

    @staticmethod
    def prepare(x: np.ndarray) -> np.ndarray:
        # qkv reads through non-negative element strides; anything else is copied once.
        if any(s < 0 or s % x.itemsize for s in x.strides):
            return np.ascontiguousarray(x)
        return x

    @staticmethod
    def strided(x: np.ndarray, shape: Sequence[int], strides: Sequence[int]) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(
            x, shape=tuple(shape), strides=tuple(s * x.itemsize for s in strides), writeable=False)

    @staticmethod
    def contiguous(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x)

    @staticmethod
    def empty(shape: Sequence[int], like: np.ndarray, dtype: Optional[str] = None) -> np.ndarray:
        return np.empty(tuple(shape), dtype=like.dtype if dtype is None else np.dtype(dtype))

    @staticmethod
    def native(x: np.ndarray) -> np.ndarray:
        # NumPy's DLPack has no bfloat16: the native layer reads a uint16 array as bf16 bits.
        return x.view(np.uint16) if x.dtype.name == "bfloat16" else x


class TorchKind:
    """torch tensors on the CPU (autograd history is detached: qkv.torch handles gradients)."""

    name = "torch"

    @staticmethod
    def dtype_name(x) -> str:
        return str(x.dtype).replace("torch.", "")

    @staticmethod
    def strides(x) -> Shape:
        return tuple(x.stride())

    @staticmethod
    def prepare(x):
        if x.device.type != "cpu":
            raise TypeError(f"qkv runs on the CPU; got a tensor on {x.device} of shape {tuple(x.shape)}")
        return x.detach()

    @staticmethod
    def strided(x, shape, strides):
        return x.as_strided(tuple(shape), tuple(strides))

    @staticmethod
    def contiguous(x):
        return x.contiguous()

    @staticmethod
    def empty(shape, like, dtype: Optional[str] = None):
        t = _torch()
        return t.empty(tuple(shape), dtype=like.dtype if dtype is None else getattr(t, dtype))

    @staticmethod
    def native(x):
        return x


def kind_of(x: Any, name: str, fn: str):
    """(kind, x') for one argument: x' is x itself, or a zero-copy NumPy/torch view of a DLPack producer."""
    if isinstance(x, np.ndarray):
        return NumpyKind, x
    t = _torch()
    if t is not None and isinstance(x, t.Tensor):
        return TorchKind, x
    if hasattr(x, "__dlpack__"):
        try:
            return NumpyKind, np.from_dlpack(x)
        except (TypeError, BufferError, RuntimeError):
            if t is None:
                raise
            return TorchKind, t.from_dlpack(x)
    raise TypeError(f"[{fn}] {name}: expected a NumPy array, a torch tensor or a DLPack producer, "
                    f"got {type(x).__name__}")


def common_kind(fn: str, named: Sequence[Tuple[str, Any]]):
    """Checks that all arrays are of one framework; returns (kind, [prepared arrays])."""
    kinds, arrays = [], []
    for name, x in named:
        kind, a = kind_of(x, name, fn)
        kinds.append(kind)
        arrays.append(kind.prepare(a))
    if any(k is not kinds[0] for k in kinds):
        desc = ", ".join(f"{n}: {k.name}" for (n, _), k in zip(named, kinds))
        raise TypeError(f"[{fn}] arrays must all be NumPy arrays or all torch tensors, got {desc}")
    return kinds[0], arrays


def shape_of(x) -> Shape:
    return tuple(int(n) for n in x.shape)


def broadcast_shapes(fn: str, named: Sequence[Tuple[str, Shape]]) -> Shape:
    """NumPy/PyTorch broadcasting of several shapes, with all shapes in the error message."""
    rank = max((len(s) for _, s in named), default=0)
    out = []
    for d in range(rank):
        size = 1
        for _, s in named:
            i = d - (rank - len(s))
            if i < 0 or s[i] == 1:
                continue
            if size != 1 and s[i] != size:
                desc = ", ".join(f"{n} {list(s)}" for n, s in named)
                raise ValueError(f"[{fn}] batch dimensions do not broadcast: {desc}")
            size = s[i]
        out.append(size)
    return tuple(out)


def broadcasts_to(shape: Shape, target: Shape) -> bool:
    """Whether `shape` broadcasts (right-aligned, size 1 stretching) to exactly `target`."""
    return len(shape) <= len(target) and all(
        n in (1, t) for n, t in zip(reversed(shape), reversed(target)))


def broadcast_strides(shape: Shape, strides: Shape, target: Shape) -> Shape:
    """Strides of `shape` broadcast (right-aligned) to `target`; 0 on every broadcast dimension."""
    out = []
    for d in range(len(target)):
        i = d - (len(target) - len(shape))
        if i < 0 or (shape[i] == 1 and target[d] != 1):
            out.append(0)
        else:
            out.append(strides[i])
    return tuple(out)


def merge_dims(shape: Shape, strides: Shape) -> Optional[Tuple[int, int]]:
    """(size, stride) of one dimension equivalent to `shape`/`strides`, or None if none exists."""
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if not dims:
        return 1, 0
    if any(n == 0 for n, _ in dims):
        return 0, 0
    size, stride = dims[-1]
    for n, s in reversed(dims[:-1]):
        if s != stride * size:
            return None
        size *= n
    return size, stride


def contiguous_strides(shape: Shape) -> Shape:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(int(n), 1)
    return tuple(reversed(out))


def to_rank4(kind, x, lead: Shape, tail: Shape):
    """A [B, *tail] view of x broadcast to lead + tail, with B = prod(lead) (copies only if it must)."""
    full = tuple(lead) + tuple(tail)
    shape = shape_of(x)
    if len(lead) == 1 and shape == full:
        return x  # already [B, *tail]: the common rank-4 call costs nothing here
    st = broadcast_strides(shape, kind.strides(x), full)
    merged = merge_dims(full[: len(lead)], st[: len(lead)])
    if merged is None:
        x = kind.contiguous(kind.strided(x, full, st))
        st = contiguous_strides(full)
        merged = merge_dims(full[: len(lead)], st[: len(lead)])
    b, sb = merged
    return kind.strided(x, (b,) + tuple(tail), (sb,) + st[len(lead):])


def check_float(fn: str, named: Sequence[Tuple[str, Any]], kind) -> str:
    """All arrays share one supported float dtype; returns its name."""
    names = [kind.dtype_name(x) for _, x in named]
    if names[0] not in FLOAT_DTYPES:
        raise TypeError(f"[{fn}] {named[0][0]}: dtype must be float32, bfloat16 or float64, got {names[0]} "
                        f"(shape {list(shape_of(named[0][1]))})")
    for (n, x), d in zip(named, names):
        if d != names[0]:
            desc = ", ".join(f"{m} {dn}{list(shape_of(y))}" for (m, y), dn in zip(named, names))
            raise TypeError(f"[{fn}] {n}: dtypes must match, got {desc}")
    return names[0]


def is_float16(x: Any) -> bool:
    """Whether x is a float16 NumPy array or torch tensor (qkv computes those in float32)."""
    return str(getattr(x, "dtype", "")) in ("float16", "torch.float16")


def float16_to(x: Any, dtype: str) -> Any:
    """x (NumPy or torch) converted to float32 or float16; float16 -> float32 is exact."""
    if isinstance(x, np.ndarray):
        return x.astype(dtype)
    return x.to(getattr(_torch(), dtype))


def index_array(fn: str, name: str, x: Any) -> Any:
    """An integer array (key lengths, cumulative offsets) from an array or a sequence of ints."""
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.int64)
    kind, a = kind_of(x, name, fn)
    a = kind.prepare(a)
    d = kind.dtype_name(a)
    if d not in ("int32", "int64"):
        raise TypeError(f"[{fn}] {name}: dtype must be int32 or int64, got {d} (shape {list(shape_of(a))})")
    if len(a.shape) != 1:
        raise ValueError(f"[{fn}] {name}: expected rank 1, got shape {list(shape_of(a))}")
    return kind.native(a)
