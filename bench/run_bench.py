#!/usr/bin/env python3
"""One command for the attention forward benchmarks: qkv (Google Benchmark program), PyTorch's
scaled_dot_product_attention and, where the `ggml` package is installed, ggml's CPU flash attention
(bench/ggml_peer.py) on the same CPU threads, in the same run; writes the table and the plot, and
rewrites the generated section of BENCHMARKS.md.

    python3 bench/run_bench.py [--build build] [--reps 2] [--rounds 2] [--quick] [--ggml auto|off]
    python3 bench/run_bench.py --small [--reps 5]   # S ∈ {256, 512} rows only; prints, writes nothing

Row by row: each qkv row (bench_attention, one process per row) is followed at once by its torch
row (one persistent torch process), so that both sides of a ratio see the shared cores in the same
minute. Measured here, in this run: the machine's fp32 FMA peak (at the start and at the end; the
higher is the one % peak divides by), read bandwidth and STREAM triad (bench_attention --peak); decode rows give their K/V streaming rate as % of both (the read probe
is the higher bar: decode only reads). FLOP model: 4·B·H·Sq·Skv·D, halved for causal. Times: each
side's row is timed in two rounds (qkv, torch, torch, qkv) of --reps repeats; its time is the faster
of the two round medians.
The read-probe % of a decode row is against the probe measured right before that same row
(bench_attention's pct_probe counter: the median over the repeats of each repeat's rate / its own
probe), not against the probe taken once at the start: this machine's bandwidth moves by tens of %
within the hour, and a figure from the same minute is the one to compare with.
PyTorch at its best CPU settings: torch.set_num_threads(2), OMP_WAIT_POLICY=PASSIVE, the
default SDPA dispatch (its CPU flash-attention kernel for f32/bf16), contiguous [B, H, S, D].
ggml (slow at long S, so on a subset of the grid: GGML_SHAPES): 2 threads, K/V in the row's dtype.
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
NAME = re.compile(r"(fwd|dec)/(\w+)/(\w+)/B(\d+)/H(\d+)/Hkv(\d+)/S(?:kv)?(\d+)/D(\d+)(?:/(causal|full))?/T(\d+)")

TORCH_WORKER = r"""
import json, os, statistics, sys, time
import torch
import torch.nn.functional as F
torch.set_num_threads(2)
print(json.dumps({"torch": torch.__version__}), flush=True)
for line in sys.stdin:  # one case per line; one answer per line
    c = json.loads(line)
    dt = torch.bfloat16 if c["dtype"] == "bf16" else torch.float32
    g = torch.Generator().manual_seed(0)
    q = (torch.rand(c["B"], c["H"], c["Sq"], c["D"], generator=g) * 2 - 1).to(dt)
    k = (torch.rand(c["B"], c["Hkv"], c["Skv"], c["D"], generator=g) * 2 - 1).to(dt)
    v = (torch.rand(c["B"], c["Hkv"], c["Skv"], c["D"], generator=g) * 2 - 1).to(dt)
    kw = dict(is_causal=c["causal"], enable_gqa=c["Hkv"] != c["H"])
    with torch.inference_mode():
        F.scaled_dot_product_attention(q, k, v, **kw)
        ts = []
        for _ in range(c["reps"]):
            n, t0 = 0, time.perf_counter()
            while True:
                F.scaled_dot_product_attention(q, k, v, **kw)
                n += 1
                if time.perf_counter() - t0 > 0.2:
                    break
            ts.append((time.perf_counter() - t0) / n)
    print(json.dumps({"name": c["name"], "time": statistics.median(ts)}), flush=True)
