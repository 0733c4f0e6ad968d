"""qkv.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention.

Tolerance rule (FlashAttention's): for float32 and bfloat16, qkv's error against torch in float64
may be at most twice torch's own error in the same precision (against the same float64 result),
plus a floor of a few units in the last place for cases where torch happens to be almost exact:
  float32: 2·err_torch + 1e-6      bfloat16: 2·err_torch + 2^-8 (one bf16 ulp at 1.0)
float64 inputs are compared at 1e-12 (both sides compute in float64).
"""

import math

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")
F = torch.nn.functional
ml_dtypes = pytest.importorskip("ml_dtypes")

TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
FLOOR = {"float32": 1e-6, "bfloat16": 2.0 ** -8}


def torch_f64(q, k, v, mask=None, **kw):
    """torch's answer in float64; a row torch leaves NaN (fully masked) is 0 by qkv's definition."""
    m = mask
    if m is not None and m.dtype != torch.bool:
        m = m.double()
    o = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m, **kw)
    return torch.nan_to_num(o, nan=0.0)


def check_parity(q, k, v, mask=None, tag="", **kw):
    """Runs qkv and torch on the same torch tensors; asserts the tolerance rule; returns the error."""
    want = torch_f64(q, k, v, mask, **kw)
    got = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)
    assert isinstance(got, torch.Tensor) and got.dtype == q.dtype and got.shape == want.shape
    err = (got.double() - want).abs().max().item() if want.numel() else 0.0
    dtype = str(q.dtype).replace("torch.", "")
    if dtype == "float64":
        bound = 1e-12
    else:
        with torch.no_grad():
            theirs = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw).double())
        err_torch = (theirs - want).abs().max().item() if want.numel() else 0.0
        bound = 2 * err_torch + FLOOR[dtype]
    assert err <= bound, f"{tag}: max error {err:.3g} > bound {bound:.3g}"
    return err


def random_case(g: np.random.Generator):
    """One random SDPA call: shapes, GQA, broadcasting, mask kind, causal with L != S, strides."""
    dtype = g.choice(["float32", "float32", "bfloat16", "float64"])
    rank = int(g.integers(2, 6))
    L, S = int(g.choice([1, 2, 5, 13, 31, 64])), int(g.choice([1, 3, 7, 16, 37, 64]))
    E, Ev = int(g.choice([1, 4, 8, 16, 33, 64])), int(g.choice([1, 8, 16, 24, 64]))
    batch = [int(g.integers(1, 4)) for _ in range(rank - 2)]
    gqa = rank >= 3 and g.random() < 0.3
    kbatch = list(batch)
    if gqa:
        kbatch[-1] = max(1, batch[-1] // int(g.choice([1, 2, 3])))
        batch[-1] = kbatch[-1] * int(g.integers(1, 4))
    elif kbatch and g.random() < 0.3:
        kbatch[int(g.integers(0, len(kbatch)))] = 1       # key/value broadcast over one batch dim
    case = dict(dtype=dtype, qs=batch + [L, E], ks=kbatch + [S, E], vs=kbatch + [S, Ev], gqa=gqa)
    case["causal"] = bool(g.random() < 0.3)
    case["mask"] = None if case["causal"] else g.choice(["none", "bool", "additive", "keypad"])
    case["scale"] = None if g.random() < 0.7 else float(g.uniform(0.05, 1.0))
    case["transposed"] = bool(g.random() < 0.5)
    return case


def make_tensor(g, shape, dtype, transposed):
    """Random tensor of `shape`; when `transposed`, a non-contiguous view (last two dims swapped in memory)."""
    a = torch.from_numpy(g.standard_normal(shape)).to(TORCH_DTYPE[dtype])
    if transposed and len(shape) >= 2:
        a = a.transpose(-1, -2).contiguous().transpose(-1, -2)
    return a


@pytest.mark.parametrize("seed", range(120))
def test_random_sweep_matches_torch(seed):
    g = np.random.default_rng(1000 + seed)
    c = random_case(g)
    q = make_tensor(g, c["qs"], c["dtype"], c["transposed"])
    k = make_tensor(g, c["ks"], c["dtype"], c["transposed"])
    v = make_tensor(g, c["vs"], c["dtype"], False)
    L, S = c["qs"][-2], c["ks"][-2]
    mask = None
    if c["mask"] == "bool":
        mask = torch.from_numpy(g.random((L, S)) < 0.7)
    elif c["mask"] == "additive":
        mask = torch.from_numpy(g.standard_normal((L, S))).to(TORCH_DTYPE[c["dtype"]])
    elif c["mask"] == "keypad":                               # (B, 1, 1, S)-style key padding mask
        mask = torch.from_numpy(g.random((S,)) < 0.8).reshape(*([1] * (len(c["qs"]) - 1)), S)
    err = check_parity(q, k, v, mask, tag=str(c), is_causal=c["causal"], scale=c["scale"], enable_gqa=c["gqa"])
    print(f"seed {seed} {c}: max error {err:.3g}")


def test_numpy_float32_matches_torch(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 9, 16), (2, 4, 11, 16), (2, 4, 11, 8)))
    got = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    want = torch_f64(*(torch.from_numpy(x) for x in (q, k, v)), is_causal=True).numpy()
    err = np.abs(got - want).max()
    print(f"numpy float32: max error {err:.3g}")
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert err < 2e-6  # float32 rounding of O(1) outputs over ≤ 16-term sums


