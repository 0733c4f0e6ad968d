"""Ring attention (qkv.distributed) against one process doing the same total work.

    python bench/ring_bench.py --S 32768 --H 1 --D 64 --rounds 3 --name ring_S32768

Each round runs, in alternation (A/B interleaved, as the machine is shared):
  single  one process, T threads, qkv attention on the whole sequence (forward, then backward);
  ring    torchrun with P ranks of T / P threads each, ring_attention on the shards (forward, then
          backward), plus, on the same ranks, a gloo loopback ping-pong (latency and bandwidth)
          and a ring exchange of one k, v block alone (the transfer the ring hides behind compute).
Figures are wall times of the attention calls only (process start and import excluded), the
median over rounds of each side's best-of-`--reps` per round. FLOP model: 4·B·H·S²·D forward,
halved for causal; the backward is counted as 2.5x the forward.
Overlap achieved = 1 - (exposed wait per step) / (transfer time of one block alone).
Through bench/report.py: the machine line (bench_attention --peak in --build before and after, when built; the load
of every round), bench/results/NAME.{md,json} (NAME: --name, default ring_S<S>_D<D>[_causal][_P<P>]) and NAME.png.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import report  # noqa: E402


def inputs(B, H, S, D, dtype, seed=0):
    import torch
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, S, D, generator=g).to(dtype) for _ in range(4)]   # q, k, v, dout


def run_single(a):
    import torch
    import qkv
    torch.set_num_threads(a.threads)
    qkv.set_num_threads(a.threads)
    q, k, v, dout = inputs(a.B, a.H, a.S, a.D, getattr(torch, a.dtype))
    fwd, bwd = [], []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        res = qkv.attention(q, k, v, causal=a.causal, return_lse=True)
        t1 = time.perf_counter()
        qkv.attention_backward(q, k, v, res.out, dout, res.lse, causal=a.causal)
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
    return {"forward_s": min(fwd), "backward_s": min(bwd)}


def pingpong(dist, r, sizes, iters):
    """Loopback between ranks 0 and 1: one-way time per message size (half a round trip)."""
    import torch
    out = {}
    for n in sizes:
        buf = torch.empty(n // 4, dtype=torch.float32)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters if n < 1 << 20 else max(3, iters // 20)):
            if r == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif r == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        it = iters if n < 1 << 20 else max(3, iters // 20)
        out[n] = (time.perf_counter() - t0) / (2 * it)
    return out


def run_ring(a):
    import torch
    import torch.distributed as dist
    import qkv
    import qkv.distributed as qd
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    r, P = dist.get_rank(), dist.get_world_size()
    t = max(1, a.threads // P)
    torch.set_num_threads(t)
    qkv.set_num_threads(t)
    q, k, v, dout = (qd.shard(x, 2) for x in inputs(a.B, a.H, a.S, a.D, getattr(torch, a.dtype)))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    fwd, bwd, steps = [], [], []
    for _ in range(a.reps):
        dist.barrier()
        t0 = time.perf_counter()
        out = qd.ring_attention(q, k, v, causal=a.causal)
        t1 = time.perf_counter()
        out.backward(dout)
        t2 = time.perf_counter()
        # The slowest rank sets the time of a collective.
        times = torch.tensor([t1 - t0, t2 - t1], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        fwd.append(float(times[0]))
        bwd.append(float(times[1]))
        steps.append({k_: dict(v_) for k_, v_ in qd.last_timings.items()})
        q.grad = k.grad = v.grad = None
    best = min(range(a.reps), key=lambda i: fwd[i] + bwd[i])
    # One k, v block moved around the ring alone: what each step has to hide.
    block = torch.empty(k.numel() + v.numel(), dtype=k.dtype)
    recv = torch.empty_like(block)
    nxt, prv = (r + 1) % P, (r - 1) % P
    xfer = []
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter()
        for w in (dist.isend(block, nxt), dist.irecv(recv, prv)):
            w.wait()
        xfer.append(time.perf_counter() - t0)
    pp = pingpong(dist, r, [8, 1 << 10, 1 << 16, 1 << 20, 1 << 24], 200) if P >= 2 else {}
    rep = {"rank": r, "forward_s": fwd[best], "backward_s": bwd[best], "steps": steps[best],
           "block_bytes": block.numel() * block.element_size(), "block_transfer_s": min(xfer),
           "pingpong_one_way_s": pp}
    with open(os.path.join(a.out_dir, f"rank{r}.json"), "w") as f:
        json.dump(rep, f)
    dist.destroy_process_group()


def child_args(a):
    return ["--B", str(a.B), "--H", str(a.H), "--S", str(a.S), "--D", str(a.D), "--dtype", a.dtype,
            "--threads", str(a.threads), "--reps", str(a.reps)] + (["--causal"] if a.causal else [])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=1)
    p.add_argument("--S", type=int, default=32768)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--P", type=int, default=2)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--threads", type=int, default=2, help="total threads: the single process, or P ranks")
    p.add_argument("--reps", type=int, default=1, help="calls per process (the best is kept)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--role", choices=["driver", "single", "ring"], default="driver")
    p.add_argument("--out-dir", help="(ring ranks) where each rank writes its JSON")
    p.add_argument("--name", help="writes bench/results/NAME.{md,json,png} (default ring_S<S>_D<D>[_causal][_P<P>])")
    p.add_argument("--build", default=os.path.join(report.ROOT, "build-ci"), help="where bench/bench_attention is")
    a = p.parse_args()
    if a.role == "single":
        print(json.dumps(run_single(a)))
        return
    if a.role == "ring":
        run_ring(a)
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    before = report.measure_peak(a.build)
    rounds = []
    for i in range(a.rounds):
        load = report.loadavg()
        env1 = dict(env, QKV_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
        single = json.loads(subprocess.run([sys.executable, HERE, "--role", "single"] + child_args(a), env=env1,
                                           check=True, capture_output=True, text=True).stdout)
        with tempfile.TemporaryDirectory() as d:
            tp = str(max(1, a.threads // a.P))
            envP = dict(env, QKV_NUM_THREADS=tp, OMP_NUM_THREADS=tp)
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={a.P}", HERE, "--role", "ring", "--out-dir", d] + child_args(a),
                           env=envP, check=True, capture_output=True, text=True)
            ranks = []
            for r in range(a.P):
                with open(os.path.join(d, f"rank{r}.json")) as f:
                    ranks.append(json.load(f))
        rounds.append({"load_1min": load, "single": single, "ring": ranks})
        print(f"round {i}: load {load:.1f}  single fwd {single['forward_s']:.2f} s bwd {single['backward_s']:.2f} s"
              f"  ring fwd {ranks[0]['forward_s']:.2f} s bwd {ranks[0]['backward_s']:.2f} s", flush=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    s_f, s_b = med([x["single"]["forward_s"] for x in rounds]), med([x["single"]["backward_s"] for x in rounds])
    r_f, r_b = med([x["ring"][0]["forward_s"] for x in rounds]), med([x["ring"][0]["backward_s"] for x in rounds])
    last = rounds[-1]["ring"]
    steps = {ph: {"compute_s": [st["steps"][ph]["compute"] for st in last],
                  "wait_s": [st["steps"][ph]["wait"] for st in last]} for ph in ("forward", "backward")}
    xfer = max(st["block_transfer_s"] for st in last)
    # Waits after the compute of steps that had a transfer in flight (all but the last forward step).
    fw = [w for st in last for w in st["steps"]["forward"]["wait"][:-1]]
    summary = {
        "single_forward_s": s_f, "single_backward_s": s_b, "ring_forward_s": r_f, "ring_backward_s": r_b,
        "ratio_forward": r_f / s_f, "ratio_fwd_bwd": (r_f + r_b) / (s_f + s_b),
        "block_bytes": last[0]["block_bytes"], "block_transfer_s": xfer,
        "forward_wait_per_step_s": statistics.median(fw) if fw else 0.0,
        "overlap_forward": 1 - (statistics.median(fw) / xfer) if fw and xfer > 0 else None,
        "steps_last_round": steps, "pingpong_one_way_s": last[0]["pingpong_one_way_s"],
    }
    flop = 4 * a.B * a.H * a.S * a.S * a.D * (0.5 if a.causal else 1.0)
    summary["single_forward_gflops"] = flop / s_f / 1e9
    summary["ring_forward_gflops"] = flop / r_f / 1e9
    print(json.dumps({k_: v_ for k_, v_ in summary.items() if k_ not in ("steps_last_round",)}, indent=1))
    after = report.measure_peak(a.build)
    machine = report.machine_line(before, after, [x["load_1min"] for x in rounds])
    name = a.name or f"ring_S{a.S}_D{a.D}" + ("_causal" if a.causal else "") + (f"_P{a.P}" if a.P != 2 else "")
    what = f"B={a.B}, H={a.H}, S={a.S}, D={a.D}, {a.dtype}, {'causal' if a.causal else 'not causal'}"
    table = "\n".join([
        f"{what}; medians of {a.rounds} interleaved rounds (best of {a.reps} calls each).", "",
        f"| | one process, {a.threads} threads | ring, P = {a.P} ranks | ring / one process |", "|---|---|---|---|",
        f"| forward | {s_f:.3g} s | {r_f:.3g} s | {r_f / s_f:.2f} |",
        f"| backward | {s_b:.3g} s | {r_b:.3g} s | {r_b / s_b:.2f} |",
        f"| forward + backward | {s_f + s_b:.3g} s | {r_f + r_b:.3g} s | {(r_f + r_b) / (s_f + s_b):.2f} |", "",
        f"one k, v block ({summary['block_bytes'] / 2**20:.1f} MiB) alone: {xfer * 1e3:.1f} ms; forward wait per step "
        f"{summary['forward_wait_per_step_s'] * 1e3:.2f} ms"
        + (f"; overlap {100 * summary['overlap_forward']:.1f} %" if summary["overlap_forward"] is not None else "")])
    print(table + "\n" + machine)
    report.write_results(name, report.command_line(), machine, table,
                         {"args": vars(a), "host": platform.node(), "cpus": os.cpu_count(),
                          "summary": summary, "rounds": rounds, "before": before, "after": after})
    report.bar_plot(name + ".png", f"Ring attention against one process, {what}: seconds (lower is faster)",
                    ["forward", "backward"], {f"one process, {a.threads} threads": [s_f, s_b],
                                               f"ring, P = {a.P}": [r_f, r_b]}, "seconds", machine)


if __name__ == "__main__":
    main()
