"""qkv.onnx_attention (issue #19: ONNX's Attention operator, opsets 23-25) against onnx.reference's
Attention (opset 25, which has every attribute of 23-24 plus the windows), on a seeded sweep:
3-D [B, S, H*D] and 4-D inputs, grouped-query heads, bool and float masks of rank 2-4 (some shorter
than the key length, which ONNX pads), past_key/past_value (present outputs; new keys as many as the
queries or not), nonpad_kv_seqlen, is_causal, softcap, windows, every qk_matmul_output_mode.

Tolerances: float64 on both sides 1e-12 (sums of <= 16 products of unit-size values, rounding ~1e-15).
float32 inputs (qkv's fast kernels): FlashAttention's rule, 2x the error of onnx.reference run in
float32 against its float64 run, plus 2^-20 of the largest output (2 ulps).
"""

import numpy as np
import pytest

import qkv

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

_TYPES = {np.dtype(np.float64): TensorProto.DOUBLE, np.dtype(np.float32): TensorProto.FLOAT,
          np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(bool): TensorProto.BOOL,
          np.dtype(np.int64): TensorProto.INT64}


def onnx_run(feeds, attrs, want_qk):
    """onnx.reference's Attention; feeds by ONNX input name (absent inputs omitted)."""
    order = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    last = max(i for i, n in enumerate(order) if n in feeds)
    names = [n if n in feeds else "" for n in order[:last + 1]]
    inputs = [helper.make_tensor_value_info(n, _TYPES[feeds[n].dtype], None) for n in names if n]
    outs = ["Y", "present_key", "present_value"] + (["qk"] if want_qk else [])
    node = helper.make_node("Attention", names, outs, **attrs)
    t = _TYPES[feeds["Q"].dtype]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info(n, t, None) for n in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    return ReferenceEvaluator(model).run(None, feeds)


def case(seed):
    """The inputs and attributes of sweep case `seed`, float64."""
    rng = np.random.default_rng(seed)
    B, Hkv, group = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.choice([1, 2, 3]))
    H, Sq, D, Dv = Hkv * group, int(rng.integers(1, 7)), int(rng.choice([4, 8, 16])), int(rng.choice([4, 8]))
    three_d = seed % 2 == 0
    past = int(rng.integers(1, 6)) if seed % 3 == 1 else 0
    Snew = Sq if (past and seed % 4 < 2) or not past else int(rng.integers(1, 7))
    Skv = past + Snew
    q = 1.5 * rng.standard_normal((B, H, Sq, D))
    k, v = 1.5 * rng.standard_normal((B, Hkv, Snew, D)), rng.standard_normal((B, Hkv, Snew, Dv))
    feeds = {}
    if three_d:
        feeds["Q"] = q.transpose(0, 2, 1, 3).reshape(B, Sq, H * D)
        feeds["K"] = k.transpose(0, 2, 1, 3).reshape(B, Snew, Hkv * D)
        feeds["V"] = v.transpose(0, 2, 1, 3).reshape(B, Snew, Hkv * Dv)
    else:
        feeds.update(Q=q, K=k, V=v)
    if past:
        feeds["past_key"] = 1.5 * rng.standard_normal((B, Hkv, past, D))
        feeds["past_value"] = rng.standard_normal((B, Hkv, past, Dv))
    if seed % 3 == 2:
        feeds["nonpad_kv_seqlen"] = rng.integers(0, Skv + 1, size=B).astype(np.int64)
    if seed % 5 != 4:
        rank = 2 + seed % 3
        last = Skv - (int(rng.integers(0, 2)) if seed % 7 == 3 else 0)  # sometimes one short: ONNX pads it
        shape = [B, H, Sq, last][4 - rank:]
        shape = [1 if (i < rank - 2 and rng.random() < 0.5) else d for i, d in enumerate(shape)]
        feeds["attn_mask"] = (rng.random(shape) < 0.85 if seed % 2 else
                              np.where(rng.random(shape) < 0.1, -np.inf, rng.standard_normal(shape)))
    attrs = dict(is_causal=int(seed % 4 != 3), qk_matmul_output_mode=int(seed % 4))
    if three_d:
        attrs.update(q_num_heads=H, kv_num_heads=Hkv)
    if seed % 3 == 0:
        attrs["softcap"] = 2.0
    if seed % 5 == 1:
        attrs["left_window_size"] = int(rng.integers(0, 4))
    if seed % 7 == 2:
        attrs["right_window_size"] = int(rng.integers(0, 3))
    if seed % 6 == 5:
        attrs["scale"] = 0.3
    return feeds, attrs


def run_qkv(feeds, attrs, want_qk, **extra):
    return qkv.onnx_attention(feeds["Q"], feeds["K"], feeds["V"], feeds.get("attn_mask"), feeds.get("past_key"),
                              feeds.get("past_value"), feeds.get("nonpad_kv_seqlen"), return_qk_matmul_output=want_qk,
                              **attrs, **extra)


