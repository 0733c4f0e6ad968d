#!/usr/bin/env python3
"""Writes the golden files that tie qkv's training to PyTorch (checked by tests/train/test_train_torch.cpp).

  gpt_grads.json   a tiny GPT (bench/train_gpt_torch.py's model, f64) with order-1 random weights,
                   one batch; the mean cross-entropy and the gradient of every parameter (autograd)
  adamw.json       three steps of torch.optim.AdamW (decay on a subset, clip_grad_norm_ before
                   each step) on f32 tensors: inputs, learning rates, and the parameters after

    python3 tests/train/make_golden.py        (rerun only when the model or optimiser changes)
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
from train_gpt_torch import GPT  # noqa: E402


def gpt_grads():
    torch.manual_seed(0)
    V, T, L, H, C, B = 7, 6, 2, 2, 8, 3
    model = GPT(V, T, L, H, C, bias=True).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
            p.copy_(p.float().double())  # f32-representable, so the f32 model sees the very same weights
    x = torch.randint(0, V, (B, T))
    y = torch.randint(0, V, (B, T))
    loss = model(x, y)
    loss.backward()
    return {
        "config": {"vocab": V, "context": T, "layers": L, "heads": H, "embd": C, "bias": True, "batch": B},
        "tokens": x.flatten().tolist(), "targets": y.flatten().tolist(),
        "params": {n: p.detach().flatten().tolist() for n, p in model.named_parameters()},
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
    for name, fn in (("gpt_grads.json", gpt_grads), ("adamw.json", adamw)):
        with open(os.path.join(out, name), "w") as f:
            json.dump(fn(), f)
        print("wrote", os.path.join(out, name))
