"""The safetensors file format for NumPy arrays, on the library's own reader and writer.

    [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [data]

The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
the data section) and may hold "__metadata__", a map of strings to strings. Reading, validating
(src/model/safetensors.hpp: every field against the file's size, tensors tiling the data exactly)
and the atomic write (a temporary renamed over the path) are the C++ module's; this file only
converts between NumPy dtypes and the format's names.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

import numpy as np

from . import _qkv

# safetensors dtype name -> NumPy dtype (None: bfloat16, from ml_dtypes)
_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": None,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
           "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("[qkv.safetensors] BF16 tensors need the ml_dtypes package (pip install ml_dtypes)") from None
    return ml_dtypes.bfloat16


def _name_of(dtype: np.dtype, fn: str, key: str) -> str:
    if dtype.name == "bfloat16":
        return "BF16"
    for name, np_dtype in _DTYPES.items():
        if np_dtype is not None and dtype == np.dtype(np_dtype):
            return name
    raise TypeError(f"[{fn}] {key}: dtype {dtype} has no safetensors name")


def save_file(tensors: Mapping[str, np.ndarray], path: str, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (name -> array, any layout; stored row-major, in name order) and string
    `metadata` to `path`."""
    fn = "qkv.safetensors.save_file"
    metadata = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TypeError(f"[{fn}] metadata: keys and values must be strings, got {metadata!r}")
    entries = []
    for key in sorted(tensors):
        a = np.ascontiguousarray(tensors[key])
        entries.append((key, _name_of(a.dtype, fn, key), list(a.shape), a.tobytes()))
    _qkv.safetensors_write(str(path), entries, metadata)


def load_file(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """(tensors, metadata) of a safetensors file; every header field is validated first."""
    raw, metadata = _qkv.safetensors_read(str(path))
    tensors = {}
    for key, (dtype, shape, data) in raw.items():
        np_dtype = _DTYPES[dtype]
        a = np.frombuffer(data, dtype=np_dtype if np_dtype is not None else _bfloat16())
        tensors[key] = a.reshape(shape).copy()  # writable, owning its memory
    return tensors, metadata
