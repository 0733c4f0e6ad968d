"""Attention dropout through every Python entry point, against independent values.

The oracle is the formula of include/qkv/attention.hpp written with NumPy / torch ops on an
explicitly materialised mask (qkv.dropout_mask): out = (softmax(S) ∘ keep / (1 − p)) · V, and its
gradients by torch autograd through those same ops. The mask itself is checked by the C++ suite
(tests/kernels/test_dropout.cpp: every kernel's decisions equal the reference's, keep rate within
a binomial bound); here: that every entry point applies that mask, with the seed it documents.
"""

import numpy as np
import pytest

import qkv
from conftest import reference_attention

torch = pytest.importorskip("torch")
import qkv.torch  # noqa: E402


def explicit(q, k, v, keep, p, *, causal=False, scale=None, mask=None):
    """torch ops on [B, H, L, E] tensors (GQA by repeat): (softmax(S) ∘ keep / (1 − p)) · V."""
    H, Hkv = q.shape[1], k.shape[1]
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s + mask
    w = torch.where(torch.as_tensor(keep), torch.softmax(s, -1) / (1 - p), 0.0)
    return w @ v


def randn(*shape, dtype=torch.float64, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(grad)


# ---------------------------------------------------------------------------------------------
# qkv.attention / attention_backward (NumPy, explicit seed)

@pytest.mark.parametrize("kernel", ["reference", "flash"])
def test_attention_applies_the_mask_of_dropout_mask(kernel):
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 9, 16), (2, 2, 70, 16), (2, 2, 70, 8)))
    dtype = np.float64 if kernel == "reference" else np.float32
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    p, seed, offset = 0.3, 2**64 - 5, 7   # the whole u64 range is accepted
    r = qkv.attention(q, k, v, causal=True, dropout_p=p, seed=seed, offset=offset, return_lse=True, kernel=kernel)
    out0, lse0, pat0 = reference_attention(q, k, v, causal=True)
    keep = qkv.dropout_mask((2, 4, 9, 70), p, seed, offset)
    want = np.einsum("bhij,bhjd->bhid", np.where(keep, pat0 / (1 - p), 0.0), np.repeat(v.astype(np.float64), 2, 1))
    # f64: the same sums in another order (1e-12); f32: rounding of a few-unit output (FlashAttention
    # rule's floor 1e-6, times 1/(1 − p) for the larger weights, with margin): 1e-5.
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(r.out, want, rtol=0, atol=tol)
    np.testing.assert_allclose(r.lse, lse0, rtol=0, atol=tol)   # lse: the softmax's, before dropout
    assert 0.6 < keep.mean() < 0.8


def test_return_pattern_gives_the_dropped_rescaled_weights():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 5, 4)) for _ in range(3))
    r = qkv.attention(q, k, v, dropout_p=0.5, seed=3, return_pattern=True)
    _, _, pat0 = reference_attention(q, k, v)
    keep = qkv.dropout_mask((1, 2, 5, 5), 0.5, 3)
    np.testing.assert_allclose(r.pattern, np.where(keep, 2 * pat0, 0.0), rtol=0, atol=1e-15)
    np.testing.assert_allclose(r.out, r.pattern @ v, rtol=0, atol=1e-14)   # the weights that multiplied V


