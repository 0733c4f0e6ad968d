"""qkv.torch.scaled_dot_product_attention: gradients against torch autograd through torch's SDPA.

Tolerances: float64 on both sides agrees to 1e-12 (different summation orders only). float32
gradients are compared with torch's float64 gradients under the rule of test_sdpa.py: at most
twice torch's own float32 error plus 1e-5 (the backward sums over up to Skv·Dv products of O(1)
terms, so a few float32 ulps of O(10) values).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
import qkv.torch  # noqa: E402


def grads(fn, q, k, v, dout, **kw):
    ins = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = fn(*ins, **kw)
    return (out, *torch.autograd.grad(out, ins, dout))


CASES = [
    dict(qs=(2, 3, 7, 8), ks=(2, 3, 9, 8), vs=(2, 3, 9, 5)),
    dict(qs=(2, 3, 7, 8), ks=(1, 3, 9, 8), vs=(1, 3, 9, 5)),                 # batch broadcast
    dict(qs=(2, 4, 7, 8), ks=(2, 2, 9, 8), vs=(2, 2, 9, 5), enable_gqa=True),
    dict(qs=(2, 4, 7, 8), ks=(2, 1, 9, 8), vs=(2, 2, 9, 5), enable_gqa=True),  # Hk != Hv
    dict(qs=(3, 9, 16), ks=(3, 4, 16), vs=(3, 4, 16), is_causal=True),        # L > S, top-left
    dict(qs=(5, 8), ks=(2, 3, 6, 8), vs=(2, 3, 6, 4), scale=0.2),              # rank 2 query
    dict(qs=(2, 2, 1, 2, 5, 8), ks=(2, 1, 3, 2, 6, 8), vs=(2, 1, 3, 2, 6, 8)),  # two broadcast batch dims
    dict(qs=(2, 3, 6, 8), ks=(2, 3, 6, 8), vs=(2, 3, 6, 8), mask="bool"),
    dict(qs=(2, 3, 6, 8), ks=(2, 3, 6, 8), vs=(2, 3, 6, 8), mask="additive"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gradients_match_torch_autograd(case, dtype):
    g = torch.Generator().manual_seed(7)
    case = dict(case)
    q, k, v = (torch.randn(case.pop(s), generator=g, dtype=torch.float64) for s in ("qs", "ks", "vs"))
    mask = case.pop("mask", None)
    if mask == "bool":
        case["attn_mask"] = torch.rand(q.shape[-2], k.shape[-2], generator=g) < 0.7
        case["attn_mask"][:, 0] = True            # no fully masked row: torch's gradient there is NaN
    elif mask == "additive":
        case["attn_mask"] = torch.randn(q.shape[-2], k.shape[-2], generator=g, dtype=torch.float64)
    out64 = F.scaled_dot_product_attention(q, k, v, **case)
    dout = torch.randn(out64.shape, generator=g, dtype=torch.float64)
    want = grads(F.scaled_dot_product_attention, q, k, v, dout, **case)
    cast = {kk: (vv.to(dtype) if isinstance(vv, torch.Tensor) and vv.is_floating_point() else vv)
            for kk, vv in case.items()}
    got = grads(qkv.torch.scaled_dot_product_attention, q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype),
                **cast)
    names = ("out", "dq", "dk", "dv")
    if dtype == torch.float64:
        bounds = [1e-12] * 4
    else:
        theirs = grads(F.scaled_dot_product_attention, q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype),
                       **cast)
        bounds = [2 * (t.double() - w).abs().max().item() + 1e-5 for t, w in zip(theirs, want)]
    for name, a, w, bound in zip(names, got, want, bounds):
        assert a.shape == w.shape and a.dtype == dtype
        err = (a.double() - w).abs().max().item()
        print(f"{dtype} {name}: max error {err:.3g} (bound {bound:.3g})")
        assert err <= bound, name


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (3, 5, 5))
    # Central differences in float64 against qkv's analytic backward; torch's default tolerances.
    assert torch.autograd.gradcheck(lambda a, b, c: qkv.torch.scaled_dot_product_attention(a, b, c, is_causal=True),
                                    (q, k, v))


def test_bfloat16_backward_close_to_float64():
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 16, 32, generator=g, dtype=torch.float64) for _ in range(3))
    dout = torch.randn(1, 2, 16, 32, generator=g, dtype=torch.float64)
    want = grads(F.scaled_dot_product_attention, q, k, v, dout, is_causal=True)
    got = grads(qkv.torch.scaled_dot_product_attention, *(x.bfloat16() for x in (q, k, v, dout)), is_causal=True)
    theirs = grads(F.scaled_dot_product_attention, *(x.bfloat16() for x in (q, k, v, dout)), is_causal=True)
    for name, a, t, w in zip(("out", "dq", "dk", "dv"), got, theirs, want):
        err, err_t = (a.double() - w).abs().max().item(), (t.double() - w).abs().max().item()
        print(f"bf16 {name}: qkv {err:.3g}, torch {err_t:.3g}")
        assert a.dtype == torch.bfloat16
        # bf16 inputs are rounded by 2^-9 relative; the rule: twice torch's error + one bf16 ulp of O(4).
        assert err <= 2 * err_t + 2.0 ** -6, name


def test_inside_a_model_training_step():
    """An nn.Module that calls qkv.torch's SDPA trains: its loss falls as torch's twin's does."""

    class Attn(torch.nn.Module):
        def __init__(self, sdpa):
            super().__init__()
            torch.manual_seed(10)
            self.proj = torch.nn.Linear(16, 48)
            self.out = torch.nn.Linear(16, 16)
            self.sdpa = sdpa

        def forward(self, x):
            q, k, v = (t.unflatten(-1, (2, 8)).transpose(1, 2) for t in self.proj(x).chunk(3, -1))
            return self.out(self.sdpa(q, k, v, is_causal=True).transpose(1, 2).flatten(2))

    x = torch.randn(4, 12, 16, generator=torch.Generator().manual_seed(11))
    target = x.roll(1, dims=1)
    losses = {}
    for name, fn in (("qkv", qkv.torch.scaled_dot_product_attention), ("torch", F.scaled_dot_product_attention)):
        m = Attn(fn)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses[name] = []
        for _ in range(5):
            opt.zero_grad()
            loss = (m(x) - target).square().mean()
            loss.backward()
            opt.step()
            losses[name].append(loss.item())
    print(f"losses qkv {losses['qkv']}, torch {losses['torch']}")
    assert losses["qkv"][-1] < losses["qkv"][0]
    # Same model, same data: five SGD steps in float32 stay within float32 rounding of torch's.
    assert np.allclose(losses["qkv"], losses["torch"], rtol=1e-4)


