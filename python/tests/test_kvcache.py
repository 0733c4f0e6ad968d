"""KV caches (issue #19 item 6) through qkv.KVCache and qkv.attention_kvcache, against torch:

- the f64 peer: torch's explicit attention (matmul, masked_fill, softmax) over the cache's keys, each
  sequence causal to its own length (FlashAttention's cache_seqlens), on the dequantised values for
  int8 (k_scale · k, the scales as float32) and on q as the int8 decode quantises it on every ISA
  (int8 per row, qkv/attention.hpp), the tolerance then widened by the bound's P·V term (the
  weights' 15-bit fixed point: 64 / 65534 of the largest |v|);
- paged = contiguous bit for bit (the same kernel over the same rows, addressed by the block table).
Tolerance for float32 outputs, FlashAttention's rule: 2x the error of the same explicit formula run
in float32 against float64, plus 2^-20 of the largest output (2 ulps).
"""

import numpy as np
import pytest

import qkv

torch = pytest.importorskip("torch")


def explicit(q, k, v, lens, dtype=torch.float64, causal=True):
    """q [B, H, Sq, D], k [B, Skv, Hkv, D], v [B, Skv, Hkv, Dv]: query i of sequence b sees keys
    j < lens[b] and, when causal, j <= i + lens[b] - Sq."""
    q, k, v = q.to(dtype), k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2)
    B, H, Sq, D = q.shape
    k, v = k.repeat_interleave(H // k.shape[1], 1), v.repeat_interleave(H // v.shape[1], 1)
    s = q @ k.transpose(-1, -2) / D**0.5
    i, j = torch.arange(Sq)[:, None], torch.arange(k.shape[2])[None, :]
    lens = torch.as_tensor(lens)[:, None, None, None]
    s = s.masked_fill(((j > i + lens - Sq) & causal) | (j >= lens), -float("inf"))
    return torch.softmax(s, -1).nan_to_num(0.0) @ v


def int8_contract_q(q):
    """q [.., D] as the int8 decode quantises it (qkv/attention.hpp): q8 = round(q · (127 / max|q|))
    in float32 arithmetic (round half to even, as the kernel), worth q8 · float32(max|q| / 127)."""
    amax = q.float().abs().amax(-1, keepdim=True)
    return torch.round(q.float() * (127 / amax)).double() * (amax / 127).double()


def rule_tol(got, q, k, v, lens):
    want, lowp = explicit(q, k, v, lens), explicit(q, k, v, lens, torch.float32).double()
    return (got.double() - want).abs().max().item(), 2 * (lowp - want).abs().max().item() + 2**-20 * want.abs().max().item()


@pytest.mark.parametrize("block_size", [None, 16, 64])
@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_kvcache_prefill_then_decode(block_size, dtype):
    """Append a 9-token prompt, then 3 single tokens; after each, attend and compare with the peer
    on the keys so far (int8: the dequantised keys the cache holds)."""
    B, H, Hkv, D = 2, 4, 2, 32
    cache = qkv.KVCache(B, 40, Hkv, D, dtype=dtype, block_size=block_size, framework="torch")
    g = torch.Generator().manual_seed(1)
    ks, vs = [], []
    for S in (9, 1, 1, 1):
        kn, vn = torch.randn(B, S, Hkv, D, generator=g), torch.randn(B, S, Hkv, D, generator=g)
        q = torch.randn(B, H, S, D, generator=g)
        cache.append(kn, vn)
        ks.append(kn), vs.append(vn)
        out = cache.attend(q)
        n = int(cache.lengths[0])
        if dtype == "int8":
            # The keys the cache holds: gathered through the table and dequantised (float64 products).
            rows = torch.arange(n)
            if block_size is None:
                blk, r = torch.arange(B)[:, None].expand(B, n), rows[None, :].expand(B, n)
            else:
                blk, r = cache.block_table[:, rows // block_size].long(), (rows % block_size)[None, :].expand(B, n)
            k = cache.k[blk, r].double() * cache.k_scale[blk, r][..., None].double()
            v = cache.v[blk, r].double() * cache.v_scale[blk, r][..., None].double()
            # The quantisation error itself: within half a step, step = max|x| / 127 per (token, head).
            x = torch.cat(ks, 1)
            step = x.abs().amax(-1, keepdim=True) / 127
            assert ((k - x).abs() <= step / 2 * (1 + 1e-5)).all()
            q = int8_contract_q(q)
        else:
            k, v = torch.cat(ks, 1), torch.cat(vs, 1)
        err, tol = rule_tol(out, q, k, v, [n] * B)
        if dtype == "int8":
            tol += 64 / 65534 * v.abs().max().item()
        assert err <= tol, (S, err, tol)


@pytest.mark.parametrize("block_size", [None, 16])
def test_reset_one_sequence_restarts_it_alone(block_size):
    """reset(1) after a 7-token prompt: the next append writes sequence 1 from position 0 while
    sequence 0 goes on; attend sees 10 keys for sequence 0 and 3 for sequence 1 (the peer on those)."""
    B, H, Hkv, D = 2, 4, 2, 16
    cache = qkv.KVCache(B, 32, Hkv, D, block_size=block_size, framework="torch")
    g = torch.Generator().manual_seed(4)
    k1, v1 = torch.randn(B, 7, Hkv, D, generator=g), torch.randn(B, 7, Hkv, D, generator=g)
    cache.append(k1, v1)
    cache.reset(1)
    assert cache.lengths.tolist() == [7, 0]
    k2, v2 = torch.randn(B, 3, Hkv, D, generator=g), torch.randn(B, 3, Hkv, D, generator=g)
    cache.append(k2, v2)
    assert cache.lengths.tolist() == [10, 3]
    q = torch.randn(B, H, 2, D, generator=g)
    k = torch.zeros(B, 10, Hkv, D)
    v = torch.zeros(B, 10, Hkv, D)
    k[0], v[0] = torch.cat([k1[0], k2[0]]), torch.cat([v1[0], v2[0]])
    k[1, :3], v[1, :3] = k2[1], v2[1]
    err, tol = rule_tol(cache.attend(q), q, k, v, [10, 3])
    assert err <= tol, (err, tol)
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]
    with pytest.raises(ValueError, match=r"\[qkv.KVCache.reset\] seq: must be None or an int in \[0, batch = 2\), got 2"):
        cache.reset(2)


def test_paged_equals_contiguous_bit_for_bit_with_ragged_lengths():
    B, H, Hkv, D, bs, nblk = 3, 8, 2, 64, 16, 12
    g = torch.Generator().manual_seed(2)
    k, v = torch.randn(B, bs * nblk, Hkv, D, generator=g), torch.randn(B, bs * nblk, Hkv, D, generator=g)
    q = torch.randn(B, H, 2, D, generator=g)
    lens = torch.tensor([190, 17, 64], dtype=torch.int32)
    perm = torch.randperm(B * nblk, generator=g)
    table = perm.reshape(B, nblk).int()
    pool_k, pool_v = torch.full((B * nblk, bs, Hkv, D), float("nan")), torch.full((B * nblk, bs, Hkv, D), float("nan"))
    for b in range(B):
        for i in range(nblk):
            if i * bs < lens[b]:  # only the blocks holding keys are filled: the rest stay NaN, unread
                pool_k[table[b, i]] = k[b, i * bs:(i + 1) * bs]
                pool_v[table[b, i]] = v[b, i * bs:(i + 1) * bs]
    a = qkv.attention_kvcache(q, k, v, cache_seqlens=lens, causal=True, kernel="flash_decode", return_lse=True)
    p = qkv.attention_kvcache(q, pool_k, pool_v, cache_seqlens=lens, block_table=table, causal=True, return_lse=True)
    assert p.kernel.kernel == "flash_decode"
    assert torch.equal(a.out, p.out) and torch.equal(a.lse, p.lse)
    err, tol = rule_tol(p.out, q, k, v, lens)
    assert err <= tol


def test_bfloat16_queries_on_int8_cache():
    """bf16 queries against an int8 cache: the f64 reference on the bf16 query values, within
    qkv/attention.hpp's int8 bound ((e^{2Δ} - 1) V + 64 / 65534 V, Δ = scale · max|q| / 254 ·
    max_j ||k_j||_1, V = max |v|, over the dequantised cache) plus 2^-8 of the largest output
    (bf16 output rounding, with slack)."""
    B, H, Hkv, D = 1, 4, 1, 64
    cache = qkv.KVCache(B, 300, Hkv, D, dtype="int8", block_size=32, framework="torch")
    g = torch.Generator().manual_seed(3)
    cache.append(torch.randn(B, 300, Hkv, D, generator=g), torch.randn(B, 300, Hkv, D, generator=g))
    q = torch.randn(B, H, 1, D, generator=g).bfloat16()
    out = cache.attend(q)
    assert out.dtype == torch.bfloat16
    ref = cache.attend(q.float(), kernel="reference")  # the f64 reference on the dequantised cache
    k = cache.k.double() * cache.k_scale.double()[..., None]
    v = cache.v.double() * cache.v_scale.double()[..., None]
    delta = D**-0.5 * q.double().abs().max().item() / 254 * (1 + 2**-14) * k.abs().sum(-1).max().item()
    bound = (np.expm1(2 * delta) + 64 / 65534) * v.abs().max().item()
    assert (out.float() - ref).abs().max() <= 2**-8 * ref.abs().max() + bound


def test_numpy_cache_and_errors():
    cache = qkv.KVCache(1, 32, 1, 8)  # NumPy, float32, contiguous
    x = np.ones((1, 4, 1, 8), np.float32)
    cache.append(x, 2 * x)
    out = cache.attend(np.ones((1, 2, 1, 8), np.float32))
    np.testing.assert_allclose(out, 2.0, rtol=0, atol=1e-6)  # all values are 2: any softmax gives 2
    with pytest.raises(ValueError, match=r"\[qkv.KVCache\] block_size: must be None or a power of two, got 12"):
        qkv.KVCache(1, 32, 1, 8, block_size=12)
    with pytest.raises(ValueError, match=r"\[qkv::kvcache_append\] pos\[0\] = 4: rows \[pos, pos \+ 29\) must lie in"):
        cache.append(np.ones((1, 29, 1, 8), np.float32), np.ones((1, 29, 1, 8), np.float32))
    k = np.zeros((2, 16, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"cache.block_table\[0, 1\] = 7 outside the pool \[0, Bc = 2\)"):
        qkv.attention_kvcache(np.zeros((1, 1, 1, 8), np.float32), k, k, block_table=np.array([[0, 7]], np.int32))


onnx = pytest.importorskip("onnx")


@pytest.mark.parametrize("causal", [False, True])
def test_past_present_against_onnx_reference(causal):
    """ONNX Attention (opset 24) with past_key / past_value: Y and present_key equal KVCache's
    append(past), append(new), attend(q) (float64 peer, float32 qkv: the FlashAttention rule)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    B, H, Hkv, D, P, S = 2, 4, 2, 16, 11, 3
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal(s) for s in [(B, H, S, D), (B, Hkv, S, D), (B, Hkv, S, D)])
    pk, pv = rng.standard_normal((B, Hkv, P, D)), rng.standard_normal((B, Hkv, P, D))
    names = ["Q", "K", "V", "", "past_key", "past_value"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in names if n]
    outs = [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in ("Y", "present_key")]
    node = helper.make_node("Attention", names, ["Y", "present_key"], is_causal=int(causal))
    model = helper.make_model(helper.make_graph([node], "g", inputs, outs), opset_imports=[helper.make_opsetid("", 24)])
    y, present = ReferenceEvaluator(model).run(None, {"Q": q, "K": k, "V": v, "past_key": pk, "past_value": pv})
    for block_size in (None, 16):
        cache = qkv.KVCache(B, 32, Hkv, D, block_size=block_size)
        cache.append(pk.transpose(0, 2, 1, 3).astype(np.float32), pv.transpose(0, 2, 1, 3).astype(np.float32))
        cache.append(k.transpose(0, 2, 1, 3).astype(np.float32), v.transpose(0, 2, 1, 3).astype(np.float32))
        out = cache.attend(q.astype(np.float32), causal=causal)
        rows = (cache.k if block_size is None else cache.k.reshape(B, 32, Hkv, D))[:, :P + S]  # blocks in order
        np.testing.assert_array_equal(rows.transpose(0, 2, 1, 3), present.astype(np.float32))
        t = [torch.from_numpy(x) for x in (q, np.concatenate([pk, k], 2).transpose(0, 2, 1, 3),
                                          np.concatenate([pv, v], 2).transpose(0, 2, 1, 3))]
        want = explicit(*t, [P + S] * B, causal=causal)
        lowp = explicit(*[x.float() for x in t], [P + S] * B, torch.float32, causal).double()
        assert np.abs(y - want.numpy()).max() < 1e-12  # the peer and the explicit formula agree
        tol = 2 * (lowp - want).abs().max().item() + 2**-20 * np.abs(y).max()
        assert np.abs(out - y).max() <= tol


def test_streaming_llm_cache_reads_only_kept_keys_and_window():
    """StreamingLLM on a paged cache: keep_first = 4 attention-sink tokens and a window of 100. The
    blocks wholly between them (whole 64-key tiles of the decode kernel) hold NaN: the output is
    finite, so they were not read, and equals the explicit float64 rule (torch peer, the FlashAttention
    rule) on the same keys."""
    B, H, Hkv, D, bs, n, keep, window = 2, 4, 2, 32, 16, 1000, 4, 100
    cache = qkv.KVCache(B, n, Hkv, D, block_size=bs, framework="torch")
    g = torch.Generator().manual_seed(7)
    k, v = torch.randn(B, n, Hkv, D, generator=g), torch.randn(B, n, Hkv, D, generator=g)
    cache.append(k, v)
    for b in range(B):  # keys [64, 832): tiles no row reads (kept keys end in tile 0, the window starts at 899)
        for blk in range(64 // bs, 832 // bs):
            cache.k[cache.block_table[b, blk]] = float("nan")
            cache.v[cache.block_table[b, blk]] = float("nan")
    q = torch.randn(B, H, 1, D, generator=g)
    out = cache.attend(q, window_left=window, keep_first=keep)
    assert torch.isfinite(out).all()
    kk, vv = k.double().transpose(1, 2).repeat_interleave(H // Hkv, 1), v.double().transpose(1, 2).repeat_interleave(H // Hkv, 1)
    j = torch.arange(n)
    allowed = (j >= n - 1 - window) | (j < keep)

    def peer(dtype):
        s = (q.to(dtype) @ kk.to(dtype).transpose(-1, -2)) / D**0.5
        return torch.softmax(s.masked_fill(~allowed, -float("inf")), -1) @ vv.to(dtype)

    want, lowp = peer(torch.float64), peer(torch.float32).double()
    tol = 2 * (lowp - want).abs().max().item() + 2**-20 * want.abs().max().item()
    assert (out.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("block_size", [None, 32])
def test_float16_cache_against_explicit(block_size):
    """A float16 cache: append rounds K and V to float16 (as torch's .half()), attend widens them
    exactly; against the explicit float64 formula on those float16 values (FlashAttention's rule)."""
    B, H, Hkv, D = 2, 4, 2, 64
    cache = qkv.KVCache(B, 200, Hkv, D, dtype="float16", block_size=block_size, framework="torch")
    g = torch.Generator().manual_seed(11)
    k, v = torch.randn(B, 150, Hkv, D, generator=g), torch.randn(B, 150, Hkv, D, generator=g)
    cache.append(k, v)
    assert cache.k.dtype == torch.float16
    q = torch.randn(B, H, 3, D, generator=g)
    out = cache.attend(q)
    err, tol = rule_tol(out, q, k.half().float(), v.half().float(), [150] * B)
    assert err <= tol, (err, tol)
    with pytest.raises(ValueError, match=r"dtype: must be 'float32', 'bfloat16', 'float16' or 'int8', got 'int4'"):
        qkv.KVCache(1, 8, 1, 8, dtype="int4")
