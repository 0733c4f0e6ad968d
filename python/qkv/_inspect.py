"""qkv.inspect: the `qkv inspect` page and its numbers, in Python and in a notebook.

    import qkv
    r = qkv.inspect("data/models/stories260K/stories260K.bin", "a fluffy blue creature")
    r                      # in Jupyter: the page itself (self-contained, no network), in an iframe
    r.pattern(2)           # layer 2's weights [H, S, S], row i = query i over keys
    r.attribution          # [T, L, H]: each head's push on each of the ten likeliest tokens' logits
    r.ablation_p("zero")   # [L, H]: p of the prediction with that head knocked out

It runs the `qkv` command that the package installs (`qkv inspect --format json` and the page), so
the numbers are exactly the command's; `doc` is its JSON document (schema: docs/inspect.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
from html import escape
from typing import Any, Dict, List, Optional, Sequence

import numpy as np


def _qkv_program() -> str:
    """$QKV_BIN, else the `qkv` installed beside this Python's scripts, else the one on PATH."""
    if os.environ.get("QKV_BIN"):
        return os.environ["QKV_BIN"]
    beside = os.path.join(sysconfig.get_path("scripts"), "qkv")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("qkv")
    if found is None:
        raise RuntimeError("[qkv.inspect] the qkv program is not installed (pip install . puts it in the scripts folder)")
    return found


class Inspection:
    """One `qkv inspect` run: the page (``html``), the JSON document (``doc``) and its numbers as
    NumPy arrays. Displays as the page in Jupyter."""

    def __init__(self, doc: Dict[str, Any], html: str):
        self.doc = doc
        self.html = html

    # ---- Jupyter ----
    def _repr_html_(self) -> str:
        # The page runs its own script: an iframe keeps it apart from the notebook's.
        return (f'<iframe srcdoc="{escape(self.html, quote=True)}" style="width:100%;height:900px;border:0" '
                'sandbox="allow-scripts"></iframe>')

    def save(self, path: str) -> None:
        """Writes the page (one self-contained HTML file) to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)

    # ---- numbers ----
    @property
    def tokens(self) -> List[str]:
        return [t["text"] for t in self.doc["tokens"]]

    @property
    def token_ids(self) -> np.ndarray:
        return np.array([t["id"] for t in self.doc["tokens"]], dtype=np.int64)

    @property
    def next_tokens(self) -> List[Dict[str, Any]]:
        """The ten likeliest next tokens: [{id, text, prob, logit}] (empty for an encoder)."""
        return self.doc["next_tokens"]

    def pattern(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s attention weights [H, S, S] (row i: query i over keys), float32."""
        return np.array([h["pattern"] for h in self._layer(layer)["heads"]], dtype=np.float32)

    def scores(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s raw scores [H, S, S]; -inf where masked."""
        rows = [h["scores"] for h in self._layer(layer)["heads"]]
        return np.array([[[-np.inf if x is None else x for x in r] for r in m] for m in rows], dtype=np.float32)

    @property
    def attribution(self) -> Optional[np.ndarray]:
        """[T, L, H]: head (l, h)'s direct push on the logit of next_tokens[t] (None without a head)."""
        a = self.doc.get("attribution")
        return None if a is None else np.array([t["heads"] for t in a["tokens"]], dtype=np.float64)

    def ablation_p(self, kind: str = "zero") -> Optional[np.ndarray]:
        """[L, H]: the prediction's probability with that head knocked out ("zero" or "mean"); None
        when the table was not computed."""
        return self._ablation(kind, "p_predicted")

    def ablation_loss(self, kind: str = "zero") -> Optional[np.ndarray]:
        """[L, H]: the prompt's mean next-token loss with that head knocked out."""
        return self._ablation(kind, "loss")

    def _ablation(self, kind: str, key: str) -> Optional[np.ndarray]:
        if kind not in ("zero", "mean"):
            raise ValueError(f"[qkv.Inspection] kind: {kind!r} is not 'zero' or 'mean'")
        t = self.doc.get("ablation")
        return None if t is None else np.array([[e[key] for e in row] for row in t[kind]], dtype=np.float64)

    def _layer(self, layer: int) -> Dict[str, Any]:
        n = len(self.doc["layers"])
        if not 0 <= layer < n:
            raise IndexError(f"[qkv.Inspection] layer: {layer} is not in [0, {n})")
        return self.doc["layers"][layer]


def inspect(model: str, text: Optional[str] = None, *, tokens: Optional[Sequence[int]] = None,
            tokenizer: Optional[str] = None, ablate: Sequence[str] = (), ablation_table: str = "auto") -> Inspection:
    """Runs `qkv inspect` on ``model`` (a llama2.c .bin, a .safetensors, a Hugging Face or
    sentence-transformers folder) over ``text`` — or over token ids ``tokens`` for a model whose
    tokenizer qkv does not read — and returns an :class:`Inspection`. ``ablate``: heads to knock
    out, "L.H" or "L.H:mean"; ``ablation_table``: "auto", "on" or "off" (docs/inspect.md).
    Errors of the command are raised as ValueError with its message."""
    if (text is None) == (tokens is None):
        raise ValueError("[qkv.inspect] give exactly one of text and tokens")
    args = [_qkv_program(), "inspect", "--model", os.fspath(model), "--ablation-table", ablation_table]
    args += ["--prompt", text] if text is not None else ["--tokens", ",".join(str(int(t)) for t in tokens)]
    if tokenizer is not None:
        args += ["--tokenizer", os.fspath(tokenizer)]
    for a in ablate:
        args += ["--ablate", a]
    with tempfile.TemporaryDirectory(prefix="qkv-inspect-") as out:
        for fmt in ("json", "html"):
            res = subprocess.run(args + ["--out", out, "--format", fmt], capture_output=True, text=True)
            if res.returncode != 0:
                raise ValueError(res.stderr.strip().removeprefix("qkv: error: "))
        with open(os.path.join(out, "inspect.json"), encoding="utf-8") as f:
            doc = json.load(f)
        with open(os.path.join(out, "index.html"), encoding="utf-8") as f:
            html = f.read()
    return Inspection(doc, html)
