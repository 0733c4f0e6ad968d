"""docs/tutorial.md runs as written, and prints what it shows.

The document is parsed into fenced blocks. A ```sh block runs with bash (`set -eo pipefail`) from the
repository root, with the build's `build/` first on PATH so `qkv` is the CLI built from this tree (the
one pip installed otherwise); its stdout is the output (stderr carries progress bars and timings). A
```python block is exec'd in one namespace shared by all of them, in order, from the repository root,
as a reader pasting them into one session; its output is what it prints. The ```text block right after
a code block (only blank lines between) is that block's expected output; a code block with no ```text
block after it must print nothing.

Matching (`output_matches`): lines are compared exactly, after stripping trailing blanks; a line that is
just `...` stands for any number of lines (none included), and `...` inside a line for any run of
characters on that line. The document uses the latter only for what it cannot pin: timings, speeds,
and digits of a training loss that depend on the thread count and the instruction set.
"""

import contextlib
import io
import os
import re
import shutil
import subprocess
from typing import List, NamedTuple, Optional

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(ROOT, "docs", "tutorial.md")
# Everything the tutorial writes goes here (build/ is ignored by git); emptied before each run so
# `qkv train` starts a fresh run instead of refusing a folder that holds a checkpoint.
SCRATCH = os.path.join(ROOT, "build", "tutorial")


class Block(NamedTuple):
    lang: str                # sh | python
    code: str
    line: int                # line of the opening fence in the document, for messages
    expected: Optional[str]  # the ```text block that follows, or None


def parse_blocks(markdown: str) -> List[Block]:
    """The code blocks of `markdown`, each with its expected output. Only sh, python and text fences are
    allowed, and a text block must directly follow a code block (anything else is a mistake in the doc)."""
    lines = markdown.split("\n")
    fences = []  # (lang, body, line of the opening fence, index of the line after the closing fence)
    i = 0
    while i < len(lines):
        m = re.fullmatch(r"```(\S*)\s*", lines[i])
        if not m:
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"tutorial.md:{start + 1}: the ``` fence opened here is never closed")
        fences.append((m.group(1), "\n".join(body) + "\n", start + 1, i + 1))
        i += 1
    blocks: List[Block] = []
    previous_end = None
    for lang, body, line, end in fences:
        if lang not in ("sh", "python", "text"):
            raise ValueError(f"tutorial.md:{line}: fence language must be sh, python or text, got {lang!r}")
        if lang == "text":
            gap = lines[previous_end:line - 1] if previous_end is not None else None
            if not blocks or blocks[-1].expected is not None or gap is None or any(g.strip() for g in gap):
                raise ValueError(f"tutorial.md:{line}: a text block must directly follow a sh or python block")
            blocks[-1] = blocks[-1]._replace(expected=body)
        else:
            blocks.append(Block(lang, body, line, None))
        previous_end = end
    return blocks


def _line_pattern(line: str) -> str:
    return ".*?".join(re.escape(part) for part in line.split("..."))


def output_matches(expected: str, actual: str) -> bool:
    """Whether `actual` is what `expected` shows (the rules are in the module docstring)."""
    exp = [l.rstrip() for l in expected.rstrip("\n").split("\n")] if expected.strip() else []
    act = [l.rstrip() for l in actual.rstrip("\n").split("\n")] if actual.strip() else []
    pattern = "".join("(?:[^\n]*\n)*?" if l == "..." else _line_pattern(l) + "\n" for l in exp)
    return re.fullmatch(pattern, "".join(l + "\n" for l in act)) is not None


def _qkv_path() -> str:
    """PATH with this tree's build/ first when it holds the CLI; the qkv command must be found."""
    path = os.environ.get("PATH", "")
    if os.path.isfile(os.path.join(ROOT, "build", "qkv")):
        path = os.path.join(ROOT, "build") + os.pathsep + path
    if shutil.which("qkv", path=path) is None:
        pytest.fail("the qkv command is neither in build/ (cmake --build) nor on PATH (pip install .)")
    return path


def run_sh(code: str, path: str) -> str:
    r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + code], cwd=ROOT, env={**os.environ, "PATH": path},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"exit code {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def run_python(code: str, namespace: dict, name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, name, "exec"), namespace)
    return out.getvalue()


def test_matcher_elides_only_what_it_is_told_to():
    # The matcher is the test's oracle: it must reject a wrong digit, a missing line and an extra line.
    assert output_matches("a 1\n...\nz 26\n", "a 1\nb 2\nc 3\nz 26\n")
    assert output_matches("a 1\n...\nz 26\n", "a 1\nz 26\n")
    assert output_matches("loss 3.2..., ... steps/s\n", "loss 3.2217, 6.55 steps/s\n")
    assert output_matches("", "")
    assert not output_matches("loss 3.2..., ... steps/s\n", "loss 3.1217, 6.55 steps/s\n")
    assert not output_matches("a 1\nz 26\n", "a 1\nb 2\nz 26\n")
    assert not output_matches("a 1\nb 2\n", "a 1\n")
    assert not output_matches("", "something\n")
    assert not output_matches("  0.25\n", "0.25\n")  # leading blanks count (grids are aligned)


def test_parser_pairs_outputs_with_their_blocks():
    doc = "x\n```sh\necho hi\n```\n\n```text\nhi\n```\nprose\n```python\nx = 1\n```\nprose\n```python\nprint(x)\n```\n"
    blocks = parse_blocks(doc)
    assert [(b.lang, b.code, b.line, b.expected) for b in blocks] == [
        ("sh", "echo hi\n", 2, "hi\n"), ("python", "x = 1\n", 10, None), ("python", "print(x)\n", 14, None)]
    with pytest.raises(ValueError, match="directly follow"):
        parse_blocks("```python\nx = 1\n```\nprose\n```text\n1\n```\n")
    with pytest.raises(ValueError, match="sh, python or text"):
        parse_blocks("```console\n$ qkv\n```\n")


def test_tutorial_runs_as_written(monkeypatch):
    with open(DOC, encoding="utf-8") as f:
        blocks = parse_blocks(f.read())
    assert sum(b.lang == "sh" for b in blocks) >= 5 and sum(b.lang == "python" for b in blocks) >= 5
    path = _qkv_path()
    shutil.rmtree(SCRATCH, ignore_errors=True)
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__tutorial__"}
    for b in blocks:
        where = f"docs/tutorial.md:{b.line}"
        actual = run_sh(b.code, path) if b.lang == "sh" else run_python(b.code, namespace, where)
        expected = b.expected if b.expected is not None else ""
        assert output_matches(expected, actual), (
            f"{where}: the {b.lang} block printed\n{actual}\nbut the document shows\n{expected}")
