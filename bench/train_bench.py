#!/usr/bin/env python3
"""Training speed of `qkv train` beside its PyTorch twin, eager and torch.compile'd, for GPT-2 and Llama-style
models of the same size, interleaved in one run (#24 item 4).

    python3 bench/train_bench.py --build build-ci --rounds 3 --steps 200

Per architecture, one `qkv train` run of one step at lr 1e-30 gives the initial weights (bench/train_model_torch.py
checks that the twin's loss on the first batch equals qkv's, so both do the same work); then each round runs, in
a rotating order, every contender as its own process on those weights and the same batches:
  qkv          `qkv train` (QKV_NUM_THREADS), W + N steps; its loss.csv times every step (evaluation excluded).
               CPU seconds per step = (CPU of that run − CPU of a W-step run) / N, so start-up, tokenising and
               the validation at both ends cancel.
  torch ...    bench/train_model_torch.py: eager (AdamW foreach, or fused), or torch.compile in a mode; the W
               warm-up steps, where compiling happens, are reported apart as "warm-up s".
Both sides: 2 threads, OMP_WAIT_POLICY=PASSIVE, nanoGPT's Shakespeare recipe (4 layers, width 128, 4 heads,
context 64, batch 12, AdamW, clip 1, warmup + cosine). GPT-2: learned positions, LayerNorm, exact GELU (hidden
512); Llama: rotary, RMSNorm, SwiGLU (hidden 392), 4 query heads on 2 key/value heads — 808,192 parameters against
GPT-2's 804,096 (+0.5 %).

The machine's fp32 FMA peak (bench_attention --peak) and the load are measured before and after. On a shared
machine the CPU seconds per step are the steadier figure: wall time counts the other processes' share of the
cores. Writes bench/results/train_bench.{json,md} and the plot train_bench.png through bench/report.py;
`--from RESULTS.json` redraws the table and the plot from a stored run without measuring.
"""
import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

ARCHS = {
    "gpt2": ["--arch", "gpt2"],
    "llama": ["--arch", "llama", "--kv-heads", "2", "--hidden-dim", "392"],
}
TORCH = {  # contender → bench/train_model_torch.py flags
    "torch eager": [],
    "torch eager + fused AdamW": ["--fused-adamw"],
    "torch.compile default": ["--compile", "default"],
    "torch.compile max-autotune-no-cudagraphs": ["--compile", "max-autotune-no-cudagraphs"],
}


def run_child(cmd, env):
    """(stdout, CPU seconds of the child: user + system of all its threads)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"bench/train_bench.py: {' '.join(cmd[:4])} ... failed:\n{p.stdout[-2000:]}{p.stderr[-3000:]}")
    return p.stdout, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def qkv_train(a, arch, out, steps, extra, env):
    cmd = [a.qkv, "train", "--data", a.data, "--out", out, *ARCHS[arch], "--steps", str(steps), "--seed", "1337",
           "--eval-interval", "1000000", "--eval-batches", "1", "--checkpoint-interval", str(steps), "--quiet", *extra]
    return run_child(cmd, env)


def elapsed(out):
    """loss.csv's elapsed_s of the training rows: the training seconds after each step (evaluation excluded)."""
    with open(os.path.join(out, "loss.csv")) as f:
        return [float(r["elapsed_s"]) for r in csv.DictReader(f) if r["train_loss"]]


def run_qkv(a, arch, tmp, env):
    _, cpu_short = qkv_train(a, arch, os.path.join(tmp, "short"), a.warmup_steps, [], env)
    out = os.path.join(tmp, "long")
    _, cpu_long = qkv_train(a, arch, out, a.warmup_steps + a.steps, [], env)
    t = elapsed(out)
    return {"steps_per_s": a.steps / (t[-1] - t[a.warmup_steps - 1]), "cpu_s_per_step": (cpu_long - cpu_short) / a.steps,
            "warmup_s": t[a.warmup_steps - 1]}


def run_torch(a, init, flags, tmp, env):
    js = os.path.join(tmp, "torch.json")
    run_child([sys.executable, os.path.join(report.ROOT, "bench", "train_model_torch.py"), "--data", a.data, "--init",
               init, "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps), "--threads", str(a.threads),
               "--json", js, *flags], env)
    r = json.load(open(js))
    return {"steps_per_s": r["steps_per_s"], "cpu_s_per_step": r["cpu_s_per_step"], "warmup_s": r["compile_s"],
            "loss0": r["loss0"], "qkv_loss0": r["qkv_loss0"]}


