"""The long `qkv inspect` page: compute time, page size and render time in a headless Chromium.

stories260K (5 layers × 8 heads) at 512 tokens and, through a copy whose header allows 1,024
(tests/inspect/long_context.py), at 1,000 tokens. Each round, for each length:
  compute  the wall and CPU time (user + system, getrusage of the child) of
           `qkv inspect --prompt … --out DIR` (load, tokenise, traced forward,
           attribution, lens, the page's encoding and the PNGs; the ablation table is skipped by
           `auto` at these lengths: 2·L·H reruns would cost > 1e10 FLOP);
  size     index.html in bytes;
  ready    seconds from navigation until the page has drawn every thumbnail and its first head
           (body[data-ready]), in Debian's chromium (tests/inspect/browser.py), a fresh load;
  redraw   one redraw of all 40 thumbnails (drawAllSmall) and one scrolled redraw of the open head.
Medians over the rounds; the load average is printed with the table.

    python3 bench/inspect_long.py [--qkv build-ci/qkv] [--rounds 3] [--out bench/results/inspect_long.md]
"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "inspect"))
from browser import Browser  # noqa: E402
from long_context import PROMPT_1000, STORY, stories260k_with_context  # noqa: E402

PROMPT_512 = STORY * 16 + "Once upon a time, there was a little girl named Lily."  # 512 tokens with BOS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build-ci", "qkv"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "inspect_long.md"))
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="qkv-inspect-bench-")
    models = {512: os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin"),
              1000: stories260k_with_context(os.path.join(ROOT, "data", "models", "stories260K"),
                                             os.path.join(tmp, "model1024"))}
    prompts = {512: PROMPT_512, 1000: PROMPT_1000}
    rows = {n: {"compute": [], "cpu": [], "size": [], "ready": [], "thumbs": [], "scroll": []} for n in prompts}
    load0 = os.getloadavg()
    browser = Browser()
    try:
        for r in range(a.rounds):
            for n in prompts:
                out = os.path.join(tmp, f"page{n}")
                t, u = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run([a.qkv, "inspect", "--model", models[n], "--prompt", prompts[n], "--out", out],
                               check=True, capture_output=True)
                rows[n]["compute"].append(time.perf_counter() - t)
                v = resource.getrusage(resource.RUSAGE_CHILDREN)
                rows[n]["cpu"].append(v.ru_utime + v.ru_stime - u.ru_utime - u.ru_stime)
                page = os.path.join(out, "index.html")
                rows[n]["size"].append(os.path.getsize(page))
                rows[n]["ready"].append(browser.open(page))
                S = browser.eval("S")
                assert S == n, f"the {n}-token prompt gave {S} tokens"
                rows[n]["thumbs"].append(browser.eval(
                    "(() => { const t = performance.now(); drawAllSmall(); return performance.now() - t; })()") / 1e3)
                rows[n]["scroll"].append(browser.eval("""(() => { const t = performance.now();
                    for (let i = 0; i < 10; i++) { wrap.scrollTop = 300 * i; wrap.scrollLeft = 200 * i; drawDetail(); }
                    return (performance.now() - t) / 10; })()""") / 1e3)
                print(f"round {r}, {n} tokens: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in rows[n].items()), flush=True)
    finally:
        browser.close()
    load1 = os.getloadavg()
    med = {n: {k: statistics.median(v) for k, v in rows[n].items()} for n in rows}
    lines = [f"`python3 bench/inspect_long.py --rounds {a.rounds}`, stories260K, medians of {a.rounds}; "
             f"load {load0[0]:.1f} before, {load1[0]:.1f} after; {os.cpu_count()} cores.", "",
             "| tokens | qkv inspect wall (CPU) | index.html | page ready (chromium, wall) | 40 thumbnails redrawn | scroll redraw |",
             "|---|---|---|---|---|---|"]
    for n, m in med.items():
        lines.append(f"| {n} | {m['compute']:.1f} s ({m['cpu']:.1f} s) | {m['size'] / 1e6:.2f} MB | {m['ready']:.2f} s | "
                     f"{m['thumbs'] * 1e3:.0f} ms | {m['scroll'] * 1e3:.1f} ms |")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
