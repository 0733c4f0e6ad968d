#!/usr/bin/env python3
"""How qkv degrades when another multi-threaded process shares the cores (issue #16, item 9).

Three workloads, each at QKV_NUM_THREADS threads (default 2):
  train     `qkv train` on tinyshakespeare for 60 steps: tokens/s (median of the
            progress rows of its loss.csv after the first)
  forward   bench_attention, forward B=1 H=16 S=512 D=64 causal f32: GFLOP/s
  decode    bench_model --gpt2-small (random GPT-2 small weights, 124 M parameters): decode
            tokens/s, each token one team of threads meeting ~60 times at barriers
each run quiet and then beside a busy process of --busy-threads threads (a NumPy matmul loop, or a
second `qkv train`), interleaved round by round (quiet, busy, quiet, busy, ...) so that drifts of
the shared machine fall on both; medians per workload and the ratio busy / quiet. qkv meets the
goal of issue #16 when every ratio is at least 1/3 (two busy threads beside two of qkv's on two
cores leave qkv about half of the machine: an ideal scheduler gives 1/2).

  bench/oversubscription.py [--build build] [--rounds 5] [--busy numpy|qkv] [--busy-threads 2]
                            [--only train,forward,decode] [--name oversubscription]

Through bench/report.py: the machine line (bench_attention --peak before and after, the load of every round),
bench/results/NAME.{md,json} and the plot NAME.png of the busy / quiet ratios.
"""

import argparse
import csv
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "data/tinyshakespeare/input.txt"

BUSY_NUMPY = """
import numpy as np
a = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
while True:
    a = np.tanh(a @ a * 1e-3)
"""


def exe(build, name):
    """build/<name> (qkv), build/bench/<name>, or <name> in a folder of copied binaries."""
    for p in (build / name, build / "bench" / name):
        if p.exists():
            return str(p)
    sys.exit(f"oversubscription.py: no {name} in {build} or {build / 'bench'}")


def env(threads):
    e = dict(os.environ)
    e["QKV_NUM_THREADS"] = str(threads)
    return e


def run_train(build, threads, steps):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([exe(build, "qkv"), "train", "--data", str(DATA), "--out", out, "--steps", str(steps),
                        "--eval-interval", str(10 * steps), "--eval-batches", "1", "--quiet"],
                       env=env(threads), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(pathlib.Path(out) / "loss.csv") as f:
            rows = [float(r["tokens_per_s"]) for r in csv.DictReader(f) if r["tokens_per_s"]]
    return statistics.median(rows[1:] if len(rows) > 1 else rows)


def run_forward(build, threads, _steps):
    flt = f"fwd/qkv/f32/B1/H16/Hkv16/S512/D64/causal/T{threads}/"
    r = subprocess.run([exe(build, "bench_attention"), f"--benchmark_filter={flt}", "--benchmark_format=json",
                        "--benchmark_min_time=1"], env=env(threads), check=True, capture_output=True, text=True)
    rows = json.loads(r.stdout)["benchmarks"]
    if not rows:
        sys.exit(f"oversubscription.py: no bench_attention case matches {flt}")
    return rows[0]["GFLOPs"]  # the counter is already in GFLOP/s


def run_decode(build, threads, steps):
    r = subprocess.run([exe(build, "bench_model"), "--gpt2-small", "--prompt", "16", "--decode", str(steps),
                        "--repeats", "1"], env=env(threads), check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])["decode_tok_s"]


WORKLOADS = {"train": (run_train, 60, "tok/s"), "forward": (run_forward, 0, "GFLOP/s"),
             "decode": (run_decode, 48, "tok/s")}


def start_busy(kind, build, threads):
    if kind == "numpy":
        e = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                 MKL_NUM_THREADS=str(threads))
        p = subprocess.Popen([sys.executable, "-c", BUSY_NUMPY], env=e)
    else:
        out = tempfile.mkdtemp(prefix="qkv_busy_")
        p = subprocess.Popen([exe(build, "qkv"), "train", "--data", str(DATA), "--out", out, "--steps", "1000000",
                              "--eval-interval", "1000000", "--quiet"], env=env(threads),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.0)  # let it reach its steady state
    if p.poll() is not None:
        sys.exit(f"oversubscription.py: the busy process ({kind}) exited with {p.returncode}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--busy", choices=["numpy", "qkv"], default="numpy")
    ap.add_argument("--busy-threads", type=int, default=2)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("QKV_NUM_THREADS", "2")))
    ap.add_argument("--only", default="train,forward,decode")
    ap.add_argument("--name", default="oversubscription", help="writes bench/results/NAME.{md,json,png}")
    a = ap.parse_args()
    build = pathlib.Path(a.build)
    names = a.only.split(",")
    for n in names:
        if n not in WORKLOADS:
            sys.exit(f"oversubscription.py: --only: unknown workload '{n}' (known: {', '.join(WORKLOADS)})")
    figures = {n: {"quiet": [], "busy": []} for n in names}
    before = report.measure_peak(str(build))
    loads = [report.loadavg()]
    print(f"machine before: {before}", flush=True)
    for r in range(a.rounds):
        for n in names:
            fn, steps, unit = WORKLOADS[n]
            quiet = fn(build, a.threads, steps)
            busy_proc = start_busy(a.busy, build, a.busy_threads)
            try:
                busy = fn(build, a.threads, steps)
            finally:
                busy_proc.kill()
                busy_proc.wait()
            figures[n]["quiet"].append(quiet)
            figures[n]["busy"].append(busy)
            loads.append(report.loadavg())
            print(f"round {r + 1} {n}: quiet {quiet:.1f} {unit}, beside busy {busy:.1f} {unit}; load {loads[-1]}",
                  flush=True)
    after = report.measure_peak(str(build))
    machine = report.machine_line(before, after, loads)
    lines = [f"| workload | quiet (median) | beside a busy {a.busy_threads}-thread {a.busy} process | ratio |",
             "|---|---|---|---|"]
    worst = 1.0
    ratios = {}
    for n in names:
        q, b = report.median(figures[n]["quiet"]), report.median(figures[n]["busy"])
        ratios[n] = b / q
        worst = min(worst, b / q)
        lines.append(f"| {n} | {q:.1f} {WORKLOADS[n][2]} | {b:.1f} {WORKLOADS[n][2]} | {b / q:.2f} |")
    lines.append(f"\nworst ratio {worst:.2f} (goal: at least 0.33)")
    print("\n" + "\n".join(lines) + "\n" + machine)
    report.write_results(a.name, report.command_line(), machine, "\n".join(lines),
                         {"threads": a.threads, "busy": a.busy, "busy_threads": a.busy_threads, "figures": figures,
                          "loads": loads, "before": before, "after": after})
    report.bar_plot(a.name + ".png", f"qkv beside a busy {a.busy_threads}-thread {a.busy} process: speed busy / quiet "
                    "(1/2 is a fair share of 2 cores; goal ≥ 1/3)", names, {"busy / quiet": [ratios[n] for n in names]},
                    "ratio of medians", machine, ref=0.5)


if __name__ == "__main__":
    main()
