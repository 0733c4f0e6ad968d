"""Every error the Python package raises: its type, and a message that names the function, the
argument and the shapes or values involved. Nothing here may crash, return NaN or succeed."""

import re

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")


def f32(*shape):
    return np.zeros(shape, np.float32)


Q, K, V = f32(2, 3, 4, 8), f32(2, 3, 5, 8), f32(2, 3, 5, 6)
sdpa = qkv.scaled_dot_product_attention
att = qkv.attention

# (id, call, exception type, regex the message must match)
CASES = [
    ("not an array", lambda: sdpa([[1.0]], K, V), TypeError,
     r"\[qkv.scaled_dot_product_attention\] query: expected a NumPy array, a torch tensor or a DLPack producer, got list"),
    ("mixed frameworks", lambda: sdpa(Q, torch.from_numpy(K), V), TypeError,
     r"must all be NumPy arrays or all torch tensors, got query: numpy, key: torch, value: numpy"),
    ("not on the CPU", lambda: sdpa(*(torch.empty(x.shape, device="meta") for x in (Q, K, V))), TypeError,
     r"qkv runs on the CPU; got a tensor on meta of shape \(2, 3, 4, 8\)"),
    ("integer dtype", lambda: sdpa(Q.astype(np.int32), K, V), TypeError,
     r"query: dtype must be float32, bfloat16 or float64, got int32 \(shape \[2, 3, 4, 8\]\)"),
    ("float16 mixed", lambda: sdpa(torch.zeros(Q.shape, dtype=torch.float16), *(torch.zeros(x.shape) for x in (K, V))),
     TypeError, r"float16 is accepted when all three are float16, got \['float16', 'float32', 'float32'\]"),
    ("dtypes differ", lambda: sdpa(Q, K.astype(np.float64), V), TypeError,
     r"key: dtypes must match, got query float32\[2, 3, 4, 8\], key float64\[2, 3, 5, 8\], value float32\[2, 3, 5, 6\]"),
    ("rank 1", lambda: sdpa(f32(8), K, V), ValueError,
     r"must have rank >= 2 \(\.\.\., L, E\), got query \[8\], key \[2, 3, 5, 8\], value \[2, 3, 5, 6\]"),
    ("E differs", lambda: sdpa(Q, f32(2, 3, 5, 7), V), ValueError,
     r"key: last dimension must equal query's E = 8, got query \[2, 3, 4, 8\], key \[2, 3, 5, 7\]"),
    ("S differs", lambda: sdpa(Q, K, f32(2, 3, 6, 6)), ValueError,
     r"value: dimension -2 must equal key's S = 5, got .* value \[2, 3, 6, 6\]"),
    ("batch does not broadcast", lambda: sdpa(Q, f32(3, 3, 5, 8), f32(3, 3, 5, 6)), ValueError,
     r"batch dimensions do not broadcast: query \[2, 3\], key \[3, 3\], value \[3, 3\]"),
    ("dropout", lambda: sdpa(Q, K, V, dropout_p=1.0), ValueError,
     r"\[qkv.scaled_dot_product_attention\] dropout_p: must be in \[0, 1\), got 1.0"),
    ("mask with causal", lambda: sdpa(Q, K, V, attn_mask=np.ones((4, 5), bool), is_causal=True), ValueError,
     r"attn_mask and is_causal=True together are ambiguous"),
    ("mask dtype", lambda: sdpa(Q, K, V, attn_mask=np.ones((4, 5), np.int64)), TypeError,
     r"attn_mask: dtype must be bool \(True = may attend\) or float32/bfloat16/float64 .*got int64 \(shape \[4, 5\]\)"),
    ("mask framework", lambda: sdpa(Q, K, V, attn_mask=torch.ones(4, 5, dtype=torch.bool)), TypeError,
     r"attn_mask: must be of the same kind as the inputs \(numpy\), got torch"),
    ("mask shape", lambda: sdpa(Q, K, V, attn_mask=np.ones((4, 6), bool)), ValueError,
     r"attn_mask: shape \[4, 6\] does not broadcast to the scores' shape \[2, 3, 4, 5\]"),
    ("mask rank", lambda: sdpa(Q, K, V, attn_mask=np.ones((7, 2, 3, 4, 5), bool)), ValueError,
     r"attn_mask: shape \[7, 2, 3, 4, 5\] does not broadcast to the scores' shape \[2, 3, 4, 5\]"),
    ("gqa without heads", lambda: sdpa(f32(4, 8), f32(5, 8), f32(5, 6), enable_gqa=True), ValueError,
     r"enable_gqa needs a head dimension \(-3\) on query, key and value, got query \[4, 8\]"),
    ("gqa heads", lambda: sdpa(Q, f32(2, 2, 5, 8), f32(2, 2, 5, 6), enable_gqa=True), ValueError,
     r"enable_gqa: query heads \(3\) must be a multiple of key heads \(2\) and value heads \(2\)"),
    ("scale type", lambda: sdpa(Q, K, V, scale="big"), TypeError, r"scale: must be None or a float, got str"),
    ("scale not finite", lambda: sdpa(Q, K, V, scale=float("inf")), ValueError,
     r"\[qkv::attention\] opt.scale: must be finite, got inf"),
    ("torch dropout", lambda: qkv.torch.scaled_dot_product_attention(*(torch.zeros(x.shape) for x in (Q, K, V)),
                                                                     dropout_p=-0.5), ValueError,
     r"\[qkv.torch.scaled_dot_product_attention\] dropout_p: must be in \[0, 1\), got -0.5"),
    ("torch non-tensor", lambda: qkv.torch.scaled_dot_product_attention(Q, K, V), TypeError,
     r"query: expected a torch.Tensor, got ndarray"),
    # qkv.attention
    ("attention rank", lambda: att(f32(3, 4, 8), K, V), ValueError,
     r"q, k, v must have rank 4 \[B, H, S, D\] \(rank 3 with cu_seqlens\), got q \[3, 4, 8\], k \[2, 3, 5, 8\]"),
    ("attention heads", lambda: att(Q, f32(2, 2, 5, 8), f32(2, 2, 5, 6)), ValueError,
     r"\[qkv::attention\] k: query heads H = 3 must be a multiple of key/value heads Hkv = 2"),
    ("attention align", lambda: att(Q, K, V, align="middle"), ValueError,
     r"align: must be 'top_left', 'bottom_right' or 'bottom_right_key_lengths', got 'middle'"),
    ("attention kernel", lambda: att(Q, K, V, kernel="fastest"), ValueError,
     r"kernel: must be 'automatic', 'reference', 'flash' or 'flash_decode', got 'fastest'"),
    ("attention window", lambda: att(Q, K, V, window_left=-2), ValueError,
     r"window_left: must be None \(unbounded\) or an int >= 0, got -2"),
    ("attention threads", lambda: att(Q, K, V, num_threads=-1), ValueError,
     r"opt.num_threads: must be ≥ 0, got -1"),
    ("key_lengths dtype", lambda: att(Q, K, V, key_lengths=np.ones(2, np.float32)), TypeError,
     r"key_lengths: dtype must be int32 or int64, got float32 \(shape \[2\]\)"),
    ("key_lengths rank", lambda: att(Q, K, V, key_lengths=np.ones((2, 1), np.int64)), ValueError,
     r"key_lengths: expected rank 1, got shape \[2, 1\]"),
    ("key_lengths shape", lambda: att(Q, K, V, key_lengths=[5, 5, 5]), ValueError,
     r"opt.key_lengths: expected \[B\] = \[2\], got \[3\]"),
    ("key_lengths value", lambda: att(Q, K, V, key_lengths=[5, 6]), ValueError,
     r"opt.key_lengths\[1\] = 6 outside \[0, Skv = 5\]"),
    ("mask does not broadcast", lambda: att(Q, K, V, mask=np.ones((3, 3, 4, 5), bool)), ValueError,
     r"opt.mask: shape \[3, 3, 4, 5\] does not broadcast to \[B, H, Sq, Skv\] = \[2, 3, 4, 5\]"),
    ("mask rank 5", lambda: att(Q, K, V, mask=np.ones((1, 2, 3, 4, 5), bool)), ValueError,
     r"mask: rank must be 1..4, got 5"),
    ("one cu_seqlens", lambda: att(f32(4, 2, 8), f32(4, 2, 8), f32(4, 2, 8), cu_seqlens_q=[0, 4]), ValueError,
     r"cu_seqlens_q and cu_seqlens_k: give both or neither"),
    ("packed rank", lambda: att(Q, K, V, cu_seqlens_q=[0, 4], cu_seqlens_k=[0, 5]), ValueError,
     r"packed q, k, v must have rank 3 \[T, H, D\], got q \[2, 3, 4, 8\]"),
    ("packed with mask", lambda: att(f32(4, 2, 8), f32(4, 2, 8), f32(4, 2, 8), cu_seqlens_q=[0, 4],
                                     cu_seqlens_k=[0, 4], return_pattern=True), ValueError,
     r"mask, key_lengths, return_pattern and return_scores are not available with packed sequences"),
    ("cu_seqlens end", lambda: att(f32(4, 2, 8), f32(4, 2, 8), f32(4, 2, 8), cu_seqlens_q=[0, 3],
                                   cu_seqlens_k=[0, 4]), ValueError,
     r"cu_seqlens_q: must start at 0 and end at the token count 4, got 0 … 3"),
    ("cu_seqlens order", lambda: att(f32(4, 2, 8), f32(4, 2, 8), f32(4, 2, 8), cu_seqlens_q=[0, 3, 2, 4],
                                     cu_seqlens_k=[0, 1, 2, 4]), ValueError,
     r"cu_seqlens_q: must be non-decreasing, but entry 2 < entry 1"),
    ("backward lse dtype", lambda: qkv.attention_backward(Q, K, V, f32(2, 3, 4, 6), f32(2, 3, 4, 6),
                                                          np.zeros((2, 3, 4), np.int16)), TypeError,
     r"\[qkv.attention_backward\] lse: unsupported dtype \(DLPack code 0, 16 bits\)"),
    ("backward lse shape", lambda: qkv.attention_backward(Q, K, V, f32(2, 3, 4, 6), f32(2, 3, 4, 6),
                                                          f32(2, 3, 5)), ValueError,
     r"\[qkv::attention_backward\] lse: expected \[B, H, Sq\] = \[2, 3, 4\], got \[2, 3, 5\]"),
    ("backward dout shape", lambda: qkv.attention_backward(Q, K, V, f32(2, 3, 4, 6), f32(2, 3, 4, 5),
                                                           f32(2, 3, 4)), ValueError,
     r"dout: expected \[B, H, Sq, Dv\] = \[2, 3, 4, 6\], got \[2, 3, 4, 5\]"),
    # process-wide settings
    ("threads", lambda: qkv.set_num_threads(0), ValueError, r"\[qkv::set_num_threads\] n: must be ≥ 1, got 0"),
    ("isa name", lambda: qkv.set_isa("sse9"), ValueError,
     r"isa: must be 'scalar', 'avx2', 'avx512', 'avx512_vnni' or 'avx512_bf16', got 'sse9'"),
]


