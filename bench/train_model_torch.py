#!/usr/bin/env python3
"""The PyTorch peer of `qkv train` for any architecture: tools/torch_train_twin.py's model (qkv's config,
SDPA attention) trained on a character-level corpus with the same optimiser settings, to compare steps/s.

    python3 bench/train_model_torch.py --data data/tinyshakespeare/input.txt --config runs/llama/model.json \\
        --steps 200 --threads 2 [--compile]

--config: the model.json `qkv train` wrote (vocab_size must be the corpus's character count). Batches are
drawn uniformly as qkv draws them (another generator: the speed, not the curve, is compared). Prints the
mean training loss of the last 10 steps and the steps per second after --warmup-steps untimed steps.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from torch_train_twin import TwinModel  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--context", type=int, default=0, help="0: the config's seq_len")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    cfg = json.load(open(a.config))
    text = open(a.data, encoding="utf-8").read()
    chars = sorted(set(text))
    if len(chars) != cfg["vocab_size"]:
        sys.exit(f"--config: vocab_size {cfg['vocab_size']} is not the corpus's {len(chars)} characters")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text])
    T = a.context or cfg["seq_len"]
    model = TwinModel(cfg, sdpa=True)
    with torch.no_grad():
        for n, w in model.named().items():
            if w.dim() == 2:
                w.normal_(0.0, 0.02)
            else:
                w.fill_(0.0 if n.endswith(".bias") else 1.0)
    decay = [w for w in model.parameters() if w.dim() == 2]
    rest = [w for w in model.parameters() if w.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8, foreach=True)
    step_fn = torch.compile(model) if a.compile else model
    losses = []

    def step():
        i = torch.randint(0, len(ids) - T - 1, (a.batch,))
        x = torch.stack([ids[j:j + T] for j in i])
        y = torch.stack([ids[j + 1:j + T + 1] for j in i])
        loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())

    for _ in range(a.warmup_steps):
        step()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    dt = time.perf_counter() - t0
    print(f"torch{' compile' if a.compile else ' eager'}: {a.steps / dt:.2f} steps/s, "
          f"train loss {sum(losses[-10:]) / 10:.4f} after {len(losses)} steps")


if __name__ == "__main__":
    main()
