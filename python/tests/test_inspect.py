"""qkv.inspect (the `qkv inspect` page and numbers from Python) and Model.trace's inspector fields,
on the real stories260K the repository carries.

Oracles: Model.trace's own arrays, recomputed independently here in float64 NumPy (q·k/√D = the
scores, the residual step of a block, the effect of a knocked-out head on its Δe_h), and the JSON
document of the command, read with `json` (the numbers `qkv.inspect` returns must be exactly its).
Tolerance: trace arrays are f32 computed in f64 where the reference is f64 (scores) or in the
model's f32 order; we allow 1e-5·(1 + |x|), a few hundred f32 ulps of values of size ~1.
"""
import json
import pathlib
import subprocess

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


def test_inspect_returns_the_commands_numbers(page, tmp_path, model, ids):
    from qkv._inspect import _qkv_program
    subprocess.run([_qkv_program(), "inspect", "--model", str(MODEL), "--prompt", PROMPT, "--out", str(tmp_path),
                    "--format", "json"], check=True, capture_output=True)
    doc = json.loads((tmp_path / "inspect.json").read_text())
    assert page.doc == doc
    assert page.token_ids.tolist() == ids
    t = model.trace(ids)
    L, H = model.config["n_layers"], model.config["n_heads"]
    for l in range(L):
        assert np.abs(page.pattern(l) - t.layers[l].pattern).max() <= 1e-6
        s = page.scores(l)
        assert np.array_equal(np.isneginf(s), np.isneginf(t.layers[l].scores))
    assert page.attribution.shape == (10, L, H)
    assert page.attribution[0, 3, 3] == doc["attribution"]["tokens"][0]["heads"][3][3]
    assert page.ablation_p("zero").shape == (L, H) and page.ablation_loss("mean").shape == (L, H)
    assert page.ablation_p("zero")[3, 3] == doc["ablation"]["zero"][3][3]["p_predicted"]
    assert page.next_tokens[0]["id"] == int(np.argmax(t.logits[-1]))
    with pytest.raises(IndexError, match="layer: 5"):
        page.pattern(5)


def test_inspect_displays_in_a_notebook(page, tmp_path):
    html = page._repr_html_()
    assert html.startswith("<iframe srcdoc=") and "qkv-data" in html and "http" not in page.html.split("<script>")[0]
    page.save(str(tmp_path / "p.html"))
    assert (tmp_path / "p.html").read_text(encoding="utf-8") == page.html


def test_inspect_errors():
    with pytest.raises(ValueError, match="exactly one of text and tokens"):
        qkv.inspect(str(MODEL))
    with pytest.raises(ValueError, match="--ablate"):
        qkv.inspect(str(MODEL), "hi", ablate=["x"])
