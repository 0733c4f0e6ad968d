"""The long `qkv inspect` page: compute time, page size and render time in a headless Chromium,
beside bertviz's model view (the peer) of the same attention patterns.

stories260K (5 layers × 8 heads) at 128 and 512 tokens and, through a copy whose header allows
1,024 (tests/inspect/long_context.py), at 1,000 tokens. Each round, for each length:
  compute  the wall and CPU time (user + system, getrusage of the child) of
           `qkv inspect --prompt … --out DIR` (load, tokenise, traced forward,
           attribution, lens, the page's encoding and the PNGs; the ablation table is skipped by
           `auto` at these lengths: 2·L·H reruns would cost > 1e10 FLOP);
  size     index.html in bytes;
  ready    seconds from navigation until the page has drawn every thumbnail and its first head
           (body[data-ready]), in Debian's chromium (tests/inspect/browser.py), a fresh load;
  redraw   one redraw of all 40 thumbnails (drawAllSmall) and one scrolled redraw of the open head.
bertviz (when it is installed; skipped with a message otherwise), the same rounds and lengths:
  compute  wall and CPU time (this process) of qkv.Model.trace's patterns → bertviz.model_view(...,
           html_action="return"), bertviz's own work: it takes the patterns as given;
  size     its HTML (require.js, d3 and jQuery are fetched from a CDN by bertviz's page; here they are
           Debian's libjs-requirejs, libjs-d3 (3.5, with d3.schemeCategory10 defined from its
           category10) and libjs-jquery, loaded from /usr/share/javascript and not counted);
  ready    seconds from navigation until all 40 thumbnails are drawn (bertviz draws them in one
           task: the first evaluation that can run sees them all), at most --bertviz-timeout.
Medians over the rounds. Through bench/report.py: the machine line (bench_attention --peak beside --qkv before and
after, when built; the load after every round), bench/results/NAME.{md,json} and the plot NAME.png (page size and
time until drawn, qkv beside bertviz).

    python3 bench/inspect_long.py [--qkv build-ci/qkv] [--rounds 3] [--name inspect_long] [--bertviz-timeout 120]
"""
import argparse
import importlib.metadata
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "inspect"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import report  # noqa: E402
from browser import Browser  # noqa: E402
from long_context import PROMPT_1000, STORY, stories260k_with_context  # noqa: E402

PROMPT_128 = STORY * 4 + "Once upon a"  # 128 tokens with BOS
PROMPT_512 = STORY * 16 + "Once upon a time, there was a little girl named Lily."  # 512 tokens with BOS
JS = "/usr/share/javascript"
BERTVIZ_LIBS = {  # bertviz's CDN addresses → Debian's files
    "https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js": f"file://{JS}/requirejs/require.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min": f"file://{JS}/d3/d3.min",
    "https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min": f"file://{JS}/jquery/jquery.min",
}


def bertviz_page(model_path, prompt, path):
    """bertviz's model view of qkv's patterns for `prompt`: (wall s, CPU s, bytes) of making it."""
    import bertviz
    import qkv
    import torch
    model = qkv.Model.load(model_path)
    tok = qkv.Tokenizer.load(os.path.join(os.path.dirname(model_path), "tok512.bin"), model.config["vocab_size"])
    ids = tok.encode(prompt)
    tr = model.trace(ids)
    tokens = ["<s>"] + [tok.piece(a, b).decode("utf-8", "replace") for a, b in zip(ids, ids[1:])]
    t, c = time.perf_counter(), time.process_time()
    attention = [torch.from_numpy(layer.pattern)[None] for layer in tr.layers]
    html = bertviz.model_view(attention, tokens, html_action="return").data
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    for cdn, local in BERTVIZ_LIBS.items():
        html = html.replace(cdn, local)
    # d3 3.5 has category10 where bertviz (written for d3 5) reads schemeCategory10.
    html = html.replace("requirejs(['jquery', 'd3'], function($, d3) {",
                        "requirejs(['jquery', 'd3'], function($, d3) {\n"
                        "  if (!d3.schemeCategory10) d3.schemeCategory10 = d3.scale.category10().range();")
    with open(path, "w") as f:
        f.write("<!DOCTYPE html><html><body>" + html + "</body></html>")
    return wall, cpu, len(ids)