@pytest.mark.parametrize("name,call,exc,pattern", CASES, ids=[c[0] for c in CASES])
def test_error_message(name, call, exc, pattern):
    with pytest.raises(exc) as info:
        call()
    print(f"{name}: {exc.__name__}: {info.value}")
    assert re.search(pattern, str(info.value)), str(info.value)


def test_errors_leave_no_partial_state():
    # After an error, the next valid call works and the thread setting is unchanged.
    before = qkv.num_threads()
    with pytest.raises(ValueError):
        qkv.set_num_threads(-3)
    assert qkv.num_threads() == before
    assert np.all(np.isfinite(qkv.scaled_dot_product_attention(Q + 1, K + 1, V + 1)))


@pytest.mark.parametrize("shapes", [((2, 3, 4, 8), (2, 3, 5, 7), (2, 3, 5, 6)),      # key's E differs
                                    ((2, 4, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)),      # heads do not broadcast
                                    ((8,), (5, 8), (5, 6))])                         # query of rank 1
def test_numpy_and_torch_entry_points_share_the_shape_rules(shapes):
    """qkv.scaled_dot_product_attention (NumPy) and qkv.torch's (autograd) check an SDPA call's shapes
    in one place (qkv/_plan.py): the same message, only the function's name differs."""
    import qkv.torch

    msgs = []
    for fn, make in ((qkv.scaled_dot_product_attention, f32), (qkv.torch.scaled_dot_product_attention, torch.zeros)):
        with pytest.raises(ValueError) as e:
            fn(*(make(*s) for s in shapes))
        msgs.append(str(e.value))
    assert msgs[0].startswith("[qkv.scaled_dot_product_attention] ")
    assert msgs[0].replace("[qkv.scaled_dot_product_attention]", "[qkv.torch.scaled_dot_product_attention]") == msgs[1]


def test_functional_and_torch_do_not_import_each_other_at_import_time():
    """qkv/torch.py takes its checks from qkv/_plan.py, never from qkv/functional.py (the two imported
    each other's private helpers inside functions before); functional reaches qkv.torch only to route a
    call that records gradients."""
    import ast
    import pathlib

    pkg = pathlib.Path(qkv.__file__).parent
    def imported(name):
        tree = ast.parse((pkg / name).read_text())
        return {(n.module or "") + ":" + a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names}
    assert not [i for i in imported("torch.py") if "functional" in i]
    assert not [i for i in imported("_plan.py") if "functional" in i or i.endswith(":torch")]
