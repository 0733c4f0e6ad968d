#!/usr/bin/env python3
"""qkv's model beside llama.cpp (issue #18 item 4): the same random Llama weights, decode tok/s at 1 and 2
threads and prefill of 512 tokens, f32 and 16-bit weights.

    python3 bench/llamacpp_peer.py [--bench-model build-ci/bench/bench_model] [--rounds 3]
                                   [--models random-6.1M,random-110M] [--threads 1,2]

llama.cpp is optional: it comes from PyPI's llama-cpp-python, which compiles llama.cpp from source (its
GGML_NATIVE build uses this CPU's AVX-512 BF16), and the GGUF files are written with the `gguf` package:

    bash scripts/install-peers.sh

Without them the script says so and exits 0 (nothing to compare). Not in scripts/install-deps.sh: the demo and
the tests do not need it, and the source build (the library alone) takes 10–20 minutes on 2 cores.

Models (bench/decode_peers.py's random llamas, N(0, 0.02²) weights from a fixed seed; context 1024 here
so that a 512-token prefill fits):
  random-6.1M   dim 288, hidden 768, 6 layers, 6 heads, vocab 512 (stories15M's layers)
  random-110M   dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000 (stories110M's shape)
The same tensors are written as a llama2.c checkpoint (qkv reads it) and as GGUF f32, bf16 and f16. --check
first compares the last position's logits of an 8-token prompt: llama.cpp on the f32 GGUF (f32 KV cache, flash
attention off) against qkv.Model on the checkpoint (needs the qkv Python package), which shows both run one model.

Rows, each side at its own setting for the weights' type:
  f32    qkv --weights f32                          llama.cpp f32 GGUF
  16-bit qkv --weights bf16 (decode), and for the   llama.cpp bf16 GGUF and f16 GGUF (the faster
         prefill also --gemm-inputs bf16)           of the two is the peer; both are printed)
Decode: a 16-token prompt, then one token at a time up to position 256 (64 for the 110M shape); tok/s
over the decoded tokens. Prefill: 512 tokens in one call into an empty cache, tok/s = 512 / time.
llama.cpp runs at its defaults otherwise (an f16 KV cache, flash attention chosen automatically), as a user
gets it. qkv runs through bench/bench_model (a fresh process per figure, the median of --repeats after a warm-up;
QKV_NUM_THREADS=T); llama.cpp through llama-cpp-python's low-level API in a fresh process (n_threads =
n_threads_batch = T, n_batch = n_ubatch = 512, a warm-up decode first; at T > 1 the faster of OMP_WAIT_POLICY
ACTIVE and PASSIVE), timed around llama_decode. Both
report process CPU seconds too: on a shared machine they move far less with the load than wall time.
Rounds interleave qkv and llama.cpp; medians over the rounds. Through bench/report.py: the machine line (the peak
by bench_attention --peak beside --bench-model before and after, when built; the load after every round),
bench/results/NAME.{md,json} and the plot NAME.png of the decode ratios (--name, default llamacpp_peer).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402
from decode_peers import random_tensors, write_gguf, write_llama2c, write_tokenizer  # noqa: E402
from llamacpp_driver import run_llama_cpp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# name: (dim, hidden, layers, heads, kv_heads, vocab, seq_len)
SHAPES = {
    "random-6.1M": (288, 768, 6, 6, 6, 512, 1024),
    "random-110M": (768, 2048, 12, 12, 12, 32000, 1024),
}
PROMPT, PREFILL = 16, 512
POSITIONS = {"random-6.1M": 256, "random-110M": 64}



CHECK_CHILD = r"""
import sys, numpy as np, llama_cpp as L, qkv
gguf_path, checkpoint, vocab = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokens = [1, 403, 407, 261, 378, 300, 17, 99]
ours = np.asarray(qkv.Model.load(checkpoint).forward(tokens)).reshape(-1, vocab)[-1]
quiet = L.llama_log_callback(lambda level, text, data: None)
L.llama_log_set(quiet, None)
L.llama_backend_init()
model = L.llama_model_load_from_file(gguf_path.encode(), L.llama_model_default_params())
cp = L.llama_context_default_params()
cp.n_ctx = 64; cp.n_threads = 1; cp.type_k = cp.type_v = 0; cp.flash_attn_type = 0  # f32 cache, no flash
ctx = L.llama_init_from_model(model, cp)
batch = L.llama_batch_init(64, 0, 1)
batch.n_tokens = len(tokens)
for i, t in enumerate(tokens):
    batch.token[i] = t; batch.pos[i] = i; batch.n_seq_id[i] = 1; batch.seq_id[i][0] = 0
    batch.logits[i] = i == len(tokens) - 1
