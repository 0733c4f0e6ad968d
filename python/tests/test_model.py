"""qkv.Model and qkv.Tokenizer on the real stories260K the repository carries.

Oracles: llama2.c's published greedy output (tests/golden/, byte for byte), the straightforward
PyTorch transformer of tools/torch_model.py (independent of the C++ code), and NumPy float64 for
the trace's own algebra (softmax of the scores, heads summing to the block's change).
"""

import importlib.util
import pathlib

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"
GOLDEN = ROOT / "tests/golden/llama2c_stories260K_greedy_200.txt"
TEXT = "Once upon a time, Lily had a cat named Tom."


@pytest.fixture(scope="module")
def model():
    return qkv.Model.load(MODEL)


@pytest.fixture(scope="module")
def tok(model):
    return qkv.Tokenizer.load(TOKENIZER, model.config["vocab_size"])


def torch_model():
    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("torch_model", ROOT / "tools/torch_model.py")
    tm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tm)
    cfg, p = tm.load_llama2c(str(MODEL))
    return torch, tm.TorchModel(cfg, p)


def test_config_and_size(model):
    c = model.config
    # stories260K's header (shared/data/README.md): dim 64, hidden 172, 5 layers, 8 heads, 4 kv heads, vocab 512.
    assert (c["dim"], c["hidden_dim"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["vocab_size"],
            c["seq_len"]) == (64, 172, 5, 8, 4, 512, 512)
    assert model.num_params == 260032  # the file's floats less the two rotary tables (qkv params counts the same)


def test_greedy_story_is_llama2c_byte_for_byte(model, tok):
    # llama2.c's `run stories260K.bin -z tok512.bin -t 0 -n 200` (published output; run prints a final newline).
    text = model.generate(tok, "", steps=200, temperature=0)
    assert text + "\n" == GOLDEN.read_text(encoding="utf-8")


def test_generate_with_prompt_and_stats(model, tok):
    g = model.generate(tok, "Once upon a time", steps=40, temperature=0, return_stats=True)
    print(g)
    assert g.text.startswith("Once upon a time")
    ids = tok.encode("Once upon a time")
    assert g.prompt_tokens == len(ids)                      # BOS included
    # llama2.c's run forwards positions 0..steps-1 and prints the token each one predicts, so the last
    # sampled token (position 40) is never run: prompt + generated = steps + 1 when nothing stops it.
    assert g.prompt_tokens + g.generated == 40 + 1
    # Greedy decoding is the argmax of the model's own logits at each step: replay it.
    model.reset()
    logits = model.forward(ids)
    out = list(ids)
    for _ in range(g.generated):
        nxt = int(np.argmax(logits))
        if nxt in (qkv.Tokenizer.bos, qkv.Tokenizer.eos):
            break
        out.append(nxt)
        logits = model.forward([nxt])
    assert tok.decode(out) == g.text
    # Sampling is seeded: the same seed gives the same text, another seed (almost surely) another.
    a = model.generate(tok, "Lily", steps=60, temperature=1.0, top_p=0.9, seed=7)
    assert a == model.generate(tok, "Lily", steps=60, temperature=1.0, top_p=0.9, seed=7)


def test_generate_batch_equals_one_at_a_time(model, tok):
    # Prompts of different lengths (one empty) advanced in lockstep: each text is exactly the one
    # generate() gives alone (the batched step computes every sequence's logits with the same bits),
    # greedy and sampled (each sequence has its own generator with the same seed).
    prompts = ["Once upon a time", "", "Lily and Tom went to the park and saw a big", "The dog"]
    # With kv_dtype="bf16" and "int8" on both sides too (the batched step rounds or quantises each cache
    # as generate() does).
    for kw in ({"temperature": 0}, {"temperature": 0.9, "top_p": 0.9, "seed": 5}, {"temperature": 0, "kv_dtype": "bf16"},
               {"temperature": 0, "kv_dtype": "int8"}, {"temperature": 0.9, "top_p": 0.9, "seed": 5, "kv_dtype": "int8"}):
        alone = [model.generate(tok, p, steps=120, **kw) for p in prompts]
        g = model.generate_batch(tok, prompts, steps=120, return_stats=True, **kw)
        assert g.texts == alone
        assert g.prompt_tokens == sum(len(tok.encode(p)) for p in prompts)
    with pytest.raises(ValueError, match=r"\[qkv.Model.generate_batch\] prompts: must not be empty"):
        model.generate_batch(tok, [])
    with pytest.raises(TypeError, match=r"prompts\[1\]: must be str"):
        model.generate_batch(tok, ["a", 3])
    with pytest.raises(ValueError, match=r"\[qkv.Model.generate_batch\] temperature"):
        model.generate_batch(tok, ["a"], temperature=-1)
    with pytest.raises(ValueError, match=r"\[qkv.Model.generate_batch\] kv_dtype: must be 'f32', 'bf16', 'int8' or None, got 'f16'"):
        model.generate_batch(tok, ["a"], kv_dtype="f16")
    with pytest.raises(ValueError, match=r"\[qkv.Model.generate\] kv_dtype: must be 'f32', 'bf16', 'int8' or None, got 'i8'"):
        model.generate(tok, "a", kv_dtype="i8")
    with pytest.raises(TypeError, match=r"\[qkv.Model.generate\] kv_dtype"):
        model.generate(tok, "a", kv_dtype=16)


def test_logits_match_pytorch(model, tok):
    torch, tm = torch_model()
    ids = tok.encode(TEXT)
    model.reset()
    got = model.forward(ids, all_logits=True)
    with torch.no_grad():
        want = tm.forward(ids).numpy()
    err = float(np.max(np.abs(got - want)))
    print(f"max |logit| {np.max(np.abs(want)):.2f}, max |qkv - torch| {err:.3g}")
    # Both fp32 with different summation orders (tests/model/test_golden_model.cpp): ~1e-6 relative per
    # layer on logits of magnitude ~20; 1e-4 leaves a wide margin and still catches any wrong weight.
    assert got.shape == (len(ids), 512)
    assert err < 1e-4


def test_kv_cache_continues_where_it_left(model, tok):
    ids = tok.encode(TEXT)
    model.reset()
    full = model.forward(ids, all_logits=True)
    model.reset()
    model.forward(ids[:5])
    assert model.position == 5
    rows = [model.forward([t]) for t in ids[5:]]
    err = float(np.max(np.abs(np.stack(rows) - full[5:])))
    print(f"max |incremental - full| {err:.3g}")
    assert err < 1e-4  # decode kernel vs flash kernel on the same fp32 data: summation order only


def test_trace_is_every_head(model, tok):
    ids = tok.encode("a fluffy blue creature")
    S, H, C = len(ids), 8, 64
    t = model.trace(ids)
    assert len(t.layers) == 5 and t.logits.shape == (S, 512)
    for layer in t.layers:
        assert layer.scores.shape == layer.pattern.shape == (H, S, S)
        assert layer.head_delta.shape == (H, S, C) and layer.block_delta.shape == (S, C)
        above = np.triu(np.ones((S, S), bool), 1)
        assert np.all(np.isneginf(layer.scores[:, above])) and np.all(layer.pattern[:, above] == 0)
        s = layer.scores.astype(np.float64)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert np.max(np.abs(layer.pattern - p)) < 1e-6         # fp32 softmax vs f64: a few ulps of 1
        assert np.max(np.abs(layer.head_delta.sum(0) - layer.block_delta)) < 1e-5  # fp32 sum of 8 terms
    model.reset()
    err = float(np.max(np.abs(t.logits - model.forward(ids, all_logits=True))))
    assert err < 1e-4, err


def test_first_layer_pattern_matches_pytorch(model, tok):
    # Layer 0's attention pattern, computed from the weights in PyTorch: RMSNorm, W_Q/W_K, rotary, GQA.
    torch, tm = torch_model()
    ids = tok.encode(TEXT)
    S, H, Hkv, D = len(ids), 8, 4, 8
    with torch.no_grad():
        x = tm.p["tok_embeddings.weight"][torch.tensor(ids)]
        h = tm._norm(x, "layers.0.attention_norm")
        q = tm._rope(tm._lin(h, "layers.0.attention.wq").view(S, H, D), 0)
        k = tm._rope(tm._lin(h, "layers.0.attention.wk").view(S, Hkv, D), 0).repeat_interleave(H // Hkv, dim=1)
        scores = torch.einsum("shd,thd->hst", q, k) / D ** 0.5
        scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
        want = torch.softmax(scores, -1).numpy()
    got = model.trace(ids).layers[0].pattern
    err = float(np.max(np.abs(got - want)))
    print(f"layer 0 pattern: max |qkv - torch| {err:.3g}")
    assert err < 1e-5  # probabilities in [0, 1], fp32 on both sides


def test_bf16_weights(model, tok):
    # bf16 storage rounds every projection to 8 significant bits (relative error ≤ 2^-9 per weight);
    # through 5 layers the logits move by a few hundredths, and greedy text stays a story.
    m16 = qkv.Model.load(MODEL, weights="bf16")
    ids = tok.encode(TEXT)
    model.reset()
    a, b = model.forward(ids, all_logits=True), m16.forward(ids, all_logits=True)
    err = float(np.max(np.abs(a - b)))
    print(f"max |bf16 - f32 logits| {err:.3g} (max |logit| {np.max(np.abs(a)):.1f})")
    assert 0 < err < 0.2  # 0.07 seen; > 0 shows the bf16 path ran
    assert np.mean(np.argmax(a, -1) == np.argmax(b, -1)) >= 0.9
    with pytest.raises(ValueError, match="weights: must be 'f32' or 'bf16'"):
        qkv.Model.load(MODEL, weights="f16")


def test_bf16_gemm_inputs(model, tok):
    # gemm_inputs='bf16' adds two bf16 rounding stages to bf16 weights: the prefill's GEMM input rows
    # and the KV cache (q, K, V, each ≤ 2^-9 relative). One stage moves a logit by at most about
    # 8 · 2^-9 · max|logit| (the C++ bound, tests/model/test_golden_model.cpp), so against the exact
    # f32 model the bound is 3 stages and against the bf16-weights model 2. The last tokens are
    # decoded one at a time from the bf16 cache, the path generation takes.
    m16 = qkv.Model.load(MODEL, weights="bf16")
    mg = qkv.Model.load(MODEL, weights="bf16", gemm_inputs="bf16")
    ids = tok.encode(TEXT)
    model.reset()
    a, b = model.forward(ids, all_logits=True), m16.forward(ids, all_logits=True)
    pre = mg.forward(ids[:-3], all_logits=True)
    steps = [mg.forward(ids[i:i + 1], all_logits=False) for i in range(len(ids) - 3, len(ids))]
    c = np.concatenate([pre, np.stack(steps)])
    stage = 8 * 2.0**-9 * float(np.max(np.abs(a)))
    err_f32, err_b = float(np.max(np.abs(c - a))), float(np.max(np.abs(c - b)))
    print(f"max |bf16-GEMM-inputs - f32| {err_f32:.3g} (bound {3 * stage:.3g}), "
          f"- bf16 weights {err_b:.3g} (bound {2 * stage:.3g})")
    assert err_f32 < 3 * stage
    assert 0 < err_b < 2 * stage  # > 0: the activations really were rounded
    assert mg.position == len(ids)
    with pytest.raises(ValueError, match="gemm_inputs: 'bf16' needs weights='bf16'"):
        qkv.Model.load(MODEL, gemm_inputs="bf16")
    with pytest.raises(ValueError, match="gemm_inputs: must be 'f32' or 'bf16'"):
        qkv.Model.load(MODEL, weights="bf16", gemm_inputs="f16")


def test_tokenizer_round_trip(tok):
    ids = tok.encode(TEXT)
    assert ids[0] == qkv.Tokenizer.bos
    assert tok.decode(ids) == TEXT
    assert tok.encode(TEXT, bos=False) == ids[1:]
    assert tok.encode("", bos=True, eos=True) == [1, 2]
    assert tok.vocab_size == 512


def test_tokenizer_of_qkv_train_by_content(tmp_path):
    """The tokenizer.json `qkv train` writes loads through the same qkv.Tokenizer.load; its ids 1
    and 2 are characters, not BOS/EOS, so they survive decode (ids and text by hand)."""
    path = tmp_path / "tokenizer.json"
    path.write_text('{"kind": "chars", "chars": ["\\n", " ", "a", "b", "c"]}')
    tok = qkv.Tokenizer.load(path, 5)
    assert tok.format == "qkv_json"
    assert tok.encode("ab c\n") == [2, 3, 1, 4, 0]  # no BOS: the format has none
    assert tok.decode([2, 3, 1, 4, 0]) == "ab c\n"
    with pytest.raises(ValueError, match=r"read as qkv train's tokenizer.json.*5 tokens, but the model's vocabulary has 512"):
        qkv.Tokenizer.load(path, 512)
    with pytest.raises(ValueError, match=r"read as a llama2.c tokenizer.bin.*impossible max_token_length"):
        qkv.Tokenizer.load(MODEL.parent / "NOTICE", 512)
    assert qkv.Tokenizer.load(TOKENIZER, 512).format == "llama2c"


def test_bad_input_is_a_clear_error(model, tmp_path):
    with pytest.raises(ValueError, match="nope.bin"):
        qkv.Model.load(tmp_path / "nope.bin")
    short = tmp_path / "short.bin"
    short.write_bytes(MODEL.read_bytes()[:1000])
    with pytest.raises(ValueError, match="short.bin"):
        qkv.Model.load(short)
    with pytest.raises(ValueError, match="tok512.bin"):
        qkv.Tokenizer.load(TOKENIZER, 100000)  # the file holds 512 tokens
    with pytest.raises(ValueError, match="token"):
        model.trace([1, 512])                  # the vocabulary is 0..511
    with pytest.raises(ValueError, match="token"):
        model.trace([1, -3])
    with pytest.raises(ValueError, match="empty"):
        model.forward([])
    model.reset()
    with pytest.raises(ValueError):
        model.forward([1] * 513)               # the context is 512 positions
    assert model.position == 0                 # a refused call leaves the cache as it was
    with pytest.raises(TypeError, match="tokenizer"):
        model.generate("not a tokenizer")
