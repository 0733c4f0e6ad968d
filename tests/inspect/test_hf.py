"""`qkv inspect` on Hugging Face folders (model.safetensors + config.json, as `save_pretrained`
writes them): GPT-2 (LayerNorm, biases, learned positions) and Llama (RMSNorm, rotary, GQA 8/4).

The oracle is transformers itself on the same weights, float32, eager attention:
`output_attentions=True` gives every layer's pattern and `.logits` the prediction. The weights are
random and perturbed away from their initial values (python/tests/hf_tiny.py), so a wrong
layout would change patterns and logits by O(1). These folders hold no tokenizer, so the tokens
are given as ids (`--tokens`); python/tests/test_hf_tokenizers.py inspects folders with one from text.

Tolerance: the same f32 model with different summation orders: patterns within 1e-5 absolute,
probabilities within 1e-5, the attribution's parts sum to transformers' logit within
1e-5·(1 + |logit|) (we see ~1e-7).

Environment (ctest sets it): QKV_BIN, the qkv program.
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
from hf_tiny import TOKENS, gpt2, llama  # noqa: E402  (the checkpoints test_hf_checkpoints.py runs)

QKV = os.environ.get("QKV_BIN")


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_hf_folder_matches_transformers(tmp_path, make):
    assert QKV, "QKV_BIN must be set (ctest sets it)"
    ref = make(tmp_path / "model", seed=4)
    out = tmp_path / "page"
    for fmt in ("json", "html"):
        subprocess.run([QKV, "inspect", "--model", str(tmp_path / "model"), "--tokens", ",".join(map(str, TOKENS)),
                        "--out", str(out), "--format", fmt], check=True, capture_output=True)
    doc = json.loads((out / "inspect.json").read_text())
    assert [t["id"] for t in doc["tokens"]] == TOKENS and doc["tokens"][0]["text"] == f"#{TOKENS[0]}"
    with torch.no_grad():
        res = ref(torch.tensor([TOKENS]), output_attentions=True)
    worst = 0.0
    for l, a in enumerate(res.attentions):
        got = torch.tensor([h["pattern"] for h in doc["layers"][l]["heads"]])
        worst = max(worst, float((got - a[0]).abs().max()))
    assert worst <= 1e-5, worst
    p = torch.softmax(res.logits[0, -1].double(), -1)
    assert doc["next_tokens"][0]["id"] == int(p.argmax())
    for t in doc["next_tokens"]:
        assert abs(t["prob"] - float(p[t["id"]])) <= 1e-5, t
    for t in doc["attribution"]["tokens"]:
        want = float(res.logits[0, -1, t["id"]])
        assert abs(t["sum"] - want) <= 1e-5 * (1 + abs(want)), (t["sum"], want)
    # The ablation table's baseline is transformers' prediction.
    assert abs(doc["ablation"]["p_predicted"] - float(p.max())) <= 1e-5
    print(f"{make.__name__}: patterns max |qkv − transformers| = {worst:.3g}")
