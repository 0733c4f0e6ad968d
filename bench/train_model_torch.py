#!/usr/bin/env python3
"""One PyTorch contender of bench/train_bench.py: tools/torch_train_twin.py's model (qkv's config, SDPA
attention), eager or torch.compile'd, trained from the initial weights of a `qkv train` run on the very batches
qkv draws, with qkv's optimiser settings, timed step by step.

    python3 bench/train_model_torch.py --data data/tinyshakespeare/input.txt --init /tmp/tb/llama \\
        --steps 200 --threads 2 --compile max-autotune-no-cudagraphs --json out.json

--init: a `qkv train` output folder (checkpoint.safetensors, loss.csv) of one step with a learning rate of 1e-30
(bench/train_bench.py makes it): an update of ~1e-30 rounds away beside weights of order 0.02-1, so the checkpoint
holds qkv's initial weights under qkv's names, its metadata the model config and the run's seed, batch and
context, and loss.csv's step 0 the loss of those weights on the first batch. Before timing anything this script computes that loss itself
and stops unless it agrees (the same weights and tokens, i.e. the same work), then trains --warmup-steps untimed
steps (where torch.compile compiles; their wall time is reported as compile_s) and --steps timed ones.

A training step is what one `qkv train` step is: draw the batch (xoshiro256** offsets, bench/train_gpt_torch.py's
Rng), set the learning rate (nanoGPT's warmup + cosine), forward, zero_grad, backward, clip to norm 1, AdamW
(0.9, 0.99, eps 1e-8, weight decay 0.1 on matrices and embeddings). Per step the wall time (perf_counter) and
the process's CPU time (process_time: all its threads) are recorded; the JSON holds both lists.
"""
import argparse
import csv
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
from torch_train_twin import TwinModel  # noqa: E402
from train_gpt_torch import Rng, batch, lr_at  # noqa: E402

# loss.csv prints the loss with 6 decimals; qkv and torch sum the same f32 products in different orders, which
# moves a mean cross-entropy near 4.2 by a few 1e-7: 2e-5 passes those, and any difference in the work (a
# missing scale, another batch, another weight) moves the loss by far more.
LOSS_TOL = 2e-5


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--init", required=True, help="a qkv train output folder holding the initial weights")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup-steps", type=int, default=5, help="untimed steps first (torch.compile compiles here)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--compile", default="", help="a torch.compile mode (default, max-autotune-no-cudagraphs, ...); "
                                                 "empty: eager")
    p.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) instead of foreach")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from safetensors import safe_open
    from safetensors.torch import load_file
    ckpt = os.path.join(a.init, "checkpoint.safetensors")
    with safe_open(ckpt, "pt") as f:
        meta = f.metadata()
    cfg, run = json.loads(meta["model"]), json.loads(meta["run"])
    B, T, seed = run["batch"], run["context"], run["seed"]
    text = open(a.data, "rb").read()  # qkv's chars tokenizer: the sorted distinct characters (ASCII corpus)
    chars = sorted(set(text))
    if len(chars) != cfg["vocab_size"]:
        sys.exit(f"train_model_torch.py: --init's vocab_size {cfg['vocab_size']} is not the corpus's {len(chars)} "
                 "characters")
    stoi = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([stoi[c] for c in text], dtype=torch.int64)
    train = ids[:int(0.9 * len(ids))]  # qkv's --val-fraction 0.1

    model = TwinModel(cfg, sdpa=True)
    weights = load_file(ckpt)
    with torch.no_grad():
        for n, w in model.named().items():
            w.copy_(weights[n])
    with open(os.path.join(a.init, "loss.csv")) as f:
        qkv_loss0 = float(next(r for r in csv.DictReader(f) if r["step"] == "0")["train_loss"])
    rng = Rng(seed)
    with torch.no_grad():
        loss0 = model(*batch(train, rng, B, T)).item()
    if abs(loss0 - qkv_loss0) > LOSS_TOL:
        sys.exit(f"train_model_torch.py: step 0 loss {loss0:.6f} is not qkv's {qkv_loss0:.6f} (tolerance {LOSS_TOL}): "
                 "the two would not do the same work")
    rng = Rng(seed)  # step 0 draws the batch just checked

    decay = [w for w in model.parameters() if w.dim() == 2]
    rest = [w for w in model.parameters() if w.dim() < 2]
    kind = {"fused": True} if a.fused_adamw else {"foreach": True}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), eps=1e-8, **kind)
    sched = argparse.Namespace(lr=1e-3, min_lr=1e-4, warmup=100, steps=a.warmup_steps + a.steps)
    fwd = torch.compile(model, mode=a.compile) if a.compile else model
    wall, cpu, losses = [], [], []
    for step in range(a.warmup_steps + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = batch(train, rng, B, T)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, sched)
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    timed_wall, timed_cpu = wall[a.warmup_steps:], cpu[a.warmup_steps:]
    out = {"mode": a.compile or "eager", "fused_adamw": a.fused_adamw, "threads": a.threads, "torch": torch.__version__,
           "loss0": loss0, "qkv_loss0": qkv_loss0, "compile_s": sum(wall[:a.warmup_steps]),
           "steps": a.steps, "steps_per_s": a.steps / sum(timed_wall), "cpu_s_per_step": sum(timed_cpu) / a.steps,
           "final_train_loss": losses[-1], "wall": timed_wall, "cpu": timed_cpu}
    print(f"torch {out['mode']}: {out['steps_per_s']:.2f} steps/s, {out['cpu_s_per_step'] * 1e3:.1f} CPU ms/step, "
          f"warmup {out['compile_s']:.1f} s; step 0 loss {loss0:.6f} (qkv {qkv_loss0:.6f}), last {losses[-1]:.4f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
