"""Issue #16 regression tests for the Python faces (each failed before its fix):

- item 17 (`test_defect17_*`): Model.generate and MultiHeadAttention follow the CLI's argument
  rules, with one message (the C++ check qkv::validate_generate_options);
- item 3 (`test_defect03_*`): one Model shared by 8 threads generates what one thread does;
- item 4 (`test_defect04_*`): NaN / +inf scores give NaN rows as torch does (oracle: torch's
  math SDPA in float64, independent of qkv).
"""

import os
import pathlib
import threading

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"


@pytest.fixture(scope="module")
def model():
    return qkv.Model.load(MODEL)


@pytest.fixture(scope="module")
def tok(model):
    return qkv.Tokenizer.load(TOKENIZER, model.config["vocab_size"])


# ---- item 17: the CLI's rules and messages ---------------------------------------------------

def test_defect17_generate_accepts_utf8_bytes_as_text(model, tok):
    # Before: str(b'Lily') made the prompt the six characters "b'Lily'".
    want = model.generate(tok, "Lily", steps=30, temperature=0)
    assert model.generate(tok, b"Lily", steps=30, temperature=0) == want
    assert want.startswith("Lily")
    with pytest.raises(ValueError, match=r"\[qkv.Model.generate\] prompt: bytes that are not UTF-8"):
        model.generate(tok, b"\xff\xfe", steps=5)
    with pytest.raises(TypeError, match=r"\[qkv.Model.generate\] prompt: must be str or UTF-8 bytes, got int"):
        model.generate(tok, 42, steps=5)


# The messages are the C++ check's (qkv::validate_generate_options), the bounds those of
# `qkv generate`'s flags (src/cli/cmd_generate.cpp): --steps >= 0, --temperature in [0, 100],
# --top-p in [0, 1], --top-k >= 0, --seed >= 1.
@pytest.mark.parametrize("kw,exc,msg", [
    (dict(steps=-5), ValueError, r"steps: must be ≥ 0 \(positions in all, 0: the whole context\), got -5"),
    (dict(top_p=2.0), ValueError, r"top_p: must be in \[0, 1\] \(0 or 1 disables nucleus sampling\), got 2"),
    (dict(top_p=-0.1), ValueError, r"top_p: must be in \[0, 1\]"),
    (dict(top_k=-1), ValueError, r"top_k: must be ≥ 0 \(0 disables it\), got -1"),
    (dict(temperature=-1), ValueError, r"temperature: must be in \[0, 100\] \(0 is greedy\), got -1"),
    (dict(temperature=float("nan")), ValueError, r"temperature: must be in \[0, 100\] \(0 is greedy\), got nan"),
    (dict(temperature=101), ValueError, r"temperature: must be in \[0, 100\]"),
    (dict(seed=0), ValueError, r"seed: must be ≥ 1"),
    (dict(seed=-3), ValueError, r"seed: must be ≥ 1 .*got -3"),
    (dict(steps=2.5), TypeError, r"steps: must be an integer, got 2.5"),
    (dict(top_p="0.5"), TypeError, r"top_p: must be a number, got '0.5'"),
])
def test_defect17_generate_rejects_what_the_cli_rejects(model, tok, kw, exc, msg):
    with pytest.raises(exc, match=r"\[qkv.Model.generate\] " + msg):
        model.generate(tok, "Lily", **kw)


def test_defect17_generate_bounds_are_inclusive(model, tok):
    # The ends of each range are valid, as for the CLI.
    for kw in (dict(steps=0), dict(top_p=0.0), dict(top_p=1.0), dict(temperature=0.0), dict(top_k=0)):
        assert model.generate(tok, "Lily", **{"steps": 8, **kw}).startswith("Lily")


