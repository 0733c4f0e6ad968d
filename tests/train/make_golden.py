#!/usr/bin/env python3
"""Writes the golden files that tie qkv's training to PyTorch (checked by tests/train/test_train_torch.cpp).

  model_grads_{gpt2,llama,mixed}.json   a tiny model of each family (tools/torch_train_twin.py, f64)
                   with order-1 random weights, one batch; the mean cross-entropy and the gradient of
                   every parameter (autograd), by qkv's tensor names
  bert_mlm/        transformers' BertForMaskedLM (a tiny random config, order-1 weights rounded to f32, tied
                   decoder) as save_pretrained writes it: config.json + model.safetensors (f32), read by
                   qkv's one safetensors loader
  bert_mlm.json    one batch for it (tokens, token types, labels with -100 where not predicted), its
                   masked-LM loss and the gradient of every parameter, computed by transformers in f64,
                   by transformers' parameter names
  adamw.json       three steps of torch.optim.AdamW (decay on a subset, clip_grad_norm_ before
                   each step) on f32 tensors: inputs, learning rates, and the parameters after

    python3 tests/train/make_golden.py        (rerun only when the model or optimiser changes)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
from torch_train_twin import TwinModel  # noqa: E402

BASE = dict(norm_eps=1e-5, rope_theta=10000.0)
CONFIGS = {
    # nanoGPT (qkv train --arch gpt2 --bias): learned positions, LayerNorm, exact GELU, tied
    "gpt2": dict(BASE, dim=8, hidden_dim=32, n_layers=2, n_heads=2, n_kv_heads=2, vocab_size=7, seq_len=6,
                 pos="learned", norm="layernorm", mlp="gelu_exact", tied_embeddings=True, bias=True),
    # Llama: rotary, RMSNorm, SwiGLU, 4 query heads over 2 kv heads, separate unembedding
    "llama": dict(BASE, dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=9, seq_len=6,
                  pos="rotary", norm="rmsnorm", mlp="swiglu", tied_embeddings=False, bias=False),
    # the rest of the space: rotary with LayerNorm and biases, tanh GELU, one kv head, other eps and theta
    # (eps f32-representable: qkv::Config holds it as a float)
    "mixed": dict(dim=8, hidden_dim=12, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=5, seq_len=6, pos="rotary",
                  norm="layernorm", mlp="gelu", tied_embeddings=True, bias=True, norm_eps=2**-10, rope_theta=500.0),
}


def model_grads(cfg, B=3):
    torch.manual_seed(0)
    model = TwinModel(cfg, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
            p.copy_(p.float().double())  # f32-representable, so the f32 model sees the very same weights
    T, V = cfg["seq_len"], cfg["vocab_size"]
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    loss = model(x, y)
    loss.backward()
    named = model.named()
    return {
        "config": cfg, "batch": B,
        "tokens": x.flatten().tolist(), "targets": y.flatten().tolist(),
        "params": {n: p.detach().flatten().tolist() for n, p in named.items()},
        "loss": loss.item(),
        "grads": {n: p.grad.flatten().tolist() for n, p in named.items()},
    }


def bert_mlm(folder, B=3, T=8):
    import transformers
    cfg = transformers.BertConfig(vocab_size=23, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=T, type_vocab_size=2,
                                  hidden_act="gelu", layer_norm_eps=1e-12, attn_implementation="eager")
    torch.manual_seed(2)
    model = transformers.BertForMaskedLM(cfg).double().eval()  # eval: no dropout
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
            p.copy_(p.float().double())  # f32-representable: the f32 file holds exactly these weights
    model.float().save_pretrained(folder)
    model.double()
    x = torch.randint(0, cfg.vocab_size, (B, T))
    types = torch.randint(0, 2, (B, T))
    labels = torch.randint(0, cfg.vocab_size, (B, T))
    labels[torch.rand(B, T) > 0.3] = -100  # about a third of the positions predicted
    labels[:, 1] = torch.randint(0, cfg.vocab_size, (B,))
    loss = model(input_ids=x, token_type_ids=types, labels=labels).loss
    loss.backward()
    return {
        "batch": B, "seq": T,
        "tokens": x.flatten().tolist(), "types": types.flatten().tolist(), "targets": labels.flatten().tolist(),
        "loss": loss.item(),
        "grads": {n: p.grad.flatten().tolist() for n, p in model.named_parameters()},
    }


def adamw():
    torch.manual_seed(1)
    n, n_decay, steps = 12, 7, 3
    p0 = torch.randn(n)
    grads = [torch.randn(n) * s for s in (0.5, 3.0, 0.2)]  # step 2's norm exceeds the clip
    lrs = [1e-3, 8e-4, 5e-4]
    cfg = {"beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0}
    a = p0[:n_decay].clone().requires_grad_()
    b = p0[n_decay:].clone().requires_grad_()
    opt = torch.optim.AdamW([{"params": [a], "weight_decay": cfg["weight_decay"]}, {"params": [b], "weight_decay": 0.0}],
                            lr=lrs[0], betas=(cfg["beta1"], cfg["beta2"]), eps=cfg["eps"])
    norms = []
    for t in range(steps):
        a.grad, b.grad = grads[t][:n_decay].clone(), grads[t][n_decay:].clone()
        norms.append(torch.nn.utils.clip_grad_norm_([a, b], cfg["clip"]).item())
        for g in opt.param_groups:
            g["lr"] = lrs[t]
        opt.step()
    return {"config": cfg, "n_decay": n_decay, "p0": p0.tolist(), "grads": [g.tolist() for g in grads], "lrs": lrs,
            "norms": norms, "p": torch.cat([a.detach(), b.detach()]).tolist()}


if __name__ == "__main__":
    out = os.path.join(HERE, "golden")
    os.makedirs(out, exist_ok=True)
    jobs = [(f"model_grads_{k}.json", lambda c=c: model_grads(c)) for k, c in CONFIGS.items()]
    jobs.append(("bert_mlm.json", lambda: bert_mlm(os.path.join(out, "bert_mlm"))))
    for name, fn in jobs + [("adamw.json", adamw)]:
        with open(os.path.join(out, name), "w") as f:
            json.dump(fn(), f)
        print("wrote", os.path.join(out, name))