def test_plain_entry_point_keeps_the_graph():
    q, k, v = (torch.randn(1, 1, 4, 4, requires_grad=True) for _ in range(3))
    out = qkv.scaled_dot_product_attention(q, k, v)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None


def _varlen_torch(q, k, v, cq, ck, causal):
    """Oracle: torch's SDPA per sequence on the unpacked rows, bottom-right causal mask, GQA by repeat."""
    outs = []
    H, Hkv = q.shape[1], k.shape[1]
    for b in range(len(cq) - 1):
        qb, kb, vb = q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        Sq, Sk = qb.shape[0], kb.shape[0]
        if Sq == 0:
            continue
        kb, vb = kb.repeat_interleave(H // Hkv, dim=1), vb.repeat_interleave(H // Hkv, dim=1)
        mask = None
        if causal:  # key j allowed for query i iff j <= i + Sk - Sq
            mask = torch.arange(Sk)[None, :] <= (torch.arange(Sq)[:, None] + Sk - Sq)
        o = F.scaled_dot_product_attention(qb.transpose(0, 1), kb.transpose(0, 1), vb.transpose(0, 1),
                                           attn_mask=mask)
        outs.append(o.transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_gradients_match_torch_autograd(dtype, causal):
    # Four packed sequences (Sq, Skv) = (5, 9), (0, 3), (7, 7), (40, 52), GQA 4 query heads on 2.
    cq, ck = [0, 5, 5, 12, 52], [0, 9, 12, 19, 71]
    g = torch.Generator().manual_seed(11)
    q = torch.randn(cq[-1], 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(ck[-1], 2, 16, generator=g, dtype=torch.float64)
    v = torch.randn(ck[-1], 2, 8, generator=g, dtype=torch.float64)
    dout = torch.randn(cq[-1], 4, 8, generator=g, dtype=torch.float64)
    align = "bottom_right"
    got = grads(lambda a, b, c: qkv.torch.attention_varlen(a, b, c, torch.tensor(cq, dtype=torch.int32),
                                                           torch.tensor(ck), causal=causal, align=align),
                q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype))
    want = grads(lambda a, b, c: _varlen_torch(a, b, c, cq, ck, causal), q, k, v, dout)
    # The keys of the sequence without queries (rows 9..11) get exactly zero gradients, on both sides.
    assert torch.all(got[2][9:12] == 0) and torch.all(got[3][9:12] == 0)
    if dtype == torch.float64:
        errs = [float((a - b).detach().abs().max()) for a, b in zip(got, want)]
        print(f"float64 varlen: max |qkv - torch| out, dq, dk, dv = {errs}")
        assert max(errs) < 1e-12  # both float64, summation order only
    else:
        own = grads(lambda a, b, c: _varlen_torch(a, b, c, cq, ck, causal), q.float(), k.float(), v.float(),
                    dout.float())
        for name, a, b, t in zip(("out", "dq", "dk", "dv"), got, want, own):
            err = float((a.double() - b).detach().abs().max())
            terr = float((t.double() - b).detach().abs().max())
            print(f"float32 varlen {name}: qkv err {err:.3g}, torch's own float32 err {terr:.3g}")
            assert err <= 2 * terr + 1e-5  # the rule of this file's header


def test_varlen_backward_numpy_matches_torch_path():
    # qkv.attention_backward with cu_seqlens (NumPy in, NumPy out) equals the autograd path's gradients.
    cq, ck = np.array([0, 3, 10]), np.array([0, 4, 10])
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((10, 2, 8), (10, 2, 8), (10, 2, 8)))
    dout = rng.standard_normal((10, 2, 8)).astype(np.float32)
    r = qkv.attention(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True, return_lse=True)
    g = qkv.attention_backward(q, k, v, r.out, dout, r.lse, cu_seqlens_q=cq, cu_seqlens_k=ck, causal=True)
    t = grads(lambda a, b, c: qkv.torch.attention_varlen(a, b, c, cq, ck, causal=True),
              *(torch.from_numpy(x) for x in (q, k, v, dout)))
    for a, b in zip((g.dq, g.dk, g.dv), t[1:]):
        assert np.array_equal(a, b.numpy())  # the same kernels on the same data: the same bits
    with pytest.raises(ValueError, match="give both or neither"):
        qkv.attention_backward(q, k, v, r.out, dout, r.lse, cu_seqlens_q=cq)


# ---------------------------------------------------------------------------------------------
# Gradient of a float attn_mask (issue 16, item 5) and double backward (item 17)
# ---------------------------------------------------------------------------------------------

MASK_CASES = [
    dict(qs=(2, 3, 7, 8), ks=(2, 3, 9, 8), vs=(2, 3, 9, 5), ms=(2, 3, 7, 9)),      # full mask
    dict(qs=(2, 3, 7, 8), ks=(2, 3, 9, 8), vs=(2, 3, 9, 5), ms=(7, 9)),            # broadcast over B, H
    dict(qs=(2, 3, 7, 8), ks=(2, 3, 9, 8), vs=(2, 3, 9, 5), ms=(2, 1, 1, 9)),      # per-batch key bias
    dict(qs=(2, 4, 7, 8), ks=(2, 2, 9, 8), vs=(2, 2, 9, 5), ms=(1, 4, 7, 9), enable_gqa=True),
    dict(qs=(3, 6, 16), ks=(3, 5, 16), vs=(3, 5, 16), ms=(6, 5), causal_in_mask=True),  # -inf entries
]


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_float_mask_gets_torchs_gradient(case, dtype):
    """dL/dmask equals torch's (dS summed over the dimensions the mask was broadcast along)."""
    g = torch.Generator().manual_seed(21)
    case = dict(case)
    q, k, v = (torch.randn(case.pop(s), generator=g, dtype=torch.float64) for s in ("qs", "ks", "vs"))
    mask = torch.randn(case.pop("ms"), generator=g, dtype=torch.float64)
    if case.pop("causal_in_mask", False):
        L, S = mask.shape
        mask = mask.masked_fill(torch.arange(S)[None, :] > torch.arange(L)[:, None], float("-inf"))
    dout = torch.randn(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **case).shape, generator=g,
                       dtype=torch.float64)

    def run(fn, dt):
        ins = [x.to(dt).requires_grad_() for x in (q, k, v, mask)]
        out = fn(*ins[:3], attn_mask=ins[3], **case)
        return torch.autograd.grad(out, ins, dout.to(dt))

    want = run(F.scaled_dot_product_attention, torch.float64)
    got = run(qkv.torch.scaled_dot_product_attention, dtype)
    assert got[3] is not None and got[3].shape == mask.shape and got[3].dtype == dtype
    if dtype == torch.float64:
        bound = 1e-12  # both float64: summation order only
    else:
        theirs = run(F.scaled_dot_product_attention, dtype)
        bound = 2 * (theirs[3].double() - want[3]).abs().max().item() + 1e-5  # this file's float32 rule
    err = (got[3].double() - want[3]).nan_to_num(posinf=0.0, neginf=0.0).abs().max().item()
    print(f"{dtype} dmask: max error {err:.3g} (bound {bound:.3g})")
    assert err <= bound


