"""What every benchmark driver in bench/ shares: where results go, the environment both sides run in, one Google
Benchmark row as a median, the machine's measured limits and the load (one machine line), medians and paired
ratios, the results files (bench/results/NAME.md beside NAME.json), plots (PNG, matplotlib's headless Agg), and the
rewriting of a generated block of BENCHMARKS.md.

A driver measures; this module writes. The usual end of a driver:

    peak_before = report.measure_peak(build)            # before the first round ...
    ...                                                 # interleaved rounds, each sample with report.loadavg()
    peak_after = report.measure_peak(build)             # ... and after the last
    report.write_results("NAME", command=..., machine=report.machine_line(peak_before, peak_after, loads),
                         body=table, data={...})
    report.bar_plot("NAME.png", ...)

A plot can also be redrawn without measuring: `python3 bench/report.py plot NAME ...` draws bench/results/NAME.png
from the "plot" entry of bench/results/NAME.json (plot_from_json), for results kept as text or as a table.

A generated block sits between `<!-- NAME:begin (bench/DRIVER.py) -->` and `<!-- NAME:end -->`; update_doc replaces
what lies between and leaves the rest of the file, so the hand-written paragraphs around a table survive a re-run.
"""
import json
import os
import re
import shlex
import statistics
import subprocess
import sys

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


def command_line(launcher="python3"):
    """How this driver was run, to copy: `LAUNCHER bench/DRIVER.py ARGS` (arguments shell-quoted; launcher
    "torchrun --standalone --nproc-per-node P" for the drivers torchrun starts)."""
    return " ".join([launcher, os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *map(shlex.quote, sys.argv[1:])])


def loadavg():
    """The 1-minute load average now, to 0.01 (what every sample records beside its time)."""
    return round(os.getloadavg()[0], 2)


PEAK_ROW = "fwd/qkv/f32/B1/H16/Hkv16/S256/D64/full/T2/real_time"  # the short row `--peak` needs to write its context


def measure_peak(build, env=None):
    """The machine's limits now, measured by BUILD/bench/bench_attention --peak: {"fma_peak_gflops_2t",
    "fma_peak_gflops_1t", "bf16_dot_peak_gflops_2t" (AVX-512 BF16 only), "read_bandwidth_gbs_2t", ...} as floats
    rounded to 0.1, with "load" the 1-minute load average beside them. {} with a message on stderr when
    bench_attention is not built (cmake -DQKV_BUILD_BENCH=ON)."""
    exe = os.path.join(build, "bench", "bench_attention")
    if not os.path.exists(exe):
        print(f"bench/report.py: machine peak not measured: {exe} is not built (cmake -DQKV_BUILD_BENCH=ON)",
              file=sys.stderr)
        return {}
    ctx = machine(exe, ["--small-grid"], PEAK_ROW, env or peer_env())
    out = {k: round(float(v), 1) for k, v in ctx.items() if "peak" in k or "bandwidth" in k or "triad" in k}
    out["load"] = loadavg()
    return out


def machine_line(before, after, loads=()):
    """One line saying what the machine could do while a driver ran: its fp32 FMA peak on 2 threads measured before
    and after (bf16 dot-product peak and read bandwidth where measured) and the span of the load averages the
    samples recorded. `before`, `after`: measure_peak()'s dicts (empty when not measured)."""
    parts = []
    for key, what, unit in (("fma_peak_gflops_2t", "fp32 FMA peak", "GFLOP/s"),
                            ("bf16_dot_peak_gflops_2t", "bf16 dot-product peak", "GFLOP/s"),
                            ("read_bandwidth_gbs_2t", "read bandwidth", "GB/s")):
        xs = [d[key] for d in (before, after) if d and key in d]
        if xs:
            parts.append(f"{what} {span(xs, '{:.0f}')} {unit}")
    head = ("machine (2 threads, bench_attention --peak before and after): " + ", ".join(parts) if parts
            else "machine peak not measured")
    ls = [x for x in loads] + [d["load"] for d in (before, after) if d and "load" in d]
    return head + (f"; load average {span(ls, '{:.1f}')}" if ls else "")


class Transcript:
    """say(line): print a line of the report and keep it (say.lines) for write_results."""

    def __init__(self):
        self.lines = []

    def __call__(self, line=""):
        print(line, flush=True)
        self.lines.append(line)


def median(xs):
    """The median of a non-empty list of samples."""
    return statistics.median(xs)


def paired_ratios(num, den):
    """num[i] / den[i] for the samples of one round each (interleaved rounds pair their samples, so a load drift hits
    both sides of a ratio alike)."""
    if len(num) != len(den):
        raise ValueError(f"bench/report.py: paired_ratios: {len(num)} samples against {len(den)}")
    return [a / b for a, b in zip(num, den)]


