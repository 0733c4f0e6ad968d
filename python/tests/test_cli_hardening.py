"""Issue #16, item 16: `qkv attend` lines up its grid by display width and never cuts a UTF-8
character; `qkv generate` echoes a prompt's non-ASCII characters.

The oracle for widths is Python's unicodedata (East Asian Width W/F = 2 columns, combining marks =
0), independent of the C++ code's tables.
"""

import pathlib
import shutil
import subprocess
import unicodedata

import pytest

QKV = shutil.which("qkv")
pytestmark = pytest.mark.skipif(QKV is None, reason="the qkv command is not on PATH")


def width(s: str) -> int:
    w = 0
    for ch in s:
        if unicodedata.combining(ch) or unicodedata.category(ch) == "Mn":
            continue
        w += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return w


def run(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([QKV, *args], capture_output=True, timeout=60)
    print(r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace"))
    return r


@pytest.mark.parametrize("text", [
    "日本語の文章です café ñandú",                  # wide characters, a 2-byte é, words longer than a column
    "e\u0301te\u0301 naïve 東京タワーは高い ok",     # combining acute accents (zero width)
    "Ünïcödé-wörds-that-are-long 猫猫猫猫猫猫猫猫",  # cuts fall next to multi-byte characters
])
def test_attend_grid_columns_line_up_in_display_width(text):
    r = run("attend", "--text", text, "--heads", "1")
    assert r.returncode == 0
    out = r.stdout.decode("utf-8")  # raises if a character was cut in half
    lines = out.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("head 0:")) + 1
    words = text.split()
    grid = lines[start:start + 1 + len(words)]  # the header row, then one row per key
    widths = {width(l) for l in grid}
    # Every row: a 10-column label, then one 9-column cell per query.
    assert widths == {10 + 9 * len(words)}, [(width(l), l) for l in grid]
    # Each row's label is its word, or the word's first characters followed by '~'.
    for word, row in zip(words, grid[1:]):
        label = row.split()[0]
        assert label == word or (label.endswith("~") and word.startswith(label[:-1])), (word, label)


def test_generate_echoes_non_ascii_prompt():
    # Characters outside stories260K's 512 tokens go through byte-fallback tokens, one byte each;
    # before the fix every byte >= 0x80 was dropped as "unprintable".
    r = run("generate", "--prompt", "Café 猫 naïve", "--steps", "30", "--temperature", "0")
    assert r.returncode == 0
    assert r.stdout.decode("utf-8").startswith("Café 猫 naïve")