def test_mask_gradient_only_when_asked():
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    mask = torch.randn(5, 5)                        # a constant mask: no gradient, none computed
    qkv.torch.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
    assert mask.grad is None and q.grad is not None


def test_double_backward_raises():
    """torch.autograd.grad(create_graph=True) then a second backward: an error, never silent None/zeros."""
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    dq, = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(dq.sum(), (q, k, v))


# ---------------------------------------------------------------------------------------------
# FlashAttention 2's names: qkv.flash_attn_func / qkv.flash_attn_varlen_func
# ---------------------------------------------------------------------------------------------

def _fa_reference(q, k, v, causal, window, scale=None):
    """torch float64 oracle in FlashAttention's layout [B, S, H, D]: bottom-right causal and window."""
    B, Sq, H, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    i = torch.arange(Sq)[:, None] + (Sk - Sq)
    j = torch.arange(Sk)[None, :]
    ok = torch.ones(Sq, Sk, dtype=torch.bool)
    if causal:
        ok &= j <= i
    if window[0] >= 0:
        ok &= j >= i - window[0]
    if window[1] >= 0:
        ok &= j <= i + window[1]
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    kt, vt = kt.repeat_interleave(H // Hkv, 1), vt.repeat_interleave(H // Hkv, 1)
    s = (qt @ kt.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    s = s.masked_fill(~ok, float("-inf"))
    lse = torch.logsumexp(s, -1)                                   # [B, H, Sq]
    out = torch.softmax(s, -1).nan_to_num(0.0) @ vt
    return out.transpose(1, 2), lse


FA_CASES = [
    dict(B=2, Sq=7, Sk=12, H=4, Hkv=2, causal=True, window=(-1, -1)),      # bottom-right, GQA
    dict(B=1, Sq=1, Sk=9, H=2, Hkv=1, causal=True, window=(-1, -1)),       # one-token decode
    dict(B=2, Sq=10, Sk=10, H=2, Hkv=2, causal=False, window=(3, 2)),      # local attention
    dict(B=1, Sq=6, Sk=11, H=3, Hkv=3, causal=True, window=(4, -1), scale=0.3),
]


@pytest.mark.parametrize("case", FA_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_flash_attn_func_matches_torch_reference(case):
    g = torch.Generator().manual_seed(41)
    c = dict(case)
    B, Sq, Sk, H, Hkv = (c.pop(n) for n in ("B", "Sq", "Sk", "H", "Hkv"))
    q = torch.randn(B, Sq, H, 16, generator=g, dtype=torch.float64)
    k = torch.randn(B, Sk, Hkv, 16, generator=g, dtype=torch.float64)
    v = torch.randn(B, Sk, Hkv, 8, generator=g, dtype=torch.float64)
    dout = torch.randn(B, Sq, H, 8, generator=g, dtype=torch.float64)
    scale = c.get("scale")
    want_out, want_lse = _fa_reference(q, k, v, c["causal"], c["window"], scale)
    want = grads(lambda a, b, d: _fa_reference(a, b, d, c["causal"], c["window"], scale)[0], q, k, v, dout)
    got = grads(lambda a, b, d: qkv.flash_attn_func(a, b, d, softmax_scale=scale, causal=c["causal"],
                                                    window_size=c["window"]), q, k, v, dout)
    out, lse, probs = qkv.flash_attn_func(q, k, v, softmax_scale=scale, causal=c["causal"], window_size=c["window"],
                                          return_attn_probs=True)
    assert probs is None and lse.shape == (B, H, Sq) and not lse.requires_grad
    errs = [(a - w).abs().max().item() for a, w in zip(got, want)] + [(lse - want_lse).abs().max().item()]
    print(f"flash_attn_func float64: max error out, dq, dk, dv, lse = {errs}")
    assert got[0].shape == (B, Sq, H, 8) and got[0].is_contiguous()
    assert max(errs) < 1e-12   # float64 on both sides: summation order only


def test_flash_attn_varlen_func_matches_torch_reference():
    cq, ck = [0, 5, 5, 12, 30], [0, 9, 12, 19, 45]
    g = torch.Generator().manual_seed(42)
    q = torch.randn(cq[-1], 4, 16, generator=g, dtype=torch.float64)
    k = torch.randn(ck[-1], 2, 16, generator=g, dtype=torch.float64)
    v = torch.randn(ck[-1], 2, 8, generator=g, dtype=torch.float64)
    dout = torch.randn(cq[-1], 4, 8, generator=g, dtype=torch.float64)
    cu_q, cu_k = torch.tensor(cq, dtype=torch.int32), torch.tensor(ck, dtype=torch.int32)
    got = grads(lambda a, b, d: qkv.flash_attn_varlen_func(a, b, d, cu_q, cu_k, 18, 26, causal=True), q, k, v, dout)
    want = grads(lambda a, b, d: _varlen_torch(a, b, d, cq, ck, True), q, k, v, dout)
    errs = [(a - w).abs().max().item() for a, w in zip(got, want)]
    print(f"flash_attn_varlen_func float64: max error out, dq, dk, dv = {errs}")
    assert max(errs) < 1e-12
    out, lse, _ = qkv.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 18, 26, causal=True, return_attn_probs=True)
    assert lse.shape == (4, cq[-1])
    # lse of sequence 3's first query (row 12): keys 19 .. 19 + (26 - 18) of k, bottom-right causal.
    s = torch.einsum("hd,khd->hk", q[12], k[19:28].repeat_interleave(2, 1)) * 16 ** -0.5
    assert torch.allclose(lse[:, 12], torch.logsumexp(s, -1), rtol=0, atol=1e-12)


# softcap and alibi_slopes [H] or [B, H] work (python/tests/test_variants.py); a block table does not here.
def test_flash_attn_per_batch_slopes_and_block_table():
    q = torch.randn(1, 3, 2, 8)
    slopes = torch.tensor([[0.5, 0.25]])
    # [B, H] with B = 1 is the [H] call, bit for bit; packed: one row per sequence.
    assert torch.equal(qkv.flash_attn_func(q, q, q, alibi_slopes=slopes), qkv.flash_attn_func(q, q, q, alibi_slopes=slopes[0]))
    cu = torch.tensor([0, 3], dtype=torch.int32)
    assert torch.equal(qkv.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3, alibi_slopes=slopes),
                       qkv.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3, alibi_slopes=slopes[0]))
    with pytest.raises(NotImplementedError, match="block_table"):
        qkv.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 3, 3, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"max_seqlen_q = 2 is less than the longest sequence in cu_seqlens_q \(3\)"):
        qkv.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 2, 3)


