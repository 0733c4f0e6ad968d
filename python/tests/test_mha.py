"""qkv.MultiHeadAttention: against torch.nn.MultiheadAttention (self and cross-attention) and a
NumPy float64 transcription of the seeds' formula (GQA, d_value != d_head, per-head Δe); weights
saved to and loaded from safetensors, checked against the `safetensors` package.

Tolerance: float32 projections of width <= 64 and attention over <= 16 keys, O(1) values:
float32 rounding accumulates to a few 1e-7; we allow 2e-5 (matmul summation order differs).
"""

import os

import numpy as np
import pytest

import qkv
from conftest import reference_attention
from qkv import safetensors as qst

TOL = 2e-5


def oracle(m: qkv.MultiHeadAttention, x, source=None, **opts):
    """(delta, head_delta, pattern) in float64 from the block's weights: Δe = Σ_h W_O^h · attn_h + b_o."""
    c, w = m.config, {k: v.astype(np.float64) for k, v in m.state_dict().items()}
    x = np.asarray(x, np.float64)
    s = x if source is None else np.asarray(source, np.float64)
    B, S, Skv = x.shape[0], x.shape[1], s.shape[1]
    H, Hkv, Dh, Dv = c["n_heads"], c["n_kv_heads"], c["d_head"], c["d_value"]
    q = x @ w["w_q"].T + w.get("b_q", 0)
    k = s @ w["w_k"].T + w.get("b_k", 0)
    v = s @ w["w_v"].T + w.get("b_v", 0)
    heads = lambda t, n, d, L: t.reshape(B, L, n, d).transpose(0, 2, 1, 3)
    out, _, pattern = reference_attention(heads(q, H, Dh, S), heads(k, Hkv, Dh, Skv), heads(v, Hkv, Dv, Skv), **opts)
    head_delta = np.stack([out[:, h] @ w["w_o"][:, h * Dv:(h + 1) * Dv].T for h in range(H)], axis=1)
    return head_delta.sum(axis=1) + w.get("b_o", 0), head_delta, pattern


def err(a, b):
    return float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())


@pytest.mark.parametrize("cfg", [
    dict(d_model=32, n_heads=4),
    dict(d_model=24, n_heads=6, n_kv_heads=2, d_head=5, d_value=7, bias=True),      # GQA, Dv != Dh
    dict(d_model=16, n_heads=2, d_source=20, d_head=8, bias=True),                  # cross-attention
])
@pytest.mark.parametrize("opts", [{}, dict(causal=True), dict(causal=True, align="bottom_right", window_left=2)])
def test_forward_matches_the_formula(rng, cfg, opts):
    m = qkv.MultiHeadAttention(**cfg, seed=3)
    x = rng.standard_normal((2, 9, cfg["d_model"])).astype(np.float32)
    src = rng.standard_normal((2, 6, cfg["d_source"])).astype(np.float32) if "d_source" in cfg else None
    r = m.forward(x, src, return_head_delta=True, return_pattern=True, **opts)
    want, want_heads, want_pattern = oracle(m, x, src, **opts)
    e1, e2, e3 = err(r.delta, want), err(r.head_delta, want_heads), err(r.pattern, want_pattern)
    print(f"{cfg} {opts}: max error delta {e1:.3g}, head_delta {e2:.3g}, pattern {e3:.3g}")
    assert e1 < TOL and e2 < TOL and e3 < TOL
    # __call__ is forward().delta (asking for the pattern may pick another kernel: float32 rounding)
    assert err(m(x, src, **opts), want) < TOL


def test_matches_torch_multihead_attention():
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    for kdim in (None, 12):                                                # self-, then cross-attention
        tm = torch.nn.MultiheadAttention(32, 4, batch_first=True, bias=True, kdim=kdim, vdim=kdim).eval()
        m = qkv.MultiHeadAttention(32, 4, bias=True, d_source=kdim, seed=None)
        if kdim is None:
            wq, wk, wv = tm.in_proj_weight.detach().chunk(3)
        else:
            wq, wk, wv = tm.q_proj_weight, tm.k_proj_weight, tm.v_proj_weight
        bq, bk, bv = tm.in_proj_bias.detach().chunk(3)
        m.load_state_dict(dict(w_q=wq, w_k=wk, w_v=wv, w_o=tm.out_proj.weight, b_q=bq, b_k=bk, b_v=bv,
                               b_o=tm.out_proj.bias))
        x = torch.randn(3, 8, 32)
        s = x if kdim is None else torch.randn(3, 5, kdim)
        pad = torch.tensor([[False] * 5 + [True] * (s.shape[1] - 5)] * 3)  # torch: True = padding
        pad[1, 2:] = True
        with torch.no_grad():
            want, wpat = tm(x, s, s, key_padding_mask=pad, average_attn_weights=False)
        got = m.forward(x, None if kdim is None else s, key_lengths=(~pad).sum(1), return_pattern=True)
        assert isinstance(got.delta, torch.Tensor)
        e = (got.delta - want).abs().max().item()
        ep = (got.pattern - wpat).abs().max().item()
        print(f"torch MultiheadAttention kdim={kdim}: max error {e:.3g}, pattern {ep:.3g}")
        assert e < TOL and ep < TOL


