"""qkv.distributed across real processes: torchrun launches dist_worker.py on localhost (gloo).

Each launch has a timeout (a hang fails the test), one thread per rank, and a free port
(torchrun --standalone picks one). The workers write what they measured to JSON; the asserts
are here, with the tolerances and their reasons.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def launch(modes: str, P: int, out_dir, timeout: float = 120.0) -> list:
    """Run dist_worker.py MODES on P ranks; returns the P rank reports (asserts every rank wrote one)."""
    torchrun = shutil.which("torchrun")
    cmd = ([torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]) + [
        "--standalone", f"--nproc-per-node={P}", WORKER, modes, str(out_dir)]
    env = dict(os.environ, QKV_NUM_THREADS="1", OMP_NUM_THREADS="1")
    try:
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun {modes} P={P} did not finish within {timeout} s (a hang):\n{e.stdout}\n{e.stderr}")
    assert run.returncode == 0, f"torchrun {modes} P={P} failed:\n{run.stdout}\n{run.stderr[-6000:]}"
    reports = []
    for r in range(P):
        with open(os.path.join(out_dir, f"rank{r}.json")) as f:
            reports.append(json.load(f))
    print(f"torchrun P={P} {modes}: seconds per mode on rank 0 {reports[0]['seconds']}")
    return reports


# One launch per world size, each running several modes: P = 2 also trains, P = 3 also tries the
# bad inputs (3 ranks: an error raised by one rank, or by ranks 1 and 2, must reach rank 0).
MODES = {2: "exact,ddp", 3: "exact,errors", 4: "exact"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache = {}

    def get(P):
        if P not in cache:
            cache[P] = launch(MODES[P], P, tmp_path_factory.mktemp(f"dist{P}"))
        return cache[P]
    return get


# Tolerances, relative to the largest magnitude of the compared shard (max |a - b| / max |b|):
#   float64: 1e-12 against single-process qkv float64. Both are exact up to rounding (~1e-16 per
#     operation); the ring merges P partial softmaxes and sums P partial gradients in another
#     order, which costs a few ulps, far below 1e-12.
#   float32 / bfloat16: the FlashAttention rule. Against a float64 truth computed on the same
#     (rounded) inputs, the ring may err at most FACTOR times as much as single-process qkv in the
#     same dtype (or than the dtype's unit roundoff u, when the single-process error is below it
#     by luck). FACTOR is 3 where the ring rounds more often than one kernel call: every step's
#     partial output (float32, or bfloat16 as the bfloat16 forward kernel writes it) and, in
#     float32, every step's partial dq, dk, dv are rounded before they are merged or summed, P
#     roundings the single-process kernel does not make (measured at P = 2..4: up to 2.0x in
#     float32, 1.4x for the bfloat16 output). The bfloat16 backward runs in float32 and rounds its
#     gradients to bfloat16 once, as single-process does: FACTOR 2 (measured up to 1.4x).
FACTOR = {("float32", "out"): 3.0, ("float32", "dq"): 3.0, ("float32", "dk"): 3.0, ("float32", "dv"): 3.0,
          ("bfloat16", "out"): 3.0, ("bfloat16", "dq"): 2.0, ("bfloat16", "dk"): 2.0, ("bfloat16", "dv"): 2.0}
U = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8}


@pytest.mark.parametrize("P", [2, 3, 4])
def test_ring_equals_single_process(P, runs):
    worst = {}
    for rep in runs(P):
        rep = dict(rep["exact"], rank=rep["rank"])
        assert rep["unshard_roundtrip"], f"rank {rep['rank']}: unshard(shard(x)) != x"
        # float64 ring output gathered by unshard vs single-process float64: 1e-12 as below.
        assert rep["unshard_out_rel_err"] < 1e-12, rep["unshard_out_rel_err"]
        # A subgroup (ranks 1 .. P-1 for P >= 3, one rank alone for P = 2), float64: 1e-12 as below.
        sub = rep["subgroup"]
        if rep["rank"] > 0 or P == 2:
            assert sub["size"] == (P - 1 if P >= 3 else 1) and sub["rel_err"] < 1e-12, sub
        assert len(rep["rows"]) == 4 * 2 * 2 * 3   # D x causal x GQA x dtype
        for row in rep["rows"]:
            case = f"P={P} rank {rep['rank']} D={row['D']} causal={row['causal']} gqa={row['gqa']} {row['dtype']}"
            for name in ("out", "dq", "dk", "dv"):
                if row["dtype"] == "float64":
                    err, bound = row["ring_vs_single"][name], 1e-12
                else:
                    err = row["ring_vs_truth"][name]
                    bound = FACTOR[row["dtype"], name] * max(row["single_vs_truth"][name], U[row["dtype"]])
                assert err <= bound, f"{case} {name}: relative error {err:.3e} > bound {bound:.3e} ({row})"
                key = (row["dtype"], name)
                worst[key] = max(worst.get(key, 0.0), err / bound)
    print(f"P={P}: worst error / bound per (dtype, tensor):",
          {f"{d} {n}": round(v, 3) for (d, n), v in sorted(worst.items())})


def test_bad_input_raises_on_every_rank(runs):
    expected = {
        "shape_mismatch": ("ValueError", "differ across ranks"),
        "dtype_one_rank": ("ValueError", "rank 0: q, k, v must share one dtype"),
        "causal_mismatch": ("ValueError", "differ across ranks"),
        "shard_indivisible": ("ValueError", "cannot cut into 2P = 6 equal chunks"),
        "odd_local": ("ValueError", "needs an even, non-zero local length"),
        "unshard_mismatch": ("ValueError", "shards differ across ranks"),
        "wrong_backend": ("ValueError", "backend 'qkv_test_cuda_only' cannot move CPU tensors"),
        "wrong_backend_shard": ("ValueError", "backend 'qkv_test_cuda_only' cannot move CPU tensors"),
    }
    for rep in runs(3):
        rep = dict(rep["errors"], rank=rep["rank"])
        for case, (typ, text) in expected.items():
            got_type, msg = rep[case]
            assert got_type == typ and text in msg, f"rank {rep['rank']} {case}: {got_type}: {msg!r}"
            assert msg.startswith("[qkv.distributed."), msg
        # The group is usable after the errors (nothing was left half-sent): float32 ring vs
        # single-process float32, a few ulps of float32 apart (different summation order).
        assert rep["after_errors_rel_err"] < 1e-5


def test_training_across_processes_matches_one_process(runs):
    for rep in runs(2):
        rep = dict(rep["ddp"], rank=rep["rank"])
        # float64 model: DDP's average of two per-rank gradients, and the ring's merged softmax,
        # equal the one-process gradient up to rounding (1e-12, as for the float64 ring above);
        # parameters after 3 SGD steps likewise.
        for setup in ("data_parallel", "context_parallel"):
            for what in ("grad", "params"):
                assert rep[setup][what] < 1e-12, f"rank {rep['rank']} {setup} {what}: {rep[setup][what]:.3e}"


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows_per_pass", [5, 16, 512])
def test_float64_block_backward_equals_qkv(causal, rows_per_pass):
    # The float64 ring backward (torch matmuls, query rows in passes) on one block holding the whole
    # sequence against qkv's float64 backward (the reference kernel): both exact up to rounding, 1e-12.
    import qkv
    from qkv.distributed import _block_backward_f64

    g = torch.Generator().manual_seed(4)
    B, H, Hkv, S, D = 2, 4, 2, 37, 24
    q, dout = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    k, v = (torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    fwd = qkv.attention(q, k, v, causal=causal, return_lse=True)
    want = qkv.attention_backward(q, k, v, fwd.out, dout, fwd.lse, causal=causal)
    got = _block_backward_f64(q, k, v, fwd.out, dout, fwd.lse, D ** -0.5, causal, rows_per_pass)
    for name, a, b in zip(("dq", "dk", "dv"), got, want[:3]):
        err = float((a - b).abs().max() / b.abs().max())
        assert err < 1e-12, f"{name}: {err:.3e}"
