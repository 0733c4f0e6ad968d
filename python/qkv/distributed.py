"""Context parallelism: one attention over a sequence split across the ranks of torch.distributed.

    import torch.distributed as dist
    import qkv.distributed as qd
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    q_l, k_l, v_l = (qd.shard(x, dim=2) for x in (q, k, v))   # this rank's part of the sequence
    out_l = qd.ring_attention(q_l, k_l, v_l, causal=True)      # differentiable
    out = qd.unshard(out_l, dim=2)                             # the whole sequence, on every rank

Layout (P ranks, sequence length S, c = S / (2P) positions per chunk):
    the sequence is cut into 2P chunks; rank r holds chunks r and 2P-1-r, in that order, so its
    local positions are [r·c, (r+1)·c) followed by [(2P-1-r)·c, (2P-r)·c). Under a causal mask
    chunk i sees i+1 chunks' worth of keys, so the pair (r, 2P-1-r) gives every rank the same
    work: 2P+1 chunk-pairs.

Ring (shapes of one rank: q [B, H, 2c, D], k [B, Hkv, 2c, D], v [B, Hkv, 2c, Dv]):
    at step t = 0 .. P-1 rank r holds the k, v of rank src = (r - t) mod P, computes attention of
    its queries against them (qkv.attention with return_lse), and merges the partial output into
    its running output by log-sum-exp:
        lse = logaddexp(lse, lse_t),  out = out · exp(lse_old - lse) + out_t · exp(lse_t - lse).
    Meanwhile it already sends its block to rank r+1 and receives the next from rank r-1
    (isend / irecv on the group), so the transfer hides behind the compute.
    Causal, with q chunks a in {r, 2P-1-r} and kv chunks b in {src, 2P-1-src}, a pair is fully
    visible (a > b), diagonal (a = b) or invisible (a < b):
        t = 0 (src = r)  local causal attention over the local 2c positions (both diagonals; the
                         local order is increasing, so top_left alignment is the global rule)
        src < r          all 2c queries see kv chunk src only:        q [2c] x kv[:c]
        src > r          only query chunk 2P-1-r sees both kv chunks: q[c:] x kv [2c]
    so every step costs 2c² scores on every rank.

Backward: the same ring again. With the merged out and lse of the forward, the gradient of a
block is exact on its own (P_ij = exp(s_ij - lse_i), delta_i = dout_i · out_i use only the final
values): dq accumulates locally; the dk, dv partials of a block travel with it, are summed on
each rank it visits and arrive at their owner after P hops.
    float32 / bfloat16 blocks run qkv.attention_backward(kernel="flash"), which takes the given
    lse and out; bfloat16 inputs are upcast to float32 for it (that kernel computes in float32
    anyway), so the partial dq, dk, dv are summed unrounded. float64 blocks run the same formulas in torch matmuls ([B, H, Sq_blk, Skv_blk]
    scores in memory), because qkv's float64 backward (the reference kernel) recomputes the
    softmax from the keys it is given and so cannot take a global lse.
Accumulators (out, dk, dv in flight) are float32 for float32 / bfloat16 inputs, float64 for
float64; results are returned in the input dtype.

Errors: every rank validates its inputs, then one small all_gather_object exchanges the
shapes and local problems, so a mismatch raises the same ValueError on every rank instead of a
hang. Collective timeouts come from init_process_group(timeout=...).
"""

from __future__ import annotations

import math
import time
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist

from . import _plan
from . import functional as F

__all__ = ["shard", "unshard", "ring_attention", "last_timings"]

# Per-step timings of the last ring_attention forward and backward on this process, in seconds:
# {"forward": {"compute": [...], "wait": [...]}, "backward": {...}}. "wait" is the time spent
# waiting for transfers after the step's compute, i.e. communication that did not hide.
last_timings: dict = {}

_TAG_KV = 0   # message tags: k, v blocks and the dk, dv partials travel on the same pairs of ranks
_TAG_DKV = 1


# ---------------------------------------------------------------------------------------------
# Groups and the load-balanced layout
# ---------------------------------------------------------------------------------------------