@pytest.mark.parametrize("args,msg", [
    (dict(d_model=64, n_heads=0), r"n_heads: must be a positive integer, got 0"),
    (dict(d_model=64, n_heads=-2), r"n_heads: must be a positive integer, got -2"),
    (dict(d_model=0, n_heads=2), r"d_model: must be a positive integer, got 0"),
    (dict(d_model=10, n_heads=3), r"n_heads: d_model = 10 is not a multiple of n_heads = 3"),
])
def test_defect17_mha_head_count_errors_name_the_argument(args, msg):
    with pytest.raises(ValueError, match=r"\[qkv.MultiHeadAttention\] " + msg):
        qkv.MultiHeadAttention(**args)


# ---- item 3: one Model, many threads ---------------------------------------------------------

def test_defect03_model_shared_by_8_threads_generates_as_one(model, tok):
    # Before: the threads wrote each other's buffers (the GIL is released while the model runs)
    # and the texts came out garbled. Oracle: the same calls made one after another.
    jobs = [dict(prompt=p, steps=60, temperature=t, top_p=0.9, seed=s)
            for p in ("Lily", "Once upon a time", "The dog", "Tom")
            for t, s in ((0.0, 1), (1.0, 7 + len(p)))]  # greedy and seeded sampling
    want = [model.generate(tok, **j) for j in jobs]
    for rounds in range(3):
        got = [None] * (2 * len(jobs))
        start = threading.Barrier(8)

        def work(w):
            start.wait()
            for n in range(w, len(got), 8):
                got[n] = model.generate(tok, **jobs[n % len(jobs)])

        threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == want + want