assert L.llama_decode(ctx, batch) == 0
theirs = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(vocab,))
print(f"{np.abs(theirs - ours).max():.3g} {np.abs(ours).max():.3g}")
"""


def check_same_model(paths: dict, vocab: int) -> None:
    """llama.cpp's and qkv's logits on the same weights (f32 both): a wrong tensor layout in the GGUF
    runs another model of the same cost, and the timings would still look plausible."""
    p = subprocess.run([sys.executable, "-c", CHECK_CHILD, str(paths["f32.gguf"]), str(paths["bin"]), str(vocab)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        err = p.stderr.strip().splitlines()
        print(f"check: not run ({err[-1] if err else p.returncode})")
        return
    diff, mag = map(float, p.stdout.split())
    print(f"check {paths['bin'].stem}: max |llama.cpp − qkv| over the logits = {diff:.3g} (largest logit {mag:.3g})")
    if diff > 1e-4 * max(mag, 1.0):
        raise SystemExit("llamacpp_peer: llama.cpp and qkv disagree: the GGUF does not hold the checkpoint's model")


def run_qkv(bench_model: str, model: Path, threads: int, weights: str, positions: int, repeats: int) -> dict:
    env = dict(os.environ, QKV_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    base = [bench_model, "--model", str(model), "--repeats", str(repeats), "--weights", weights]
    dec = json.loads(subprocess.run(base + ["--prompt", str(PROMPT), "--decode", str(positions - PROMPT)], env=env,
                                    capture_output=True, text=True, check=True).stdout)
    pre = json.loads(subprocess.run(base + ["--prompt", str(PREFILL), "--decode", "0"] +
                                    (["--gemm-inputs", "bf16"] if weights == "bf16" else []), env=env,
                                    capture_output=True, text=True, check=True).stdout)
    return {"decode_tok_s": dec["decode_tok_s"], "decode_cpu_ms_per_token": dec["decode_cpu_ms_per_token"],
            "prefill_tok_s": pre["prefill_tok_s"], "prefill_cpu_ms": pre["prefill_cpu_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-model", default=str(ROOT / "build-ci" / "bench" / "bench_model"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="bench_model's repeats per qkv figure")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="random-6.1M,random-110M")
    ap.add_argument("--work", default="", help="folder for the generated models (default: a temporary one)")
    ap.add_argument("--name", default="llamacpp_peer", help="writes bench/results/NAME.{md,json,png}")
    ap.add_argument("--check", action="store_true", help="first check that both run the same model (needs qkv's "
                    "Python package; fails when the logits differ by more than 1e-4 of the largest)")
    a = ap.parse_args()
    try:
        import gguf  # noqa: F401, PLC0415
        import llama_cpp  # noqa: F401, PLC0415
    except ImportError as e:
        print(f"llama.cpp peer: skipped, not installed ({e}). Install it with\n"
              '  bash scripts/install-peers.sh')
        return 0
    if not Path(a.bench_model).exists():
        print(f"llamacpp_peer: {a.bench_model} not found (build the ci preset: cmake --build --preset ci)")
        return 2

    work = Path(a.work or tempfile.mkdtemp(prefix="qkv_llamacpp_peer_"))
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in a.models.split(","):
        shape = SHAPES[name]
        paths = {k: work / f"{name}.{k}" for k in ("bin", "tok.bin", "f32.gguf", "bf16.gguf", "f16.gguf")}
        if not all(p.exists() for p in paths.values()):
            t = random_tensors(shape)
            write_llama2c(paths["bin"], shape, t)
            pieces = write_tokenizer(paths["tok.bin"], shape[5])
            for dt in ("f32", "bf16", "f16"):
                write_gguf(paths[f"{dt}.gguf"], shape, t, pieces, dt)
        files[name] = paths
        if a.check:
            check_same_model(paths, shape[5])

    if a.rounds < 1:
        return 0  # --rounds 0: the files (and --check) only
    threads = [int(x) for x in a.threads.split(",")]
    res: dict[tuple, list[dict]] = {}
    build = str(Path(a.bench_model).resolve().parent.parent)
    before = report.measure_peak(build)
    loads = [report.loadavg()]
    for _ in range(a.rounds):
        for name, paths in files.items():
            pos, vocab = POSITIONS[name], SHAPES[name][5]
            for T in threads:
                for w in ("f32", "bf16"):
                    res.setdefault((name, T, "qkv", w), []).append(
                        run_qkv(a.bench_model, paths["bin"], T, w, pos, a.repeats))
                for dt in ("f32", "bf16", "f16"):
                    res.setdefault((name, T, "llama.cpp", dt), []).append(
                        run_llama_cpp(paths[f"{dt}.gguf"], T, pos, vocab, PROMPT, PREFILL))
            loads.append(report.loadavg())
    after = report.measure_peak(build)
    machine = report.machine_line(before, after, loads)
    say = report.Transcript()
    lines = say.lines

    med = lambda key, field: statistics.median(r[field] for r in res[key])  # noqa: E731
    say(f"load (1-min) over the rounds: {', '.join(map(str, loads))}; {a.rounds} interleaved rounds, medians\n")
    for what, field, cpu_field, cpu_unit in (("decode", "decode_tok_s", "decode_cpu_ms_per_token", "CPU ms/token"),
                                             (f"prefill {PREFILL}", "prefill_tok_s", "prefill_cpu_ms", "CPU ms")):
        say(f"{what}, tok/s ({cpu_unit} in brackets):\n")
        say("| model | threads | qkv f32 | llama.cpp f32 | ratio | qkv bf16 | llama.cpp bf16 | llama.cpp f16 "
            "| ratio (vs the faster) |")
        say("|---|---|---|---|---|---|---|---|---|")
        for name in files:
            for T in threads:
                cell = lambda key: f"{med(key, field):.0f} ({med(key, cpu_field):.2f})"  # noqa: E731
                q32, l32 = (name, T, "qkv", "f32"), (name, T, "llama.cpp", "f32")
                q16, lb, lh = (name, T, "qkv", "bf16"), (name, T, "llama.cpp", "bf16"), (name, T, "llama.cpp", "f16")
                best = max(med(lb, field), med(lh, field))
                say(f"| {name} | {T} | {cell(q32)} | {cell(l32)} | {med(q32, field) / med(l32, field):.2f}× "
                    f"| {cell(q16)} | {cell(lb)} | {cell(lh)} | {med(q16, field) / best:.2f}× |")
        say()
    say(machine)
    report.write_results(a.name, report.command_line(), machine, "\n".join(lines),
                         {"rounds": a.rounds, "loads": loads, "before": before, "after": after,
                          "runs": [{"model": k[0], "threads": k[1], "engine": k[2], "dtype": k[3], "samples": v}
                                   for k, v in res.items()]})
    groups = [(name, T) for name in files for T in threads]
    dec = "decode_tok_s"
    report.bar_plot(a.name + ".png", "Decode: qkv tok/s ÷ llama.cpp tok/s (> 1: qkv faster), same random Llama weights",
                    [f"{n}\n{T} thread{'s' if T > 1 else ''}" for n, T in groups],
                    {"f32": [med((n, T, "qkv", "f32"), dec) / med((n, T, "llama.cpp", "f32"), dec) for n, T in groups],
                     "bf16 (llama.cpp: the faster of bf16, f16)":
                         [med((n, T, "qkv", "bf16"), dec) / max(med((n, T, "llama.cpp", "bf16"), dec),
                                                                med((n, T, "llama.cpp", "f16"), dec)) for n, T in groups]},
                    "ratio of decode tok/s", machine, ref=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
