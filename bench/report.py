"""What the attention benchmark drivers (run_bench.py, run_backward_bench.py) share: where results go, the
environment both sides run in, one Google Benchmark row as a median, the machine's measured limits, and the
rewriting of a generated block of BENCHMARKS.md.

A generated block sits between `<!-- NAME:begin (bench/DRIVER.py) -->` and `<!-- NAME:end -->`; update_doc replaces
what lies between and leaves the rest of the file, so the hand-written paragraphs around a table survive a re-run.
"""
import json
import os
import re
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results")


def peer_env():
    """The environment of both sides of a ratio: OMP_WAIT_POLICY=PASSIVE, because on a shared machine threads
    spinning at OpenMP barriers cost small calls several times their work (41.9 ms active against 10.9 ms passive
    for S = 256, D = 64 while others compiled)."""
    return dict(os.environ, OMP_WAIT_POLICY="PASSIVE")


def gbench_median(exe, extra, name, reps, env):
    """One row of a Google Benchmark program: its record of the median over `reps` repeats (the single
    iteration record when reps = 1, where Google Benchmark writes no aggregate)."""
    run = subprocess.run([exe, *extra, "--benchmark_format=json", f"--benchmark_filter=^{re.escape(name)}$",
                          f"--benchmark_repetitions={reps}", "--benchmark_report_aggregates_only=true",
                          "--benchmark_min_time=0.2s"], check=True, capture_output=True, text=True, env=env)
    want = "aggregate" if reps > 1 else "iteration"
    for b in json.loads(run.stdout)["benchmarks"]:
        if b.get("run_type") == want and (want == "iteration" or b.get("aggregate_name") == "median"):
            return b
    raise RuntimeError(f"bench/report.py: {os.path.basename(exe)} gave no median for {name}")


def machine(exe, extra, name, env):
    """The machine's limits as the benchmark program measures them (`--peak`: fp32 FMA peak, read bandwidth,
    STREAM triad), with one short row run, since Google Benchmark writes its context only when a row runs."""
    run = subprocess.run([exe, *extra, "--peak", "--benchmark_format=json", f"--benchmark_filter=^{re.escape(name)}$",
                          "--benchmark_min_time=0.01s"], check=True, capture_output=True, text=True, env=env)
    return json.loads(run.stdout)["context"]


def ratio_summary(xs):
    """'median× (min–max)' of a list of speed ratios ('x×' for one, '—' for none)."""
    if len(xs) < 2:
        return f"{xs[0]:.2f}×" if xs else "—"
    return f"{statistics.median(xs):.2f}× ({min(xs):.2f}–{max(xs):.2f})"


def span(xs, fmt):
    """'lo–hi' of xs in the format fmt, one figure when both ends print alike."""
    lo, hi = fmt.format(min(xs)), fmt.format(max(xs))
    return lo if lo == hi else f"{lo}–{hi}"


def write_atomic(path, text):
    """Writes text to path through a temporary name, so that a failed run leaves the old file whole."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def update_doc(block, driver, table):
    """Replaces BENCHMARKS.md's generated block `block` (written by bench/`driver`) with table. A file without
    the block's markers is left as it is."""
    path = os.path.join(ROOT, "BENCHMARKS.md")
    begin, end = f"<!-- {block}:begin (bench/{driver}) -->", f"<!-- {block}:end -->"
    text = open(path).read() if os.path.exists(path) else ""
    if begin not in text or end not in text:
        return
    head, rest = text.split(begin, 1)
    write_atomic(path, head + begin + "\n" + table + end + rest.split(end, 1)[1])


def save_plot(fig, name):
    """Saves a matplotlib figure as bench/results/NAME through a temporary name."""
    tmp = os.path.join(OUT, name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, os.path.join(OUT, name))
