"""qkv.KVCache is a view of the C++ qkv::AttentionKvCache (include/qkv/kv_cache.hpp): its k, v,
k_scale, v_scale, block_table and lengths are the C++ storage, no copies, and hold exactly the bits
the storage contract gives. The oracle is the contract written in NumPy:

- float32 rows as given; bfloat16 and float16 rows rounded to nearest-even from float32
  (ml_dtypes / NumPy casts);
- int8: per (token, head) scale = float32(max|x| / 127) (1 for an all-zero row),
  q = clip(rint(x / scale), -127, 127), the division in float64 as 1 / scale then a product;
- sequence b's token j in row j of k[b] (contiguous) or in row j % block_size of block
  block_table[b, j // block_size] (paged, blocks handed out in order); rows no append wrote stay
  zero (reset keeps the rows, the next append writes over them).
Comparisons are exact (bit for bit): the cache stores, it does not compute.
"""

import ml_dtypes
import numpy as np
import pytest

import qkv

NP_DTYPE = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "int8": np.int8}


def quantise(x):
    """x float32 [.., D] -> (int8 [.., D], float32 scale [..]) as the contract above."""
    amax = np.abs(x.astype(np.float64)).max(-1)
    scale = np.where(amax > 0, (amax / 127).astype(np.float32), np.float32(1))
    inv = 1.0 / scale.astype(np.float64)
    return np.clip(np.rint(x.astype(np.float64) * inv[..., None]), -127, 127).astype(np.int8), scale


def expected_rows(dtype, x):
    """The stored form of float32 rows x [.., D] and their scales (None unless int8)."""
    if dtype == "int8":
        return quantise(x)
    return x.astype(NP_DTYPE[dtype]), None


def logical(cache, t):
    """Storage t [Bc, Sc, ...] as [batch, capacity, ...] in token order (paged: through block_table)."""
    if cache.block_size is None:
        return t
    return np.stack([np.concatenate([t[blk] for blk in cache.block_table[b]]) for b in range(cache.batch)])


@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int8"])
def test_storage_bits_equal_the_contract(dtype, block_size):
    """A 21-token prompt, reset(1), then 2 appends of 3 and 1: sequence 0 holds 25 tokens,
    sequence 1 holds 4 (written from row 0 over its old rows, the rest of which stay as they were)."""
    B, Hkv, D, Dv, max_len = 2, 3, 8, 5, 40
    rng = np.random.default_rng(19)
    cache = qkv.KVCache(B, max_len, Hkv, D, value_dim=Dv, dtype=dtype, block_size=block_size)
    assert cache.k.dtype == NP_DTYPE[dtype] and cache.v.dtype == NP_DTYPE[dtype]
    assert (cache.k_scale is None) == (dtype != "int8") and (cache.block_table is None) == (block_size is None)
    want_k = np.zeros((B, 48 if block_size else max_len, Hkv, D), np.float32)  # paged: 3 whole blocks
    want_v = np.zeros((B, want_k.shape[1], Hkv, Dv), np.float32)
    lens, written = [0, 0], [0, 0]  # tokens held; rows ever written (reset keeps the rows)
    for step, S in enumerate((21, 3, 1)):
        kn = rng.standard_normal((B, S, Hkv, D)).astype(np.float32) * 4
        vn = rng.standard_normal((B, S, Hkv, Dv)).astype(np.float32)
        if step == 1:
            kn[0, 0, 1] = 0  # an all-zero (token, head) row: int8 scale 1
        cache.append(kn, vn)
        for b in range(B):
            want_k[b, lens[b]:lens[b] + S], want_v[b, lens[b]:lens[b] + S] = kn[b], vn[b]
            lens[b] += S
            written[b] = max(written[b], lens[b])
        if step == 0:
            cache.reset(1)
            lens[1] = 0
    assert cache.lengths.tolist() == lens == [25, 4] and cache.lengths.dtype == np.int64
    never = np.arange(want_k.shape[1])[None, :] >= np.array(written)[:, None]  # [B, capacity]
    for got, got_scale, want in ((cache.k, cache.k_scale, want_k), (cache.v, cache.v_scale, want_v)):
        rows, scale = expected_rows(dtype, want)
        np.testing.assert_array_equal(logical(cache, got).view(np.uint8), rows.view(np.uint8))
        if scale is not None:
            scale[never] = 0  # the zeroed storage: no append wrote these rows' scales
            np.testing.assert_array_equal(logical(cache, got_scale).view(np.uint32), scale.view(np.uint32))


