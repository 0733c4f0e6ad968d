"""Score variants (issue #19) through qkv.attention, qkv.torch and qkv.flash_attn_func, against peers:

- torch's flex_attention with a score_mod for softcap and ALiBi (float64; torch's implementation),
- a naive numpy formula for attention sinks (gpt-oss: a logit without a value in every denominator),
- onnx.reference's Attention (opset 24) for softcap and the per-batch key-length causal alignment,
- torch autograd on the explicit formula for the gradients of q, k, v, the sinks and a float mask.

Tolerances: qkv's float64 reference kernel against a float64 peer 1e-10 (both exact up to the
rounding of sums of ~100 terms, ~1e-14). float32 flash kernels against the float64 peer follow
FlashAttention's rule: at most 2x the error of the same formula computed naively in float32 (the
peer run in float32), plus 2^-20 of the largest value (2 ulps).
"""

import math

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")


def rand(*shape, seed, dtype=torch.float64, sigma=1.0):
    g = torch.Generator().manual_seed(seed)
    return (sigma * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)


def isas():
    order = ["scalar", "avx2", "avx512", "avx512_vnni", "avx512_bf16"]
    return order[: order.index(qkv.cpu_isa()) + 1]


@pytest.fixture
def restore_isa():
    saved = qkv.active_isa()
    yield
    qkv.set_isa(saved)


def flex_peer(q, k, v, *, softcap=None, slopes=None, causal=False, offset=0):
    """flex_attention with a score_mod: softcap, then ALiBi −slope·|i + offset − j|, then causal."""
    def score_mod(score, b, h, i, j):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        diag = i + offset
        if slopes is not None:
            score = score - slopes[h] * (diag - j).abs()
        if causal:
            score = torch.where(j <= diag, score, -float("inf"))
        return score

    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex.flex_attention(q, k, v, score_mod=score_mod, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("variant", ["softcap", "alibi", "both"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
def test_softcap_alibi_against_flex_attention(variant, causal, align, restore_isa):
    B, H, Hkv, Sq, Skv, D = 2, 4, 2, 37, 70, 32
    q, k, v = rand(B, H, Sq, D, seed=1, sigma=1.5), rand(B, Hkv, Skv, D, seed=2, sigma=1.5), rand(B, Hkv, Skv, D, seed=3)
    cap = 2.5 if variant in ("softcap", "both") else None
    slopes = torch.from_numpy(qkv.alibi_slopes(H)) if variant in ("alibi", "both") else None
    offset = Skv - Sq if align == "bottom_right" else 0
    want = flex_peer(q, k, v, softcap=cap, slopes=slopes, causal=causal, offset=offset)
    kw = dict(causal=causal, align=align, softcap=cap, alibi_slopes=None if slopes is None else True)
    got = qkv.attention(q, k, v, kernel="reference", **kw).out
    assert (got - want).abs().max() < 1e-10
    naive32 = flex_peer(q.float(), k.float(), v.float(), softcap=cap, slopes=None if slopes is None else slopes.float(),
                        causal=causal, offset=offset)
    tol = 2 * (naive32.double() - want).abs().max().item() + 2 ** -20 * want.abs().max().item()
    for isa in isas():
        qkv.set_isa(isa)
        for kernel in ("flash", "flash_decode"):
            r = qkv.attention(q.float(), k.float(), v.float(), kernel=kernel, **kw)
            err = (r.out.double() - want).abs().max().item()
            assert err <= tol, (isa, kernel, err, tol)


def naive_sinks(q, k, v, sinks, scale):
    """numpy: p_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij)); out = p @ v; lse = log(denominator)."""
    G = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    m = np.maximum(s.max(-1, keepdims=True), sinks[None, :, None, None])
    e = np.exp(s - m)
    z = e.sum(-1, keepdims=True) + np.exp(sinks[None, :, None, None] - m)
    return np.einsum("bhij,bhjd->bhid", e / z, v), (m + np.log(z))[..., 0]


def test_sinks_against_numpy(restore_isa):
    B, H, Hkv, Sq, Skv, D = 2, 6, 3, 9, 300, 64
    q, k, v = (rand(*s, seed=i, sigma=1.2).numpy() for i, s in
               enumerate([(B, H, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D)]))
    sinks = rand(H, seed=9, sigma=2.0).numpy()
    want, want_lse = naive_sinks(q, k, v, sinks, D ** -0.5)
    r = qkv.attention(q, k, v, sinks=sinks, kernel="reference", return_lse=True)
    assert np.abs(r.out - want).max() < 1e-10 and np.abs(r.lse - want_lse).max() < 1e-10
    n32, _ = naive_sinks(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), sinks.astype(np.float32),
                         np.float32(D ** -0.5))
    tol = 2 * np.abs(n32 - want).max() + 2 ** -20 * np.abs(want).max()
    for isa in isas():
        qkv.set_isa(isa)
        for kernel in ("flash", "flash_decode"):
            r = qkv.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), sinks=sinks,
                              kernel=kernel, return_lse=True)
            assert np.abs(r.out - want).max() <= tol, (isa, kernel)
            assert np.abs(r.lse - want_lse).max() <= 1e-5, (isa, kernel)  # lse is float32: ~1 ulp of |lse| ≤ 10


