"""Sequences of different lengths without padding: qkv.attention on packed tokens with cu_seqlens
(FlashAttention's varlen layout), checked against attention on each sequence alone.

    python3 examples/python/varlen.py
"""
import numpy as np

import qkv

rng = np.random.default_rng(0)
H, D = 4, 32
lengths = [5, 17, 3, 40]                      # three sentences of a batch, no padding anywhere
cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
T = int(cu[-1])
q, k, v = (rng.standard_normal((T, H, D), dtype=np.float32) for _ in range(3))

res = qkv.attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, causal=True)
print(f"{len(lengths)} sequences, {T} tokens packed, kernel {res.kernel.name}")

# The same result, one sequence at a time in the [B, H, S, D] layout.
worst = 0.0
for b, n in enumerate(lengths):
    sl = slice(cu[b], cu[b + 1])
    one = qkv.attention(*(x[sl].transpose(1, 0, 2)[None] for x in (q, k, v)), causal=True).out
    worst = max(worst, float(np.abs(one[0].transpose(1, 0, 2) - res.out[sl]).max()))
print(f"max difference from attention per sequence: {worst:.1e}")
assert worst < 1e-6  # the same f32 arithmetic per row
