#!/usr/bin/env python3
"""The PyTorch eager twin of `qkv train` for GPT-2 style character-level models.

Same model (learned positions, LayerNorm, causal attention, MLP 4x with the exact GELU (nn.GELU(),
as nanoGPT), tied embeddings, optional biases), same init scheme (nanoGPT's: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L)), zero
biases, unit LayerNorm gains), same optimiser (AdamW, decay on matrices only, clipping, warmup +
cosine), same tokens (the sorted distinct characters of the corpus, first 90% train), and the same
batches: offsets drawn from the same xoshiro256** stream qkv uses (src/train/rng.hpp).

    OMP_WAIT_POLICY=PASSIVE python3 bench/train_gpt_torch.py --data data/tinyshakespeare/input.txt \
        --steps 2000 --threads 2

Prints steps/s (training steps only, evaluation excluded) and the validation losses, and with
--json FILE writes them as JSON. --init FILE starts from the weights of a qkv checkpoint
(safetensors, qkv's tensor names) instead of a fresh initialisation.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

M64 = (1 << 64) - 1


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Rng:
    """xoshiro256** seeded by splitmix64, bit for bit as qkv::train::Rng."""

    def __init__(self, seed):
        self.s = []
        z = seed & M64
        for _ in range(4):
            z = (z + 0x9E3779B97F4A7C15) & M64
            x = z
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(x ^ (x >> 31))

    def next(self):
        s = self.s
        r = (_rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return r

    def below(self, n):
        return self.next() % n


def batch(data, rng, B, T):
    """x, y: [B, T] int64; window b starts at rng.below(len(data) - T)."""
    ix = [rng.below(len(data) - T) for _ in range(B)]
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + T] for i in ix])
    return x, y


class Block(nn.Module):
    def __init__(self, C, H, bias):
        super().__init__()
        self.H = H
        self.ln_1 = nn.LayerNorm(C, bias=bias)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(C, 3 * C, bias=bias)
        self.attn.c_proj = nn.Linear(C, C, bias=bias)
        self.ln_2 = nn.LayerNorm(C, bias=bias)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(C, 4 * C, bias=bias)
        self.mlp.c_proj = nn.Linear(4 * C, C, bias=bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self, V, T, L, H, C, bias):
        super().__init__()
        self.transformer = nn.Module()
        self.transformer.wte = nn.Embedding(V, C)
        self.transformer.wpe = nn.Embedding(T, C)
        self.transformer.h = nn.ModuleList([Block(C, H, bias) for _ in range(L)])
        self.transformer.ln_f = nn.LayerNorm(C, bias=bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(T))
        for blk in self.transformer.h:
            x = blk(x)
        logits = self.transformer.ln_f(x) @ self.transformer.wte.weight.t()  # tied unembedding
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def lr_at(step, a):
    """nanoGPT's get_lr: linear warmup, cosine decay to min_lr at lr_decay_iters."""
    if step < a.warmup:
        return a.lr * (step + 1) / (a.warmup + 1)
    if step > a.steps:
        return a.min_lr
    ratio = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (a.lr - a.min_lr)


@torch.no_grad()
def evaluate(model, data, a):
    rng = Rng(a.seed ^ 0x5EED_E7A1)  # the fixed validation batches of qkv (same stream every time)
    model.eval()
    losses = [model(*batch(data, rng, a.batch, a.context)).item() for _ in range(a.eval_batches)]
    model.train()
    return sum(losses) / len(losses)


def nanogpt_state(sd, L):
    """A qkv train checkpoint's (or model.safetensors') tensors, under qkv's names, as this model's state_dict."""
    out = {"transformer.wte.weight": sd["tok_embeddings.weight"], "transformer.wpe.weight": sd["pos_embeddings.weight"],
           "transformer.ln_f.weight": sd["norm.weight"]}
    pairs = [("attention_norm", "ln_1"), ("attention.wo", "attn.c_proj"), ("ffn_norm", "ln_2"),
             ("feed_forward.w1", "mlp.c_fc"), ("feed_forward.w2", "mlp.c_proj")]
    for suffix in ("weight", "bias"):
        if f"norm.{suffix}" in sd:
            out[f"transformer.ln_f.{suffix}"] = sd[f"norm.{suffix}"]
        for l in range(L):
            q, h = f"layers.{l}.", f"transformer.h.{l}."
            for src, dst in pairs:
                if f"{q}{src}.{suffix}" in sd:
                    out[f"{h}{dst}.{suffix}"] = sd[f"{q}{src}.{suffix}"]
            if f"{q}attention.wq.{suffix}" in sd:  # c_attn = [W_Q; W_K; W_V] stacked by rows
                out[f"{h}attn.c_attn.{suffix}"] = torch.cat([sd[f"{q}attention.{m}.{suffix}"] for m in ("wq", "wk", "wv")])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--bias", type=int, default=0)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--eval-interval", type=int, default=250)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--init", help="safetensors file with the initial weights (a qkv train checkpoint, qkv's names)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    text = open(a.data, "rb").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    n = int(0.9 * len(ids))
    train, val = ids[:n], ids[n:]

    model = GPT(len(chars), a.context, a.layers, a.heads, a.embd, bool(a.bias))
    if a.init:
        from safetensors.torch import load_file
        model.load_state_dict(nanogpt_state(load_file(a.init), a.layers), strict=True)
    decay = [p_ for p_ in model.parameters() if p_.dim() >= 2]
    other = [p_ for p_ in model.parameters() if p_.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8)
    rng = Rng(a.seed)
    curve, train_time = [], 0.0
    for step in range(a.steps + 1):
        if step % a.eval_interval == 0 or step == a.steps:
            vl = evaluate(model, val, a)
            curve.append((step, vl))
            print(f"step {step:5d}  val {vl:.4f}", flush=True)
        if step == a.steps:
            break
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        loss = model(*batch(train, rng, a.batch, a.context))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        train_time += time.perf_counter() - t0
    sps = a.steps / train_time
    print(f"torch eager: {sps:.2f} steps/s over {a.steps} steps, {a.threads} threads; final val {curve[-1][1]:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps_per_s": sps, "val_curve": curve, "threads": a.threads, "torch": torch.__version__}, f)


if __name__ == "__main__":
    main()