def test_numpy_bfloat16_via_ml_dtypes(rng):
    shapes = ((1, 2, 7, 32), (1, 2, 5, 32), (1, 2, 5, 16))
    q, k, v = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in shapes)
    got = qkv.scaled_dot_product_attention(q, k, v)
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == (1, 2, 7, 16)
    want = torch_f64(*(torch.from_numpy(x.astype(np.float64)) for x in (q, k, v))).numpy()
    err = np.abs(got.astype(np.float64) - want).max()
    print(f"numpy bfloat16: max error {err:.3g}")
    assert err <= 2.0 ** -7  # one bf16 rounding of the output (relative 2^-9) on |out| < 4, twice over


def test_bool_mask_true_means_may_attend():
    # Hand-computed: one query, keys with scores 0 and ln 3 (scale 1); masking key 1 leaves key 0 alone.
    q = torch.tensor([[[1.0]]])
    k = torch.tensor([[[0.0], [math.log(3.0)]]])
    v = torch.tensor([[[10.0], [20.0]]])
    full = qkv.scaled_dot_product_attention(q, k, v, scale=1.0)
    only0 = qkv.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor([[True, False]]), scale=1.0)
    print(f"full {full.item()} (want 17.5), masked {only0.item()} (want 10)")
    assert abs(full.item() - (10 * 0.25 + 20 * 0.75)) < 1e-5  # p = (1/4, 3/4); float32 rounding
    assert abs(only0.item() - 10.0) < 1e-6


def test_fully_masked_rows_give_zeros_where_the_torch_formula_gives_nan():
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(2, 3, 4, 8, generator=g), torch.randn(2, 3, 5, 8, generator=g), torch.randn(2, 3, 5, 6, generator=g)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[2] = False                                   # query 2 may attend to nothing
    additive = torch.zeros(4, 5)
    additive[1] = -math.inf                           # query 1: -inf everywhere
    for m in (mask, additive):
        out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=m)
        dead = 2 if m.dtype == torch.bool else 1
        assert torch.equal(out[:, :, dead], torch.zeros(2, 3, 6))
        assert torch.isfinite(out).all()
        # torch's documented reference implementation: softmax of an all -inf row is NaN.
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        s = s.masked_fill(~m, -math.inf) if m.dtype == torch.bool else s + m
        ref = torch.softmax(s, dim=-1) @ v
        assert torch.isnan(ref[:, :, dead]).all()
        theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        print(f"torch {torch.__version__} SDPA on the dead row: "
              f"{'NaN' if torch.isnan(theirs[:, :, dead]).all() else 'zeros'}; qkv: zeros")
        live = [i for i in range(4) if i != dead]
        err = (out[:, :, live] - ref[:, :, live]).abs().max().item()
        print(f"live rows: max error {err:.3g}")
        assert err < 1e-5  # float32 against float32 torch


def test_causal_is_top_left_when_L_differs_from_S():
    g = torch.Generator().manual_seed(4)
    for L, S in ((3, 5), (5, 3), (1, 7), (7, 1)):
        q, k, v = (torch.randn(1, 2, n, 4, generator=g, dtype=torch.float64) for n in (L, S, S))
        got = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        explicit = torch.ones(L, S, dtype=torch.bool).tril()   # top-left: query i sees keys j <= i
        want2 = qkv.scaled_dot_product_attention(q, k, v, attn_mask=explicit)
        err = max((got - want).abs().max().item(), (got - want2).abs().max().item())
        print(f"causal L={L} S={S}: max error {err:.3g}")
        assert err < 1e-12  # float64 on both sides