def test_backward_matches_torch_autograd_on_the_explicit_mask():
    q, k, v = randn(2, 4, 7, 8, seed=1, grad=True), randn(2, 2, 11, 8, seed=2, grad=True), randn(2, 2, 11, 5, seed=3, grad=True)
    dout = randn(2, 4, 7, 5, seed=4)
    p, seed = 0.25, 99
    keep = torch.from_numpy(qkv.dropout_mask((2, 4, 7, 11), p, seed))
    explicit(q, k, v, keep, p, causal=True).backward(dout)
    for kern in ("reference", "flash"):
        dt = torch.float64 if kern == "reference" else torch.float32
        a = [x.detach().to(dt) for x in (q, k, v)]
        f = qkv.attention(*a, causal=True, dropout_p=p, seed=seed, return_lse=True, kernel=kern)
        g = qkv.attention_backward(*a, f.out, dout.to(dt), f.lse.float(), causal=True, dropout_p=p, seed=seed,
                                   kernel=kern)
        # f64: 1e-12 (sums reordered); f32: sums of ~10 terms of size ~1, 1e-5.
        tol = 1e-12 if kern == "reference" else 1e-5
        for got, x in zip((g.dq, g.dk, g.dv), (q, k, v)):
            torch.testing.assert_close(got.double(), x.grad, rtol=0, atol=tol)


def test_same_seed_same_bits_other_seed_other_mask_p0_is_no_dropout():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 2, 40, 16)).astype(np.float32) for _ in range(3))
    a = qkv.attention(q, k, v, dropout_p=0.2, seed=5).out
    assert np.array_equal(a, qkv.attention(q, k, v, dropout_p=0.2, seed=5).out)
    assert not np.array_equal(a, qkv.attention(q, k, v, dropout_p=0.2, seed=6).out)
    assert not np.array_equal(a, qkv.attention(q, k, v, dropout_p=0.2, seed=5, offset=1).out)
    plain = qkv.attention(q, k, v).out
    assert np.array_equal(plain, qkv.attention(q, k, v, dropout_p=0.0, seed=5).out)   # bit for bit
    assert np.array_equal(plain, qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.0))


def test_varlen_sequence_b_uses_batch_index_b():
    lens_q, lens_k = [3, 8, 5], [6, 8, 9]
    cu_q, cu_k = np.cumsum([0] + lens_q), np.cumsum([0] + lens_k)
    q, k, v = randn(cu_q[-1], 2, 8, seed=5, grad=True), randn(cu_k[-1], 1, 8, seed=6, grad=True), randn(cu_k[-1], 1, 4, seed=7, grad=True)
    p, seed = 0.4, 2024
    keep = torch.from_numpy(qkv.dropout_mask((3, 2, max(lens_q), max(lens_k)), p, seed))
    outs = []
    for b in range(3):
        sl_q, sl_k = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o = explicit(q[sl_q].transpose(0, 1)[None], k[sl_k].transpose(0, 1)[None], v[sl_k].transpose(0, 1)[None],
                     keep[b:b + 1, :, :lens_q[b], :lens_k[b]], p)
        outs.append(o[0].transpose(0, 1))
    want = torch.cat(outs)
    dout = randn(*want.shape, seed=8)
    want.backward(dout)
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    got = qkv.torch.attention_varlen(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), dropout_p=p, seed=seed)
    got.backward(dout)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)   # f64: reordered sums
    for x, g in zip((q, k, v), grads):
        torch.testing.assert_close(x.grad, g, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# qkv.torch: seeds from torch's generator, gradients, custom op, compile

def test_torch_sdpa_draws_its_seed_from_torchs_default_generator():
    q, k, v = randn(2, 3, 6, 8, seed=9), randn(2, 3, 10, 8, seed=10), randn(2, 3, 10, 4, seed=11)
    torch.manual_seed(0)
    a = qkv.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    torch.manual_seed(0)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))   # the documented draw
    keep = qkv.dropout_mask((2, 3, 6, 10), 0.3, seed)
    torch.testing.assert_close(a, explicit(q, k, v, keep, 0.3), rtol=0, atol=1e-12)
    torch.manual_seed(0)
    assert torch.equal(a, qkv.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.3))   # reproducible
    assert not torch.equal(a, qkv.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.3))  # next draw
    # The NumPy-or-torch entry point takes the same draw for torch tensors.
    torch.manual_seed(0)
    assert torch.equal(a, qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.3))
    # p = 0 draws nothing.
    state = torch.get_rng_state()
    qkv.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.0)
    assert torch.equal(state, torch.get_rng_state())


