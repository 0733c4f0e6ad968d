"""One rank of the distributed tests (test_distributed.py launches it with torchrun).

    torchrun --standalone --nproc-per-node P dist_worker.py MODES OUT_DIR

MODES is a comma-separated list of exact, errors, ddp (one launch runs several: starting P
processes that import torch is the slow part). Each rank writes OUT_DIR/rank<r>.json: what it
measured per mode (errors against the oracles, the messages of the exceptions it caught) and the
seconds each mode took; the pytest side asserts on them,
so a failing comparison shows every rank's numbers. One thread per rank: P = 4 ranks fit on two
cores. Every collective has a 60 s timeout, so a bug that desynchronizes the ranks fails the run
instead of hanging it.
"""

import datetime
import json
import os
import sys
import time

os.environ["QKV_NUM_THREADS"] = "1"
os.environ["OMP_NUM_THREADS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import qkv  # noqa: E402
import qkv.distributed as qd  # noqa: E402

torch.set_num_threads(1)
qkv.set_num_threads(1)


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|, in float64 (norm-wise relative error)."""
    a, ref = a.double(), ref.double()
    return float((a - ref).abs().max() / ref.abs().max())


def full_inputs(B, H, Hkv, S, D, dtype, seed):
    """q, k, v, dout over the whole sequence: the same on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64)
    dout = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    return [x.to(dtype) for x in (q, k, v, dout)]


def single_process(q, k, v, dout, causal):
    """out, dq, dk, dv of qkv attention on the whole sequence in one process (the oracle)."""
    res = qkv.attention(q, k, v, causal=causal, return_lse=True)
    g = qkv.attention_backward(q, k, v, res.out, dout, res.lse, causal=causal)
    return res.out, g.dq, g.dk, g.dv


def ring(q, k, v, dout, causal, gqa, group=None):
    """out, dq, dk, dv of ring_attention: this rank's shards."""
    leaves = [qd.shard(x, 2, group).requires_grad_() for x in (q, k, v)]
    out_l = qd.ring_attention(*leaves, causal=causal, enable_gqa=gqa, group=group)
    out_l.backward(qd.shard(dout, 2, group))
    return [out_l.detach()] + [t.grad for t in leaves]


