"""`qkv inspect` on Hugging Face folders (model.safetensors + config.json, as `save_pretrained`
writes them): GPT-2 (LayerNorm, biases, learned positions) and Llama (RMSNorm, rotary, GQA 8/4).

The oracle is transformers itself on the same weights, float32, eager attention:
`output_attentions=True` gives every layer's pattern and `.logits` the prediction. The weights are
random and perturbed away from their initial values (biases and gains included), so a wrong
layout would change patterns and logits by O(1). qkv reads no GPT-2/Llama tokenizer, so the
tokens are given as ids (`--tokens`).

Tolerance: the same f32 model with different summation orders: patterns within 1e-5 absolute,
probabilities within 1e-5, the attribution's parts sum to transformers' logit within
1e-5·(1 + |logit|) (we see ~1e-7).

Environment (ctest sets it): QKV_BIN, the qkv program.
"""
import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

QKV = os.environ.get("QKV_BIN")
TOKENS = [5, 17, 3, 60, 42, 8, 91, 23, 77, 1, 64, 30]


def perturbed(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def gpt2(seed):
    cfg = transformers.GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=32, vocab_size=97,
                                  attn_implementation="eager")
    torch.manual_seed(seed)
    return perturbed(transformers.GPT2LMHeadModel(cfg), seed)


def llama(seed):
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_attention_heads=8,
                                   num_key_value_heads=4, num_hidden_layers=2, vocab_size=97,
                                   max_position_embeddings=32, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                   attn_implementation="eager")
    torch.manual_seed(seed)
    return perturbed(transformers.LlamaForCausalLM(cfg), seed)


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_hf_folder_matches_transformers(tmp_path, make):
    assert QKV, "QKV_BIN must be set (ctest sets it)"
    ref = make(seed=4)
    ref.save_pretrained(tmp_path / "model")
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
