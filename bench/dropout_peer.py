"""The peer of bench_dropout: torch's CPU scaled_dot_product_attention with dropout_p = 0.1 beside 0,
forward and forward + backward, B = 1, H = 8, S = 2048, D in {64, 128}, f32, one thread, median thread
CPU time of 3 repeats (what other processes on the cores do not inflate). torch takes its flash kernel
at p = 0 and its math path (the N×N pattern and mask materialised) at p > 0.

    python3 bench/dropout_peer.py
"""

import statistics
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
for bwd in (False, True):
    for D in (64, 128):
        for p in (0.0, 0.1):
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.rand(1, 8, 2048, D, generator=g) * 2 - 1 for _ in range(3))
            dout = torch.rand(1, 8, 2048, D, generator=g) * 2 - 1
            for t in (q, k, v):
                t.requires_grad_(bwd)
            times = []
            for _ in range(3):
                t0 = time.thread_time()
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
                if bwd:
                    out.backward(dout)
                times.append((time.thread_time() - t0) * 1e3)
            print(f"{'fwdbwd' if bwd else 'fwd'}/p{p}/S2048/D{D}/T1 torch CPU ms {statistics.median(times):.1f}",
                  flush=True)
