"""qkv.attention and qkv.attention_backward: every option of the C++ API, against the NumPy
float64 oracle in conftest.py (and torch for the backward).

Tolerances: qkv computes float32 results from float32 inputs; against the float64 oracle the
error is float32 rounding of O(1) values accumulated over at most a few hundred terms, so
2e-6 absolute on outputs, lse and pattern. float64 inputs: 1e-12.
"""

import numpy as np
import pytest

import qkv
from conftest import reference_attention

F32_TOL = 2e-6
F64_TOL = 1e-12


def randn(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def max_err(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    same_inf = np.isinf(a) & np.isinf(b) & (np.sign(a) == np.sign(b))
    with np.errstate(invalid="ignore"):  # inf - inf where both are -inf (rows with no key): counted as 0
        return float(np.where(same_inf, 0.0, np.abs(a - b)).max()) if a.size else 0.0


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("Sq,Skv", [(5, 9), (9, 5), (7, 7), (1, 13)])
@pytest.mark.parametrize("window", [(None, None), (3, None), (2, 1), (None, 0)])
def test_causal_alignment_and_windows(rng, align, Sq, Skv, window):
    q, k, v = randn(rng, 2, 4, Sq, 8), randn(rng, 2, 2, Skv, 8), randn(rng, 2, 2, Skv, 6)
    wl, wr = window
    for causal in (False, True):
        r = qkv.attention(q, k, v, causal=causal, align=align, window_left=wl, window_right=wr, return_lse=True,
                          return_pattern=True)
        out, lse, pat = reference_attention(q, k, v, causal=causal, align=align, window_left=wl, window_right=wr)
        errs = max_err(r.out, out), max_err(r.lse, lse), max_err(r.pattern, pat)
        print(f"{align} Sq={Sq} Skv={Skv} window={window} causal={causal}: max errors out/lse/pattern {errs}")
        assert max(errs) < F32_TOL
        assert r.out.dtype == np.float32 and r.lse.dtype == np.float32 and r.pattern.shape == (2, 4, Sq, Skv)


def test_bottom_right_hand_computed():
    # Sq = 1, Skv = 3, causal bottom-right: the query sees all three keys; top-left: only key 0.
    q = np.zeros((1, 1, 1, 2), np.float32)             # all scores 0 -> uniform over allowed keys
    k = np.zeros((1, 1, 3, 2), np.float32)
    v = np.array([3.0, 6.0, 9.0], np.float32).reshape(1, 1, 3, 1)
    br = qkv.attention(q, k, v, causal=True, align="bottom_right").out.item()
    tl = qkv.attention(q, k, v, causal=True, align="top_left").out.item()
    print(f"bottom_right {br} (want 6), top_left {tl} (want 3)")
    assert br == pytest.approx(6.0, abs=1e-6) and tl == pytest.approx(3.0, abs=1e-6)  # f32 mean of 3 values


def test_key_lengths_masks_and_scale(rng):
    q, k, v = randn(rng, 3, 2, 6, 16), randn(rng, 3, 2, 10, 16), randn(rng, 3, 2, 10, 4)
    kl = np.array([10, 0, 4], np.int32)
    bool_mask = rng.random((1, 2, 6, 10)) < 0.8
    add_mask = randn(rng, 6, 10)
    for mask in (None, bool_mask, add_mask):
        r = qkv.attention(q, k, v, key_lengths=kl, mask=mask, scale=0.3, return_lse=True)
        out, lse, _ = reference_attention(q, k, v, key_lengths=kl, mask=mask, scale=0.3)
        errs = max_err(r.out, out), max_err(r.lse, lse)
        print(f"key_lengths mask={None if mask is None else mask.dtype}: max errors {errs}")
        assert max(errs) < F32_TOL
        assert np.all(r.out[1] == 0) and np.all(np.isneginf(r.lse[1]))   # batch 1 has no keys at all
    r = qkv.attention(q, k, v, key_lengths=[10, 0, 4])                   # a plain list works too
    assert max_err(r.out, reference_attention(q, k, v, key_lengths=kl)[0]) < F32_TOL


def test_varlen_packed_sequences(rng):
    lens_q, lens_k = [3, 0, 5, 1], [4, 2, 5, 6]
    cu_q, cu_k = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    q, k, v = randn(rng, cu_q[-1], 4, 8), randn(rng, cu_k[-1], 2, 8), randn(rng, cu_k[-1], 2, 3)
    r = qkv.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True, align="bottom_right",
                      return_lse=True)
    assert r.out.shape == (cu_q[-1], 4, 3) and r.lse.shape == (4, cu_q[-1])
    for b in range(4):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b] == 0:
            continue
        tr = lambda x: x.transpose(1, 0, 2)[None]        # [T, H, D] -> [1, H, T, D]
        out, lse, _ = reference_attention(tr(q[qs]), tr(k[ks]), tr(v[ks]), causal=True, align="bottom_right")
        errs = max_err(tr(r.out[qs]), out), max_err(r.lse[:, qs], lse[0])
        print(f"varlen sequence {b}: max errors {errs}")
        assert max(errs) < F32_TOL