def test_output_kinds_and_in_place_reading(monkeypatch, rng):
    """NumPy in, NumPy out; torch in, torch out; transposed/sliced/broadcast inputs are not copied."""
    from qkv import _arrays

    def no_copy(x):
        raise AssertionError("an input was copied")

    monkeypatch.setattr(_arrays.NumpyKind, "contiguous", staticmethod(no_copy))
    monkeypatch.setattr(_arrays.TorchKind, "contiguous", staticmethod(no_copy))
    base = rng.standard_normal((3, 2, 16, 10)).astype(np.float32)
    q = base.transpose(0, 1, 3, 2)[:, :, :7]            # [3, 2, 7, 16], strided
    k = np.broadcast_to(base[:1, :, :, :9].transpose(0, 1, 3, 2), (3, 2, 9, 16))
    v = base[:, :, ::2, :9].transpose(0, 1, 3, 2)[..., :5]  # [3, 2, 9, 5]
    got = qkv.scaled_dot_product_attention(q, k, v)
    want = torch_f64(torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(np.ascontiguousarray(k)),
                     torch.from_numpy(np.ascontiguousarray(v))).numpy()
    assert isinstance(got, np.ndarray)
    err = np.abs(got - want).max()
    print(f"strided numpy: max error {err:.3g}")
    assert err < 2e-6  # float32 rounding
    tq, tk, tv = torch.from_numpy(base).transpose(-1, -2)[:, :, :7], torch.from_numpy(base).transpose(-1, -2)[:, :, :9], \
        torch.from_numpy(base).transpose(-1, -2)[:, :, :9, :5]
    tgot = qkv.scaled_dot_product_attention(tq, tk.expand(3, 2, 9, 16), tv)
    assert isinstance(tgot, torch.Tensor)
    terr = (tgot.double() - torch_f64(tq, tk, tv)).abs().max().item()
    print(f"strided torch: max error {terr:.3g}")
    assert terr < 2e-6


def test_negative_strides_and_other_dlpack_producers(rng):
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 6, 8), (2, 5, 8), (2, 5, 3)))
    got = qkv.scaled_dot_product_attention(q[:, ::-1], k[::-1], v[::-1])      # copied once (negative strides)
    want = torch_f64(*(torch.from_numpy(np.ascontiguousarray(x)) for x in (q[:, ::-1], k[::-1], v[::-1]))).numpy()
    err = np.abs(got - want).max()
    print(f"negative strides: max error {err:.3g}")
    assert err < 2e-6

    class Producer:
        """A minimal DLPack producer that is neither NumPy nor torch."""

        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return self.a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    got2 = qkv.scaled_dot_product_attention(Producer(q), Producer(k), Producer(v))
    assert isinstance(got2, np.ndarray)
    assert np.array_equal(got2, qkv.scaled_dot_product_attention(q, k, v))


def test_gqa_with_different_key_and_value_heads():
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, 1, 7, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, 2, 7, 5, generator=g, dtype=torch.float64)
    err = check_parity(q, k, v, tag="gqa Hk=1 Hv=2", enable_gqa=True)
    print(f"gqa Hk != Hv: max error {err:.3g}")


def test_a_torch_script_runs_unchanged(monkeypatch):
    """A nanoGPT-style block written for torch's SDPA, run with qkv's in its place."""

    class CausalSelfAttention(torch.nn.Module):
        def __init__(self, d, h):
            super().__init__()
            self.h = h
            self.qkv = torch.nn.Linear(d, 3 * d)
            self.proj = torch.nn.Linear(d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(x).split(C, dim=2)
            q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
            return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))

    torch.manual_seed(6)
    block = CausalSelfAttention(32, 4).eval()
    x = torch.randn(2, 10, 32)
    with torch.no_grad():
        want = block(x)
        monkeypatch.setattr(F, "scaled_dot_product_attention", qkv.scaled_dot_product_attention)
        got = block(x)
    err = (got - want).abs().max().item()
    print(f"nanoGPT block, eval: max error {err:.3g}")
    assert err < 1e-5  # float32 against float32 torch, O(1) activations
    # Training mode records gradients: the call goes through qkv's backward.
    block.train()
    loss = block(x).square().sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in block.parameters())