def test_defect03_forward_and_trace_take_turns(model, tok):
    # forward() on the shared cache and trace() from other threads: each trace equals one made alone.
    ids = tok.encode("Once upon a time, Lily had a cat")
    want = model.trace(ids).logits
    errors = []

    def tracer():
        for _ in range(4):
            if not np.array_equal(model.trace(ids).logits, want):
                errors.append("trace differs")

    def generator():
        for _ in range(4):
            model.generate(tok, "Tom", steps=40, temperature=0)

    threads = [threading.Thread(target=f) for f in (tracer, tracer, generator, generator)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- item 4: NaN and inf in the scores --------------------------------------------------------

torch = pytest.importorskip("torch")


def torch_rows(q, k, v, mask=None, is_causal=False):
    """torch's math SDPA in float64: out [.., L, Ev]."""
    t = [torch.from_numpy(np.asarray(x, np.float64)) for x in (q, k, v)]
    m = None if mask is None else torch.from_numpy(np.asarray(mask))
    if m is not None and m.dtype != torch.bool:
        m = m.double()
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(*t, attn_mask=m, is_causal=is_causal).numpy()


def poisoned(rng, dtype=np.float32):
    q = rng.standard_normal((2, 3, 40, 16)).astype(dtype)
    k = rng.standard_normal((2, 3, 90, 16)).astype(dtype)
    v = rng.standard_normal((2, 3, 90, 16)).astype(dtype)
    k[0, 0, 5, 3] = np.nan     # every row of (0, 0) attends key 5 (non-causal): all NaN
    k[0, 1, 70, 2] = np.inf    # score +inf (NaN row) or -inf (key ignored), by the sign of q[..., 2]
    q[1, 2, 7, 0] = np.nan     # row 7 of (1, 2)
    return q, k, v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_defect04_nan_rows_match_torch(dtype):
    rng = np.random.default_rng(16)
    q, k, v = poisoned(rng, dtype)
    mask = rng.standard_normal((2, 3, 40, 90)).astype(dtype)
    mask[1, 0, 3, 50] = np.nan  # a NaN mask entry: row 3 of (1, 0)
    mask[1, 1, 9, 60] = np.inf  # a +inf mask entry: row 9 of (1, 1)
    for m in (None, mask):
        got = np.asarray(qkv.scaled_dot_product_attention(q, k, v, attn_mask=m))
        want = torch_rows(q, k, v, m)
        nan_got, nan_want = np.isnan(got).all(-1), np.isnan(want).all(-1)
        # Rows are all NaN or all finite, and exactly torch's rows are NaN.
        assert (np.isnan(got).any(-1) == nan_got).all()
        assert nan_want.any() and (nan_got == nan_want).all(), np.argwhere(nan_got != nan_want)[:5]
        # Before the fix qkv's rows were finite there: (0, 0) alone is 40 rows.
        assert nan_got[0, 0].all() and nan_got[1, 2, 7]
        # Finite rows within float32 rounding of torch's float64 (2e-6, test_sdpa.py's rule).
        tol = 2e-6 if dtype == np.float32 else 1e-12
        assert np.abs(got[~nan_got] - want[~nan_want]).max() < tol


def test_defect04_lse_and_gradients_are_nan_on_nan_rows():
    rng = np.random.default_rng(17)
    q, k, v = poisoned(rng)
    r = qkv.attention(q, k, v, causal=True, return_lse=True)
    out = np.asarray(r.out)
    nan_rows = np.isnan(out).all(-1)
    # causal: row i of (0, 0) sees key 5 from i = 5 on; row 7 of (1, 2) has a NaN query.
    assert not nan_rows[0, 0, :5].any() and nan_rows[0, 0, 5:].all() and nan_rows[1, 2, 7]
    assert (np.isnan(np.asarray(r.lse)) == nan_rows).all()
    # torch adds −inf to masked scores, so a masked NaN or +inf score gives it a NaN row, where
    # qkv's policy ignores masked keys. Key 70 is masked for every row (causal, L = 40): zero it
    # for torch. Key 5 is masked for rows 0..4 of (0, 0) only: those rows differ.
    k_t = k.copy()
    k_t[0, 1, 70] = 0.0
    want = np.isnan(torch_rows(q, k_t, v, is_causal=True)).all(-1)
    assert want[0, 0, :5].all()
    want[0, 0, :5] = False
    assert (want == nan_rows).all()
    dout = rng.standard_normal(out.shape).astype(np.float32)
    g = qkv.attention_backward(q, k, v, out, dout, r.lse, causal=True)
    dq = np.asarray(g.dq)
    # torch's dq is NaN on these rows too (it is also NaN on every row of (0, 0), through
    # 0 · NaN with the masked key 5: qkv keeps rows 0..4 finite, the masked key being ignored).
    assert (np.isnan(dq).all(-1) == nan_rows).all()
    dk, dv = np.asarray(g.dk), np.asarray(g.dv)
    # Keys 0..39 of (0, 0) are attended by NaN rows (rows 5..39 see keys up to i): NaN.
    assert np.isnan(dk[0, 0, :40]).all() and np.isnan(dv[0, 0, :40]).all()
    # Keys no row attends (>= 40, causal with L = 40) get zeros, finite.
    assert (dk[0, 0, 40:] == 0).all() and (dv[0, 0, 40:] == 0).all()


def test_defect04_masked_nan_keys_and_dead_rows_stay_clean():
    rng = np.random.default_rng(18)
    q, k, v = poisoned(rng)
    allow = np.ones((2, 3, 40, 90), bool)
    allow[0, 0, :, 5] = False        # the NaN key masked out: every row of (0, 0) finite
    allow[1, 2, 7, :] = False        # the NaN query's row masked entirely: zeros
    got = np.asarray(qkv.scaled_dot_product_attention(q, k, v, attn_mask=allow))
    assert np.isfinite(got[0, 0]).all()
    assert (got[1, 2, 7] == 0).all()
    additive = np.where(allow, 0.0, -np.inf).astype(np.float32)
    got_add = np.asarray(qkv.scaled_dot_product_attention(q, k, v, attn_mask=additive))
    assert np.array_equal(got_add[0, 0], got[0, 0]) and (got_add[1, 2, 7] == 0).all()
    # Oracle for the finite rows: torch with the NaN key replaced by zeros (it is masked anyway).
    k0 = k.copy()
    k0[0, 0, 5] = 0.0
    assert np.abs(got[0, 0] - torch_rows(q, k0, v, allow)[0, 0]).max() < 2e-6


# ---- item 6: out-of-memory kill instead of an error ------------------------------------------
# Each case runs in a child process: before the fix the kernel killed the process (SIGKILL) when
# the pages were touched, and it must kill only the child. The sizes are far beyond any machine
# these tests run on (≥ 25 GB; the check compares with MemAvailable and the cgroup limit).

import subprocess
import sys
import textwrap


def run_child(code, tmp_path=None):
    env = dict(os.environ)
    # The child imports the very qkv this process imported (the installed wheel, or python/ in a dev tree).
    here = str(pathlib.Path(qkv.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env=env, cwd=str(tmp_path or ROOT))
    return r.returncode, r.stdout + r.stderr


def expect_memory_error(code, what, need, tmp_path=None):
    avail = qkv._qkv.available_memory()
    if need < avail:
        pytest.skip(f"this machine has {avail / 1e9:.0f} GB available: {need / 1e9:.0f} GB would fit")
    rc, out = run_child("""
        import numpy as np, qkv
        try:
    """ + textwrap.indent(textwrap.dedent(code), " " * 12) + """
        except MemoryError as e:
            print("MemoryError:", e)
        else:
            print("no error")
    """, tmp_path)
    assert rc == 0, f"child died with {rc} (before the fix: -9, killed by the kernel): {out[-500:]}"
    assert "MemoryError: [" in out and what in out and "are available" in out, out[-500:]
    print(out.strip(), f"(available here {avail / 1e9:.1f} GB)")


def test_defect06_mha_too_large_raises_memory_error():
    # 4 weights of 40000 × 40000 floats: 25.6 GB.
    expect_memory_error("qkv.MultiHeadAttention(d_model=40000, n_heads=1)",
                        "[qkv::MultiHeadAttention] weights w_q, w_k, w_v, w_o: needs 25.6 GB", 25.6e9)


def test_defect06_attention_output_too_large_raises_memory_error():
    # Broadcast inputs (stride 0: no memory) whose output [256, 256, 20000, 8] f32 is 42 GB.
    expect_memory_error("""
        q = np.broadcast_to(np.ones((1, 1, 1, 8), np.float32), (256, 256, 20000, 8))
        qkv.attention(q, q, q)
    """, "[qkv.attention] out and lse: needs 41.9 GB", 41.9e9)
    expect_memory_error("""
        q = np.broadcast_to(np.ones((1, 1, 1, 8), np.float32), (256, 256, 20000, 8))
        qkv.scaled_dot_product_attention(q, q, q)
    """, "[qkv.scaled_dot_product_attention] output: needs 41.9 GB", 41.9e9)
    # The pattern [1, 64, 20000, 20000] of small inputs: 102 GB.
    expect_memory_error("""
        q = np.zeros((1, 64, 20000, 8), np.float32)
        qkv.attention(q, q, q, return_pattern=True)
    """, "[qkv.attention] out, lse and pattern: needs 102 GB", 102e9)


def test_defect06_model_with_huge_context_raises_memory_error(tmp_path):
    # A Llama checkpoint (46 MB) whose config claims 2^20 positions, the most a config may:
    # its KV cache, [8 layers, 8 kv heads, 2^20, 64] for k and for v, would be 34.4 GB.
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=256, num_attention_heads=8,
                                   num_key_value_heads=8, num_hidden_layers=8, vocab_size=97,
                                   max_position_embeddings=32)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    import json
    c = json.loads((tmp_path / "config.json").read_text())
    c["max_position_embeddings"] = 2**20
    (tmp_path / "config.json").write_text(json.dumps(c))
    expect_memory_error(f"qkv.Model.load({str(tmp_path)!r})",
                        "[qkv::KvCache] k and v [n_layers, n_kv_heads, capacity, head_dim] = [8, 8, 1048576, 64] "
                        "each: needs 34.4 GB", 34.4e9, tmp_path)
