#!/usr/bin/env python3
"""Decode speed of `qkv generate` beside llama2.c's run.c and llama.cpp (issue #18), end to end.

    python3 bench/decode_peers.py --qkv build-ci/qkv --llama2c ../shared/peers/llama2c [--rounds 5]

Models (greedy, prompt "Once upon a time", 256 positions; 64 for random-110M):
  stories260K      the shipped checkpoint (data/models/stories260K)
  random-6.1M      random llama, stories15M's layers: dim 288, hidden 768, 6 layers, 6 heads, vocab 512
  random-110M      random llama, stories110M's shape: dim 768, hidden 2048, 12 layers, 12 heads, vocab 32000
Random weights are N(0, 0.02²) from a fixed seed, written once as a llama2.c checkpoint (header of 7 int32,
then the f32 tensors in run.c's order) and, for llama.cpp, as GGUF (f32 here; write_gguf also writes f16 and
bf16, which bench/llamacpp_peer.py compares) with the `gguf` package. A
tokenizer of the model's vocabulary is written in llama2.c's format (the 512 pieces of tok512.bin, then filler
pieces), and the same pieces go into the GGUF.

Peers:
  llama2.c   run.c compiled here with `gcc -Ofast -march=native -fopenmp` (its fastest build), run with
             OMP_NUM_THREADS=T; its own "achieved tok/s" is read (it counts every position after the first).
             At T > 1 it runs with OMP_WAIT_POLICY ACTIVE and PASSIVE and the faster counts (CPU seconds: both).
  llama.cpp  through llama-cpp-python (optional: skipped with a message when it is not installed), driven by
             bench/llamacpp_driver.py (shared with llamacpp_peer.py): after a warm-up, tokens are fed one at a time through llama_decode (low-level API), timed around the calls: the Python call
             overhead (a few µs) is included, which matters only for stories260K-sized models.
  qkv        `qkv generate -t 0`, QKV_NUM_THREADS=T; the decode tok/s it prints on stderr (sampled tokens after
             the first / decode time), and --batch-file with 8 prompts for the batched rows, once with
             f32 KV caches (the default), once with --kv-dtype bf16 (caches in bf16: half the bytes) and
             once with --kv-dtype int8 (int8 rows with an f32 scale each: about a quarter of the bytes).

--base BIN (optional): a second qkv binary (main's, say) whose rows, B=1 and batched, run right after
--qkv's in every round, so that both see the same load; the table then has a row for each, and the ratios
of --qkv's tok/s to --base's. --no-peers leaves llama2.c and llama.cpp out (qkv against qkv).

Runs are interleaved (qkv, llama2.c, llama.cpp, qkv, …) for `--rounds` rounds; medians are printed, with
the load after every round and the machine's peak (bench_attention --peak beside --qkv, when built) before and
after. Output: a Markdown table on stdout and, through bench/report.py, bench/results/NAME.{md,json} and the
plot NAME.png (--name, default decode_peers).
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402
from llamacpp_driver import run_llama_cpp  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "data" / "models" / "stories260K"
PROMPT = "Once upon a time"

# Positions per run (greedy, prompt included): 256, 64 for the 110M shape (0.44 GB of f32 weights a token).
STEPS = {"stories260K": 256, "random-6.1M": 256, "random-110M": 64}
# name: (dim, hidden, layers, heads, kv_heads, vocab, seq_len)
SHAPES = {
    "random-6.1M": (288, 768, 6, 6, 6, 512, 256),
    "random-110M": (768, 2048, 12, 12, 12, 32000, 1024),
}


def batch_engines(batch: int) -> list[tuple[str, str]]:
    """(--kv-dtype, engine name) of the batched rows, run in this order in every round."""
    return [("f32", f"qkv B={batch}"), ("bf16", f"qkv B={batch} bf16 KV"), ("int8", f"qkv B={batch} int8 KV")]


def read_tok512() -> list[tuple[float, bytes]]:
    data = (STORIES / "tok512.bin").read_bytes()
    off, out = 4, []
    while off < len(data):
        score, n = struct.unpack_from("<fi", data, off)
        off += 8
        out.append((score, data[off:off + n]))
        off += n
    return out


def write_tokenizer(path: Path, vocab: int) -> list[tuple[float, bytes]]:
    pieces = read_tok512()[:vocab]
    for i in range(len(pieces), vocab):
        pieces.append((-1e6 - i, f"tok{i}".encode()))
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p) for _, p in pieces)))
        for score, p in pieces:
            f.write(struct.pack("<fi", score, len(p)) + p)
    return pieces


def random_tensors(shape, seed=1234):
    dim, hidden, layers, heads, kv, vocab, seq = shape
    head = dim // heads
    rng = np.random.default_rng(seed)
    r = lambda *s: (rng.standard_normal(s, dtype=np.float32) * 0.02).astype(np.float32)  # noqa: E731
    return {
        "tok": r(vocab, dim),
        "att_norm": np.ones((layers, dim), np.float32),
        "wq": r(layers, dim, dim), "wk": r(layers, kv * head, dim), "wv": r(layers, kv * head, dim),
        "wo": r(layers, dim, dim),
        "ffn_norm": np.ones((layers, dim), np.float32),
        "w1": r(layers, hidden, dim), "w2": r(layers, dim, hidden), "w3": r(layers, hidden, dim),
        "norm": np.ones(dim, np.float32),
    }


def write_llama2c(path: Path, shape, t) -> None:
    dim, hidden, layers, heads, kv, vocab, seq = shape
    head = dim // heads
    with open(path, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, layers, heads, kv, vocab, seq))  # vocab > 0: shared classifier
        for k in ("tok", "att_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w2", "w3", "norm"):
            f.write(t[k].tobytes())
        # run.c skips freq_cis_real / freq_cis_imag (seq_len · head_size / 2 floats each).
        f.write(np.zeros(seq * head, np.float32).tobytes())


def write_gguf(path: Path, shape, t, pieces, dtype: str) -> None:
    import gguf  # noqa: PLC0415

    dim, hidden, layers, heads, kv, vocab, seq = shape
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(seq)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(hidden)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(dim // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type({"f32": 0, "f16": 1, "bf16": 32}[dtype])  # llama_ftype: ALL_F32, MOSTLY_F16, MOSTLY_BF16
    w.add_tokenizer_model("llama")
    w.add_token_list([p for _, p in pieces])
    w.add_token_scores([s for s, _ in pieces])
    types = [2, 3, 3] + [1] * (vocab - 3)  # unknown, control (BOS, EOS), normal
    for i, (_, p) in enumerate(pieces):
        if re.fullmatch(rb"<0x[0-9A-F]{2}>", p):
            types[i] = 6  # byte
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    # Matrices in the file's type (norm weights stay f32, as llama.cpp's converter writes them).
    def mat(a):
        if dtype == "f16":
            return a.astype(np.float16)
        if dtype == "bf16":  # nearest-even bf16 bytes, declared as BF16 (the shape is read from the bytes)
            return gguf.quants.quantize(np.ascontiguousarray(a), gguf.GGMLQuantizationType.BF16)
        return a
    # q and k rows as they are: llama2.c's checkpoints keep Meta's interleaved rotary pairs, which is
    # llama.cpp's order for the llama architecture (its converter permutes Hugging Face's rotate-half
    # rows into it). bench/llamacpp_peer.py --check: llama.cpp's logits = qkv's within 5e-7.
    def add(name, a):
        w.add_tensor(name, a, raw_dtype=gguf.GGMLQuantizationType.BF16 if a.dtype == np.uint8 else None)

    add("token_embd.weight", mat(t["tok"]))
    for l in range(layers):
        w.add_tensor(f"blk.{l}.attn_norm.weight", t["att_norm"][l])
        add(f"blk.{l}.attn_q.weight", mat(t["wq"][l]))
        add(f"blk.{l}.attn_k.weight", mat(t["wk"][l]))
        add(f"blk.{l}.attn_v.weight", mat(t["wv"][l]))
        add(f"blk.{l}.attn_output.weight", mat(t["wo"][l]))
        w.add_tensor(f"blk.{l}.ffn_norm.weight", t["ffn_norm"][l])
        add(f"blk.{l}.ffn_gate.weight", mat(t["w1"][l]))
        add(f"blk.{l}.ffn_down.weight", mat(t["w2"][l]))
        add(f"blk.{l}.ffn_up.weight", mat(t["w3"][l]))
    w.add_tensor("output_norm.weight", t["norm"])
    add("output.weight", mat(t["tok"]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# CPU seconds (user + system) of every process run through `timed` since the start: on a machine
# shared with other work the wall-clock tok/s moves with the load, the CPU a run costs much less.
CPU: dict[tuple, list] = {}


def timed(key: tuple, cmd: list, env: dict) -> subprocess.CompletedProcess:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(key, []).append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    return p


def run_qkv(qkv: str, model: Path, tok: Path, threads: int, steps: int, extra=(), key=("qkv",)) -> float:
    env = dict(os.environ, QKV_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    p = timed(key, [qkv, "generate", "--model", str(model), "--tokenizer", str(tok), "-t", "0", "-n", str(steps),
                    *(extra or ["-i", PROMPT])], env)
    m = re.search(r"decode ([0-9.]+) tok/s", p.stderr)
    return float(m.group(1))


def run_llama2c(exe: Path, model: Path, tok: Path, threads: int, steps: int, key=("llama2.c",)) -> float:
    """Its faster of OpenMP's two wait policies at T > 1: spinning (the default) wins on a quiet machine,
    sleeping (PASSIVE, as qkv's runs use) on a busy one, where a spinning team waits a time slice a region."""
    best = 0.0
    for policy in ("ACTIVE", "PASSIVE") if threads > 1 else ("ACTIVE",):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY=policy)
        p = timed(key, [str(exe), str(model), "-z", str(tok), "-t", "0", "-n", str(steps), "-i", PROMPT], env)
        best = max(best, float(re.search(r"achieved tok/s: ([0-9.]+)", p.stderr + p.stdout).group(1)))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default=str(ROOT / "build-ci" / "qkv"))
    ap.add_argument("--llama2c", default=str(ROOT.parent / "shared" / "peers" / "llama2c"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="stories260K,random-6.1M,random-110M")
    ap.add_argument("--batch", type=int, default=8, help="prompts in the --batch-file rows (0: none)")
    ap.add_argument("--work", default="", help="folder for the generated models (default: a temporary one)")
    ap.add_argument("--name", default="decode_peers", help="writes bench/results/NAME.{md,json,png}")
    ap.add_argument("--base", default="", help="a second qkv binary, run interleaved with --qkv (rows 'base')")
    ap.add_argument("--no-peers", action="store_true", help="run neither llama2.c nor llama.cpp")
    a = ap.parse_args()
    # (row label, binary, prefix of its engine names): --qkv's engines are "qkv", "qkv B=8", …
    qkvs = [("qkv", a.qkv, "")] + ([("base", a.base, "base ")] if a.base else [])

    work = Path(a.work or tempfile.mkdtemp(prefix="qkv_decode_peers_"))
    work.mkdir(parents=True, exist_ok=True)
    run_c = Path(a.llama2c) / "run.c"
    llama2c = None
    have_llama_cpp = False
    if a.no_peers:
        print("llama2.c, llama.cpp: skipped (--no-peers)", file=sys.stderr)
    else:
        if run_c.exists() and shutil.which("gcc"):
            llama2c = work / "run"
            subprocess.run(["gcc", "-Ofast", "-march=native", "-fopenmp", str(run_c), "-lm", "-o", str(llama2c)],
                           check=True)
        else:
            print(f"llama2.c: skipped ({run_c} not found or no gcc)", file=sys.stderr)
        try:
            import gguf  # noqa: F401, PLC0415
            import llama_cpp  # noqa: F401, PLC0415
            have_llama_cpp = True
        except ImportError as e:
            print(f"llama.cpp: skipped (bash scripts/install-peers.sh; {e})", file=sys.stderr)

    models = {}
    for name in a.models.split(","):
        if name == "stories260K":
            models[name] = (STORIES / "stories260K.bin", STORIES / "tok512.bin", None)
            continue
        shape = SHAPES[name]
        binp, tokp, ggp = work / f"{name}.bin", work / f"{name}.tok.bin", work / f"{name}.f32.gguf"
        if not binp.exists() or (have_llama_cpp and not ggp.exists()):
            t = random_tensors(shape)
            write_llama2c(binp, shape, t)
            pieces = write_tokenizer(tokp, shape[5])
            if have_llama_cpp:
                write_gguf(ggp, shape, t, pieces, "f32")
        models[name] = (binp, tokp, ggp if have_llama_cpp else None)

    threads = [int(x) for x in a.threads.split(",")]
    results: dict[tuple, list] = {}
    batch_file = work / "prompts.txt"
    batch_file.write_text("".join(f"{PROMPT}{' there was' * (i % 3)}\n" for i in range(max(a.batch, 1))))
    build = str(Path(a.qkv).resolve().parent)
    before = report.measure_peak(build)
    loads = [report.loadavg()]
    for _ in range(a.rounds):
        for name, (binp, tokp, ggp) in models.items():
            steps = STEPS[name]
            for T in threads:
                results.setdefault((name, T, "qkv"), []).append(run_qkv(a.qkv, binp, tokp, T, steps, key=(name, T, "qkv")))
                if a.base:
                    results.setdefault((name, T, "base qkv"), []).append(
                        run_qkv(a.base, binp, tokp, T, steps, key=(name, T, "base qkv")))
                if llama2c:
                    results.setdefault((name, T, "llama2.c"), []).append(
                        run_llama2c(llama2c, binp, tokp, T, steps, key=(name, T, "llama2.c")))
                if ggp:
                    results.setdefault((name, T, "llama.cpp"), []).append(
                        run_llama_cpp(ggp, T, steps, SHAPES[name][5], prompt=5)["decode_tok_s"])
                for kv, eng in batch_engines(a.batch) if a.batch else []:
                    for _, exe, prefix in qkvs:
                        results.setdefault((name, T, prefix + eng), []).append(
                            run_qkv(exe, binp, tokp, T, steps, ["--batch-file", str(batch_file), "--kv-dtype", kv],
                                    key=(name, T, prefix + eng)))
        loads.append(report.loadavg())
    after = report.measure_peak(build)
    machine = report.machine_line(before, after, loads)
    say = report.Transcript()
    lines = say.lines

    say(f"load (1-min) over the rounds: {', '.join(map(str, loads))}; {a.rounds} interleaved rounds, medians, tok/s\n")
    peers = ["llama2.c", "llama.cpp"]
    say("| model | threads | qkv | " + " | ".join(f"{p} | qkv / {p}" for p in peers) +
        f" | qkv B={a.batch} (all sequences) | B={a.batch} / B=1 | B={a.batch}, bf16 KV cache | / B=1 |"
        f" B={a.batch}, int8 KV cache | / B=1 |")
    say("|---|---|---|" + "---|---|" * len(peers) + "---|---|---|---|---|---|")
    for name in models:
        for T in threads:
            for label, _, prefix in qkvs:
                q = statistics.median(results[(name, T, prefix + "qkv")])
                row = f"| {name} | {T} | {q:.0f} |" if label == "qkv" else f"| {name} (base) | {T} | {q:.0f} |"
                for p in peers:
                    r = results.get((name, T, p))
                    row += f" {statistics.median(r):.0f} | {q / statistics.median(r):.2f}× |" if r else " – | – |"
                for _, eng in batch_engines(a.batch):
                    rb = results.get((name, T, prefix + eng))
                    row += f" {statistics.median(rb):.0f} | {statistics.median(rb) / q:.2f}× |" if rb else " – | – |"
                say(row)
    if a.base:
        say(f"\nqkv / base (medians of tok/s), base = {a.base}:")
        for name in models:
            for T in threads:
                parts = [f"{eng} {statistics.median(results[(name, T, eng)]) / statistics.median(results[(name, T, 'base ' + eng)]):.2f}×"
                         for eng in ["qkv"] + [e for _, e in batch_engines(a.batch)] if (name, T, "base " + eng) in results]
                say(f"  {name}, {T} thread{'s' if T > 1 else ''}: " + ", ".join(parts))
    say("\nCPU seconds per run (whole process: load, prefill, decode; medians):")
    for key in sorted(CPU):
        say(f"  {' '.join(map(str, key))}: {statistics.median(CPU[key]):.3f} s")
    for name in models:
        if len(threads) > 1:
            one, two = (statistics.median(results[(name, T, "qkv")]) for T in threads[:2])
            say(f"\nqkv {name}: {threads[1]} threads / {threads[0]} = {two / one:.2f}×")
    say(machine)
    report.write_results(a.name, report.command_line(), machine, "\n".join(lines),
                         {"rounds": a.rounds, "loads": loads, "before": before, "after": after,
                          "tok_s": [{"model": k[0], "threads": k[1], "engine": k[2], "samples": v} for k, v in results.items()],
                          "cpu_s": [{"run": list(map(str, k)), "samples": v} for k, v in CPU.items()]})
    # tok/s relative to qkv at B=1 (one bar per engine, one group per model and thread count): the models'
    # speeds differ by 100×, their ratios fit one axis.
    groups = [(name, T) for name in models for T in threads]
    engines = ["qkv", *peers] + ([eng for _, eng in batch_engines(a.batch)] if a.batch else [])
    engines += ["base " + e for e in engines if a.base and e.startswith("qkv")]
    med = {key: statistics.median(v) for key, v in results.items()}
    report.bar_plot(a.name + ".png", f"Decode tok/s as a share of qkv's (B=1), greedy, medians of {a.rounds} "
                    "interleaved rounds (> 1: faster than qkv)", [f"{n}\n{T} thread{'s' if T > 1 else ''}" for n, T in groups],
                    {e: [med[(n, T, e)] / med[(n, T, "qkv")] if (n, T, e) in med else None for n, T in groups]
                     for e in engines}, "tok/s ÷ qkv's tok/s", machine, ref=1.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