def mode_exact(r, P):
    # Awkward sizes: chunks of c = 11 positions, local blocks of 22 rows (not a tile multiple).
    B, c = 2, 11
    S = 2 * P * c
    rows = []
    for D in (32, 64, 80, 128):
        for causal in (False, True):
            for gqa in (False, True):
                H, Hkv = (4, 2) if gqa else (2, 2)
                # Inputs representable in bfloat16, so that all three dtypes see the same values
                # and one float64 oracle serves them all (qkv's float64 kernels, the reference, are
                # the slow part of this test: one call per case instead of three).
                base = [x.to(torch.bfloat16).double()
                        for x in full_inputs(B, H, Hkv, S, D, torch.float64, 1000 * D + 10 * causal + gqa)]
                # The oracles on the whole sequence, cut to this rank's shards (no communication:
                # one collective fewer per tensor and case keeps P = 4 on two cores fast).
                truth = [qd.shard(x, 2) for x in single_process(*base, causal)]
                for dtype in (torch.float64, torch.float32, torch.bfloat16):
                    q, k, v, dout = (x.to(dtype) for x in base)
                    got = ring(q, k, v, dout, causal, gqa)
                    # single-process qkv in the same dtype (for float64, the truth itself)
                    single = truth if dtype == torch.float64 else [
                        qd.shard(x, 2) for x in single_process(q, k, v, dout, causal)]
                    names = ("out", "dq", "dk", "dv")
                    rows.append({
                        "D": D, "causal": causal, "gqa": gqa, "dtype": str(dtype).replace("torch.", ""),
                        "ring_vs_single": {n: rel_err(a, b) for n, a, b in zip(names, got, single)},
                        "ring_vs_truth": {n: rel_err(a, b) for n, a, b in zip(names, got, truth)},
                        "single_vs_truth": {n: rel_err(a, b) for n, a, b in zip(names, single, truth)},
                    })
    # Subgroups: group ranks differ from global ranks (P >= 3: ranks 1 .. P-1 form a ring of P-1;
    # rank 0 is not in it), and a group of one rank (P = 2: each rank alone, no communication).
    members = [list(range(1, P))] if P >= 3 else [[0], [1]]
    groups = [dist.new_group(m, backend="gloo") for m in members]   # every rank creates every group
    mine = next((g for g, m in zip(groups, members) if r in m), None)
    sub = {}
    if mine is not None:
        Pg = dist.get_world_size(mine)
        q, k, v, dout = full_inputs(1, 4, 2, 2 * Pg * 7, 48, torch.float64, 9)
        got = ring(q, k, v, dout, True, True, mine)
        single = [qd.shard(x, 2, mine) for x in single_process(q, k, v, dout, True)]
        sub = {"size": Pg, "rel_err": max(rel_err(a, b) for a, b in zip(got, single))}
    # unshard inverts shard exactly, and gathers the ring's output into the single-process one.
    q, k, v, _ = full_inputs(B, 2, 2, S, 64, torch.float64, 5)
    roundtrip = all(torch.equal(qd.unshard(qd.shard(x, d), d), x) for x in (q, k, v) for d in (2, -1, 0)
                    if x.shape[d] % (2 * P) == 0)
    out = qd.unshard(qd.ring_attention(*(qd.shard(x, 2) for x in (q, k, v)), causal=True), 2)
    return {"rows": rows, "subgroup": sub, "unshard_roundtrip": roundtrip,
            "unshard_out_rel_err": rel_err(out, qkv.attention(q, k, v, causal=True).out)}


