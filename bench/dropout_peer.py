#!/usr/bin/env python3
"""Attention dropout, p = 0.1 beside p = 0: qkv (BUILD/bench/bench_dropout) and its peer, torch's CPU
scaled_dot_product_attention, forward and forward + backward, B = 1, H = 8, S = 2048, D in {64, 128}, f32, one
thread. torch takes its flash kernel at p = 0 and its math path (the N×N pattern and mask materialised) at p > 0.

    python3 bench/dropout_peer.py [--build build-ci] [--rounds 3] [--repeats 3] [--name dropout_peer]

Each figure is a CPU time, which other processes on the cores do not inflate: qkv's is Google Benchmark's CPU time
of the row's median over --repeats repetitions, torch's the median thread CPU time of --repeats calls. Rounds
interleave the two (qkv, torch, torch, qkv, ...) and every sample records the load; figures are medians over the
rounds. Without BUILD/bench/bench_dropout (cmake -DQKV_BUILD_BENCH=ON) torch runs alone. Through bench/report.py:
the machine line (bench_attention --peak before and after, when built), bench/results/NAME.{md,json} and the plot
NAME.png of the CPU times.
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

SHAPES = [("fwd", 64, "fwd D = 64"), ("fwd", 128, "fwd D = 128"), ("fwdbwd", 64, "fwd+bwd D = 64"),
          ("fwdbwd", 128, "fwd+bwd D = 128")]  # (bench_dropout's kind, D, column heading)
ROWS = [(kind, D, p) for kind, D, _ in SHAPES for p in (0.0, 0.1)]


def row_name(kind, D, p):
    """bench_dropout's name of a one-thread row (without its /real_time suffix)."""
    return f"{kind}/p{p}/S2048/D{D}/T1"


def torch_cpu_ms(kind, D, p, repeats):
    """torch's median thread CPU ms over `repeats` calls (forward, or forward + backward of a random dout)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(1, 8, 2048, D, generator=g) * 2 - 1 for _ in range(3))
    dout = torch.rand(1, 8, 2048, D, generator=g) * 2 - 1
    for t in (q, k, v):
        t.requires_grad_(kind == "fwdbwd")
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        if kind == "fwdbwd":
            out.backward(dout)
        times.append((time.thread_time() - t0) * 1e3)
    return report.median(times)


def qkv_cpu_ms(exe, kind, D, p, repeats):
    """qkv's CPU ms: the median record of bench_dropout's row over `repeats` repetitions."""
    b = report.gbench_median(exe, [], row_name(kind, D, p) + "/real_time", repeats, report.peer_env())
    return b["cpu_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]


def ms(x):
    """A CPU time in ms as the report prints it: three figures, whole milliseconds from 1000 on."""
    return f"{x:.0f}" if x >= 1000 else f"{x:.3g}"


def table(med):
    """The report's table: per shape, p = 0 → 0.1 on each side (qkv's cost in %, torch's as a factor), then
    torch / qkv at p = 0.1. `med`: side → row name → median CPU ms (qkv's empty when it did not run)."""
    lines = ["| 1 thread, CPU ms, p = 0 → 0.1 | " + " | ".join(h for _, _, h in SHAPES) + " |",
             "|---" * (len(SHAPES) + 1) + "|"]
    for side, label in (("qkv", "qkv"), ("torch", f"torch {torch.__version__.split('+')[0]} SDPA")):
        if med[side]:
            cells = []
            for kind, D, _ in SHAPES:
                a, b = med[side][row_name(kind, D, 0.0)], med[side][row_name(kind, D, 0.1)]
                cells.append(f"{ms(a)} → {ms(b)} " + (f"({100 * (b / a - 1):+.0f} %)" if side == "qkv" else f"({b / a:.1f}×)"))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if med["qkv"]:
        lines += ["", "torch / qkv at p = 0.1: " + ", ".join(
            f"{h} {med['torch'][row_name(k, D, 0.1)] / med['qkv'][row_name(k, D, 0.1)]:.2f}×" for k, D, h in SHAPES)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build-ci", help="the build with bench/bench_dropout and bench/bench_attention")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="dropout_peer", help="writes bench/results/NAME.{md,json,png}")
    a = ap.parse_args()
    torch.set_num_threads(1)
    exe = os.path.join(a.build, "bench", "bench_dropout")
    if not os.path.exists(exe):
        print(f"bench/dropout_peer.py: {exe} is not built (cmake -DQKV_BUILD_BENCH=ON): torch alone", file=sys.stderr)
        exe = None
    before = report.measure_peak(a.build)
    samples = {"qkv": {}, "torch": {}}
    loads = []
    for r in range(a.rounds):
        for i, (kind, D, p) in enumerate(ROWS):
            order = ("qkv", "torch") if (r + i) % 2 == 0 else ("torch", "qkv")
            for side in order:
                if side == "qkv" and exe is None:
                    continue
                ms = (qkv_cpu_ms(exe, kind, D, p, a.repeats) if side == "qkv" else torch_cpu_ms(kind, D, p, a.repeats))
                load = report.loadavg()
                samples[side].setdefault(row_name(kind, D, p), []).append({"cpu_ms": ms, "load": load})
                loads.append(load)
                print(f"{row_name(kind, D, p)} {side} CPU ms {ms:.1f}", flush=True)
    after = report.measure_peak(a.build)
    machine = report.machine_line(before, after, loads)
    med = {side: {n: report.median([x["cpu_ms"] for x in xs]) for n, xs in rows.items()} for side, rows in samples.items()}
    body = (f"B = 1, H = 8, S = 2048, f32, non-causal, one thread; medians of {a.rounds} interleaved rounds, each "
            f"the median of {a.repeats} repeats.\n\n" + table(med))
    print(body + "\n" + machine)
    report.write_results(a.name, report.command_line(), machine, body,
                         {"rounds": a.rounds, "repeats": a.repeats, "torch": torch.__version__, "before": before,
                          "after": after, "samples": samples, "median_cpu_ms": med})
    report.bar_plot(a.name + ".png", "Attention dropout: B=1, H=8, S=2048, f32, non-causal, 1 thread: CPU ms "
                    f"(medians of {a.rounds} rounds, lower is faster)",
                    [h for _, _, h in SHAPES],
                    {f"{side}, p = {p:g}": [med[side].get(row_name(k, D, p)) for k, D, _ in SHAPES]
                     for side in ("qkv", "torch") for p in (0.0, 0.1)}, "CPU ms", machine)


if __name__ == "__main__":
    main()