def test_attributes_are_the_native_storage():
    """No copies: the attributes are the C++ cache's memory (the same addresses as a fresh look at
    it), writable, and they keep the cache alive after the KVCache object is gone."""
    torch = pytest.importorskip("torch")
    cache = qkv.KVCache(2, 20, 1, 4, dtype="bfloat16", block_size=16, framework="torch")
    assert cache.max_len == 32  # paged: 20 rounded up to whole blocks
    native = cache._cache.storage()
    for name in ("k", "v", "block_table"):
        assert getattr(cache, name).data_ptr() == native[name].ctypes.data, name
    assert cache.k.dtype == torch.bfloat16 and cache.block_table.dtype == torch.int32
    assert cache.block_table.tolist() == [[0, 1], [2, 3]]
    assert np.shares_memory(cache.lengths, native["lengths"])
    x = torch.full((2, 32, 1, 4), 1.5)
    cache.append(x, x)  # 32 = max_len after rounding: accepted
    assert cache.lengths.tolist() == [32, 32]
    with pytest.raises(ValueError, match=r"\[qkv::kvcache_append\] pos\[0\] = 32: rows \[pos, pos \+ 1\) must lie in"):
        cache.append(x[:, :1], x[:, :1])
    cache.lengths[1] = 3  # the lengths are the cache's: attend sees 3 keys for sequence 1
    assert cache._cache.storage()["lengths"].tolist() == [32, 3]
    k = cache.k
    del cache, native
    assert float(k[0, 0, 0, 0]) == 1.5  # the view holds the C++ cache


def test_native_errors_name_the_method():
    cache = qkv.KVCache(2, 8, 1, 4)
    with pytest.raises(ValueError,
                       match=r"\[qkv::AttentionKvCache::attend\] q: expected \[B = 2, H, Sq, D\], got \[1, 2, 1, 4\]"):
        cache.attend(np.zeros((1, 2, 1, 4), np.float32))
    with pytest.raises(ValueError,
                       match=r"\[qkv::AttentionKvCache::append\] k_new, v_new: expected \[B = 2, Snew, Hkv = 1, "
                             r"D = 4\]"):
        cache.append(np.zeros((2, 1, 1, 5), np.float32), np.zeros((2, 1, 1, 4), np.float32))
    with pytest.raises(ValueError, match=r"\[qkv.KVCache\] value_dim: must be None or an int >= 1, got 0"):
        qkv.KVCache(1, 8, 1, 4, value_dim=0)


