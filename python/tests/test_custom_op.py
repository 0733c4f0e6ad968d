"""qkv's attention as a torch custom op: opcheck on a sweep of shapes, torch.compile(fullgraph=True).

torch.library.opcheck runs the op's schema, fake (meta) kernel, autograd registration and
dynamo-tracing checks against the real kernel; tolerances there are torch's own (exact bits for
the fake/real comparison of shapes and strides). The compiled model is compared with the same
model run eagerly: the same kernels on the same data, so the outputs must be bitwise equal.
"""

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
import qkv.torch  # noqa: E402

op = torch.ops.qkv.attention.default

# (B, H, Hkv, L, S, E, Ev, options): GQA, L != S, single-token decode, odd and prime sizes.
SWEEP = [
    (1, 2, 2, 4, 4, 8, 8, dict(causal=True)),
    (2, 4, 2, 7, 9, 16, 8, {}),
    (2, 6, 3, 1, 13, 32, 32, dict(causal=True, align="bottom_right")),
    (1, 3, 1, 11, 5, 7, 5, dict(window_left=2, window_right=1)),
    (3, 2, 2, 5, 5, 4, 4, dict(mask="float")),
    (2, 2, 1, 6, 8, 8, 8, dict(mask="bool", key_lengths=True)),
    (2, 4, 2, 9, 70, 16, 8, dict(causal=True, dropout=0.3)),
    (1, 2, 2, 5, 6, 8, 8, dict(mask="float", dropout=0.5)),
]


def _args(B, H, Hkv, L, S, E, Ev, opts, dtype, requires_grad):
    g = torch.Generator().manual_seed(B * 100 + L * 10 + S)
    q = torch.randn(B, H, L, E, generator=g, dtype=dtype, requires_grad=requires_grad)
    k = torch.randn(B, Hkv, S, E, generator=g, dtype=dtype, requires_grad=requires_grad)
    v = torch.randn(B, Hkv, S, Ev, generator=g, dtype=dtype, requires_grad=requires_grad)
    mask = None
    if opts.get("mask") == "float":
        mask = torch.randn(B, H, L, S, generator=g, dtype=dtype, requires_grad=requires_grad)
    elif opts.get("mask") == "bool":
        mask = torch.rand(B, 1, L, S, generator=g) < 0.7
        mask[..., 0] = True
        mask = mask.expand(B, H, L, S)
    kl = torch.tensor([max(S - b, 1) for b in range(B)]) if opts.get("key_lengths") else None
    wl, wr = opts.get("window_left", -1), opts.get("window_right", -1)
    p = opts.get("dropout", 0.0)
    seed = torch.tensor(12345 + B, dtype=torch.int64) if p else None
    return (q, k, v, mask, kl, opts.get("scale"), opts.get("causal", False), opts.get("align", "top_left"), wl, wr, p,
            seed)


@pytest.mark.parametrize("shape", SWEEP, ids=lambda s: "x".join(map(str, s[:7])) + "," + ",".join(map(str, s[7])))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck(shape, dtype, requires_grad):
    torch.library.opcheck(op, _args(*shape, dtype, requires_grad))


def test_sdpa_goes_through_the_op():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with torch.profiler.profile() as prof:
        qkv.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert "qkv::attention" in {e.key for e in prof.key_averages()}


class _Block(torch.nn.Module):
    """A causal self-attention block calling qkv.torch's SDPA (GQA: 4 query heads on 2)."""

    def __init__(self, sdpa):
        super().__init__()
        torch.manual_seed(3)
        self.q = torch.nn.Linear(32, 32)
        self.kv = torch.nn.Linear(32, 32)
        self.o = torch.nn.Linear(32, 32)
        self.sdpa = sdpa

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, 4, 8).transpose(1, 2)
        k, v = (t.view(B, S, 2, 8).transpose(1, 2) for t in self.kv(x).chunk(2, -1))
        y = self.sdpa(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(B, S, 32))


def test_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    m = _Block(qkv.torch.scaled_dot_product_attention)
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(4))
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    compiled = torch.compile(m, fullgraph=True)
    out_c = compiled(x)
    out_c.sum().backward()
    grads_c = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    out_e = m(x)
    out_e.sum().backward()
    # The attention is the same kernel in both; the projections may be fused differently by
    # inductor, so the comparison is float32 rounding of O(1) values (1e-5), not bitwise.
    torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    for gc, p in zip(grads_c, m.parameters()):
        torch.testing.assert_close(gc, p.grad, rtol=1e-4, atol=1e-5)
    # And qkv's compiled block equals torch's SDPA in the same block (float32 rounding).
    ref = _Block(F.scaled_dot_product_attention)
    torch.testing.assert_close(out_c, ref(x), rtol=1e-4, atol=1e-5)


# Packed sequences (lengths 0, 1, odd; GQA), with and without dropout, through qkv::attention_varlen.
@pytest.mark.parametrize("dropout", [0.0, 0.3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_varlen(dropout, dtype):
    g = torch.Generator().manual_seed(5)
    cq = torch.tensor([0, 3, 3, 4, 11], dtype=torch.int32)
    ck = torch.tensor([0, 5, 7, 8, 17], dtype=torch.int64)
    q = torch.randn(11, 4, 8, generator=g, dtype=dtype, requires_grad=True)
    k = torch.randn(17, 2, 8, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(17, 2, 6, generator=g, dtype=dtype, requires_grad=True)
    seed = torch.tensor(9, dtype=torch.int64) if dropout else None
    torch.library.opcheck(torch.ops.qkv.attention_varlen.default,
                          (q, k, v, cq, ck, None, True, "bottom_right", -1, -1, dropout, seed))


def test_varlen_compiles_fullgraph_and_equals_eager():
    g = torch.Generator().manual_seed(6)
    cq = torch.tensor([0, 5, 12], dtype=torch.int32)
    q = torch.randn(12, 4, 16, generator=g, requires_grad=True)
    k = torch.randn(12, 2, 16, generator=g, requires_grad=True)
    v = torch.randn(12, 2, 16, generator=g, requires_grad=True)

    def f(q, k, v):
        return qkv.torch.attention_varlen(q, k, v, cq, cq, causal=True)

    out = torch.compile(f, fullgraph=True)(q, k, v)
    out.sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = f(q, k, v)
    want.sum().backward()
    # The same kernels on the same data: bitwise equal.
    assert torch.equal(out, want)
    assert all(torch.equal(a, x.grad) for a, x in zip(grads, (q, k, v)))
