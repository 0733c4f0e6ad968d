"""How much of the ring's communication hides behind compute, across block sizes.

    torchrun --standalone --nproc-per-node 2 bench/ring_overlap.py --out bench/results/ring_overlap.json

For each sequence length S (P ranks, one thread each, causal, f32, B = 1, H = Hkv, D = 64), on
every rank: ring_attention forward + backward `--reps` times (the fastest call kept), with
qkv.distributed.last_timings giving each ring step's compute time and the wait after it; then
one k, v block exchanged around the ring alone (isend + irecv, nothing to overlap with). The
exposed wait of a step is the part of its transfer that did not hide:
    overlap = 1 - median(exposed wait of steps with a transfer in flight) / (transfer alone).
Also the gloo loopback one-way time of small and large messages (latency, bandwidth) and each
rank's peak RSS. Rank 0 writes the JSON (all ranks' figures).
"""

import argparse
import datetime
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist

import qkv
import qkv.distributed as qd


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
    p.add_argument("--out")
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
        for row in rows:
            print(f"S={row['S']:6d}  fwd {row['forward_s'] * 1e3:8.1f} ms  step compute "
                  f"{row['forward_compute_per_step_s'] * 1e3:8.2f} ms  transfer alone {row['transfer_alone_s'] * 1e3:6.2f} ms"
                  f"  exposed wait {row['forward_exposed_wait_per_step_s'] * 1e3:6.3f} ms  overlap "
                  f"{row['overlap_forward']:.3f}", flush=True)
        print("one-way s:", lat, " peak RSS MB per rank:", [e["peak_rss_mb"] for e in everyone])
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"P": P, "args": vars(a), "load_1min": os.getloadavg()[0],
                           "date": datetime.datetime.now().isoformat(timespec="seconds"),
                           "note": "shared 2-core machine; one thread per rank", "ranks": everyone}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
