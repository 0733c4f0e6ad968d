"""The README's picture of `qkv inspect`: the page's answer to "which head made the model predict
this token, and by looking at which earlier token" — the direct logit attribution map of
stories260K on the seed sentence, with the head that pushes the prediction most opened beside it
(its push, the tokens it pushes up and down, the key its last query attends most).

It runs the real `qkv inspect`, opens the page in Debian's chromium (tests/inspect/browser.py) and
saves that section of the page, scaled down, as a small PNG:

    python3 scripts/inspect_picture.py [--qkv build/qkv] [--out docs/inspect-readme.png] [--scale 0.7]
"""
import argparse
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "inspect"))
from browser import Browser  # noqa: E402

PROMPT = "a fluffy blue creature roamed the verdant forest"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qkv", default=os.path.join(ROOT, "build", "qkv"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "inspect-readme.png"))
    ap.add_argument("--scale", type=float, default=0.7)
    a = ap.parse_args()
    model = os.path.join(ROOT, "data", "models", "stories260K", "stories260K.bin")
    with tempfile.TemporaryDirectory(prefix="qkv-picture-") as out:
        subprocess.run([a.qkv, "inspect", "--model", model, "--prompt", PROMPT, "--out", out],
                       check=True, capture_output=True)
        b = Browser(width=1200, height=900)
        try:
            b.open(os.path.join(out, "index.html"))
            # The page opens the predicted token and its strongest head; the section holds the map,
            # the head's detail and the parts' sum.
            r = b.eval("""(() => { tip.style.display = 'none'; const s = document.getElementById('attr-section');
                s.scrollIntoView(); const r = s.getBoundingClientRect();
                return {x: r.left + window.scrollX, y: r.top + window.scrollY, width: r.width, height: r.height}; })()""")
            head = b.eval("document.querySelector('#attr-detail h2').textContent")
            b.screenshot(a.out, clip={**r, "scale": a.scale})
        finally:
            b.close()
    print(f"{a.out}: {os.path.getsize(a.out) / 1e3:.0f} kB, {head}")


if __name__ == "__main__":
    main()