def test_plain_entry_point_differentiates_a_mask_alone():
    """Only the mask requires grad: qkv.scaled_dot_product_attention still returns torch's dL/dmask."""
    g = torch.Generator().manual_seed(43)
    q, k, v = (torch.randn(1, 2, 5, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.randn(5, 5, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask.requires_grad_()).sum(), mask)
    want = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum(), mask)
    assert (got[0] - want[0]).abs().max().item() < 1e-12   # float64 both sides


def test_mask_gradient_with_qkvs_own_rules():
    """qkv.torch.attention: float mask + bottom-right causal + window + key lengths; dL/dmask equals
    torch's on the equivalent additive mask (the rules folded in as -inf), float64 both sides."""
    g = torch.Generator().manual_seed(44)
    B, H, L, S = 2, 2, 5, 9
    q = torch.randn(B, H, L, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(B, 1, S, 8, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.randn(B, H, L, S, generator=g, dtype=torch.float64)
    kl = torch.tensor([9, 7])
    i, j = torch.arange(L)[:, None] + (S - L), torch.arange(S)[None, :]
    ok = (j <= i) & (j >= i - 3) & (j[None, None] < kl.view(-1, 1, 1, 1))
    dout = torch.randn(B, H, L, 8, generator=g, dtype=torch.float64)
    m1 = mask.clone().requires_grad_()
    out, _ = qkv.torch.attention(q, k, v, mask=m1, key_lengths=kl, causal=True, align="bottom_right", window_left=3)
    got, = torch.autograd.grad(out, m1, dout)
    m2 = mask.clone().requires_grad_()
    want_out = F.scaled_dot_product_attention(q, k.expand(B, H, S, 8), v.expand(B, H, S, 8),
                                              attn_mask=m2.masked_fill(~ok, float("-inf")))
    want, = torch.autograd.grad(want_out, m2, dout)
    assert (out - want_out).abs().max().item() < 1e-12
    assert (got - want).abs().max().item() < 1e-12
