"""qkv's model beside a plain PyTorch implementation (eager, KV cache; tools/torch_model.py with
F.scaled_dot_product_attention), same shapes, same run, batch 1. Prints the table of BENCHMARKS.md.

Rows per model: qkv with fp32 weights against torch fp32 (the same arithmetic); qkv with bf16
weights (ModelOptions::weights) against torch at its best, i.e. the faster of its fp32 and bf16
(every tensor bfloat16) modes, chosen separately for prefill and decode and named in the table;
the same with bf16 GEMM inputs (ModelOptions::gemm_inputs: prefill rounds each projection's input
rows to bf16 too, as torch's bf16 mode does); then torch bf16's own figures.

    python3 bench/model_peer.py [--build build] [--repeats 5] [--rounds 3]

The two engines alternate: each of --rounds rounds runs every qkv mode (bench/bench_model, a fresh
process, --repeats prefills and decodes after a warm-up) and then every torch mode (--repeats after
a warm-up) on the same shapes, and each figure is the median over all rounds' repeats (rounds ×
repeats samples per side). On a shared machine whose speed moves by the minute, alternating keeps
both sides in the same conditions; one round is the old one-pass order.

Both sides compute the last position's logits only in prefill, and past the last layer's attention
they finish that layer for the last position only (its other rows feed nothing but their cached keys
and values): Model::forward's default and TorchModel.forward(all_logits=False).

stories260K: prompt 128 tokens, decode 128. GPT-2-small shape (12 layers, 12 heads, d_model 768,
context 1024, vocab 50257, random weights): prompt 512, decode 64. Medians of the repeats.

Through bench/report.py: the machine line (bench_attention --peak in --build before and after, when built, and the
load after every round), bench/results/NAME.{md,json} and the plot NAME.png of the ratios (--name, default
model_peer).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from torch_model import TorchModel, load_llama2c  # noqa: E402


def torch_speed(model, vocab, prompt, decode, repeats):
    """Lists of prefill and decode tokens/s, one per repeat after a warm-up."""
    tokens = [(i * 7919 + 1) % vocab for i in range(prompt + decode)]
    pre, dec = [], []
    for r in range(repeats + 1):
        cache = model.new_cache()
        t0 = time.perf_counter()
        model.forward(tokens[:prompt], cache, 0, all_logits=False)
        t1 = time.perf_counter()
        for s in range(prompt, prompt + decode):
            model.forward(tokens[s:s + 1], cache, s, all_logits=False)
        t2 = time.perf_counter()
        if r:
            pre.append(prompt / (t1 - t0))
            dec.append(decode / (t2 - t1))
    return pre, dec


def gpt2_small_params():
    g = torch.Generator().manual_seed(1)
    C, Hd, L, V, P = 768, 3072, 12, 50257, 1024
    p = {"tok_embeddings.weight": 0.02 * torch.randn(V, C, generator=g),
         "pos_embeddings.weight": 0.02 * torch.randn(P, C, generator=g),
         "norm.weight": torch.ones(C), "norm.bias": torch.zeros(C)}
    for l in range(L):
        q = f"layers.{l}."
        for n in ("attention_norm", "ffn_norm"):
            p[q + n + ".weight"], p[q + n + ".bias"] = torch.ones(C), torch.zeros(C)
        for n, o, i in (("attention.wq", C, C), ("attention.wk", C, C), ("attention.wv", C, C),
                        ("attention.wo", C, C), ("feed_forward.w1", Hd, C), ("feed_forward.w2", C, Hd)):
            p[q + n + ".weight"] = 0.02 * torch.randn(o, i, generator=g)
            p[q + n + ".bias"] = torch.zeros(o)
    cfg = dict(dim=C, hidden_dim=Hd, n_layers=L, n_heads=12, n_kv_heads=12, vocab_size=V, seq_len=P,
               pos="learned", norm="layernorm", mlp="gelu", tied_embeddings=True, bias=True,
               norm_eps=1e-5, rope_theta=10000.0)
    return cfg, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="model_peer", help="writes bench/results/NAME.{md,json,png}")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("QKV_NUM_THREADS", "2")))
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    exe = os.path.join(a.build, "bench", "bench_model")
    before = report.measure_peak(a.build)
    loads = []
    rows = []
    for name, qkv_args, make, prompt, decode in (
            ("stories260K", ["--model", os.path.join(root, "data/models/stories260K/stories260K.bin")],
             lambda: load_llama2c(os.path.join(root, "data/models/stories260K/stories260K.bin")), 128, 128),
            ("GPT-2-small shape", ["--gpt2-small"], gpt2_small_params, 512, 64)):
        cfg, p = make()
        peers = {label: TorchModel(cfg, p, sdpa=True, dtype=dt)
                 for label, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
        qs = {w: ([], []) for w in ("f32", "bf16", "bf16+gemm")}
        ts = {label: ([], []) for label in peers}
        for _ in range(a.rounds):
            for w, extra in (("f32", []), ("bf16", []), ("bf16+gemm", ["--gemm-inputs", "bf16"])):
                out = subprocess.run([exe, *qkv_args, "--prompt", str(prompt), "--decode", str(decode),
                                      "--repeats", str(a.repeats), "--weights", w.split("+")[0], *extra],
                                     check=True, capture_output=True, text=True).stdout
                r = json.loads(out)
                qs[w][0].extend(r["prefill_all"])
                qs[w][1].extend(r["decode_all"])
            for label, model in peers.items():
                pre, dec = torch_speed(model, cfg["vocab_size"], prompt, decode, a.repeats)
                ts[label][0].extend(pre)
                ts[label][1].extend(dec)
            loads.append(report.loadavg())
        q = {w: {"prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec)}
             for w, (pre, dec) in qs.items()}
        t = {label: (statistics.median(pre), statistics.median(dec)) for label, (pre, dec) in ts.items()}
        # qkv fp32 against torch fp32 (same arithmetic); qkv bf16 weights against torch in
        # whichever of its modes is faster, prefill and decode chosen separately.
        best_p = max(t, key=lambda k: t[k][0])
        best_d = max(t, key=lambda k: t[k][1])
        rows.append((name, prompt, decode, "fp32", q["f32"]["prefill_tok_s"], t["fp32"][0], "fp32",
                     q["f32"]["decode_tok_s"], t["fp32"][1], "fp32"))
        rows.append((name, prompt, decode, "bf16", q["bf16"]["prefill_tok_s"], t[best_p][0], best_p,
                     q["bf16"]["decode_tok_s"], t[best_d][1], best_d))
        rows.append((name, prompt, decode, "bf16, bf16 GEMM inputs", q["bf16+gemm"]["prefill_tok_s"], t[best_p][0],
                     best_p, q["bf16+gemm"]["decode_tok_s"], t[best_d][1], best_d))
        rows.append((name, prompt, decode, "(torch bf16)", None, t["bf16"][0], "bf16", None, t["bf16"][1], "bf16"))
        del p, peers
    after = report.measure_peak(a.build)
    machine = report.machine_line(before, after, loads)
    lines = [f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; "
             f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}; medians of {a.rounds} alternating "
             f"rounds x {a.repeats} repeats",
             "",
             "| model | prompt | decode | qkv weights | qkv prefill tok/s | torch prefill tok/s (mode) | ratio "
             "| qkv decode tok/s | torch decode tok/s (mode) | ratio |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, P, N, w, qp, tp, tpm, qd, td, tdm in rows:
        if qp is None:
            lines.append(f"| {n} | {P} | {N} | {w} | | {tp:.0f} (bf16) | | | {td:.1f} (bf16) | |")
            continue
        lines.append(f"| {n} | {P} | {N} | {w} | {qp:.0f} | {tp:.0f} ({tpm}) | {qp / tp:.2f}× "
                     f"| {qd:.1f} | {td:.1f} ({tdm}) | {qd / td:.2f}× |")
    print("\n".join(lines))
    print(machine)
    report.write_results(a.name, report.command_line(), machine, "\n".join(lines),
                         {"rounds": a.rounds, "repeats": a.repeats, "loads": loads, "before": before, "after": after,
                          "rows": [dict(zip(("model", "prompt", "decode", "qkv_weights", "qkv_prefill_tok_s",
                                             "torch_prefill_tok_s", "torch_prefill_mode", "qkv_decode_tok_s",
                                             "torch_decode_tok_s", "torch_decode_mode"), r)) for r in rows]})
    ratio_rows = [r for r in rows if r[4] is not None]
    report.bar_plot(a.name + ".png", "qkv's model against eager PyTorch (KV cache, SDPA), batch 1: speed ratio "
                    "(> 1: qkv faster)", [f"{r[0].replace(' shape', '')}\n{r[3].replace(', bf16 GEMM inputs', ' + GEMM in')}"
                                            for r in ratio_rows],
                    {"prefill": [r[4] / r[5] for r in ratio_rows], "decode": [r[7] / r[8] for r in ratio_rows]},
                    "qkv tok/s ÷ torch tok/s", machine, log=True, ref=1.0)


if __name__ == "__main__":
    main()
