"""The safetensors file format, read and written with NumPy (no other dependency).

    [8 bytes: N, little-endian u64] [N bytes: JSON header, space-padded] [data]

The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into
the data section) and may hold "__metadata__", a map of strings to strings. Everything is checked
against the file's size before any tensor is read; files are written to a temporary name and
renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Dict, Mapping, Optional, Tuple

import numpy as np

_MAX_HEADER = 100 * 1024 * 1024  # the format's own limit on the JSON header

# safetensors dtype name -> (numpy dtype or None for bfloat16, bytes per element)
_DTYPES = {"F64": (np.float64, 8), "F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (None, 2),
           "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
           "U8": (np.uint8, 1), "BOOL": (np.bool_, 1)}


def _bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("[qkv.safetensors] BF16 tensors need the ml_dtypes package (pip install ml_dtypes)") from None
    return ml_dtypes.bfloat16


def _name_of(dtype: np.dtype, fn: str, key: str) -> str:
    if dtype.name == "bfloat16":
        return "BF16"
    for name, (np_dtype, _) in _DTYPES.items():
        if np_dtype is not None and dtype == np.dtype(np_dtype):
            return name
    raise TypeError(f"[{fn}] {key}: dtype {dtype} has no safetensors name")


def save_file(tensors: Mapping[str, np.ndarray], path: str, metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes `tensors` (name -> array, any layout; stored row-major) and string `metadata` to `path`."""
    fn = "qkv.safetensors.save_file"
    header: Dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError(f"[{fn}] metadata: keys and values must be strings, got {dict(metadata)!r}")
        header["__metadata__"] = dict(metadata)
    blobs, offset = [], 0
    for key in sorted(tensors):
        if key == "__metadata__":
            raise ValueError(f"[{fn}] tensor name '__metadata__' is reserved")
        a = np.ascontiguousarray(tensors[key])
        data = a.tobytes()
        header[key] = {"dtype": _name_of(a.dtype, fn, key), "shape": list(a.shape),
                       "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".safetensors")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            for b in blobs:
                f.write(b)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def load_file(path: str) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """(tensors, metadata) of a safetensors file; every header field is validated first."""
    fn = "qkv.safetensors.load_file"
    with open(path, "rb") as f:
        raw = f.read()
    size = len(raw)

    def bad(what: str):
        raise ValueError(f"[{fn}] {path}: {what}")

    if size < 8:
        bad(f"file of {size} bytes is shorter than the 8-byte header length")
    n = int.from_bytes(raw[:8], "little")
    if n > _MAX_HEADER or n > size - 8:
        bad(f"header length {n} exceeds the file ({size} bytes) or the format's limit")
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        bad(f"header is not valid JSON ({e})")
    if not isinstance(header, dict):
        bad("header is not a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        bad("__metadata__ must map strings to strings")
    data_size = size - 8 - n
    spans, tensors = [], {}
    for key, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            bad(f"tensor '{key}': expected keys dtype, shape, data_offsets, got {entry!r}")
        dtype, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in _DTYPES:
            bad(f"tensor '{key}': unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            bad(f"tensor '{key}': shape must be a list of non-negative ints, got {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2 or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1] <= data_size):
            bad(f"tensor '{key}': data_offsets {offs!r} outside the data section of {data_size} bytes")
        np_dtype, itemsize = _DTYPES[dtype]
        count = 1
        for d in shape:
            count *= d
        if count * itemsize != offs[1] - offs[0]:
            bad(f"tensor '{key}': {dtype}{shape} needs {count * itemsize} bytes, data_offsets give "
                f"{offs[1] - offs[0]}")
        spans.append((offs[0], offs[1], key))
        start = 8 + n + offs[0]
        buf = np.frombuffer(raw, dtype=np.uint8, count=offs[1] - offs[0], offset=start)
        tensors[key] = buf.view(np_dtype if np_dtype is not None else _bfloat16()).reshape(shape).copy()
    spans.sort()
    for (b0, e0, k0), (b1, e1, k1) in zip(spans, spans[1:]):
        if b1 < e0:
            bad(f"tensors '{k0}' and '{k1}' overlap in the data section")
    return tensors, dict(metadata)
