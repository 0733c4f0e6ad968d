"""Peak memory per rank of a long causal ring forward: S = 262,144, D = 64 across P ranks.

    torchrun --standalone --nproc-per-node 4 bench/ring_memory.py --S 262144 --H 1 --D 64

Every rank builds only its own shard (chunks r and 2P-1-r, each from its own seed), so no rank
ever holds the whole sequence. Recorded per rank: peak RSS (getrusage), the RSS before the
inputs existed (torch and qkv loaded: the baseline), the forward's wall time. The attention's own
memory is peak - baseline; the single-process figure beside it is the formula for q, k, v, out
and lse of the whole sequence (one process would need at least that on top of its baseline).
Rank 0 writes, through bench/report.py, bench/results/NAME.{md,json} (with the load) and NAME.png (NAME: --name,
default ring_memory_S<S>_P<P>).
"""

import argparse
import datetime
import json
import os
import resource
import sys
import time

import torch
import torch.distributed as dist

import qkv
import qkv.distributed as qd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--S", type=int, default=262144)
    p.add_argument("--H", type=int, default=1)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--name", help="writes bench/results/NAME.{md,json,png} (default ring_memory_S<S>_P<P>)")
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3600))
    r, P = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    qkv.set_num_threads(1)
    base = rss_mb()
    c = a.S // (2 * P)

    def chunk(i, which):   # chunk i of q, k or v, the same on whichever rank builds it
        g = torch.Generator().manual_seed(3 * i + which)
        return torch.randn(1, a.H, c, a.D, generator=g)

    q, k, v = (torch.cat([chunk(r, w), chunk(2 * P - 1 - r, w)], 2) for w in range(3))
    dist.barrier()
    t0 = time.perf_counter()
    out = qd.ring_attention(q, k, v, causal=True)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rep = {"rank": r, "baseline_rss_mb": base, "peak_rss_mb": peak, "attention_mb": peak - base,
           "forward_s": seconds, "out_finite": bool(torch.isfinite(out).all())}
    everyone = [None] * P
    dist.all_gather_object(everyone, rep)
    if r == 0:
        whole = (4 * a.H * a.S * a.D * 4 + a.H * a.S * 4) / 2 ** 20
        print(json.dumps(everyone, indent=1))
        print(f"one process, whole sequence: q, k, v, out, lse alone = {whole:.0f} MiB")
        name = a.name or f"ring_memory_S{a.S}_P{P}"
        machine = report.machine_line({}, {}, [report.loadavg()])
        table = "\n".join([f"causal ring forward, B=1, H={a.H}, S={a.S}, D={a.D}, float32, P = {P} ranks of one thread; "
                           f"one process would hold {whole:.0f} MiB of q, k, v, out and lse alone.", "",
                           "| rank | baseline RSS MiB | peak RSS MiB | attention MiB (peak − baseline) | forward s |",
                           "|---|---|---|---|---|"] +
                          [f"| {e['rank']} | {e['baseline_rss_mb']:.0f} | {e['peak_rss_mb']:.0f} | "
                           f"{e['attention_mb']:.0f} | {e['forward_s']:.1f} |" for e in everyone])
        report.write_results(name, report.command_line(f"torchrun --standalone --nproc-per-node {P}"), machine, table,
                             {"args": vars(a), "P": P, "single_process_tensors_mb": whole, "ranks": everyone})
        report.bar_plot(name + ".png", f"Ring attention's memory per rank, S = {a.S}, P = {P} (dashed: one process's "
                        "q, k, v, out and lse alone)", [f"rank {e['rank']}" for e in everyone],
                        {"attention MiB (peak − baseline)": [e["attention_mb"] for e in everyone]}, "MiB", machine,
                        ref=whole)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
