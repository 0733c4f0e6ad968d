"""Writes the golden files that tie qkv's model to PyTorch (tests/model/test_golden_model.cpp reads them).

For three models — the real stories260K (llama2.c checkpoint: rotary, RMSNorm, SwiGLU, GQA, tied) and
two small random ones saved as safetensors + config (GPT-2 style: learned positions, LayerNorm, GELU,
biases, untied classifier, F32; and a positionless GQA model stored as BF16) — it runs the fp32
PyTorch model of tools/torch_model.py on a fixed token sequence and writes

    tests/golden/model/NAME.logits:  int32 S, int32 V, int32 tokens[S], float32 logits[S, V]

Run from the repository root:  python3 tools/make_golden_model.py
"""
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_model import TorchModel, load_llama2c, load_safetensors  # noqa: E402

OUT = "tests/golden/model"


def write_logits(name, tokens, logits):
    logits = logits.detach().float().numpy()
    S, V = logits.shape
    with open(os.path.join(OUT, name + ".logits"), "wb") as f:
        f.write(struct.pack("<2i", S, V))
        f.write(np.asarray(tokens, dtype="<i4").tobytes())
        f.write(logits.astype("<f4").tobytes())
    print(f"{name}: {S} positions × {V} logits, |logit| ≤ {np.abs(logits).max():.2f}")


def random_model(name, cfg, dtype):
    """Random parameters with qkv's names, saved as NAME.safetensors + NAME.json; returns the
    parameters as the fp32 values actually stored (bf16-rounded when dtype is bf16)."""
    from safetensors.torch import save_file
    g = torch.Generator().manual_seed(1234)
    C, Hd, L, H, Hkv, V, P = (cfg[k] for k in ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads",
                                               "vocab_size", "seq_len"))
    D = C // H
    ln, bias = cfg["norm"] == "layernorm", cfg["bias"]
    shapes = {"tok_embeddings.weight": (V, C)}
    if cfg["pos"] == "learned":
        shapes["pos_embeddings.weight"] = (P, C)
    for l in range(L):
        p = f"layers.{l}."
        shapes[p + "attention_norm.weight"] = (C,)
        if ln and bias:
            shapes[p + "attention_norm.bias"] = (C,)
        for w, o in (("wq", H * D), ("wk", Hkv * D), ("wv", Hkv * D)):
            shapes[p + f"attention.{w}.weight"] = (o, C)
            if bias:
                shapes[p + f"attention.{w}.bias"] = (o,)
        shapes[p + "attention.wo.weight"] = (C, H * D)
        if bias:
            shapes[p + "attention.wo.bias"] = (C,)
        shapes[p + "ffn_norm.weight"] = (C,)
        if ln and bias:
            shapes[p + "ffn_norm.bias"] = (C,)
        shapes[p + "feed_forward.w1.weight"] = (Hd, C)
        if bias:
            shapes[p + "feed_forward.w1.bias"] = (Hd,)
        shapes[p + "feed_forward.w2.weight"] = (C, Hd)
        if bias:
            shapes[p + "feed_forward.w2.bias"] = (C,)
        if cfg["mlp"] == "swiglu":
            shapes[p + "feed_forward.w3.weight"] = (Hd, C)
    shapes["norm.weight"] = (C,)
    if ln and bias:
        shapes["norm.bias"] = (C,)
    if not cfg["tied_embeddings"]:
        shapes["output.weight"] = (V, C)
    params = {}
    for k, s in shapes.items():
        if "norm" in k and k.endswith(".weight"):
            t = 1.0 + 0.1 * torch.randn(s, generator=g)
        elif k.endswith(".bias"):
            t = 0.1 * torch.randn(s, generator=g)
        else:
            t = torch.randn(s, generator=g) / (s[-1] ** 0.5)
        params[k] = t.to(dtype).contiguous()
    save_file(params, os.path.join(OUT, name + ".safetensors"))
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(cfg, f, indent=2)
    return load_safetensors(os.path.join(OUT, name + ".safetensors"), os.path.join(OUT, name + ".json"))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    # stories260K: BOS, then a fixed walk through the vocabulary, 64 positions.
    cfg, p = load_llama2c("data/models/stories260K/stories260K.bin")
    tokens = [1] + [3 + (i * 37) % 509 for i in range(63)]
    write_logits("stories260K", tokens, TorchModel(cfg, p).forward(tokens))

    gpt2 = dict(dim=32, hidden_dim=64, n_layers=2, n_heads=4, n_kv_heads=4, vocab_size=61, seq_len=32,
                pos="learned", norm="layernorm", mlp="gelu", tied_embeddings=False, bias=True,
                norm_eps=1e-5, rope_theta=10000.0)
    cfg, p = random_model("tiny_gpt2", gpt2, torch.float32)
    tokens = [(i * 7 + 3) % 61 for i in range(32)]
    write_logits("tiny_gpt2", tokens, TorchModel(cfg, p).forward(tokens))

    gqa = dict(dim=32, hidden_dim=48, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=53, seq_len=24,
               pos="none", norm="rmsnorm", mlp="swiglu", tied_embeddings=True, bias=False,
               norm_eps=1e-5, rope_theta=10000.0)
    cfg, p = random_model("tiny_gqa_bf16", gqa, torch.bfloat16)
    tokens = [(i * 11 + 5) % 53 for i in range(24)]
    write_logits("tiny_gqa_bf16", tokens, TorchModel(cfg, p).forward(tokens))


if __name__ == "__main__":
    main()
