"""How much nanoGPT's validation estimate moves for one trained model.

nanoGPT's README quotes one run's validation loss as the mean over eval_iters = 20 random batches of
12 windows of 64 characters (240 windows, drawn uniformly from the validation split). This script
takes a `qkv train` checkpoint (nanoGPT parameter names; the model configuration in its metadata),
computes the loss of each of N uniformly drawn validation windows with the PyTorch twin's model
(bench/train_gpt_torch.py), and reports the windows' mean (the loss such estimates scatter around),
the standard error of a 240-window estimate, and, by drawing 240 of the N windows 20,000 times,
the 5th–95th percentile of the estimate and how often it falls at or below 1.88 and 1.90.

    python3 bench/val_estimate_spread.py --checkpoint DIR/checkpoint.safetensors \
        --data data/tinyshakespeare/input.txt [--windows 24000] [--threads 2]
"""
import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_gpt_torch import GPT  # noqa: E402


@torch.no_grad()
def window_losses(model, val, starts, T):
    """Mean cross-entropy of each window val[s:s+T] → val[s+1:s+1+T], one value per start."""
    out = []
    for i in range(0, len(starts), 256):
        ix = starts[i:i + 256]
        x = torch.stack([val[s:s + T] for s in ix])
        y = torch.stack([val[s + 1:s + 1 + T] for s in ix])
        h = model.transformer.wte(x) + model.transformer.wpe(torch.arange(T))
        for blk in model.transformer.h:
            h = blk(h)
        logits = model.transformer.ln_f(h) @ model.transformer.wte.weight.t()
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        out.append(ce.view(len(ix), T).mean(dim=1))
    return torch.cat(out).double()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--windows", type=int, default=24000, help="validation windows to score")
    p.add_argument("--eval-iters", type=int, default=20, help="nanoGPT's eval_iters in the README's CPU run")
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)

    with safe_open(a.checkpoint, "pt") as f:
        meta = f.metadata()
    cfg, run = json.loads(meta["model"]), json.loads(meta["run"])
    if run["tokenizer"] != "chars":
        sys.exit(f"{a.checkpoint}: tokenizer {run['tokenizer']}; this script reads character-level runs")
    T = cfg["context"]
    model = GPT(cfg["vocab"], T, cfg["layers"], cfg["heads"], cfg["embd"], bool(cfg["bias"]))
    sd = load_file(a.checkpoint)
    model.load_state_dict({k: v for k, v in sd.items() if k in dict(model.named_parameters())}, strict=True)
    model.eval()

    text = open(a.data, "rb").read()
    chars = sorted(set(text))
    if len(chars) != cfg["vocab"]:
        sys.exit(f"{a.data}: {len(chars)} distinct bytes, the checkpoint's vocabulary has {cfg['vocab']}")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    val = ids[int((1 - run["val_fraction"]) * len(ids)):]

    g = torch.Generator().manual_seed(0)
    starts = torch.randint(len(val) - T, (a.windows,), generator=g).tolist()  # nanoGPT's get_batch draw
    w = window_losses(model, val, starts, T)
    k = a.eval_iters * a.batch
    mean, sd_w = w.mean().item(), w.std().item()
    draws = w[torch.randint(len(w), (20000, k), generator=g)].mean(dim=1)
    q = torch.quantile(draws, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
    print(f"{a.checkpoint}: {a.windows} windows of {T}; mean loss {mean:.4f} (standard error "
          f"{sd_w / math.sqrt(len(w)):.4f}), per-window std {sd_w:.4f}")
    print(f"a {a.eval_iters}-batch estimate ({k} windows): standard error {sd_w / math.sqrt(k):.4f}, "
          f"5/50/95th percentile {q[0]:.4f} / {q[1]:.4f} / {q[2]:.4f}, "
          f"<= 1.88 in {100 * (draws <= 1.88).double().mean().item():.1f}% of draws, "
          f"<= 1.90 in {100 * (draws <= 1.90).double().mean().item():.1f}%")


if __name__ == "__main__":
    main()