def test_numpy_sdpa_draws_from_numpys_global_generator():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 4, 8)) for _ in range(3))
    np.random.seed(1)
    a = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    np.random.seed(1)
    seed = int(np.random.randint(0, 2**63 - 1, dtype=np.int64))
    keep = qkv.dropout_mask((1, 2, 4, 4), 0.5, seed)
    _, _, pat0 = reference_attention(q, k, v)
    np.testing.assert_allclose(a, np.where(keep, 2 * pat0, 0.0) @ v, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_torch_attention_gradients_with_generator_and_float_mask(dtype):
    g = torch.Generator().manual_seed(77)
    q, k, v = randn(1, 4, 9, 16, seed=12), randn(1, 2, 13, 16, seed=13), randn(1, 2, 13, 8, seed=14)
    m = randn(1, 4, 9, 13, seed=15)
    dout = randn(1, 4, 9, 8, seed=16)
    args = [x.to(dtype).requires_grad_() for x in (q, k, v, m)]
    out, _ = qkv.torch.attention(*args[:3], mask=args[3], dropout_p=0.2, generator=g)
    out.backward(dout.to(dtype))
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64, generator=torch.Generator().manual_seed(77)))
    keep = qkv.dropout_mask((1, 4, 9, 13), 0.2, seed)
    ref = [x.detach().double().requires_grad_() for x in args]   # the same (rounded) inputs, f64
    want = explicit(*ref[:3], keep, 0.2, mask=ref[3])
    want.backward(dout.to(dtype).double())
    # f64: reordered sums, 1e-12. f32: FlashAttention rule's floor scaled by 1/(1 − p), with margin
    # for sums of ~13 terms: 1e-5. bf16: outputs and gradients rounded to 8 bits at |x| ≲ 4: 2^-5.
    tol = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2**-5}[dtype]
    torch.testing.assert_close(out.double(), want, rtol=0, atol=tol)
    for a, r in zip(args, ref):
        torch.testing.assert_close(a.grad.double(), r.grad, rtol=0, atol=tol * 4)


def test_unbiased_mean_over_seeds():
    """E[out] = the output without dropout. Per element, one seed's deviation has variance
    σ² = Σ_j p_ij² v_j² · p / (1 − p); the mean of N seeds stays within 5 σ / √N (chance < 6e-7
    per element; fixed seeds make the test deterministic)."""
    q, k, v = randn(1, 2, 4, 8, seed=17) * 0.5, randn(1, 2, 12, 8, seed=18) * 0.5, randn(1, 2, 12, 3, seed=19)
    p, N = 0.4, 3000
    g = torch.Generator().manual_seed(5)
    mean = sum(qkv.torch.attention(q, k, v, dropout_p=p, generator=g)[0] for _ in range(N)) / N
    out0, _, pat = reference_attention(q.numpy(), k.numpy(), v.numpy())
    var = np.einsum("bhij,bhjd->bhid", pat ** 2, v.numpy() ** 2) * p / (1 - p)
    assert np.all(np.abs(mean.numpy() - out0) <= 5 * np.sqrt(var / N) + 1e-12)