def explicit(q, k, v, *, mask=None, softcap=None, slopes=None, sinks=None, causal=False, offset=0):
    """The header's formula in torch ops (differentiable): softcap, + mask, − ALiBi, sinks in the denominator."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if mask is not None:
        s = s + mask
    i = torch.arange(q.shape[2]).view(-1, 1) + (offset if torch.is_tensor(offset) else torch.tensor(offset))
    j = torch.arange(k.shape[2])
    if slopes is not None:
        s = s - slopes.reshape(-1, q.shape[1], 1, 1) * (i - j).abs()  # [H] or [B, H]
    if causal:
        s = s.masked_fill(j > i, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
        return torch.softmax(s, -1)[..., :-1] @ v
    return torch.softmax(s, -1) @ v


def test_per_batch_alibi_slopes():
    """[B, H] slopes (FlashAttention's per-batch form) in qkv.attention, qkv.torch (with gradients)
    and flash_attn_func, against the explicit formula in float64 (1e-10, as above)."""
    q, k, v = rand(3, 4, 6, 16, seed=110), rand(3, 2, 9, 16, seed=111), rand(3, 2, 9, 16, seed=112)
    slopes = rand(3, 4, seed=113).abs()
    want = explicit(q, k, v, slopes=slopes, causal=True, offset=3)
    for kernel in ("reference", "automatic"):
        got = qkv.attention(q, k, v, alibi_slopes=slopes, causal=True, align="bottom_right", kernel=kernel).out
        assert (got - want).abs().max() < 1e-10
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, _ = qkv.torch.attention(qg, kg, vg, causal=True, align="bottom_right", alibi_slopes=slopes)
    out.sum().backward()
    qe, ke, ve = (x.clone().requires_grad_() for x in (q, k, v))
    explicit(qe, ke, ve, slopes=slopes, causal=True, offset=3).sum().backward()
    for a, b in ((qg, qe), (kg, ke), (vg, ve)):
        assert (a.grad - b.grad).abs().max() < 1e-10
    fa = qkv.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, alibi_slopes=slopes)
    assert (fa.transpose(1, 2) - want).abs().max() < 1e-10


def test_torch_gradients_against_autograd():
    B, H, Hkv, Sq, Skv, D = 2, 4, 2, 11, 17, 16
    q, k, v = (rand(*s, seed=i + 20, sigma=1.5).requires_grad_() for i, s in
               enumerate([(B, H, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D)]))
    mask = rand(Sq, Skv, seed=30).requires_grad_()
    sinks = rand(H, seed=31).requires_grad_()
    slopes = torch.from_numpy(qkv.alibi_slopes(H))
    out, _ = qkv.torch.attention(q, k, v, mask=mask, softcap=3.0, alibi_slopes=slopes, sinks=sinks, causal=True,
                                 align="bottom_right")
    want = explicit(q, k, v, mask=mask, softcap=3.0, slopes=slopes, sinks=sinks, causal=True, offset=Skv - Sq)
    assert (out - want).abs().max() < 1e-10
    g = rand(*out.shape, seed=40)
    got = torch.autograd.grad(out, (q, k, v, mask, sinks), g)
    ref = torch.autograd.grad(want, (q, k, v, mask, sinks), g)
    for name, a, b in zip(["q", "k", "v", "mask", "sinks"], got, ref):
        assert (a - b).abs().max() < 1e-9, name   # f64 kernels on both sides; sums of ≤ 200 terms


def test_torch_sink_gradient_float32_and_varlen():
    H, D = 4, 32
    lens = [5, 9]
    q = rand(sum(lens), H, D, seed=50, dtype=torch.float32).requires_grad_()
    k = rand(sum(lens), 2, D, seed=51, dtype=torch.float32).requires_grad_()
    v = rand(sum(lens), 2, D, seed=52, dtype=torch.float32).requires_grad_()
    sinks = rand(H, seed=53, dtype=torch.float32).requires_grad_()
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    out = qkv.torch.attention_varlen(q, k, v, cu, cu, causal=True, sinks=sinks, softcap=4.0)
    got = torch.autograd.grad(out.sum(), (q, sinks))
    # Per sequence, the explicit formula in float64.
    q64, k64, v64, s64 = (t.detach().double().requires_grad_() for t in (q, k, v, sinks))
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        outs.append(explicit(q64[a:b].transpose(0, 1)[None], k64[a:b].transpose(0, 1)[None],
                             v64[a:b].transpose(0, 1)[None], softcap=4.0, sinks=s64, causal=True)[0].transpose(0, 1))
    ref = torch.autograd.grad(torch.cat(outs).sum(), (q64, s64))
    # float32 kernels against float64: errors of a few float32 ulps of sums of ≤ 9 terms of size ~1-10.
    assert (got[0].double() - ref[0]).abs().max() < 1e-4
    assert (got[1].double() - ref[1]).abs().max() < 1e-4


def test_key_length_alignment_against_explicit():
    B, H, Sq, Skv, D = 3, 2, 6, 20, 8
    q, k, v = rand(B, H, Sq, D, seed=60), rand(B, H, Skv, D, seed=61), rand(B, H, Skv, D, seed=62)
    kl = torch.tensor([20, 11, 4])
    r = qkv.attention(q, k, v, key_lengths=kl, causal=True, align="bottom_right_key_lengths", kernel="reference")
    for b in range(B):
        n = int(kl[b])
        want = explicit(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=True, offset=n - Sq)
        want = torch.nan_to_num(want)  # rows before the first key (batch 2: queries 0, 1) see none: 0
        assert (r.out[b:b + 1] - want).abs().max() < 1e-12, b
    # Without key_lengths it is bottom_right; the existing aligns are unchanged.
    a = qkv.attention(q, k, v, causal=True, align="bottom_right_key_lengths").out
    assert torch.equal(a, qkv.attention(q, k, v, causal=True, align="bottom_right").out)


onnx = pytest.importorskip("onnx")


def onnx_attention(q, k, v, *, softcap=None, nonpad=None, causal=False):
    """onnx.reference's Attention (opset 24), 4-D inputs [B, H, S, D]."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in ("Q", "K", "V")]
    names = ["Q", "K", "V"]
    feeds = {"Q": q, "K": k, "V": v}
    if nonpad is not None:
        names += ["", "", "", "nonpad"]
        inputs.append(helper.make_tensor_value_info("nonpad", TensorProto.INT64, None))
        feeds["nonpad"] = nonpad
    attrs = dict(is_causal=int(causal))
    if softcap is not None:
        attrs["softcap"] = float(softcap)
    node = helper.make_node("Attention", names, ["Y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    return ReferenceEvaluator(model).run(None, feeds)[0]


@pytest.mark.parametrize("softcap", [None, 1.5])
def test_onnx_reference_softcap_and_key_lengths(softcap):
    B, H, Sq, Skv, D = 3, 2, 5, 12, 8
    q, k, v = (rand(*s, seed=70 + i, sigma=1.5).numpy() for i, s in enumerate([(B, H, Sq, D), (B, H, Skv, D),
                                                                              (B, H, Skv, D)]))
    nonpad = np.array([12, 7, 5], dtype=np.int64)
    want = onnx_attention(q, k, v, softcap=softcap, nonpad=nonpad, causal=True)
    got = qkv.attention(q, k, v, key_lengths=nonpad, causal=True, align="bottom_right_key_lengths", softcap=softcap,
                        kernel="reference").out
    assert np.abs(got - want).max() < 1e-12
    want = onnx_attention(q, k, v, softcap=softcap)
    assert np.abs(qkv.attention(q, k, v, softcap=softcap).out - want).max() < 1e-12


def test_flash_attn_func_softcap_and_alibi():
    q, k, v = rand(2, 9, 4, 16, seed=80), rand(2, 13, 2, 16, seed=81), rand(2, 13, 2, 16, seed=82)
    slopes = torch.from_numpy(qkv.alibi_slopes(4))
    out = qkv.flash_attn_func(q, k, v, causal=True, softcap=2.0, alibi_slopes=slopes)
    want = explicit(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softcap=2.0, slopes=slopes, causal=True,
                    offset=13 - 9).transpose(1, 2)
    assert (out - want).abs().max() < 1e-10
    with pytest.raises(ValueError, match=r"\[qkv.flash_attn_func\] alibi_slopes: expected a tensor \[H\] or \[B, H\]"):
        qkv.flash_attn_func(q, k, v, alibi_slopes=torch.zeros(2, 4, 1))


def test_errors_name_argument_and_value():
    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[qkv.attention\] softcap: must be a finite float > 0, got -1"):
        qkv.attention(q, q, q, softcap=-1)
    with pytest.raises(ValueError, match=r"\[qkv.attention\] sinks: expected shape \[H\] = \[2\], got \[3\]"):
        qkv.attention(q, q, q, sinks=np.zeros(3))
    with pytest.raises(ValueError, match=r"opt.alibi_slopes\[0\]: must be finite"):
        qkv.attention(q, q, q, alibi_slopes=np.array([np.inf, 1.0]))
    with pytest.raises(ValueError, match="align: must be 'top_left', 'bottom_right' or 'bottom_right_key_lengths'"):
        qkv.attention(q, q, q, align="left")


def test_custom_op_opcheck():
    q, k, v = (rand(1, 2, 4, 8, seed=90 + i).requires_grad_() for i in range(3))
    sinks = rand(2, seed=93).requires_grad_()
    torch.library.opcheck(torch.ops.qkv.attention.default,
                          (q, k, v, None, None, None, False, "top_left", -1, -1, 0.0, None, 2.0,
                           torch.from_numpy(qkv.alibi_slopes(2)), sinks))


def onnx_attention_outputs(q, k, v, *, mask=None, nonpad=None, causal=False, softcap=None, mode=0):
    """onnx.reference's Attention (opset 24): (Y, qk_matmul_output) for qk_matmul_output_mode = mode."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    names, feeds = ["Q", "K", "V"], {"Q": q, "K": k, "V": v}
    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in names]
    if mask is not None:
        names.append("mask")
        feeds["mask"] = mask
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL if mask.dtype == bool else TensorProto.DOUBLE,
                                                    None))
    if nonpad is not None:
        names += [""] * (4 - len(names)) + ["", "", "nonpad"]
        feeds["nonpad"] = nonpad
        inputs.append(helper.make_tensor_value_info("nonpad", TensorProto.INT64, None))
    attrs = dict(is_causal=int(causal), qk_matmul_output_mode=mode)
    if softcap is not None:
        attrs["softcap"] = float(softcap)
    node = helper.make_node("Attention", names, ["Y", "", "", "S"], **attrs)
    outs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in ("Y", "S")]
    model = helper.make_model(helper.make_graph([node], "g", inputs, outs), opset_imports=[helper.make_opsetid("", 24)])
    return ReferenceEvaluator(model).run(None, feeds)


STAGES = {0: "scaled", 1: "softcapped", 2: "masked"}


@pytest.mark.parametrize("seed", range(12))
def test_score_outputs_against_onnx_reference(seed):
    """A seeded sweep: GQA, bool/float masks of rank 2–4, key lengths (nonpad_kv_seqlen) with the
    per-batch causal alignment, softcap; every qk_matmul_output_mode (3 is return_pattern) at 1e-12
    (float64 on both sides; scores are a few units, the sums' rounding ~1e-15).
    ONNX's mode 0 with a softcap is skipped here: onnx 1.23.2's reference returns the capped scores
    there, against its own schema ("the output of qk matmul"); test_score_outputs_against_torch covers it."""
    rng = np.random.default_rng(seed)
    B, Hkv, group = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.choice([1, 2, 3]))
    H, Sq, Skv, D = Hkv * group, int(rng.integers(1, 9)), int(rng.integers(1, 14)), int(rng.choice([4, 8, 16]))
    q = 1.5 * rng.standard_normal((B, H, Sq, D))
    k, v = 1.5 * rng.standard_normal((B, Hkv, Skv, D)), rng.standard_normal((B, Hkv, Skv, D))
    softcap = [None, 1.5][seed % 2]
    causal = bool(seed % 3 == 0)
    nonpad = rng.integers(0, Skv + 1, size=B).astype(np.int64) if seed % 4 >= 2 else None
    mask = None
    if seed % 5 != 4:
        rank = 2 + seed % 3
        shape = [B, H, Sq, Skv][4 - rank:]
        shape = [1 if (i < rank - 2 and rng.random() < 0.5) else d for i, d in enumerate(shape)]
        mask = rng.random(shape) < 0.8 if seed % 2 else np.where(rng.random(shape) < 0.15, -np.inf,
                                                                   rng.standard_normal(shape))
    kw = dict(mask=mask, key_lengths=nonpad, causal=causal, softcap=softcap, kernel="reference",
              align="bottom_right_key_lengths" if nonpad is not None else "top_left")
    for mode in range(4):
        if mode == 0 and softcap is not None:
            continue
        y, want = onnx_attention_outputs(q, k, v, mask=mask, nonpad=nonpad, causal=causal, softcap=softcap, mode=mode)
        if mode == 3:
            r = qkv.attention(q, k, v, return_pattern=True, **kw)
            got = r.pattern
        else:
            r = qkv.attention(q, k, v, return_scores=STAGES[mode], **kw)
            got = r.scores
            assert r.pattern is None and got.dtype == np.float64 and got.shape == (B, H, Sq, Skv)
        np.testing.assert_allclose(r.out, y, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want), err_msg=f"mode {mode}")
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12, err_msg=f"mode {mode}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_score_outputs_against_torch(dtype):
    """scaled = scale·q·kᵀ for every pair (masked or not), softcapped = c·tanh(scaled / c),
    masked = softcapped + float mask − ALiBi, −inf where causal/key lengths deny: against torch's
    float64 matmul on the same (dtype-rounded) values. qkv computes in float64 and rounds once to
    the output (float32 for float32/bfloat16 inputs): error ≤ 2^-24 relative, plus 1e-12."""
    B, H, Hkv, Sq, Skv, D = 2, 4, 2, 5, 11, 16
    q, k, v = rand(B, H, Sq, D, seed=101, dtype=dtype), rand(B, Hkv, Skv, D, seed=102, dtype=dtype), \
        rand(B, Hkv, Skv, D, seed=103, dtype=dtype)
    mask = rand(Sq, Skv, seed=104, dtype=dtype).double()  # the values qkv reads
    slopes = torch.from_numpy(qkv.alibi_slopes(H))
    kl = torch.tensor([11, 6])
    s = (q.double() @ k.double().repeat_interleave(H // Hkv, 1).transpose(-1, -2)) / math.sqrt(D)
    capped = 2.0 * torch.tanh(s / 2.0)
    i, j = torch.arange(Sq)[:, None], torch.arange(Skv)[None, :]
    diag = i + kl[:, None, None, None] - Sq  # bottom_right_key_lengths
    masked = capped + mask - slopes[None, :, None, None] * (diag - j).abs()
    masked = masked.masked_fill((j > diag) | (j >= kl[:, None, None, None]), -math.inf)
    out_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for stage, want in [("scaled", s), ("softcapped", capped), ("masked", masked)]:
        r = qkv.attention(q, k, v, mask=mask.to(dtype), causal=True, align="bottom_right_key_lengths", key_lengths=kl,
                          softcap=2.0, alibi_slopes=slopes, return_scores=stage, return_lse=True)
        assert isinstance(r.scores, torch.Tensor) and r.scores.dtype == out_dtype
        tol = 1e-12 + (0 if dtype == torch.float64 else 2.0**-24 * want[want.isfinite()].abs().max().item())
        assert torch.equal(r.scores.isneginf(), want.isneginf()), stage
        fin = want.isfinite()
        assert (r.scores.double()[fin] - want[fin]).abs().max() <= tol, stage
        # The softmax of the masked scores is the pattern; their logsumexp is lse.
        if stage == "masked":
            lse = torch.logsumexp(want, -1)
            assert (r.lse.double() - lse)[lse.isfinite()].abs().max() < 1e-5


def test_score_output_errors():
    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[qkv.attention\] return_scores: must be None, 'scaled', 'softcapped' or "
                                         r"'masked', got 'raw'"):
        qkv.attention(q, q, q, return_scores="raw")
    cu = np.array([0, 3], np.int32)
    with pytest.raises(ValueError, match="return_scores are not available with packed sequences"):
        qkv.attention(q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2), q[0].transpose(1, 0, 2), cu_seqlens_q=cu,
                      cu_seqlens_k=cu, return_scores="scaled")
    with pytest.raises(ValueError, match="opt.kernel: flash takes .* no pattern or scores output .*scores requested"):
        qkv.attention(q, q, q, return_scores="scaled", kernel="flash")


def streaming_mask(Sq, Skv, window_left, keep_first, offset):
    """StreamingLLM's rule as an explicit bool mask [Sq, Skv]: causal to diag(i) = i + offset, and
    key j allowed if j >= diag(i) - window_left or j < keep_first."""
    i, j = np.arange(Sq)[:, None], np.arange(Skv)[None, :]
    diag = i + offset
    return (j <= diag) & ((j >= diag - window_left) | (j < keep_first))


@pytest.mark.parametrize("Sq,Skv,window_left,keep_first", [(1, 1200, 90, 4), (70, 300, 40, 8), (64, 64, 10, 30)])
def test_keep_first_against_explicit_mask(Sq, Skv, window_left, keep_first, restore_isa):
    """keep_first + window_left (StreamingLLM) = the same rule written as a bool mask, on a numpy
    softmax peer (float64, 1e-10), qkv's reference with the explicit mask (1e-12, forward and
    backward) and the float32 fast kernels on every ISA (the FlashAttention rule)."""
    B, H, Hkv, D = 2, 4, 2, 32
    q, k, v = rand(B, H, Sq, D, seed=1), rand(B, Hkv, Skv, D, seed=2), rand(B, Hkv, Skv, D, seed=3)
    dout = rand(B, H, Sq, D, seed=4)
    allowed = streaming_mask(Sq, Skv, window_left, keep_first, Skv - Sq)
    opts = dict(causal=True, align="bottom_right", window_left=window_left, keep_first=keep_first)

    def peer(dtype):
        kk, vv = (x.numpy().astype(dtype).repeat(H // Hkv, axis=1) for x in (k, v))
        s = q.numpy().astype(dtype) @ kk.swapaxes(-1, -2) / math.sqrt(D)
        s = np.where(allowed, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ vv

    want, lowp = peer(np.float64), peer(np.float32).astype(np.float64)
    r = qkv.attention(q, k, v, kernel="reference", return_lse=True, **opts)
    assert np.abs(r.out.numpy() - want).max() <= 1e-10
    m = qkv.attention(q, k, v, mask=torch.from_numpy(allowed), causal=True, align="bottom_right", kernel="reference",
                      return_lse=True)
    assert (r.out - m.out).abs().max() <= 1e-12 and (r.lse - m.lse).abs().max() <= 1e-12
    g1 = qkv.attention_backward(q, k, v, r.out, dout, r.lse, **opts)
    g2 = qkv.attention_backward(q, k, v, m.out, dout, m.lse, mask=torch.from_numpy(allowed), causal=True,
                                align="bottom_right", kernel="reference")
    assert g1.kernel.kernel == "reference"  # float64 inputs: the reference backward
    for a, b in zip(g1[:3], g2[:3]):
        assert (a - b).abs().max() <= 1e-12
    tol = 2 * np.abs(lowp - want).max() + 2**-20 * np.abs(want).max()
    for isa in isas():
        qkv.set_isa(isa)
        for kern in ("flash", "flash_decode"):
            f = qkv.attention(q.float(), k.float(), v.float(), kernel=kern, **opts)
            assert np.abs(f.out.double().numpy() - want).max() <= tol, (isa, kern)


def test_torch_keep_first_gradients_against_autograd():
    """qkv.torch.attention with keep_first + window_left (f64: the reference backward) against torch
    autograd through the same rule as a bool mask (streaming_mask) plus a float mask whose gradient
    qkv forms itself; 1e-9: f64 on both sides, sums of <= 200 terms. float32 runs the flash forward
    and the flash backward."""
    B, H, Hkv, Sq, Skv, D, wl, kf = 2, 4, 2, 9, 40, 16, 6, 5
    q, k, v = (rand(*s, seed=i + 50).requires_grad_() for i, s in
               enumerate([(B, H, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D)]))
    bias = rand(Sq, Skv, seed=60).requires_grad_()
    allowed = torch.from_numpy(streaming_mask(Sq, Skv, wl, kf, Skv - Sq))
    out, _ = qkv.torch.attention(q, k, v, mask=bias, causal=True, align="bottom_right", window_left=wl, keep_first=kf)
    want = explicit(q, k, v, mask=bias.masked_fill(~allowed, -math.inf), causal=True, offset=Skv - Sq)
    assert (out - want).abs().max() < 1e-10
    g = rand(*out.shape, seed=61)
    got = torch.autograd.grad(out, (q, k, v, bias), g)
    ref = torch.autograd.grad(want, (q, k, v, bias), g)
    for name, a, b in zip(["q", "k", "v", "mask"], got, ref):
        assert (a - b).abs().max() < 1e-9, name
    # Without keep_first the same call differs (the kept keys matter here).
    base, _ = qkv.torch.attention(q, k, v, mask=bias, causal=True, align="bottom_right", window_left=wl)
    assert (base - want).abs().max() > 1e-3
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    o32, _ = qkv.torch.attention(q32, k32, v32, causal=True, align="bottom_right", window_left=wl, keep_first=kf)
    o32.backward(g.float())
    want32 = explicit(q, k, v, mask=torch.zeros(Sq, Skv, dtype=torch.float64).masked_fill(~allowed, -math.inf),
                      causal=True, offset=Skv - Sq)
    ref32 = torch.autograd.grad(want32, (q, k, v), g)
    for name, a, b in zip(["q", "k", "v"], (q32.grad, k32.grad, v32.grad), ref32):
        assert (a.double() - b).abs().max() < 1e-5, name   # float32 inputs and outputs: ~2^-20 relative sums


@pytest.mark.parametrize("Sq,Skv,window_left,keep_first", [(200, 300, 70, 4), (40, 260, 30, 70), (130, 130, 0, 64)])
def test_flash_backward_keep_first_against_autograd(Sq, Skv, window_left, keep_first, restore_isa):
    """The flash backward with keep_first (its kernel named, on every ISA) against torch autograd in
    float64 through the same rule as a bool mask. Shapes: a gap of whole 64-key tiles between 4 kept
    keys and the window; 70 kept keys across a tile edge; window 0 (each row its diagonal and the
    first tile). Tolerance 2e-5 · max|grad|: float32 inputs and outputs, sums of <= 300 terms
    (~2^-16 relative), where a wrong key range errs by O(1)."""
    B, H, Hkv, D = 1, 4, 2, 32
    q, k, v = (rand(*sh, seed=i + 70) for i, sh in enumerate([(B, H, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D)]))
    g = rand(B, H, Sq, D, seed=74)
    allowed = torch.from_numpy(streaming_mask(Sq, Skv, window_left, keep_first, Skv - Sq))
    qd, kd, vd = (t.clone().requires_grad_() for t in (q, k, v))
    want = explicit(qd, kd, vd, mask=torch.zeros(Sq, Skv, dtype=torch.float64).masked_fill(~allowed, -math.inf),
                    causal=True, offset=Skv - Sq)
    ref = torch.autograd.grad(want, (qd, kd, vd), g)
    opts = dict(causal=True, align="bottom_right", window_left=window_left, keep_first=keep_first)
    q32, k32, v32, g32 = (t.float().numpy() for t in (q, k, v, g))
    for isa in isas():
        qkv.set_isa(isa)
        fwd = qkv.attention(q32, k32, v32, return_lse=True, **opts)
        grads = qkv.attention_backward(q32, k32, v32, fwd.out, g32, fwd.lse, kernel="flash", **opts)
        assert grads.kernel.name.startswith("flash_backward"), grads.kernel
        for name, a, b in zip(["q", "k", "v"], (grads.dq, grads.dk, grads.dv), ref):
            err = (torch.from_numpy(a).double() - b).abs().max().item()
            assert err < 2e-5 * b.abs().max().item(), (isa, name, err)


def test_keep_first_errors():
    x = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError, match=r"\[qkv.attention\] keep_first: must be an int >= 0, got -1"):
        qkv.attention(x, x, x, keep_first=-1)