def test_weights_are_views_and_heads_are_their_slices(rng):
    m = qkv.MultiHeadAttention(16, 4, n_kv_heads=2, seed=5)
    x = rng.standard_normal((1, 5, 16)).astype(np.float32)
    before = m.forward(x, return_head_delta=True)
    hw = m.head_weights(3)                            # kv head 1 serves query heads 2 and 3
    assert hw["value_up"].shape == (16, 4) and np.shares_memory(hw["value_up"], m.w_o)
    assert np.array_equal(hw["key"], m.w_k[4:8])
    hw["value_up"][...] = 0                           # silence head 3's value-up in place
    r = m.forward(x, return_head_delta=True)
    assert np.all(r.head_delta[:, 3] == 0)
    # Δe is the sum of the heads' shares: removing head 3 removes exactly its share.
    e = err(r.delta, before.delta - before.head_delta[:, 3])
    print(f"head 3 silenced: max error {e:.3g}")
    assert e < TOL


def test_save_load_roundtrip_and_safetensors_compatibility(tmp_path, rng):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    m = qkv.MultiHeadAttention(24, 3, n_kv_heads=1, d_value=5, bias=True, seed=9)
    path = str(tmp_path / "block.safetensors")
    m.save(path)
    assert os.listdir(tmp_path) == ["block.safetensors"]          # written to a temporary name, renamed
    theirs = safetensors_numpy.load_file(path)                     # the reference reader
    assert set(theirs) == set(m.state_dict())
    assert all(np.array_equal(theirs[k], v) for k, v in m.state_dict().items())
    m2 = qkv.MultiHeadAttention.load(path)
    assert m2.config == m.config
    x = rng.standard_normal((2, 4, 24)).astype(np.float32)
    assert np.array_equal(m2(x), m(x))
    # A file written by the reference writer loads too.
    meta = {"format": "qkv.MultiHeadAttention", **{k: str(v) for k, v in m.config.items()}}
    other = str(tmp_path / "theirs.safetensors")
    safetensors_numpy.save_file(m.state_dict(), other, metadata=meta)
    assert np.array_equal(qkv.MultiHeadAttention.load(other)(x), m(x))


def test_bfloat16_tensors_in_safetensors(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    path = str(tmp_path / "bf16.safetensors")
    qst.save_file({"a": a, "b": np.ones(2, np.int64)}, path, {"k": "v"})
    t, meta = qst.load_file(path)
    assert t["a"].dtype == ml_dtypes.bfloat16 and np.array_equal(t["a"], a) and meta == {"k": "v"}


def corrupt(path, data):
    with open(path, "wb") as f:
        f.write(data)


def test_broken_files_are_rejected(tmp_path):
    path = str(tmp_path / "x.safetensors")
    good = str(tmp_path / "good.safetensors")
    qst.save_file({"w": np.zeros((2, 2), np.float32)}, good)
    raw = open(good, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    cases = [
        (b"\x01\x02", r"shorter than the 8-byte header length"),
        ((10 ** 6).to_bytes(8, "little") + b"{}", r"header length 1000000 does not fit in the file of 10 bytes"),
        ((2).to_bytes(8, "little") + b"[]", r"header must be a JSON object, got array"),
        ((3).to_bytes(8, "little") + b"{x}", r"header is not valid JSON"),
        (raw[:-4], r"data_offsets \[0, 16\] outside the data region of 12 bytes"),
        (raw[:8] + raw[8:8 + n].replace(b"F32", b"Q32") + raw[8 + n:], r"unknown dtype 'Q32'"),
        (raw[:8] + raw[8:8 + n].replace(b"[2,2]", b"[2,3]") + raw[8 + n:], r"F32 \[2,3\] needs 6 × 4 bytes but data_offsets span 16"),
        (raw + b"\0\0\0\0", r"the tensors cover 16 bytes of a data region of 20 \(trailing bytes\)"),
    ]
    for data, pattern in cases:
        corrupt(path, data)
        with pytest.raises(ValueError, match=pattern) as info:
            qst.load_file(path)
        print(info.value)
    with pytest.raises(ValueError, match=r"metadata must hold format='qkv.MultiHeadAttention'"):
        qkv.MultiHeadAttention.load(good)


def test_block_errors(rng):
    m = qkv.MultiHeadAttention(16, 2)
    cases = [
        (lambda: qkv.MultiHeadAttention(10, 3), ValueError, r"d_model = 10 is not a multiple of n_heads = 3"),
        (lambda: qkv.MultiHeadAttention(16, 4, n_kv_heads=3), ValueError, r"config.n_kv_heads: must divide n_heads"),
        (lambda: m(np.zeros((2, 3, 8), np.float32)), ValueError,
         r"x: expected f32 \[B, S, d_model = 16\], got f32\[2, 3, 8\]"),
        (lambda: m(np.zeros((2, 3, 16), np.float64)), TypeError, r"x: dtype must be float32, got float64"),
        (lambda: m(np.zeros((3, 16), np.float32), np.zeros((2, 4, 16), np.float32)), ValueError,
         r"source: expected f32 \[B = 1, Skv, d_source = 16\], got f32\[1, 2, 4, 16\]"),
        (lambda: qkv.MultiHeadAttention(16, 2, d_source=8)(np.zeros((1, 3, 16), np.float32)), ValueError,
         r"source: required, because d_source 8 differs from d_model 16"),
        (lambda: m.load_state_dict({"w_q": np.zeros((16, 16))}), ValueError, r"weights: expected names"),
        (lambda: m.load_state_dict({**m.state_dict(), "w_o": np.zeros((16, 15))}), ValueError,
         r"w_o: expected shape \[16, 16\], got \[16, 15\]"),
        (lambda: m(np.zeros((1, 3, 16), np.float32), mask=np.ones((3, 4), bool)), ValueError,
         r"opt.mask: shape \[3, 4\] does not broadcast"),
        (lambda: m.head_weights(2), ValueError, r"h: must be in \[0, 2\), got 2"),
    ]
    for call, exc, pattern in cases:
        with pytest.raises(exc, match=pattern) as info:
            call()
        print(f"{exc.__name__}: {info.value}")
