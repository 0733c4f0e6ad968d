"""Shared setup and oracles for the qkv Python tests.

The oracle for qkv's own options (windows, alignment, key lengths, packed sequences) is
`reference_attention`, a direct NumPy float64 transcription of the formula in
include/qkv/attention.hpp, independent of the C++ code. The oracle for PyTorch semantics is torch.
"""

import os

import numpy as np
import pytest

import qkv

# Two cores on the project's machines, shared with other work: never oversubscribe them.
if "QKV_NUM_THREADS" not in os.environ:
    qkv.set_num_threads(2)

try:
    import torch

    torch.set_num_threads(2)
except ImportError:  # the torch tests skip themselves
    torch = None


def reference_attention(q, k, v, *, mask=None, key_lengths=None, scale=None, causal=False, align="top_left",
                        window_left=None, window_right=None):
    """(out, lse, pattern) in float64 for q [B,H,Sq,D], k [B,Hkv,Skv,D], v [B,Hkv,Skv,Dv]."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    B, H, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    k = np.repeat(k, H // Hkv, axis=1)
    v = np.repeat(v, H // Hkv, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * (1.0 / np.sqrt(D) if scale is None else scale)
    i = np.arange(Sq)[:, None]
    j = np.arange(Skv)[None, :]
    diag = i + (Skv - Sq if align == "bottom_right" else 0)
    allowed = np.ones((B, H, Sq, Skv), dtype=bool)
    if causal:
        allowed &= j <= diag
    if window_left is not None:
        allowed &= j >= diag - window_left
    if window_right is not None:
        allowed &= j <= diag + window_right
    if key_lengths is not None:
        allowed &= j[None, None] < np.asarray(key_lengths)[:, None, None, None]
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == bool:
            allowed &= mask
        else:
            s = s + mask.astype(np.float64)
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    live = np.isfinite(m)
    e = np.where(np.isfinite(s), np.exp(s - np.where(live, m, 0.0)), 0.0)
    z = e.sum(axis=-1, keepdims=True)
    p = np.where(live, e / np.where(live, z, 1.0), 0.0)
    lse = np.where(live, m + np.log(np.where(live, z, 1.0)), -np.inf)[..., 0]
    return p @ v, lse, p


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)