def bertviz_ready(browser, path, n_thumbs, timeout):
    """Seconds from navigation until bertviz has drawn n_thumbs thumbnails, or None after timeout."""
    t0 = time.monotonic()
    browser.call("Page.navigate", session=True, url="file://" + os.path.abspath(path))
    while time.monotonic() - t0 < timeout:
        try:
            if browser.eval(f"document.querySelectorAll('[id^=attn_background_]').length === {n_thumbs}",
                            timeout=max(1.0, timeout - (time.monotonic() - t0))):
                return time.monotonic() - t0
        except RuntimeError:  # no page to evaluate in yet (navigating)
            pass
        except TimeoutError:  # the page busy drawing past the timeout
            return None
        time.sleep(0.05)
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build-ci", "qkv"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--name", default="inspect_long", help="writes bench/results/NAME.{md,json,png}")
    ap.add_argument("--bertviz-timeout", type=float, default=120.0)
    a = ap.parse_args()
    try:
        import bertviz  # noqa: F401
        import qkv  # noqa: F401  (the patterns bertviz is given)
        peer = all(os.path.exists(p[len("file://"):] + (".js" if not p.endswith(".js") else ""))
                   for p in BERTVIZ_LIBS.values())
        if not peer:
            print("bertviz: skipped (Debian's libjs-requirejs, libjs-d3, libjs-jquery are not installed)")
    except ImportError as e:
        peer = False
        print(f"bertviz: skipped ({e}; pip install bertviz, and the qkv package)")
    tmp = tempfile.mkdtemp(prefix="qkv-inspect-bench-")
    models = {128: os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin"),
              512: os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin"),
              1000: stories260k_with_context(os.path.join(ROOT, "data", "models", "stories260K"),
                                             os.path.join(tmp, "model1024"))}
    prompts = {128: PROMPT_128, 512: PROMPT_512, 1000: PROMPT_1000}
    rows = {n: {"compute": [], "cpu": [], "size": [], "ready": [], "thumbs": [], "scroll": []} for n in prompts}
    peer_rows = {n: {"compute": [], "cpu": [], "size": [], "ready": []} for n in prompts}
    build = os.path.dirname(os.path.abspath(a.qkv))
    before = report.measure_peak(build)
    loads = [report.loadavg()]
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
                if not peer:
                    continue
                page = os.path.join(tmp, f"bertviz{n}.html")
                wall, cpu, S = bertviz_page(models[n], prompts[n], page)
                assert S == n, f"the {n}-token prompt gave {S} tokens"
                peer_browser = Browser()  # its own: a page still drawing at the timeout is closed with it
                try:
                    ready = bertviz_ready(peer_browser, page, 40, a.bertviz_timeout)
                finally:
                    peer_browser.close()
                for k, v in (("compute", wall), ("cpu", cpu), ("size", os.path.getsize(page)),
                             ("ready", float("inf") if ready is None else ready)):
                    peer_rows[n][k].append(v)
                print(f"round {r}, {n} tokens, bertviz: " + ", ".join(f"{k} {v[-1]:.3g}" for k, v in peer_rows[n].items()),
                      flush=True)
            loads.append(report.loadavg())
    finally:
        browser.close()
    after = report.measure_peak(build)
    machine = report.machine_line(before, after, loads)
    med = {n: {k: statistics.median(v) for k, v in rows[n].items()} for n in rows}
    lines = [f"stories260K, medians of {a.rounds}; {os.cpu_count()} cores.", "",
             "| tokens | qkv inspect wall (CPU) | index.html | page ready (chromium, wall) | 40 thumbnails redrawn | scroll redraw |",
             "|---|---|---|---|---|---|"]
    for n, m in med.items():
        lines.append(f"| {n} | {m['compute']:.1f} s ({m['cpu']:.1f} s) | {m['size'] / 1e6:.2f} MB | {m['ready']:.2f} s | "
                     f"{m['thumbs'] * 1e3:.0f} ms | {m['scroll'] * 1e3:.1f} ms |")
    if peer:
        lines += ["", f"bertviz {importlib.metadata.version('bertviz')} model view of the same "
                  f"patterns (∞: not drawn within {a.bertviz_timeout:.0f} s):", "",
                  "| tokens | bertviz model_view wall (CPU) | its HTML | page ready (chromium, wall) |", "|---|---|---|---|"]
        for n in prompts:
            m = {k: statistics.median(v) for k, v in peer_rows[n].items()}
            ready = "∞" if m["ready"] == float("inf") else f"{m['ready']:.2f} s"
            lines.append(f"| {n} | {m['compute']:.2f} s ({m['cpu']:.2f} s) | {m['size'] / 1e6:.2f} MB | {ready} |")
    print("\n".join(lines) + "\n" + machine)
    report.write_results(a.name, report.command_line(), machine, "\n".join(lines),
                         {"rounds": a.rounds, "qkv": rows, "bertviz": peer_rows if peer else None, "loads": loads,
                          "before": before, "after": after})
    lengths = list(prompts)
    peer_med = {n: {k: statistics.median(v) for k, v in peer_rows[n].items()} for n in lengths} if peer else {}
    # A page bertviz did not draw within the timeout has no time to show (None leaves its bar out).
    peer_ready = [None if not peer or peer_med[n]["ready"] == float("inf") else peer_med[n]["ready"] for n in lengths]
    report.bar_plot(a.name + ".png", "qkv inspect's page beside bertviz's model view (stories260K; log axis)",
                    [f"{n} tokens" for n in lengths],
                    {"qkv: page MB": [med[n]["size"] / 1e6 for n in lengths],
                     "qkv: s until drawn": [med[n]["ready"] for n in lengths],
                     "bertviz: page MB": [peer_med[n]["size"] / 1e6 if peer else None for n in lengths],
                     "bertviz: s until drawn": peer_ready},
                    "MB / seconds", machine, log=True)


if __name__ == "__main__":
    main()