def _check_group(fn: str, group) -> Tuple[int, int]:
    """(rank, size) of this process in `group` (None: the default group); raises if the group
    cannot move CPU tensors or this process is not in it."""
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(f"[{fn}] torch.distributed is not initialized: call "
                           f"torch.distributed.init_process_group('gloo', timeout=...) first")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"[{fn}] group: this process (global rank {dist.get_rank()}) is not a member")
    backend = str(dist.get_backend(group))
    # "gloo", or a device map such as "cpu:gloo,cuda:nccl": qkv's tensors live on the CPU.
    names = dict(p.split(":", 1) for p in backend.split(",")) if ":" in backend else {"cpu": backend}
    cpu = names.get("cpu")
    if cpu is None or "cpu" not in dist.Backend.backend_capability.get(cpu, []):
        raise ValueError(f"[{fn}] group: backend {backend!r} cannot move CPU tensors (qkv runs on the CPU); "
                         f"use a group with the gloo (or mpi, ucc) backend, e.g. new_group(backend='gloo')")
    return dist.get_rank(group), dist.get_world_size(group)


def _global(group, r: int) -> int:
    return r if group is None else dist.get_global_rank(group, r)


def _dim(fn: str, x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"[{fn}] x: expected a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"[{fn}] dim: {dim} is out of range for a tensor of shape {list(x.shape)}")
    return dim % x.dim()


def shard(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This rank's part of the full sequence x along `dim`: chunks r and 2P-1-r of 2P, concatenated.

    x.shape[dim] must be a multiple of 2P. Every rank calls it with the same full x (no
    communication happens). Returns a new tensor (x.shape with dim divided by P).
    """
    fn = "qkv.distributed.shard"
    r, P = _check_group(fn, group)
    d = _dim(fn, x, dim)
    S = x.shape[d]
    if S % (2 * P):
        raise ValueError(f"[{fn}] x: dimension {d} has length {S}, which the load-balanced split over {P} ranks "
                         f"cannot cut into 2P = {2 * P} equal chunks (shape {list(x.shape)})")
    c = S // (2 * P)
    return torch.cat([x.narrow(d, r * c, c), x.narrow(d, (2 * P - 1 - r) * c, c)], dim=d)


def unshard(x_local: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """The full sequence from every rank's shard (the inverse of :func:`shard`), on every rank.

    A collective: every rank of the group calls it with shards of equal shape (checked first with a
    small all_gather, so a mismatch raises on every rank). Keeps no autograd history.
    """
    fn = "qkv.distributed.unshard"
    _, P = _check_group(fn, group)
    problem = ""
    try:
        d = _dim(fn, x_local, dim)
        if x_local.shape[d] % 2:
            problem = f"dimension {d} has odd length {x_local.shape[d]} (a shard holds two equal chunks)"
        desc = (tuple(x_local.shape), str(x_local.dtype), problem)
    except (TypeError, ValueError) as e:   # reported by every rank below, without the [fn] prefix twice
        desc = (None, None, str(e).removeprefix(f"[{fn}] "))
    descs = _all_gather_object(desc, P, group)
    bad = [i for i, di in enumerate(descs) if di[2]]
    if bad:
        raise ValueError(f"[{fn}] x_local: " + "; ".join(f"rank {i}: {descs[i][2]}" for i in bad))
    if any(di[:2] != descs[0][:2] for di in descs):
        raise ValueError(f"[{fn}] x_local: shards differ across ranks: " +
                         ", ".join(f"rank {i} {list(di[0])} {di[1]}" for i, di in enumerate(descs)))
    parts = [torch.empty_like(x_local, memory_format=torch.contiguous_format) for _ in range(P)]
    dist.all_gather(parts, x_local.detach().contiguous(), group=group)
    c = x_local.shape[d] // 2
    chunks = [None] * (2 * P)
    for i, p in enumerate(parts):
        chunks[i], chunks[2 * P - 1 - i] = p.narrow(d, 0, c), p.narrow(d, c, c)
    return torch.cat(chunks, dim=d)


def _all_gather_object(obj, P: int, group) -> list:
    out: List[object] = [None] * P
    dist.all_gather_object(out, obj, group=group)
    return out


# ---------------------------------------------------------------------------------------------
# The ring
# ---------------------------------------------------------------------------------------------

def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class _Ring:
    """Sends to rank r+1 and receives from rank r-1 of the group, asynchronously."""

    def __init__(self, group, r: int, P: int):
        self.group = group
        self.next, self.prev = _global(group, (r + 1) % P), _global(group, (r - 1) % P)

    def send(self, t: torch.Tensor, tag: int):
        return dist.isend(t, self.next, group=self.group, tag=tag)

    def recv(self, t: torch.Tensor, tag: int):
        return dist.irecv(t, self.prev, group=self.group, tag=tag)


def _blocks(r: int, src: int, c: int, causal: bool):
    """(query rows, kv rows, diagonal) of the one attention call of a ring step; see the module doc."""
    if not causal:
        return slice(None), slice(None), False
    if src == r:
        return slice(None), slice(None), True
    if src < r:
        return slice(None), slice(0, c), False
    return slice(c, 2 * c), slice(None), False


def _pack(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """k and v copied into one flat buffer [k.numel() + v.numel()] (one message per ring step)."""
    buf = torch.empty(k.numel() + v.numel(), dtype=k.dtype)
    buf[:k.numel()].view(k.shape).copy_(k)
    buf[k.numel():].view(v.shape).copy_(v)
    return buf


def _unpack(buf: torch.Tensor, ks, vs) -> Tuple[torch.Tensor, torch.Tensor]:
    nk = math.prod(ks)
    return buf[:nk].view(ks), buf[nk:].view(vs)


def _forward(q, k, v, scale, causal, group, r, P):
    """(out [B, H, S_l, Dv] in q's dtype, lse [B, H, S_l] float32/float64) of the whole ring."""
    ring = _Ring(group, r, P)
    c = q.shape[2] // 2
    acc = _acc_dtype(q.dtype)
    cur, nxt = _pack(k, v), None
    out = lse = None
    times = {"compute": [], "wait": []}
    for t in range(P):
        src = (r - t) % P
        reqs = []
        if t < P - 1:
            nxt = torch.empty_like(cur) if nxt is None else nxt
            reqs = [ring.send(cur, _TAG_KV), ring.recv(nxt, _TAG_KV)]
        t0 = time.perf_counter()
        kb, vb = _unpack(cur, k.shape, v.shape)
        rows, cols, diag = _blocks(r, src, c, causal)
        res = F.attention(q[:, :, rows], kb[:, :, cols], vb[:, :, cols], scale=scale, causal=diag,
                          align="top_left", return_lse=True)
        if t == 0:  # step 0 covers every row (module doc), so every lse below is finite
            out, lse = res.out.to(acc), res.lse
        else:
            o_acc, l_acc = out[:, :, rows], lse[:, :, rows]
            new = torch.logaddexp(l_acc, res.lse)
            o_acc.mul_(torch.exp(l_acc - new).unsqueeze(-1))
            o_acc.add_(res.out.to(acc).mul_(torch.exp(res.lse - new).unsqueeze(-1)))   # res.out is ours: in place
            l_acc.copy_(new)
        t1 = time.perf_counter()
        for w in reqs:
            w.wait()
        times["compute"].append(t1 - t0)
        times["wait"].append(time.perf_counter() - t1)
        if reqs:
            cur, nxt = nxt, cur
    last_timings["forward"] = times
    return out.to(q.dtype), lse


def _block_backward_f64(q, k, v, out, dout, lse, scale, diag, rows_per_pass=512):
    """(dq, dk, dv) of one block in float64 from the final out and lse (see the module doc).
    q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv]; dk, dv summed over each head group.
    Query rows go `rows_per_pass` at a time, so the scores take [B, H, rows_per_pass, Skv]."""
    G, Hkv = q.shape[1] // k.shape[1], k.shape[1]
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)             # [B, H, Skv, D | Dv]
    dq = torch.empty_like(q)
    dk, dv = torch.zeros_like(kk), torch.zeros_like(vv)
    for i0 in range(0, q.shape[2], rows_per_pass):
        qi, oi, gi = (x[:, :, i0:i0 + rows_per_pass] for x in (q, out, dout))
        s = torch.matmul(qi, kk.transpose(-1, -2)) * scale                     # [B, H, n, Skv]
        if diag:   # key j is masked for query row i0 + i when j > i0 + i
            n, Skv = s.shape[-2:]
            s.masked_fill_(torch.arange(Skv) > torch.arange(i0, i0 + n).unsqueeze(1), -math.inf)
        p = torch.exp(s - lse[:, :, i0:i0 + rows_per_pass].unsqueeze(-1))
        ds = p * (torch.matmul(gi, vv.transpose(-1, -2)) - (gi * oi).sum(-1, keepdim=True)) * scale
        dq[:, :, i0:i0 + rows_per_pass] = torch.matmul(ds, kk)
        dk += torch.matmul(ds.transpose(-1, -2), qi)
        dv += torch.matmul(p.transpose(-1, -2), gi)
    return dq, dk.unflatten(1, (Hkv, G)).sum(2), dv.unflatten(1, (Hkv, G)).sum(2)


def _backward(q, k, v, out, lse, dout, scale, causal, group, r, P):
    """(dq, dk, dv) of this rank's shards; see the module doc."""
    ring = _Ring(group, r, P)
    c = q.shape[2] // 2
    dtype, acc = q.dtype, _acc_dtype(q.dtype)
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    dq = torch.zeros(q.shape, dtype=acc)
    nk = k.numel()
    # The blocks' gradients are computed in `acc`: one rounding to bfloat16, at the end.
    q, out, dout = q.to(acc), out.to(acc), dout.to(acc)
    cur, nxt = _pack(k, v), None
    sending = None   # (request, buffer) of the dk, dv partials sent last step
    times = {"compute": [], "wait": []}
    for t in range(P):
        src = (r - t) % P
        reqs = []
        if t < P - 1:
            nxt = torch.empty_like(cur) if nxt is None else nxt
            reqs = [ring.send(cur, _TAG_KV), ring.recv(nxt, _TAG_KV)]
        # The dk, dv sums of block src so far, from rank r-1 (which visited it at step t-1).
        dkv = torch.empty(nk + v.numel(), dtype=acc)
        recv = ring.recv(dkv, _TAG_DKV) if t > 0 else None
        t0 = time.perf_counter()
        kb, vb = _unpack(cur.to(acc), k.shape, v.shape)
        rows, cols, diag = _blocks(r, src, c, causal)
        qr, o, g, lr = q[:, :, rows], out[:, :, rows], dout[:, :, rows], lse[:, :, rows]
        if dtype == torch.float64:
            gq, gk, gv = _block_backward_f64(qr, kb[:, :, cols], vb[:, :, cols], o, g, lr, sc, diag)
        else:
            gq, gk, gv, _ = F.attention_backward(qr, kb[:, :, cols], vb[:, :, cols], o, g, lr, scale=scale,
                                                 causal=diag, align="top_left", kernel="flash")
        dq[:, :, rows] += gq
        t1 = time.perf_counter()
        if recv is not None:
            recv.wait()
        else:
            dkv.zero_()
        dk_b, dv_b = _unpack(dkv, k.shape, v.shape)
        dk_b[:, :, cols] += gk
        dv_b[:, :, cols] += gv
        if sending is not None:
            sending[0].wait()
        sending = (ring.send(dkv, _TAG_DKV), dkv) if P > 1 else (None, dkv)
        for w in reqs:
            w.wait()
        times["compute"].append(t1 - t0)
        times["wait"].append(time.perf_counter() - t1)
        if reqs:
            cur, nxt = nxt, cur
    # After P hops the sums of this rank's own block arrive from rank r-1 (P = 1: they are here).
    t1 = time.perf_counter()
    mine = sending[1]
    if P > 1:
        mine = torch.empty(nk + v.numel(), dtype=acc)
        ring.recv(mine, _TAG_DKV).wait()
        sending[0].wait()
    times["wait"].append(time.perf_counter() - t1)
    last_timings["backward"] = times
    dk, dv = _unpack(mine, k.shape, v.shape)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, group, r, P):
        out, lse = _forward(q.detach(), k.detach(), v.detach(), scale, causal, group, r, P)
        ctx.opts = (scale, causal, group, r, P)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, group, r, P = ctx.opts
        dq, dk, dv = _backward(q, k, v, out, lse, dout.contiguous(), scale, causal, group, r, P)
        return dq, dk, dv, None, None, None, None, None


_FN = "qkv.distributed.ring_attention"


def _describe(q, k, v, causal: bool, scale, enable_gqa: bool) -> Tuple[tuple, str]:
    """(what must agree across ranks, this rank's own problem or '')."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            return (), f"{name}: expected a torch.Tensor, got {type(t).__name__}"
        if t.device.type != "cpu":
            return (), f"{name}: qkv runs on the CPU, got a tensor on {t.device}"
    desc = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype), bool(causal), scale, bool(enable_gqa))
    shapes = f"q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}"
    if q.dtype not in (torch.float32, torch.bfloat16, torch.float64) or k.dtype != q.dtype or v.dtype != q.dtype:
        return desc, f"q, k, v must share one dtype of float32, bfloat16, float64, got {q.dtype}, {k.dtype}, {v.dtype}"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return desc, f"q, k, v must have rank 4 [B, H, S_local, D], got {shapes}"
    (B, H, S, D), (Bk, Hk, Sk, Dk), (Bv, Hv, Sv, _) = q.shape, k.shape, v.shape
    if Bk != B or Bv != B or Dk != D or Sk != S or Sv != S or Hv != Hk:
        return desc, (f"k and v must be [B, Hkv, S_local, D] and [B, Hkv, S_local, Dv] with q's B, S_local and D "
                      f"(q [B, H, S_local, D]), got {shapes}")
    if (Hk != H and not enable_gqa) or Hk == 0 or H % Hk:
        return desc, (f"key/value heads ({Hk}) must equal query heads ({H}), or divide them with "
                      f"enable_gqa=True, got {shapes}, enable_gqa={enable_gqa}")
    if S == 0 or (causal and S % 2):
        return desc, (f"S_local = {S}: a causal ring needs an even, non-zero local length (two equal chunks "
                      f"from qkv.distributed.shard), got {shapes}")
    return desc, ""


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                   scale: Optional[float] = None, enable_gqa: bool = False, group=None) -> torch.Tensor:
    """Attention over the sequence shared by the ranks of `group`; returns this rank's output shard.

    Args:
        q: [B, H, S_local, D], this rank's queries as :func:`shard` lays them out (dim 2);
            float32, bfloat16 or float64, on the CPU.
        k: [B, Hkv, S_local, D], v: [B, Hkv, S_local, Dv]: this rank's keys and values, same layout.
        causal: query i sees key j <= i, positions counted in the full sequence (needs the
            :func:`shard` layout; without causal any layout works, as long as q and k, v agree).
        scale: score scale; None means 1/sqrt(D).
        enable_gqa: allow Hkv < H (H % Hkv == 0); query head h reads kv head h // (H / Hkv).
        group: the process group (None: the default one); its backend must move CPU tensors (gloo).

    Returns:
        [B, H, S_local, Dv] in q's dtype, equal to rows of single-process attention on the
        gathered sequence. Differentiable in q, k and v (the backward is a second ring).

    A collective: every rank of the group must call it, with the same shapes and options; this is
    checked first (one small all_gather), and a mismatch raises ValueError on every rank.
    """
    r, P = _check_group(_FN, group)
    desc = None
    try:
        sc = _plan.check_scale(_FN, scale)
    except TypeError as e:
        sc, local = None, str(e)
    else:
        desc, local = _describe(q, k, v, causal, sc, enable_gqa)
    descs = _all_gather_object((desc if not local else None, local), P, group)
    bad = [(i, d[1]) for i, d in enumerate(descs) if d[1]]
    if bad:
        raise ValueError(f"[{_FN}] " + "; ".join(f"rank {i}: {m}" for i, m in bad))
    if any(d[0] != descs[0][0] for d in descs):
        raise ValueError(f"[{_FN}] q, k, v or options differ across ranks (each rank must pass shards of the same "
                         f"shape): " + "; ".join(f"rank {i}: q {list(d[0][0])}, k {list(d[0][1])}, v {list(d[0][2])}, "
                                                 f"{d[0][3]}, causal={d[0][4]}, scale={d[0][5]}, "
                                                 f"enable_gqa={d[0][6]}" for i, d in enumerate(descs)))
    return _RingAttention.apply(q, k, v, sc, bool(causal), group, r, P)