def write_results(name, command, machine, body, data):
    """bench/results/NAME.md (the command that made it, the machine line, then `body`: the driver's table and
    notes, Markdown) and bench/results/NAME.json (`data`: every sample, with the machine line). Returns the .md path."""
    md = os.path.join(OUT, name + ".md")
    write_atomic(md, f"    {command}\n\n{machine}\n\n{body.rstrip()}\n")
    write_atomic(os.path.join(OUT, name + ".json"), json.dumps(dict(data, machine=machine), indent=1) + "\n")
    return md


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # headless: no display on the benchmark machines
    import matplotlib.pyplot as plt
    return plt


def bar_plot(name, title, groups, series, ylabel, note="", log=False, ref=None):
    """A grouped bar chart as bench/results/NAME (PNG): one group of bars per entry of `groups`, one bar per series
    (`series`: label → one value per group, None for none; a series without values, a peer that was skipped, is
    left out), each bar labelled with its value; `note` under the axis (the machine line, say); `log`: a log axis
    (ratios that span decades); `ref`: a dashed line at that value (1 for ratios)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.2))
    series = {label: values for label, values in series.items() if any(v is not None for v in values)}  # skipped peers
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        pts = [(x, v) for x, v in zip(xs, values) if v is not None]
        bars = ax.bar([x for x, _ in pts], [v for _, v in pts], width, label=label, color=f"C{i}")
        ax.bar_label(bars, fmt=lambda v: f"{v:.0f}" if v >= 1000 else f"{v:.3g}", fontsize=7)  # 1775, not 1.78e+03
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    if log:
        from matplotlib.ticker import LogFormatter
        ax.set_yscale("log")
        # 4, not 4×10⁰; minor ticks labelled only while the axis spans about a decade, so that they never crowd
        ax.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))
    if ref is not None:
        ax.axhline(ref, color="0.4", linestyle="--", linewidth=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the axes, never over a bar
    ax.margins(y=0.15)
    if note:
        fig.text(0.01, 0.01, note, fontsize=6.5, color="0.35")
    fig.tight_layout(rect=(0, 0.04 if note else 0, 1, 1))
    save_plot(fig, name)
    plt.close(fig)


def resolve(value, where):
    """A plot value: a number or None as it is, or "FILE.json:KEY.KEY..." the number at that path of
    bench/results/FILE.json (a list index as its number), so that a plot draws from a driver's raw results rather
    than a copy. `where` names the plot in errors."""
    if value is None or isinstance(value, (int, float)):
        return value
    file, _, path = value.partition(":")
    try:
        with open(os.path.join(OUT, file)) as f:
            node = json.load(f)
        for key in path.split("."):
            node = node[int(key)] if isinstance(node, list) else node[key]
    except (OSError, ValueError, KeyError, IndexError) as e:
        raise ValueError(f"bench/report.py: {where}: the value {value!r} does not name a number in bench/results "
                         f"({type(e).__name__}: {e})") from None
    if not isinstance(node, (int, float)):
        raise ValueError(f"bench/report.py: {where}: {value!r} is {type(node).__name__}, not a number")
    return node


def plot_from_json(name):
    """Draws bench/results/NAME.png from bench/results/NAME.json's "plot": bar_plot's arguments (title, groups,
    series, ylabel, and optionally note, log, ref), each series value a number, null, or a reference that resolve()
    reads from another results file. Figures kept by hand (a driver's printed table, a benchmark's console output)
    sit in such a file with "command" (what measured them) and "source" (where they were recorded) beside "plot"."""
    where = f"bench/results/{name}.json"
    with open(os.path.join(OUT, name + ".json")) as f:
        spec = json.load(f)["plot"]
    series = {}
    for label, values in spec["series"].items():
        if len(values) != len(spec["groups"]):
            raise ValueError(f"bench/report.py: {where}: series {label!r} has {len(values)} values for "
                             f"{len(spec['groups'])} groups")
        series[label] = [resolve(v, where) for v in values]
    bar_plot(name + ".png", spec["title"], spec["groups"], series, spec["ylabel"], spec.get("note", ""),
             log=spec.get("log", False), ref=spec.get("ref"))


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] != "plot":
        sys.exit("usage: python3 bench/report.py plot NAME ...   (draws bench/results/NAME.png from NAME.json's \"plot\")")
    for n in sys.argv[2:]:
        plot_from_json(n)
        print(os.path.join("bench", "results", n + ".png"))