"""


def parse(name):
    m = NAME.fullmatch(name)
    kind, kern, dtype, B, H, Hkv, S, D, causal, T = m.groups()
    B, H, Hkv, S, D, T = map(int, (B, H, Hkv, S, D, T))
    Sq = 1 if kind == "dec" else S
    c = dict(kind=kind, kernel=kern, dtype=dtype, B=B, H=H, Hkv=Hkv, Sq=Sq, Skv=S, D=D, causal=causal == "causal", T=T)
    c["flop"] = 4.0 * B * H * Sq * S * D / (2 if c["causal"] else 1)
    c["kv_bytes"] = 2.0 * B * Hkv * S * D * (2 if dtype == "bf16" else 4)
    return c


def ggml_wanted(c):
    """The grid rows ggml is timed on: it takes minutes at S ≥ 8192, so S ≤ 4096 and decode; its bf16
    path is 4–10× slower than its f32, so bf16 forward rows only at B = 1 without GQA."""
    if c["kind"] == "dec":
        return True
    return c["Skv"] <= 4096 and (c["dtype"] == "f32" or (c["B"] == 1 and c["Hkv"] == c["H"]))


def ggml_available():
    return subprocess.run([sys.executable, "-c", "import ggml"], capture_output=True).returncode == 0


def peer_key(c):
    """The PyTorch case matching a qkv case (same shape, dtype, causality; 2 threads)."""
    return f"{c['kind']}/{c['dtype']}/B{c['B']}/H{c['H']}/Hkv{c['Hkv']}/Sq{c['Sq']}/Skv{c['Skv']}/D{c['D']}/{int(c['causal'])}"


def qkv_row(exe, grid, name, reps, env):
    """One row of the grid timed by bench_attention: the median of `reps` repeats."""
    b = gbench_median(exe, grid, name, reps, env)
    c = parse(b["run_name"].replace("/real_time", ""))
    c["time_s"] = b["real_time"] / 1e3  # unit: ms
    c["label"] = b.get("label", "")
    c["pct_probe"], c["probe_gbs"] = b.get("pct_probe"), b.get("probe_GBs")  # decode rows only
    return c


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=2, help="repeats per round (each side's round median)")
    ap.add_argument("--rounds", type=int, choices=(1, 2), default=2,
                    help="2: qkv, torch, torch, qkv per row, each side the faster of its two round medians")
    ap.add_argument("--quick", action="store_true", help="S ≤ 2048 only (a smoke run, not for the table)")
    ap.add_argument("--ggml", choices=("auto", "off"), default="auto",
                    help="auto: also time ggml where the ggml package is importable")
    ap.add_argument("--small", action="store_true",
                    help="only the short-sequence grid (bench_attention --small-grid) against torch; prints the table "
                         "and writes no file")
    ap.add_argument("--from-json", metavar="FILE",
                    help="time nothing: re-render forward.md, the plot and BENCHMARKS.md's summary from a saved run")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    if args.from_json:
        result = json.load(open(args.from_json))
        write_table(result)
        plot(result)
        update_doc("forward-table", "run_bench.py", summary_table(result))
        return
    exe = os.path.join(args.build, "bench", "bench_attention")
    started = time.time()

    grid = ["--small-grid"] if args.small else []
    if args.small:
        args.ggml = "off"
    names = subprocess.run([exe, *grid, "--benchmark_list_tests"], check=True, capture_output=True,
                           text=True).stdout.split()
    if args.quick:
        names = [n for n in names if re.search(r"/(S|Skv)(256|512|1024|2048)/", n)]
    env = peer_env()
    ctx = machine(exe, grid, names[0], env)
    torch_proc = subprocess.Popen([sys.executable, "-c", TORCH_WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env=env)
    torch_version = json.loads(torch_proc.stdout.readline())["torch"]
    # Row by row, each qkv row beside its torch row, so that both see the machine in the same
    # minute (timing the whole grid of one and then of the other once left a 0.92× row that a
    # re-run a minute later measured at 1.54×), and in two rounds in the order qkv, torch, torch,
    # qkv: each side's time is the faster of its two round medians. This VM stalls for a second
    # or two now and then (the 03:26 grid had qkv at 81 ms for a row that ran at 44 ms in every
    # check before and after); a stall has to hit both rounds of a side to show.
    def torch_row(key):
        torch_proc.stdin.write(json.dumps(dict(peers[key], reps=args.reps)) + "\n")
        torch_proc.stdin.flush()
        return json.loads(torch_proc.stdout.readline())["time"]

    cases, peers, torch_times = {}, {}, {}
    for name in names:
        c = qkv_row(exe, grid, name, args.reps, env)
        key = peer_key(c) if c["kernel"] == "qkv" and c["T"] == 2 else None
        if key and key not in peers:
            peers[key] = dict(name=key, **{k: c[k] for k in ("dtype", "B", "H", "Hkv", "Sq", "Skv", "D", "causal")})
            torch_times[key] = min(torch_row(key), torch_row(key) if args.rounds > 1 else float("inf"))
        if args.rounds > 1:
            again = qkv_row(exe, grid, name, args.reps, env)
            if again["time_s"] < c["time_s"]:
                c = again
        c["torch_s"] = torch_times[key] if key else None
        print(fmt_case(c), c["dtype"], f"T{c['T']}", c["kernel"], f"{c['time_s'] * 1e3:.2f} ms",
              f"torch {c['torch_s'] * 1e3:.2f} ms" if c["torch_s"] else "", file=sys.stderr, flush=True)
        cases[name] = c
    torch_proc.stdin.close()
    torch_proc.wait()
    end_ctx = machine(exe, grid, names[0], env)
    peak = max(float(ctx["fma_peak_gflops_2t"]), float(end_ctx["fma_peak_gflops_2t"]))
    mem = None if args.small else \
        json.loads(subprocess.run([exe, "--memory-probe"], check=True, capture_output=True, text=True).stdout)

    ggml_version, ggml_times = None, {}
    if args.ggml == "auto" and ggml_available():
        want = [p for p in peers.values() if ggml_wanted(p | {"kind": p["name"].split("/")[0]})]
        gr = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "ggml_peer.py"), json.dumps(want), str(args.reps)],
                            check=True, capture_output=True, text=True, env=env)
        out = json.loads(gr.stdout.strip().splitlines()[-1])
        ggml_version, ggml_times = out["ggml"], out["times"]
    for c in cases.values():
        c["ggml_s"] = ggml_times.get(peer_key(c)) if c["kernel"] == "qkv" and c["T"] == 2 else None

    result = dict(peak_gflops=peak, peak_gflops_1t=float(ctx["fma_peak_gflops_1t"]),
                  peak_avx2_gflops=float(ctx["fma_peak_avx2_gflops_2t"]),
                  peak_start_end=[float(ctx["fma_peak_gflops_2t"]), float(end_ctx["fma_peak_gflops_2t"])],
                  read_gbs=float(ctx["read_bandwidth_gbs_2t"]), triad_gbs=float(ctx["stream_triad_gbs_2t"]),
                  memory=mem["memory_probe"] if mem else None, torch=torch_version, ggml=ggml_version, openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
                  cpu=ctx.get("host_name", ""), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  wall_s=time.time() - started, cases=list(cases.values()))
    if args.small:
        print(write_table(result, path=None))
        return
    write_atomic(os.path.join(OUT, "forward.json"), json.dumps(result, indent=1))
    table = write_table(result)
    plot(result)
    update_doc("forward-table", "run_bench.py", summary_table(result))
    print(table)


def fmt_case(c):
    s = f"B{c['B']} H{c['H']}" + (f"/{c['Hkv']}" if c["Hkv"] != c["H"] else "")
    s += f" Sq{c['Sq']} Skv{c['Skv']}" if c["kind"] == "dec" else f" S{c['Skv']}"
    return s + f" D{c['D']}" + (" causal" if c["causal"] else "")


def write_table(r, path=os.path.join(OUT, "forward.md")):
    ends = r.get("peak_start_end")
    lines = [f"Measured in this run: fp32 FMA peak {r['peak_gflops']:.0f} GFLOP/s on 2 threads "
             + (f"(the higher of {ends[0]:.0f} at the start and {ends[1]:.0f} at the end of the run; " if ends else "(")
             + f"{r['peak_gflops_1t']:.0f} on 1; AVX2 only: {r['peak_avx2_gflops']:.0f}), read bandwidth "
             f"{r['read_gbs']:.1f} GB/s, STREAM triad {r['triad_gbs']:.1f} GB/s. PyTorch {r['torch']}; ggml-py {r.get('ggml') or '(not installed)'}; "
             f"OPENBLAS_CORETYPE={r['openblas_coretype']}; {r['date']}; run took {r['wall_s'] / 60:.1f} min.", "",
             "| case | dtype | threads | qkv kernel | qkv ms | GFLOP/s | % peak | torch ms | qkv / torch | ggml ms | qkv / ggml |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in r["cases"]:
        g = c["flop"] / c["time_s"] / 1e9
        gbs = c['kv_bytes'] / c['time_s'] / 1e9
        extra = f"{gbs:.1f} GB/s K,V ({c['pct_probe']:.0f}% of the {c['probe_gbs']:.1f} GB/s read probe beside it, " \
                f"{100 * gbs / r['triad_gbs']:.0f}% triad)" \
            if c["kind"] == "dec" else f"{100 * g / r['peak_gflops']:.0f}%"
        t = f"{c['torch_s'] * 1e3:.2f}" if c["torch_s"] else "—"
        ratio = f"{c['torch_s'] / c['time_s']:.2f}×" if c["torch_s"] else "—"
        gs = c.get("ggml_s")
        gt, gratio = (f"{gs * 1e3:.2f}", f"{gs / c['time_s']:.2f}×") if gs else ("—", "—")
        lines.append(f"| {fmt_case(c)} | {c['dtype']} | {c['T']} | {c['label']} | {c['time_s'] * 1e3:.2f} | {g:.0f} | "
                     f"{extra} | {t} | {ratio} | {gt} | {gratio} |")
    m = r["memory"]
    lines += [""] if m is None else ["", f"Memory: S = {m['S']}, B = H = 1, D = {m['D']} ({m['kernel']}): extra peak RSS "
              f"{m['extra_peak_MB']:.1f} MB beyond the {m['inputs_MB']:.0f} MB of q, k, v, out."]
    fwd = [c for c in r["cases"] if c["torch_s"] and c["kind"] == "fwd"]

    def ratio_line(what, rows):
        x = [c["torch_s"] / c["time_s"] for c in rows]
        return f"{what} ({len(x)} rows): median {statistics.median(x):.2f}×, min {min(x):.2f}×, max {max(x):.2f}×." if x else ""

    # The shape grid: D ∈ {64, 128}, B ∈ {1, 4}, H = 16 (and Hkv = 4), causal and not, every
    # shape in fp32 and in bf16. The other head dims are reported beside it, not in its median.
    grid = [c for c in fwd if c["D"] in (64, 128)]
    for what, rows in (("Forward qkv / torch speed ratio over the shape grid (D 64 and 128, every shape in fp32 and bf16)", grid),
                       ("The fp32 rows of it alone", [c for c in grid if c["dtype"] == "f32"]),
                       ("The bf16 rows of it alone", [c for c in grid if c["dtype"] == "bf16"]),
                       ("The other head dims (fp32, S = 2048)", [c for c in fwd if c["D"] not in (64, 128)])):
        line = ratio_line(what, rows)
        if line:
            lines.append(line)
    # Causal against non-causal qkv time at the same shape (issue #3: ≤ 0.55).
    full = {fmt_case(c) + c["dtype"] + str(c["T"]): c for c in r["cases"]
            if c["kind"] == "fwd" and c["kernel"] == "qkv" and not c["causal"]}
    cr = [(c["time_s"] / full[fmt_case(c).replace(" causal", "") + c["dtype"] + str(c["T"])]["time_s"], c) for c in r["cases"]
          if c["kind"] == "fwd" and c["kernel"] == "qkv" and c["causal"]
          and fmt_case(c).replace(" causal", "") + c["dtype"] + str(c["T"]) in full]
    if cr:
        over = [f"{fmt_case(c)} {c['dtype']} {x:.2f}" for x, c in cr if x > 0.55]
        lines.append(f"Causal / non-causal qkv time at the same shape ({len(cr)} pairs): median "
                     f"{statistics.median(x for x, _ in cr):.2f}, min {min(x for x, _ in cr):.2f}, max {max(x for x, _ in cr):.2f}; "
                     f"above 0.55: {', '.join(over) if over else 'none'}.")
    gr = [c["ggml_s"] / c["time_s"] for c in r["cases"] if c.get("ggml_s") and c["kind"] == "fwd"]
    if gr:
        lines.append(f"Forward qkv / ggml speed ratio over the rows ggml ran (S ≤ 4096): median "
                     f"{statistics.median(gr):.2f}×, min {min(gr):.2f}×, max {max(gr):.2f}×.")
    table = "\n".join(lines) + "\n"
    if path:
        write_atomic(path, table)
    return table


def summary_table(r):
    """BENCHMARKS.md's view of a run: one line per group of the grid (dtype, head dim, mask; decode by dtype and
    heads), each with its range of % of the measured limit and its speed ratios to the peers. Every row of the
    run is in bench/results/forward.md."""
    def ratios(rows, key):
        return ratio_summary([c[key] / c["time_s"] for c in rows if c.get(key)])

    lines = [f"{r['date']}, PyTorch {r['torch']}, ggml-py {r.get('ggml') or '(not installed)'}; measured in the same run: "
             f"fp32 FMA peak {r['peak_gflops']:.0f} GFLOP/s on 2 threads ({r['peak_gflops_1t']:.0f} on 1), read probe "
             f"{r['read_gbs']:.1f} GB/s, STREAM triad {r['triad_gbs']:.1f} GB/s. Ratios: median (min–max) of peer time / "
             "qkv time over the group's rows; > 1 means qkv is faster.", "",
             "| group (2 threads) | rows | S | qkv % of limit | qkv / torch SDPA | qkv / ggml |",
             "|---|---|---|---|---|---|"]
    fwd = [c for c in r["cases"] if c["kind"] == "fwd" and c["kernel"] == "qkv" and c["T"] == 2]
    groups = []
    for dtype in ("f32", "bf16"):
        for D in (64, 128):
            for causal in (False, True):
                groups.append((f"{dtype} D={D} {'causal' if causal else 'full'}, B=1 H=16",
                               [c for c in fwd if c["dtype"] == dtype and c["D"] == D and c["causal"] == causal
                                and c["B"] == 1 and c["Hkv"] == c["H"]]))
        groups.append((f"{dtype} D=128, B=4 or GQA H=16/Hkv=4",
                       [c for c in fwd if c["dtype"] == dtype and c["D"] == 128 and (c["B"] > 1 or c["Hkv"] != c["H"])]))
    groups.append(("f32 D ∈ {32, 80, 96, 256}, S=2048", [c for c in fwd if c["D"] not in (64, 128)]))
    for name, rows in groups:
        if not rows:
            continue
        limit = r["peak_gflops"] * (2 if rows[0]["dtype"] == "bf16" else 1)  # vdpbf16ps: 2× the FLOPs per instruction
        pct = [100 * c["flop"] / c["time_s"] / 1e9 / limit for c in rows]
        lines.append(f"| {name} | {len(rows)} | {span([c['Skv'] for c in rows], '{}')} | {span(pct, '{:.0f}')} % of "
                     f"{'bf16 dot-product (2× fp32)' if rows[0]['dtype'] == 'bf16' else 'fp32 FMA'} peak | "
                     f"{ratios(rows, 'torch_s')} | {ratios(rows, 'ggml_s')} |")
    dec = [c for c in r["cases"] if c["kind"] == "dec" and c["kernel"] == "qkv"]
    for dtype in ("f32", "bf16"):
        for gqa in (False, True):
            rows = [c for c in dec if c["dtype"] == dtype and (c["Hkv"] != c["H"]) == gqa]
            if rows:
                lines.append(f"| decode {dtype} {'GQA H=16/Hkv=4' if gqa else 'H=16'}, D=128, Sq=1 | {len(rows)} | "
                             f"Skv {span([c['Skv'] for c in rows], '{}')} | "
                             f"{span([c['pct_probe'] for c in rows if c['Skv'] >= 16384], '{:.0f}')} % of the read probe "
                             f"(Skv ≥ 16384, K/V beyond the cache) | {ratios(rows, 'torch_s')} | {ratios(rows, 'ggml_s')} |")
    m = r.get("memory")
    if m:
        lines += ["", f"Memory: S = {m['S']}, B = H = 1, D = {m['D']}: {m['extra_peak_MB']:.1f} MB of peak RSS beyond "
                  f"the {m['inputs_MB']:.0f} MB of q, k, v and out."]
    return "\n".join(lines) + "\n"


def plot(r):
    """GFLOP/s against S for B = 1, H = 16: a row of panels per dtype, a panel per head dim."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, panels = plt.subplots(2, 2, figsize=(12, 9))
    for row, dtype in zip(panels, ("f32", "bf16")):
        for ax, D in zip(row, (64, 128)):
            plot_panel(ax, r, dtype, D)
        row[0].set_ylabel("GFLOP/s (4·B·H·S²·D, halved for causal)")
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    save_plot(fig, "forward_gflops.png")