def test_custom_op_and_compile_with_dropout():
    q, k, v = randn(1, 2, 8, 16, dtype=torch.float32, seed=20), randn(1, 2, 8, 16, dtype=torch.float32, seed=21), \
        randn(1, 2, 8, 16, dtype=torch.float32, seed=22)
    seed = torch.tensor(31, dtype=torch.int64)
    torch.library.opcheck(torch.ops.qkv.attention.default,
                          (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), None, None, None, True,
                           "top_left", -1, -1, 0.3, seed))

    def f(q, k, v):
        return qkv.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.3, is_causal=True)

    compiled = torch.compile(f, fullgraph=True)
    out = compiled(q, k, v)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    assert not torch.equal(out, qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_flash_attn_func_dropout_and_gradients():
    q, k, v = randn(2, 7, 4, 8, seed=23, grad=True), randn(2, 9, 2, 8, seed=24, grad=True), randn(2, 9, 2, 8, seed=25, grad=True)
    torch.manual_seed(3)
    out, lse, none = qkv.flash_attn_func(q, k, v, dropout_p=0.2, causal=True, return_attn_probs=True)
    dout = randn(*out.shape, seed=26)
    out.backward(dout)
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))
    keep = torch.from_numpy(qkv.dropout_mask((2, 4, 7, 9), 0.2, seed))
    ref = [x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    # bottom-right causal for 7 queries on 9 keys: query i sees keys j <= i + 2
    m = torch.where(torch.ones(7, 9, dtype=torch.bool).triu(3), float("-inf"), 0.0).double()
    want = explicit(*ref, keep, 0.2, mask=m).transpose(1, 2)
    want.backward(dout)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)   # f64: reordered sums
    for x, r in zip((q, k, v), ref):
        torch.testing.assert_close(x.grad, r.grad.transpose(1, 2), rtol=0, atol=1e-12)
    cu = torch.tensor([0, 7, 14], dtype=torch.int32)
    o2 = qkv.flash_attn_varlen_func(q.detach().reshape(14, 4, 8), k.detach()[:, :7].reshape(14, 2, 8),
                                    v.detach()[:, :7].reshape(14, 2, 8), cu, cu, 7, 7, dropout_p=0.2)
    assert o2.shape == (14, 4, 8) and torch.isfinite(o2).all()
    assert none is None and lse.shape == (2, 4, 7)


# ---------------------------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("call,exc,msg", [
    (lambda x: qkv.attention(x, x, x, dropout_p=1.0, seed=1), ValueError,
     r"\[qkv.attention\] dropout_p: must be in \[0, 1\), got 1.0"),
    (lambda x: qkv.attention(x, x, x, dropout_p=-0.5, seed=1), ValueError, r"dropout_p: must be in \[0, 1\), got -0.5"),
    (lambda x: qkv.attention(x, x, x, dropout_p="a", seed=1), TypeError, r"dropout_p: must be a float in \[0, 1\), got str"),
    (lambda x: qkv.attention(x, x, x, dropout_p=0.1), ValueError,
     r"\[qkv.attention\] seed: required with dropout_p = 0.1"),
    (lambda x: qkv.attention(x, x, x, dropout_p=0.1, seed=-1), ValueError,
     r"\[qkv.attention\] seed: must be an int in \[0, 2\*\*64\), got -1"),
    (lambda x: qkv.attention_backward(x, x, x, x, x, x[..., 0], dropout_p=0.1), ValueError,
     r"\[qkv.attention_backward\] seed: required"),
    (lambda x: qkv.scaled_dot_product_attention(x, x, x, dropout_p=1.5), ValueError,
     r"\[qkv.scaled_dot_product_attention\] dropout_p: must be in \[0, 1\), got 1.5"),
    (lambda x: qkv.torch.scaled_dot_product_attention(torch.from_numpy(x), torch.from_numpy(x), torch.from_numpy(x),
                                                      dropout_p=1.0), ValueError,
     r"\[qkv.torch.scaled_dot_product_attention\] dropout_p: must be in \[0, 1\), got 1.0"),
    (lambda x: qkv.torch.attention(*(torch.from_numpy(x),) * 3, dropout_p=0.1, seed=2**63), ValueError,
     r"\[qkv.torch.attention\] seed: must be an int in \[0, 2\*\*63\)"),
    (lambda x: qkv.dropout_mask((1, 2, 3), 0.1, 0), ValueError, r"\[qkv.dropout_mask\] shape: expected \[B, H, Sq, Skv\]"),
])
def test_dropout_errors_name_function_and_argument(call, exc, msg):
    x = np.zeros((1, 1, 3, 4), np.float32)
    with pytest.raises(exc, match=msg):
        call(x)