# ---------------------------------------------------------------------------------------------
# float16 (issue 17): computed in float32, rounded to float16 once; the rule of this file with
# 2·err_torch plus one float16 ulp at 1.0 (2^-10) as the floor.
# ---------------------------------------------------------------------------------------------

HALF_CASES = [
    dict(qs=(2, 3, 17, 16), ks=(2, 3, 23, 16), vs=(2, 3, 23, 8)),
    dict(qs=(2, 4, 9, 32), ks=(2, 2, 9, 32), vs=(2, 2, 9, 32), is_causal=True, enable_gqa=True),
    dict(qs=(1, 2, 64, 64), ks=(1, 2, 64, 64), vs=(1, 2, 64, 64), mask="additive"),
    dict(qs=(5, 8), ks=(5, 8), vs=(5, 8), mask="bool"),
]


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_float16_torch_within_twice_torchs_error(case):
    g = torch.Generator().manual_seed(31)
    case = dict(case)
    q, k, v = (torch.randn(case.pop(s), generator=g).half() for s in ("qs", "ks", "vs"))
    mask = case.pop("mask", None)
    if mask == "additive":
        case["attn_mask"] = torch.randn(q.shape[-2], k.shape[-2], generator=g).half()
    elif mask == "bool":
        case["attn_mask"] = torch.rand(q.shape[-2], k.shape[-2], generator=g) < 0.6
        case["attn_mask"][:, 0] = True
    m = case.get("attn_mask")
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                         attn_mask=None if m is None else (m if m.dtype == torch.bool else m.double()),
                                         **{kk: vv for kk, vv in case.items() if kk != "attn_mask"})
    got = qkv.scaled_dot_product_attention(q, k, v, **case)
    grad_path = qkv.torch.scaled_dot_product_attention(q, k, v, **case)
    theirs = F.scaled_dot_product_attention(q, k, v, **case)
    assert got.dtype == grad_path.dtype == torch.float16 and got.shape == theirs.shape
    err = (got.double() - ref).abs().max().item()
    err_t = (theirs.double() - ref).abs().max().item()
    print(f"float16: qkv error {err:.3g}, torch's own {err_t:.3g}")
    assert err <= 2 * err_t + 2.0 ** -10
    assert torch.equal(got, grad_path)   # the plain and the autograd entry points: same computation


def test_float16_numpy():
    rng = np.random.default_rng(32)
    q, k, v = (rng.standard_normal((2, 3, 11, 16)).astype(np.float16) for _ in range(3))
    got = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert isinstance(got, np.ndarray) and got.dtype == np.float16
    t = [torch.from_numpy(x) for x in (q, k, v)]
    ref = F.scaled_dot_product_attention(*(x.double() for x in t), is_causal=True)
    err = (torch.from_numpy(got).double() - ref).abs().max().item()
    err_t = (F.scaled_dot_product_attention(*t, is_causal=True).double() - ref).abs().max().item()
    print(f"numpy float16: qkv error {err:.3g}, torch's own {err_t:.3g}")
    assert err <= 2 * err_t + 2.0 ** -10


def test_float16_gradients_within_twice_torchs_error():
    g = torch.Generator().manual_seed(33)
    q, k, v, dout = (torch.randn(1, 2, 13, 16, generator=g, dtype=torch.float64) for _ in range(4))

    def grads(fn, dt):
        ins = [x.to(dt).requires_grad_() for x in (q, k, v)]
        out = fn(*ins, is_causal=True)
        return (out, *torch.autograd.grad(out, ins, dout.to(dt)))

    want = grads(F.scaled_dot_product_attention, torch.float64)
    got = grads(qkv.torch.scaled_dot_product_attention, torch.float16)
    theirs = grads(F.scaled_dot_product_attention, torch.float16)
    for name, a, t, w in zip(("out", "dq", "dk", "dv"), got, theirs, want):
        assert a.dtype == torch.float16
        err, err_t = (a.double() - w).abs().max().item(), (t.double() - w).abs().max().item()
        print(f"float16 {name}: qkv {err:.3g}, torch {err_t:.3g}")
        assert err <= 2 * err_t + 2.0 ** -8, name   # gradients of O(4): one float16 ulp there
