"""How much of the ring's communication hides behind compute, across block sizes.

    torchrun --standalone --nproc-per-node 2 bench/ring_overlap.py [--name ring_overlap_P2]

For each sequence length S (P ranks, one thread each, causal, f32, B = 1, H = Hkv, D = 64), on
every rank: ring_attention forward + backward `--reps` times (the fastest call kept), with
qkv.distributed.last_timings giving each ring step's compute time and the wait after it; then
one k, v block exchanged around the ring alone (isend + irecv, nothing to overlap with). The
exposed wait of a step is the part of its transfer that did not hide:
    overlap = 1 - median(exposed wait of steps with a transfer in flight) / (transfer alone).
Also the gloo loopback one-way time of small and large messages (latency, bandwidth) and each
rank's peak RSS. Rank 0 writes, through bench/report.py, bench/results/NAME.{md,json} (all ranks' figures, the
load) and NAME.png, the overlap against S (NAME: --name, default ring_overlap_P<P>).
"""

import argparse
import datetime
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist

import qkv
import qkv.distributed as qd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402


def transfer_alone(n, dtype, r, P, reps=5):
    """Seconds of one isend to r+1 with one irecv from r-1 of n elements (the minimum of reps)."""
    a, b = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
    best = float("inf")
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        for w in (dist.isend(a, (r + 1) % P), dist.irecv(b, (r - 1) % P)):
            w.wait()
        best = min(best, time.perf_counter() - t0)
    return best


def one_way(nbytes, r, iters):
    """Half a round trip between ranks 0 and 1 (others idle)."""
    buf = torch.empty(max(1, nbytes // 4), dtype=torch.float32)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        if r == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif r == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return (time.perf_counter() - t0) / (2 * iters)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--S", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--H", type=int, default=1)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--name", help="writes bench/results/NAME.{md,json,png} (default ring_overlap_P<P>)")
    a = p.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    r, P = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    qkv.set_num_threads(1)
    rows = []
    for S in a.S:
        g = torch.Generator().manual_seed(S)
        full = [torch.randn(1, a.H, S, a.D, generator=g) for _ in range(4)]
        q, k, v, dout = (qd.shard(x, 2) for x in full)
        best = None
        for _ in range(a.reps):
            leaves = [x.clone().requires_grad_() for x in (q, k, v)]
            dist.barrier()
            t0 = time.perf_counter()
            out = qd.ring_attention(*leaves, causal=True)
            t1 = time.perf_counter()
            out.backward(dout)
            t2 = time.perf_counter()
            if best is None or t2 - t0 < best["forward_s"] + best["backward_s"]:
                best = {"forward_s": t1 - t0, "backward_s": t2 - t1,
                        "steps": {ph: dict(v_) for ph, v_ in qd.last_timings.items()}}
        xfer = transfer_alone(k.numel() + v.numel(), k.dtype, r, P)
        fw = best["steps"]["forward"]["wait"][:-1]       # steps with a k, v transfer in flight
        bw = best["steps"]["backward"]["wait"][1:-1]     # steps with k, v and dk, dv in flight
        rows.append({"S": S, "S_local": S // P, "block_bytes": (k.numel() + v.numel()) * 4, **best,
                     "transfer_alone_s": xfer,
                     "forward_compute_per_step_s": statistics.median(best["steps"]["forward"]["compute"]),
                     "forward_exposed_wait_per_step_s": statistics.median(fw) if fw else 0.0,
                     "backward_exposed_wait_per_step_s": statistics.median(bw) if bw else 0.0,
                     "overlap_forward": 1 - statistics.median(fw) / xfer if fw else None})
    lat = {n: one_way(n, r, 200 if n <= 1 << 16 else 10) for n in (8, 1 << 10, 1 << 16, 1 << 20, 1 << 24)}
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    rep = {"rank": r, "rows": rows, "one_way_s": lat, "peak_rss_mb": rss_mb}
    everyone = [None] * P
    dist.all_gather_object(everyone, rep)
    if r == 0:
        lines = [f"P = {P} ranks of one thread, causal, float32, B = 1, H = {a.H}, D = {a.D}; rank 0's figures, the "
                 f"fastest of {a.reps} calls.", "",
                 "| S | forward ms | compute per step ms | one block alone ms | exposed wait per step ms | overlap |",
                 "|---|---|---|---|---|---|"]
        for row in rows:
            ov = "—" if row["overlap_forward"] is None else f"{row['overlap_forward']:.3f}"
            lines.append(f"| {row['S']} | {row['forward_s'] * 1e3:.1f} | {row['forward_compute_per_step_s'] * 1e3:.2f} | "
                         f"{row['transfer_alone_s'] * 1e3:.2f} | {row['forward_exposed_wait_per_step_s'] * 1e3:.3f} | {ov} |")
        lines += ["", f"gloo loopback one-way seconds by message bytes: {lat}; peak RSS MiB per rank: "
                  f"{[round(e['peak_rss_mb']) for e in everyone]}"]
        print("\n".join(lines), flush=True)
        name = a.name or f"ring_overlap_P{P}"
        machine = report.machine_line({}, {}, [report.loadavg()])
        report.write_results(name, report.command_line(f"torchrun --standalone --nproc-per-node {P}"), machine,
                             "\n".join(lines), {"P": P, "args": vars(a), "ranks": everyone})
        report.bar_plot(name + ".png", f"Ring attention, P = {P}: share of each step's k, v transfer hidden behind "
                        "compute (forward)", [f"S = {row['S']}" for row in rows],
                        {"overlap": [row["overlap_forward"] for row in rows]}, "1 − exposed wait / transfer alone",
                        machine, ref=1.0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