def summarise(data, name, command, write=True):
    """The table (medians over the rounds; ratios: median (range) of the rounds' paired ratios) and the plot
    bench/results/NAME.png of one run's `data` (what main() measured, or a stored train_bench JSON); with `write`,
    the results files bench/results/NAME.{md,json} too."""
    runs = data["runs"]
    archs = list(runs)
    rows = ["| 2 threads | steps/s | CPU ms / step | warm-up s | qkv / this: steps/s | qkv / this: CPU time |",
            "|---|---|---|---|---|---|"]
    for arch in archs:
        q = runs[arch]["qkv"]
        for contender, rs in runs[arch].items():
            sps = [x["steps_per_s"] for x in rs]
            cpu = [x["cpu_s_per_step"] for x in rs]
            ratio_w = report.paired_ratios([x["steps_per_s"] for x in q], sps)
            ratio_c = report.paired_ratios(cpu, [x["cpu_s_per_step"] for x in q])
            rows.append(f"| {arch} {contender} | {report.median(sps):.2f} | {report.median(cpu) * 1e3:.1f} | "
                        f"{report.median([x['warmup_s'] for x in rs]):.1f} | "
                        + ("— | — |" if contender == "qkv" else
                           f"{report.ratio_summary(ratio_w)} | {report.ratio_summary(ratio_c)} |"))
    table = "\n".join(rows)
    print(table)
    body = ("\n".join(data.get("log", [])) + "\n\nMedians over the rounds; ratios: median (range) of the rounds' "
            "paired ratios.\n\n" + table)
    if write:
        report.write_results(name, command, data["machine"], body, data)
    contenders = list(runs[archs[0]])
    report.bar_plot(name + ".png", f"Training steps/s, {data['threads']} threads, nanoGPT Shakespeare recipe "
                    f"(≈ 0.8 M parameters); median of {len(runs[archs[0]]['qkv'])} rounds",
                    archs, {c: [report.median([x["steps_per_s"] for x in runs[arch][c]]) if c in runs[arch] else None
                                for arch in archs] for c in contenders},
                    "optimiser steps / s (higher is faster)", data["machine"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(report.ROOT, "build-ci"))
    ap.add_argument("--data", default=os.path.join(report.ROOT, "data", "tinyshakespeare", "input.txt"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per run")
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--archs", default="gpt2,llama")
    ap.add_argument("--torch", default=",".join(TORCH), help="torch contenders, comma-separated, of: " + ", ".join(TORCH))
    ap.add_argument("--name", default="train_bench", help="writes bench/results/NAME.{json,md,png}")
    ap.add_argument("--from", dest="stored", help="a stored train_bench JSON: print its table and draw NAME.png, "
                    "measure nothing")
    a = ap.parse_args()
    name = a.name
    command = report.command_line()
    if a.stored:
        with open(a.stored) as f:
            data = json.load(f)
        if "machine" not in data:  # written before bench/report.py's machine line: its start/end peaks and loads
            data["machine"] = report.machine_line(
                {"fma_peak_gflops_2t": data["start"]["peak_fma_gflops_2t"], "load": data["start"]["loadavg"][0]},
                {"fma_peak_gflops_2t": data["end"]["peak_fma_gflops_2t"], "load": data["end"]["loadavg"][0]},
                [x["loadavg"] for arch in data["runs"].values() for rs in arch.values() for x in rs])
        summarise(data, name, command, write=False)
        return
    a.qkv = os.path.join(a.build, "qkv")
    archs, torch_names = a.archs.split(","), a.torch.split(",")
    env = dict(report.peer_env(), QKV_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    say = report.Transcript()
    log = say.lines

    tmp = tempfile.mkdtemp(prefix="train_bench_")
    inits = {}
    for arch in archs:
        inits[arch] = os.path.join(tmp, f"init_{arch}")
        qkv_train(a, arch, inits[arch], 1, ["--lr", "1e-30", "--min-lr", "1e-30", "--warmup", "0"], env)
    runs = {arch: {c: [] for c in ["qkv", *torch_names]} for arch in archs}
    start = report.measure_peak(a.build, env)
    say(f"{a.threads} threads, {a.steps} timed steps after {a.warmup_steps}; machine before: {start}")
    for r in range(a.rounds):
        for arch in archs:
            order = ["qkv", *torch_names]
            k = (r + archs.index(arch)) % len(order)  # rotate who goes first
            for contender in order[k:] + order[:k]:
                d = os.path.join(tmp, f"r{r}_{arch}_{contender.replace(' ', '_')}")
                os.makedirs(d)
                res = (run_qkv(a, arch, d, env) if contender == "qkv"
                       else run_torch(a, inits[arch], TORCH[contender], d, env))
                res["loadavg"] = report.loadavg()
                runs[arch][contender].append(res)
                say(f"round {r + 1} {arch:5s} {contender:42s} {res['steps_per_s']:6.2f} steps/s "
                    f"{res['cpu_s_per_step'] * 1e3:6.1f} CPU ms/step  warm-up {res['warmup_s']:5.1f} s  "
                    f"load {res['loadavg']:.1f}" + (f"  step-0 loss {res['loss0']:.6f} = qkv {res['qkv_loss0']:.6f}"
                                                    if "loss0" in res else ""))
    end = report.measure_peak(a.build, env)
    say(f"after: machine {end}")
    loads = [x["loadavg"] for arch in runs.values() for rs in arch.values() for x in rs]
    summarise({"start": start, "end": end, "threads": a.threads, "steps": a.steps, "warmup_steps": a.warmup_steps,
               "runs": runs, "log": log, "machine": report.machine_line(start, end, loads)}, name, command)


if __name__ == "__main__":
    main()