def plot_panel(ax, r, dtype, D):
    for causal, style in ((False, "-"), (True, "--")):
        sel = [c for c in r["cases"] if c["kind"] == "fwd" and c["kernel"] == "qkv" and c["dtype"] == dtype
               and c["B"] == 1 and c["Hkv"] == 16 and c["D"] == D and c["causal"] == causal and c["T"] == 2]
        sel.sort(key=lambda c: c["Skv"])
        if not sel:
            continue
        tag = "causal" if causal else "full"
        ax.plot([c["Skv"] for c in sel], [c["flop"] / c["time_s"] / 1e9 for c in sel], "o" + style, color="C0",
                label=f"qkv {tag}")
        for key, marker, color, who in (("torch_s", "s", "C1", "torch SDPA"), ("ggml_s", "^", "C2", "ggml")):
            pts = [(c["Skv"], c["flop"] / c[key] / 1e9) for c in sel if c.get(key)]
            if pts:
                ax.plot([a for a, _ in pts], [b for _, b in pts], marker + style, color=color, label=f"{who} {tag}")
    ax.axhline(r["peak_gflops"], color="gray", lw=0.8, ls=":", label="measured fp32 FMA peak")
    if dtype == "bf16":  # one vdpbf16ps does twice the FLOPs of one vfmadd231ps at the same rate
        ax.axhline(2 * r["peak_gflops"], color="gray", lw=0.8, ls="-.", label="bf16 dot-product peak (2× fp32)")
    ax.set_xscale("log", base=2)
    ax.set_title(f"{dtype} forward, B=1, H=16, D={D}, 2 threads")
    ax.set_xlabel("sequence length S")
    ax.grid(alpha=0.3)


if __name__ == "__main__":
    main()