@pytest.mark.parametrize("seed", range(40))
def test_sweep_against_onnx_reference_float64(seed):
    feeds, attrs = case(seed)
    # ONNX's mode 0 with a softcap: onnx 1.23.2's reference returns the capped scores, against its own
    # schema ("the output of qk matmul"); qkv returns the scaled ones (test_variants.py covers them).
    want_qk = not (attrs["qk_matmul_output_mode"] == 0 and attrs.get("softcap"))
    want = onnx_run(feeds, attrs, want_qk)
    got = run_qkv(feeds, attrs, want_qk)
    assert got.Y.shape == want[0].shape and got.Y.dtype == np.float64
    np.testing.assert_allclose(got.Y, want[0], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(got.present_key, want[1])
    np.testing.assert_array_equal(got.present_value, want[2])
    if want_qk:
        np.testing.assert_array_equal(np.isneginf(got.qk_matmul_output), np.isneginf(want[3]))
        np.testing.assert_allclose(got.qk_matmul_output, want[3], rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 5, 8, 13])
def test_sweep_float32_fast_kernels(seed):
    feeds, attrs = case(seed)
    attrs["qk_matmul_output_mode"] = 0
    want = onnx_run(feeds, attrs, False)[0]
    lowp = onnx_run({n: (x.astype(np.float32) if x.dtype == np.float64 else x) for n, x in feeds.items()}, attrs,
                    False)[0].astype(np.float64)
    f32 = {n: (x.astype(np.float32) if x.dtype == np.float64 else x) for n, x in feeds.items()}
    got = run_qkv(f32, attrs, False)
    assert got.Y.dtype == np.float32
    tol = 2 * np.abs(lowp - want).max() + 2**-20 * np.abs(want).max()
    assert np.abs(got.Y - want).max() <= tol


def test_float16_and_double_softmax_precision():
    """float16 inputs compute in float32 and come back float16 (within half a float16 ulp of the
    float64 result, plus the float32 error); softmax_precision=DOUBLE runs the float64 reference."""
    feeds, attrs = case(4)
    want = onnx_run(feeds, attrs, False)[0]
    half = {n: (x.astype(np.float16) if x.dtype == np.float64 else x) for n, x in feeds.items()}
    exact = onnx_run({n: x.astype(np.float64) if x.dtype == np.float16 else x for n, x in half.items()}, attrs, False)[0]
    got = run_qkv(half, attrs, False)
    assert got.Y.dtype == np.float16 and got.present_key.dtype == np.float16
    assert np.abs(got.Y.astype(np.float64) - exact).max() <= 2**-11 * np.abs(exact).max() + 1e-6
    f32 = {n: (x.astype(np.float32) if x.dtype == np.float64 else x) for n, x in feeds.items()}
    d = run_qkv(f32, attrs, False, softmax_precision=TensorProto.DOUBLE)
    # The float64 reference on the float32 values, rounded once: within one float32 ulp of the float64 result.
    exact32 = onnx_run({n: x.astype(np.float64) if x.dtype == np.float32 else x for n, x in f32.items()}, attrs, False)[0]
    assert np.abs(d.Y.astype(np.float64) - exact32).max() <= 2**-23 * np.abs(exact32).max()
    assert want.shape == got.Y.shape


def test_torch_inputs_and_errors():
    torch = pytest.importorskip("torch")
    feeds, attrs = case(6)
    want = onnx_run(feeds, attrs, False)[0]
    got = run_qkv({n: torch.from_numpy(x) for n, x in feeds.items()}, attrs, False)
    assert isinstance(got.Y, torch.Tensor)
    assert (got.Y.numpy() - want).__abs__().max() <= 1e-12
    x3 = np.zeros((1, 2, 6))
    with pytest.raises(ValueError, match=r"\[qkv.onnx_attention\] q_num_heads: 3-D inputs need an int >= 1, got None"):
        qkv.onnx_attention(x3, x3, x3)
    with pytest.raises(ValueError, match=r"K: hidden size 6 is not a multiple of the head count 4"):
        qkv.onnx_attention(x3, x3, x3, q_num_heads=2, kv_num_heads=4)
    x4 = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"q_num_heads and kv_num_heads: only for 3-D inputs"):
        qkv.onnx_attention(x4, x4, x4, q_num_heads=2)
    with pytest.raises(ValueError, match=r"nonpad_kv_seqlen: cannot be combined with past_key"):
        qkv.onnx_attention(x4, x4, x4, None, x4, x4, np.array([3]))
    with pytest.raises(ValueError, match=r"qk_matmul_output_mode: must be 0, 1, 2 or 3, got 4"):
        qkv.onnx_attention(x4, x4, x4, qk_matmul_output_mode=4)