@pytest.mark.parametrize("block_size", [None, 16])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_append_to_grows_one_sequence(dtype, block_size):
    """append_to(b, ...) writes after sequence b's tokens and advances lengths[b] alone, as the same
    rows appended per sequence in the NumPy contract: sequences 2, 0, 2, 1 get 5, 17, 12, 1 tokens
    (sequence 2 crosses a block edge), then a batch append adds 2 to each; attend then equals
    the float64 softmax over each sequence's stored (dequantised) rows."""
    B, Hkv, D, Dv, max_len, H = 3, 2, 8, 4, 40, 4
    rng = np.random.default_rng(23)
    cache = qkv.KVCache(B, max_len, Hkv, D, value_dim=Dv, dtype=dtype, block_size=block_size)
    cap = cache.k.shape[1] * (cache.k.shape[0] // B if block_size else 1)
    want_k = np.zeros((B, cap, Hkv, D), np.float32)
    want_v = np.zeros((B, cap, Hkv, Dv), np.float32)
    lens = [0] * B
    for b, S in ((2, 5), (0, 17), (2, 12), (1, 1)):
        kn = rng.standard_normal((S, Hkv, D)).astype(np.float32)
        vn = rng.standard_normal((S, Hkv, Dv)).astype(np.float32)
        cache.append_to(b, kn, vn)
        want_k[b, lens[b]:lens[b] + S], want_v[b, lens[b]:lens[b] + S] = kn, vn
        lens[b] += S
        assert cache.lengths.tolist() == lens
    kn = rng.standard_normal((B, 2, Hkv, D)).astype(np.float32)
    vn = rng.standard_normal((B, 2, Hkv, Dv)).astype(np.float32)
    cache.append(kn, vn)
    for b in range(B):
        want_k[b, lens[b]:lens[b] + 2], want_v[b, lens[b]:lens[b] + 2] = kn[b], vn[b]
        lens[b] += 2
    assert cache.lengths.tolist() == lens == [19, 3, 19]
    for got, got_scale, want in ((cache.k, cache.k_scale, want_k), (cache.v, cache.v_scale, want_v)):
        rows, scale = expected_rows(dtype, want)
        written = np.arange(cap)[None, :] < np.array(lens)[:, None]
        np.testing.assert_array_equal(logical(cache, got).view(np.uint8)[written], rows.view(np.uint8)[written])
        if scale is not None:
            np.testing.assert_array_equal(logical(cache, got_scale)[written].view(np.uint32),
                                          scale[written].view(np.uint32))
    # attend: one query per head against each sequence's stored rows, in float64 (GQA: head h reads kv head h // 2).
    q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
    qq = q.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else q
    out = np.asarray(cache.attend(qq), np.float64)
    for b in range(B):
        k64, ks = expected_rows(dtype, want_k[b, :lens[b]])
        v64, vs = expected_rows(dtype, want_v[b, :lens[b]])
        k64, v64 = k64.astype(np.float64), v64.astype(np.float64)
        if ks is not None:
            k64, v64 = k64 * ks[..., None], v64 * vs[..., None]
        for h in range(H):
            qh = qq[b, h, 0].astype(np.float64)
            if dtype == "int8":  # q as the int8 decode rounds it (qkv/attention.hpp): one step max|q|/127 per row
                amax = np.abs(q[b, h, 0]).max()
                qh = np.round(q[b, h, 0] * np.float32(127 / amax)).astype(np.float64) * (np.float64(amax) / 127)
            s = k64[:, h // 2] @ qh / np.sqrt(D)
            p = np.exp(s - s.max())
            p /= p.sum()
            # bfloat16: out is rounded to bfloat16 (2^-8 relative) and P to bfloat16 in P·V; int8: the
            # contract's P·V term, P·v_scale rounded to 15 bits on each 64-key tile's largest weight
            # (64/65534 of max|v|), plus f32 sums; float32: f32 sums. Beside |out| ≤ max|v| ≈ 3.
            vmax = np.abs(v64[:, h // 2]).max()
            tol = 3e-2 if dtype == "bfloat16" else 64 / 65534 * vmax + 1e-5 if dtype == "int8" else 1e-5
            np.testing.assert_allclose(out[b, h, 0], p @ v64[:, h // 2], atol=tol, rtol=0)


def test_append_to_errors():
    cache = qkv.KVCache(2, 8, 1, 4)
    x = np.zeros((3, 1, 4), np.float32)
    with pytest.raises(ValueError, match=r"\[qkv.KVCache.append_to\] seq: must be an int in \[0, batch = 2\), got 2"):
        cache.append_to(2, x, x)
    with pytest.raises(ValueError, match=r"\[qkv::AttentionKvCache::append_to\] k_new, v_new: expected \[Snew, Hkv = 1, "
                                         r"D = 4\] and \[Snew, Hkv, Dv = 4\], got k_new \[1, 3, 1, 4\]"):
        cache.append_to(0, x[None], x[None])
    cache.append_to(1, np.zeros((6, 1, 4), np.float32), np.zeros((6, 1, 4), np.float32))
    with pytest.raises(ValueError, match=r"\[qkv::AttentionKvCache::append_to\] k_new: 3 new rows for sequence 1, "
                                         r"which holds 6 of at most max_len = 8"):
        cache.append_to(1, x, x)
    assert cache.lengths.tolist() == [0, 6]
