#!/usr/bin/env python3
"""ggml's CPU flash attention (ggml_flash_attn_ext) timed on the shapes of the qkv benchmark grid: a
second peer beside PyTorch SDPA, run by bench/run_bench.py when the `ggml` Python package (PyPI
`ggml-py`, which builds ggml from its vendored sources) is importable.

    python3 bench/ggml_peer.py CASES_JSON REPS        # what run_bench.py calls; prints one JSON line:
                                                      # {"ggml": version, "times": {case: median s}, "loads": {case: load}}
    python3 bench/ggml_peer.py --check                 # ggml's output against torch SDPA on small shapes

ggml's settings: the ggml-cpu backend built for this machine (GGML_NATIVE, AVX-512), the graph run by
ggml_graph_compute_with_ctx with 2 threads, Q in f32 (ggml's only Q type), K and V in f32 for
qkv's fp32 rows and bf16 for its bf16 rows, a causal mask as ggml takes it (an f16 [Skv, Sq] tensor of
0 / −inf) for causal rows, the default precision (f32 accumulators on the CPU). ggml's layouts: Q [D, Sq, H, B], K/V [D, Skv, Hkv, B]
(ne0 first), output [D, H, Sq, B]. The ggml-py bindings declare ggml_flash_attn_ext without its last
argument (logit_softcap), so it is called here through ctypes with the header's full signature.
"""
import ctypes
import json
import os
import sys
import time

import ggml
import ggml.ggml as g
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

F32, F16, BF16 = g.GGML_TYPE_F32, g.GGML_TYPE_F16, g.GGML_TYPE_BF16


def _flash_attn_ext():
    for lib in g.libs:
        try:
            f = lib.ggml_flash_attn_ext
        except AttributeError:
            continue
        f.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_float] * 3
        f.restype = ctypes.c_void_p
        return f
    raise RuntimeError("ggml_flash_attn_ext not found in the ggml libraries")


FLASH = _flash_attn_ext()


def bf16_bits(x):
    """float32 → bfloat16 bits, rounded to nearest even (as torch and qkv round)."""
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


class Case:
    """One attention call as a ggml graph: inputs [B, H, S, D] in numpy, uploaded once."""

    def __init__(self, q, k, v, causal, kv_type):
        B, H, Sq, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
        esz = {F32: 4, F16: 2, BF16: 2}[kv_type]
        # inputs, output, mask, plus the graph and the compute work buffer ggml places in the same pool
        mem = 4 * q.size + 2 * esz * k.size + 4 * q.size + 2 * Skv * Sq + 512 * 1024 * 1024
        self.ctx = g.ggml_init(g.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
        nt = g.ggml_new_tensor_4d
        self.q = nt(self.ctx, F32, D, Sq, H, B)
        self.k = nt(self.ctx, kv_type, D, Skv, Hkv, B)
        self.v = nt(self.ctx, kv_type, D, Skv, Hkv, B)
        put = lambda t, a: ctypes.memmove(g.ggml_get_data(t), a.ctypes.data, a.nbytes)
        put(self.q, np.ascontiguousarray(q, np.float32))
        for t, a in ((self.k, k), (self.v, v)):
            a = np.ascontiguousarray(a, np.float32)
            put(t, a if kv_type == F32 else bf16_bits(a) if kv_type == BF16 else a.astype(np.float16))
        mask = None
        if causal:  # bottom-right aligned as torch's is_causal for Sq = Skv (the grid's causal rows)
            mask = nt(self.ctx, F16, Skv, Sq, 1, 1)
            i = np.arange(Sq)[:, None] + (Skv - Sq)
            put(mask, np.where(np.arange(Skv)[None, :] <= i, 0.0, -np.inf).astype(np.float16))
        out = FLASH(self.ctx, self.q, self.k, self.v, mask, 1.0 / np.sqrt(D), 0.0, 0.0)
        self.out = ctypes.cast(out, ctypes.POINTER(g.ggml_tensor))
        self.graph = g.ggml_new_graph(self.ctx)
        g.ggml_build_forward_expand(self.graph, self.out)
        self.shape = (B, H, Sq, D)

    def run(self, threads=2):
        g.ggml_graph_compute_with_ctx(self.ctx, self.graph, threads)

    def result(self):
        """The output as [B, H, Sq, D] (ggml writes [D, H, Sq, B])."""
        B, H, Sq, D = self.shape
        n = B * H * Sq * D
        a = np.ctypeslib.as_array(ctypes.cast(g.ggml_get_data(self.out), ctypes.POINTER(ctypes.c_float)), (n,))
        return a.reshape(B, Sq, H, D).transpose(0, 2, 1, 3).copy()

    def free(self):
        g.ggml_free(self.ctx)


def inputs(c):
    rng = np.random.default_rng(0)
    u = lambda *s: (rng.random(s, dtype=np.float32) * 2 - 1)
    return u(c["B"], c["H"], c["Sq"], c["D"]), u(c["B"], c["Hkv"], c["Skv"], c["D"]), u(c["B"], c["Hkv"], c["Skv"], c["D"])


def time_cases(cases, reps):
    """({case name: median seconds of `reps` timings, each a loop of runs of ≥ 0.2 s}, {case name: the load average
    after its timings})."""
    res, loads = {}, {}
    for c in cases:
        case = Case(*inputs(c), c["causal"], BF16 if c["dtype"] == "bf16" else F32)
        case.run()
        ts = []
        for _ in range(reps):
            n, t0 = 0, time.perf_counter()
            while True:
                case.run()
                n += 1
                if time.perf_counter() - t0 > 0.2:
                    break
            ts.append((time.perf_counter() - t0) / n)
        case.free()
        res[c["name"]] = report.median(ts)
        loads[c["name"]] = report.loadavg()
        print(c["name"], res[c["name"]], f"load {loads[c['name']]}", file=sys.stderr, flush=True)
    return res, loads


def check():
    """ggml's output against torch SDPA in float64 (so that this script measures a correct call)."""
    import torch
    import torch.nn.functional as F
    worst = 0.0
    for B, H, Hkv, Sq, Skv, D, causal in [(1, 4, 4, 37, 37, 64, False), (2, 4, 2, 64, 64, 128, True), (1, 8, 4, 1, 300, 64, False)]:
        c = dict(B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=Skv, D=D)
        q, k, v = inputs(c)
        tq, tk, tv = (torch.from_numpy(a).double() for a in (q, k, v))
        want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, enable_gqa=H != Hkv).numpy()
        case = Case(q, k, v, causal, F32)
        case.run()
        err = np.abs(case.result() - want).max()
        case.free()
        print(f"B{B} H{H} Hkv{Hkv} Sq{Sq} Skv{Skv} D{D} causal={causal}: max |ggml − torch f64| = {err:.2e}")
        worst = max(worst, err)
    # f32 inputs and accumulation over ≤ 300 keys: a few 1e-7 of |out| ≤ 1 when the call is right;
    # a wrong layout, scale or mask gives errors of order 0.1.
    assert worst < 1e-5, worst
    print("ggml check: ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
    else:
        times, loads = time_cases(json.loads(sys.argv[1]), int(sys.argv[2]))
        print(json.dumps({"ggml": ggml.__version__, "times": times, "loads": loads}))