def test_threads_kernel_choice_and_float64(rng):
    q, k, v = randn(rng, 1, 2, 33, 16, dtype=np.float64), randn(rng, 1, 2, 17, 16, dtype=np.float64), \
        randn(rng, 1, 2, 17, 16, dtype=np.float64)
    want = reference_attention(q, k, v, causal=True)[0]
    results = [qkv.attention(q, k, v, causal=True, num_threads=n) for n in (1, 2)]
    for r in results:
        print(f"threads: kernel {r.kernel}, max error {max_err(r.out, want):.3g}")
        assert max_err(r.out, want) < F64_TOL
        assert r.kernel.kernel in ("reference", "flash", "flash_decode") and r.kernel.name
    ref = qkv.attention(q, k, v, kernel="reference")
    assert ref.kernel.kernel == "reference" and ref.kernel.name.startswith("reference")
    assert qkv.cpu_isa() in ("scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16")
    before = qkv.num_threads()
    qkv.set_num_threads(1)
    assert qkv.num_threads() == 1
    qkv.set_num_threads(before)


def test_bfloat16_numpy_and_torch(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    torch = pytest.importorskip("torch")
    q, k, v = (randn(rng, 1, 2, 9, 32).astype(ml_dtypes.bfloat16) for _ in range(3))
    want = reference_attention(*(x.astype(np.float64) for x in (q, k, v)))[0]
    r = qkv.attention(q, k, v, return_lse=True)
    rt = qkv.attention(*(torch.from_numpy(x.astype(np.float32)).bfloat16() for x in (q, k, v)))
    err, err_t = max_err(r.out.astype(np.float64), want), max_err(rt.out.double().numpy(), want)
    print(f"bf16 numpy {err:.3g}, torch {err_t:.3g}, kernel {r.kernel.name}")
    assert r.out.dtype == ml_dtypes.bfloat16 and rt.out.dtype == torch.bfloat16 and r.lse.dtype == np.float32
    assert err <= 2.0 ** -7 and err_t <= 2.0 ** -7  # one bf16 rounding of |out| < 2: at most 2^-8·2


def test_backward_matches_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    q, k, v = randn(rng, 2, 4, 7, 8, dtype=np.float64), randn(rng, 2, 2, 9, 8, dtype=np.float64), \
        randn(rng, 2, 2, 9, 5, dtype=np.float64)
    dout = randn(rng, 2, 4, 7, 5, dtype=np.float64)
    for causal, align in ((False, "top_left"), (True, "top_left"), (True, "bottom_right")):
        fwd = qkv.attention(q, k, v, causal=causal, align=align, window_left=4, return_lse=True)
        g = qkv.attention_backward(q, k, v, fwd.out, dout, fwd.lse, causal=causal, align=align, window_left=4)
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        _, _, pat = reference_attention(q, k, v, causal=causal, align=align, window_left=4)
        # Differentiate the same pattern in torch: out = P(q, k) v with the allowed set fixed.
        allowed = torch.from_numpy(pat > 0)
        s = torch.einsum("bhid,bhjd->bhij", tq, tk.repeat_interleave(2, 1)) / np.sqrt(8)
        p = torch.softmax(s.masked_fill(~allowed, -torch.inf), -1)
        o = p @ tv.repeat_interleave(2, 1)
        want = torch.autograd.grad(o, (tq, tk, tv), torch.from_numpy(dout))
        errs = [max_err(a, b.numpy()) for a, b in zip((g.dq, g.dk, g.dv), want)]
        print(f"backward causal={causal} {align}: max errors dq/dk/dv {errs}, kernel {g.kernel.name}")
        assert max(errs) < F64_TOL