def expect_error(fn):
    """(type name, message) of the exception fn raises, or ("none", "") if it returns."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects the type and message
        return [type(e).__name__, str(e)]
    return ["none", ""]


def mode_errors(r, P):
    B, H, D, c = 1, 2, 16, 4
    q, k, v, _ = full_inputs(B, H, H, 2 * P * c, D, torch.float32, 7)
    ql, kl, vl = (qd.shard(x, 2) for x in (q, k, v))
    out = {}
    # Shapes that differ across ranks: the last rank has two more positions.
    extra = torch.zeros(B, H, 2, D)
    pad = (lambda x: torch.cat([x, extra], 2)) if r == P - 1 else (lambda x: x)
    out["shape_mismatch"] = expect_error(lambda: qd.ring_attention(pad(ql), pad(kl), pad(vl), causal=True))
    # A problem on one rank only (rank 0 passes k in float64): every rank must still raise.
    kd = kl.double() if r == 0 else kl
    out["dtype_one_rank"] = expect_error(lambda: qd.ring_attention(ql, kd, vl))
    # Options that differ across ranks.
    out["causal_mismatch"] = expect_error(lambda: qd.ring_attention(ql, kl, vl, causal=(r == 0)))
    # S not divisible as the load-balanced split needs (2P chunks), and an odd local length.
    odd = torch.zeros(B, H, 2 * P * c + 1, D)
    out["shard_indivisible"] = expect_error(lambda: qd.shard(odd, 2))
    out["odd_local"] = expect_error(lambda: qd.ring_attention(ql[:, :, 1:], kl[:, :, 1:], vl[:, :, 1:],
                                                              causal=True))
    out["unshard_mismatch"] = expect_error(lambda: qd.unshard(pad(ql), 2))
    # A group whose backend cannot move CPU tensors (registered for CUDA only, as NCCL is).
    dist.Backend.register_backend("qkv_test_cuda_only",
                                  lambda store, rank, size, timeout: dist.ProcessGroupGloo(store, rank, size, timeout),
                                  devices=["cuda"])
    cuda_only = dist.new_group(backend="qkv_test_cuda_only")
    out["wrong_backend"] = expect_error(lambda: qd.ring_attention(ql, kl, vl, group=cuda_only))
    out["wrong_backend_shard"] = expect_error(lambda: qd.shard(q, 2, group=cuda_only))
    # After all of that the group still works: a valid call gives the single-process result.
    got = qd.unshard(qd.ring_attention(ql, kl, vl, causal=True), 2)
    out["after_errors_rel_err"] = rel_err(got, qkv.attention(q, k, v, causal=True).out)
    return out


class TinyAttentionModel(torch.nn.Module):
    """x [B, S, E] -> x + W_o · attention(W_qkv x) -> mean-pooled logits [B, 3]; float64."""

    def __init__(self, E=16, H=2, attn=None):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.qkv = torch.nn.Parameter(torch.randn(3 * E, E, generator=g, dtype=torch.float64) / E ** 0.5)
        self.o = torch.nn.Parameter(torch.randn(E, E, generator=g, dtype=torch.float64) / E ** 0.5)
        self.head = torch.nn.Parameter(torch.randn(3, E, generator=g, dtype=torch.float64) / E ** 0.5)
        self.H, self.attn = H, attn

    def forward(self, x):
        B, S, E = x.shape
        q, k, v = (x @ self.qkv.T).view(B, S, 3, self.H, E // self.H).permute(2, 0, 3, 1, 4)  # each [B, H, S, Dh]
        a = self.attn(q, k, v).transpose(1, 2).reshape(B, S, E)
        return (x + a @ self.o.T) @ self.head.T   # [B, S, 3] per-token logits


def mode_ddp(r, P):
    import qkv.torch as qt
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = torch.Generator().manual_seed(11)
    Bt, S, E = 2 * P, 4 * P, 16
    x = torch.randn(Bt, S, E, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (Bt, S), generator=g)

    def loss_fn(logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 3), labels.reshape(-1))

    def train(model, xs, ys, steps=3):
        """Gradients of the first step and parameters after `steps` SGD steps."""
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        first = None
        for _ in range(steps):
            opt.zero_grad()
            loss_fn(model(xs), ys).backward()
            if first is None:
                first = [p.grad.clone() for p in model.parameters()]
            opt.step()
        return first, [p.detach().clone() for p in model.parameters()]

    plain = lambda q, k, v: qt.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    # The oracle: one process, the combined batch, the full sequence.
    ref_g, ref_p = train(TinyAttentionModel(attn=plain), x, y)
    out = {}
    # Data parallel: rank r takes sequences [2r, 2r + 2) of the batch.
    dp_g, dp_p = train(DDP(TinyAttentionModel(attn=plain)), x[2 * r:2 * r + 2], y[2 * r:2 * r + 2])
    out["data_parallel"] = {"grad": max(map(rel_err, dp_g, ref_g)), "params": max(map(rel_err, dp_p, ref_p))}
    # Context parallel: every rank takes the whole batch and its shard of the sequence; the ring
    # runs on its own gloo group, DDP averages the weight gradients over the default group (the
    # mean over ranks of per-shard mean losses is the mean over all tokens: equal shard sizes).
    cp_group = dist.new_group(backend="gloo")
    ring = lambda q, k, v: qd.ring_attention(q, k, v, causal=True, group=cp_group)  # noqa: E731
    cp_g, cp_p = train(DDP(TinyAttentionModel(attn=ring)), qd.shard(x, 1), qd.shard(y, 1))
    out["context_parallel"] = {"grad": max(map(rel_err, cp_g, ref_g)), "params": max(map(rel_err, cp_p, ref_p))}
    return out


def main():
    modes, out_dir = sys.argv[1].split(","), sys.argv[2]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    r, P = dist.get_rank(), dist.get_world_size()
    report = {"rank": r, "world": P, "seconds": {}}
    for mode in modes:
        t0 = time.perf_counter()
        report[mode] = {"exact": mode_exact, "errors": mode_errors, "ddp": mode_ddp}[mode](r, P)
        report["seconds"][mode] = time.perf_counter() - t0
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
