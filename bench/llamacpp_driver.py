"""The llama.cpp side of the decode benchmarks (bench/decode_peers.py, bench/llamacpp_peer.py): one child
process per measurement runs llama-cpp-python's low-level API on a GGUF file — a prompt, then `positions` tokens
decoded one at a time, then one prefill of `prefill` tokens — and prints its wall and CPU times as JSON.

Tokens are a fixed arithmetic sequence over the vocabulary (ids ≥ 3), the same for every engine's run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

LLAMA_CPP_CHILD = r"""
import json, sys, time, llama_cpp as L
path, threads, prompt, positions, prefill, vocab = sys.argv[1], *map(int, sys.argv[2:])
quiet = L.llama_log_callback(lambda level, text, data: None)  # kept referenced while llama.cpp may call it
L.llama_log_set(quiet, None)
L.llama_backend_init()
model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = 1024; cp.n_batch = cp.n_ubatch = 512; cp.n_threads = cp.n_threads_batch = threads
ctx = L.llama_init_from_model(model, cp)
batch = L.llama_batch_init(512, 0, 1)
tok = lambda i: (i * 7919 + 1) % (vocab - 3) + 3
def feed(tokens, pos0):
    batch.n_tokens = len(tokens)
    for i, t in enumerate(tokens):
        batch.token[i] = t; batch.pos[i] = pos0 + i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0
        batch.logits[i] = i == len(tokens) - 1
    assert L.llama_decode(ctx, batch) == 0
def clear():
    L.llama_memory_clear(L.llama_get_memory(ctx), True)
def clocks():
    return time.perf_counter(), time.process_time()
feed([tok(i) for i in range(prompt)], 0); feed([tok(prompt)], prompt); clear()  # warm-up
feed([tok(i) for i in range(prompt)], 0)
w0, c0 = clocks()
for pos in range(prompt, positions):
    feed([tok(pos)], pos)
w1, c1 = clocks()
clear()
feed([tok(i) for i in range(prefill)], 0)  # warm-up of the 512-row graph
clear()
w2, c2 = clocks()
feed([tok(i) for i in range(prefill)], 0)
w3, c3 = clocks()
n = positions - prompt
print(json.dumps({"decode_tok_s": n / (w1 - w0), "decode_cpu_ms_per_token": 1e3 * (c1 - c0) / n,
                  "prefill_tok_s": prefill / (w3 - w2), "prefill_cpu_ms": 1e3 * (c3 - c2)}))
"""


def run_llama_cpp(gguf_path: Path, threads: int, positions: int, vocab: int, prompt: int = 16,
                  prefill: int = 512) -> dict:
    """At T > 1 the faster, figure by figure, of OpenMP's two wait policies: ggml's OpenMP team spins
    (the default, best on a quiet machine); on a busy one a spinning thread can wait out a whole time
    slice of a preempted partner at every barrier, and PASSIVE (sleeping, as qkv's runs use) wins."""
    best: dict = {}
    for policy in ("ACTIVE", "PASSIVE") if threads > 1 else ("ACTIVE",):
        p = subprocess.run([sys.executable, "-c", LLAMA_CPP_CHILD, str(gguf_path), str(threads), str(prompt),
                            str(positions), str(prefill), str(vocab)], capture_output=True, text=True, check=True,
                           env=dict(os.environ, OMP_WAIT_POLICY=policy))
        r = json.loads(p.stdout.strip().splitlines()[-1])
        for speed, cpu in (("decode_tok_s", "decode_cpu_ms_per_token"), ("prefill_tok_s", "prefill_cpu_ms")):
            if r[speed] > best.get(speed, 0.0):
                best[speed], best[cpu] = r[speed], r[cpu]
    return best
