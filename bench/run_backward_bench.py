#!/usr/bin/env python3
"""One command for the attention backward benchmarks: qkv (bench_backward, Google Benchmark) and
PyTorch's scaled_dot_product_attention forward + backward on the same CPU threads, in the same run;
writes bench/results/backward.{json,md} (every row), the plot bench/results/backward_gflops.png, and
BENCHMARKS.md's summary (one line per group of rows).

    python3 bench/run_backward_bench.py [--build build] [--reps 2] [--rounds 2] [--quick]
    python3 bench/run_backward_bench.py --from-json bench/results/backward.json   # re-render, time nothing

Measured in this run: the machine's fp32 FMA peak (bench_backward --peak). FLOP model
(FlashAttention's convention): forward 4·B·H·S²·D, backward 2.5× that, halved for causal.
Row by row, in two rounds (qkv, torch, torch, qkv) of --reps repeats; each side's time is the
faster of its two round medians. PyTorch at its best CPU settings: torch.set_num_threads(2)
(1 for the one-thread rows), OMP_WAIT_POLICY=PASSIVE, default SDPA dispatch, contiguous
[B, H, S, D] tensors with requires_grad; "bwd" times out.backward(dout) on a retained graph.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

from report import OUT, ROOT, gbench_median, machine, peer_env, ratio_summary, save_plot, span, update_doc, write_atomic
NAME = re.compile(r"(fwdbwd|bwd)/qkv/(\w+)/B(\d+)/H(\d+)/Hkv(\d+)/S(\d+)/D(\d+)/(causal|full)/T(\d+)")

TORCH_WORKER = r"""
import json, statistics, sys, time
import torch
import torch.nn.functional as F
print(json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:  # one case per line; one answer per line
    c = json.loads(line)
    torch.set_num_threads(c["T"])
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    mk = lambda h: (torch.rand(c["B"], h, c["S"], c["D"], generator=g) * 2 - 1).to(dt).requires_grad_()
    q, k, v = mk(c["H"]), mk(c["Hkv"]), mk(c["Hkv"])
    dout = (torch.rand(c["B"], c["H"], c["S"], c["D"], generator=g) * 2 - 1).to(dt)
    kw = dict(is_causal=c["causal"], enable_gqa=c["Hkv"] != c["H"])
    if c["kind"] == "fwdbwd":
        def step():
            F.scaled_dot_product_attention(q, k, v, **kw).backward(dout)
    else:
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        def step():
            out.backward(dout, retain_graph=True)
    step()
    ts, cs = [], []
    for _ in range(c["reps"]):
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while True:
            step()
            n += 1
            if time.perf_counter() - t0 > 0.2:
                break
        ts.append((time.perf_counter() - t0) / n)
        cs.append((time.process_time() - c0) / n)
    print(json.dumps({"time": statistics.median(ts), "cpu": statistics.median(cs)}), flush=True)
"""


def parse(name):
    kind, dtype, B, H, Hkv, S, D, causal, T = NAME.fullmatch(name).groups()
    B, H, Hkv, S, D, T = map(int, (B, H, Hkv, S, D, T))
    c = dict(name=name, kind=kind, dtype=dtype, B=B, H=H, Hkv=Hkv, S=S, D=D, causal=causal == "causal", T=T)
    c["flop"] = 4.0 * B * H * S * S * D * (3.5 if kind == "fwdbwd" else 2.5) / (2 if c["causal"] else 1)
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=2, help="repeats per round (each side's round median)")
    ap.add_argument("--rounds", type=int, choices=(1, 2), default=2,
                    help="2: qkv, torch, torch, qkv per row, each side the faster of its two round medians")
    ap.add_argument("--quick", action="store_true", help="S ≤ 2048 only (a smoke run, not for the table)")
    ap.add_argument("--from-json", metavar="FILE",
                    help="time nothing: re-render backward.md, the plot and BENCHMARKS.md's summary from a saved run")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.from_json:
        render(json.load(open(args.from_json)))
        return
    exe = os.path.join(args.build, "bench", "bench_backward")
    started = time.time()
    load_start = os.getloadavg()[0]
    names = subprocess.run([exe, "--benchmark_list_tests"], check=True, capture_output=True, text=True).stdout.split()
    names = [n for n in names if NAME.match(n)]  # not the forward-alone rows (no torch peer here)
    if args.quick:
        names = [n for n in names if re.search(r"/S(1024|2048)/", n)]
    env = peer_env()
    ctx = machine(exe, [], names[0], env)
    torch_proc = subprocess.Popen([sys.executable, "-c", TORCH_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)
    torch_version = json.loads(torch_proc.stdout.readline())["torch"]

    def qkv_row(name):
        b = gbench_median(exe, [], name, args.reps, env)
        c = parse(b["run_name"].replace("/real_time", ""))
        c["time_s"] = b["real_time"] / 1e3  # unit: ms
        c["cpu_s"] = b["cpu_time"] / 1e3  # the main thread's CPU time: all of it when T = 1
        c["label"] = b.get("label", "")
        return c

    def torch_row(c):
        torch_proc.stdin.write(json.dumps(dict(c, reps=args.reps)) + "\n")
        torch_proc.stdin.flush()
        return json.loads(torch_proc.stdout.readline())

    # Row by row in two rounds, qkv, torch, torch, qkv, each side the faster of its two round
    # medians (as bench/run_bench.py: both sides see the shared cores in the same minute, and a
    # stall of this VM has to hit both rounds of a side to show).
    cases = []
    for name in names:
        c = qkv_row(name)
        t = min((torch_row(c) for _ in range(args.rounds)), key=lambda x: x["time"])
        if args.rounds > 1:
            again = qkv_row(name)
            if again["time_s"] < c["time_s"]:
                c = again
        c["torch_s"], c["torch_cpu_s"] = t["time"], t["cpu"]
        print(name, c["time_s"], c["torch_s"], file=sys.stderr, flush=True)
        cases.append(c)
    torch_proc.stdin.close()
    torch_proc.wait()

    result = dict(peak_gflops=float(ctx["fma_peak_gflops_2t"]), peak_gflops_1t=float(ctx["fma_peak_gflops_1t"]),
                  torch=torch_version, openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), wall_s=time.time() - started,
                  load=[load_start, os.getloadavg()[0]], cases=cases)
    write_atomic(os.path.join(OUT, "backward.json"), json.dumps(result, indent=1))
    print(render(result))


def render(r):
    """Every row to backward.md, the plot, and the summary into BENCHMARKS.md; returns the full table."""
    table = write_table(r)
    plot(r)
    update_doc("backward-table", "run_backward_bench.py", summary_table(r))
    return table


def load_text(r):
    """', load average a–b' (1-minute, at the start and end of the run) when the run recorded it."""
    return f", load average {r['load'][0]:.1f}–{r['load'][1]:.1f}" if r.get("load") else ""


def write_table(r):
    lines = [f"Measured in this run: fp32 FMA peak {r['peak_gflops']:.0f} GFLOP/s on 2 threads "
             f"({r['peak_gflops_1t']:.0f} on 1). PyTorch {r['torch']}; OPENBLAS_CORETYPE={r['openblas_coretype']}; "
             f"{r['date']}; run took {r['wall_s'] / 60:.1f} min{load_text(r)}.", "",
             "| what | case | dtype | threads | qkv kernels | qkv ms | GFLOP/s | % peak | torch ms | qkv / torch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        g = c["flop"] / c["time_s"] / 1e9
        peak = r["peak_gflops"] if c["T"] == 2 else r["peak_gflops_1t"]
        case = f"B{c['B']} H{c['H']}" + (f"/{c['Hkv']}" if c["Hkv"] != c["H"] else "") + f" S{c['S']} D{c['D']}"
        case += " causal" if c["causal"] else ""
        t = f"{c['torch_s'] * 1e3:.1f}" if c["torch_s"] else "—"
        ratio = f"{c['torch_s'] / c['time_s']:.2f}×" if c["torch_s"] else "—"
        what = "fwd+bwd" if c["kind"] == "fwdbwd" else "bwd"
        lines.append(f"| {what} | {case} | {c['dtype']} | {c['T']} | {c['label']} | {c['time_s'] * 1e3:.1f} | {g:.0f} | "
                     f"{100 * g / peak:.0f}% | {t} | {ratio} |")
    one = [c for c in r["cases"] if c["T"] == 1 and c["torch_cpu_s"]]
    if one:
        lines += ["", "One thread, by CPU time (insensitive to other processes sharing the cores):", "",
                  "| what | case | qkv CPU ms | GFLOP per CPU-s | torch CPU ms | qkv / torch |",
                  "|---|---|---|---|---|---|"]
        for c in one:
            g = c["flop"] / c["cpu_s"] / 1e9
            lines.append(f"| {'fwd+bwd' if c['kind'] == 'fwdbwd' else 'bwd'} | S{c['S']} D{c['D']}"
                         f"{' causal' if c['causal'] else ''} {c['dtype']} | {c['cpu_s'] * 1e3:.1f} | {g:.0f} | "
                         f"{c['torch_cpu_s'] * 1e3:.1f} | "
                         f"{c['torch_cpu_s'] / c['cpu_s']:.2f}× |")
    ratios = [c["torch_s"] / c["time_s"] for c in r["cases"] if c["torch_s"]]
    if ratios:
        lines.append("")
        lines.append(f"qkv / torch speed ratio over the grid: median {statistics.median(ratios):.2f}×, "
                     f"min {min(ratios):.2f}×, max {max(ratios):.2f}×.")
    table = "\n".join(lines) + "\n"
    write_atomic(os.path.join(OUT, "backward.md"), table)
    return table


def summary_table(r):
    """BENCHMARKS.md's view of a run: one line per group of rows (what is timed, dtype, head dim, heads, threads),
    full and causal side by side, each with its range of % of the measured fp32 FMA peak and its speed ratio to
    torch (median and range over the group's sequence lengths). Every row is in bench/results/backward.md."""
    def group(c):
        heads = f"H={c['H']}" + (f"/Hkv={c['Hkv']}" if c["Hkv"] != c["H"] else "")
        return f"{'fwd+bwd' if c['kind'] == 'fwdbwd' else 'bwd'} {c['dtype']} D={c['D']} {heads}, {c['T']} thread" + \
            ("s" if c["T"] > 1 else "")

    def cell(rows):
        if not rows:
            return "— | —"
        pct = [100 * c["flop"] / c["time_s"] / 1e9 / (r["peak_gflops"] if c["T"] == 2 else r["peak_gflops_1t"])
               for c in rows]
        return f"{span(pct, '{:.0f}')} % | {ratio_summary([c['torch_s'] / c['time_s'] for c in rows if c['torch_s']])}"

    lines = [f"{r['date']}, PyTorch {r['torch']}; measured in the same run: fp32 FMA peak {r['peak_gflops']:.0f} GFLOP/s "
             f"on 2 threads ({r['peak_gflops_1t']:.0f} on 1){load_text(r)}. B = 1. Ratios: median (min–max) of torch time / qkv time over "
             "the group's rows; > 1 means qkv is faster.", "",
             "| group | S | full: % of peak | full: qkv / torch | causal: % of peak | causal: qkv / torch |",
             "|---|---|---|---|---|---|"]
    groups = {}
    for c in r["cases"]:
        if c["T"] > 1:  # the one-thread rows are compared by CPU time below
            groups.setdefault(group(c), []).append(c)
    for name, rows in groups.items():
        lines.append(f"| {name} | {span([c['S'] for c in rows], '{}')} | {cell([c for c in rows if not c['causal']])} | "
                     f"{cell([c for c in rows if c['causal']])} |")
    ratios = [c["torch_s"] / c["time_s"] for c in r["cases"] if c["torch_s"]]
    one = {}
    for c in r["cases"]:
        if c["T"] == 1 and c["torch_cpu_s"]:
            name = f"{'fwd+bwd' if c['kind'] == 'fwdbwd' else 'bwd'} {c['dtype']} D={c['D']}"
            one.setdefault(name, {}).setdefault("causal" if c["causal"] else "full", []).append(
                c["torch_cpu_s"] / c["cpu_s"])
    own = {T: bf16_over_f32(r, T) for T in (1, 2)}
    if ratios:
        lines += ["", f"Over all {len(ratios)} rows: qkv / torch {ratio_summary(ratios)}." +
                  (" One thread by CPU time (full / causal, qkv / torch): " +
                   "; ".join(f"{k} {ratio_summary(v.get('full', []))} / {ratio_summary(v.get('causal', []))}"
                             for k, v in one.items()) + "."
                   if one else "") +
                  "".join(f" qkv bf16 / qkv f32 (f32 time / bf16 time, same shape; {how}): " +
                          "; ".join(f"{k} {ratio_summary(v)}" for k, v in own[T].items()) + "."
                          for T, how in ((1, "one thread, CPU time"), (2, "2 threads, wall time")) if own[T])]
    return "\n".join(lines) + "\n"


def bf16_over_f32(r, threads):
    """Speed of qkv's bf16 rows over its f32 rows of the same shape on `threads` threads, grouped by what is timed,
    the mask and D: CPU time on 1 thread (all the work there, and insensitive to other processes), wall time on more."""
    key = lambda c: (c["kind"], c["B"], c["H"], c["Hkv"], c["S"], c["D"], c["causal"], c["T"])
    f32 = {key(c): c for c in r["cases"] if c["dtype"] == "f32"}
    out = {}
    t = "cpu_s" if threads == 1 else "time_s"
    for c in r["cases"]:
        if c["dtype"] == "bf16" and c["T"] == threads and key(c) in f32:
            name = f"{'fwd+bwd' if c['kind'] == 'fwdbwd' else 'bwd'} D={c['D']} {'causal' if c['causal'] else 'full'}"
            out.setdefault(name, []).append(f32[key(c)][t] / c[t])
    return out


def plot(r):
    """GFLOP/s against S, f32, D = 128, H = 8, 2 threads: one panel for fwd+bwd, one for bwd; qkv and torch,
    full and causal, with the measured peak."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, panels = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, kind in zip(panels, ("fwdbwd", "bwd")):
        for causal, style in ((False, "-"), (True, "--")):
            sel = sorted((c for c in r["cases"] if c["kind"] == kind and c["dtype"] == "f32" and c["D"] == 128
                          and c["H"] == c["Hkv"] == 8 and c["T"] == 2 and c["causal"] == causal), key=lambda c: c["S"])
            tag = "causal" if causal else "full"
            ax.plot([c["S"] for c in sel], [c["flop"] / c["time_s"] / 1e9 for c in sel], "o" + style, color="C0",
                    label=f"qkv {tag}")
            pts = [(c["S"], c["flop"] / c["torch_s"] / 1e9) for c in sel if c["torch_s"]]
            ax.plot([a for a, _ in pts], [b for _, b in pts], "s" + style, color="C1", label=f"torch SDPA {tag}")
        ax.axhline(r["peak_gflops"], color="gray", lw=0.8, ls=":", label="measured fp32 FMA peak")
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)
        ax.set_title(f"{'forward + backward' if kind == 'fwdbwd' else 'backward'}, f32, B=1, H=8, D=128, 2 threads")
        ax.set_xlabel("sequence length S")
        ax.grid(alpha=0.3)
    panels[0].set_ylabel("GFLOP/s (fwd 4·B·H·S²·D, bwd 2.5×; causal halved)")
    panels[0].legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, "backward_gflops.png")


if __name__ == "__main__":
    main()
