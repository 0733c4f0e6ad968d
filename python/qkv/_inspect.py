"""qkv.inspect: the `qkv inspect` page and its numbers, in Python and in a notebook.

    import qkv
    r = qkv.inspect("data/models/stories260K/stories260K.bin", "a fluffy blue creature")
    r                      # in Jupyter: the page itself (self-contained, no network), in an iframe
    r.pattern(2)           # layer 2's weights [H, S, S], row i = query i over keys
    r.delta_norm           # [L, H, S]: |Δe_h| of every head at every token
    r.attribution          # [T, L, H]: each head's push on each of the ten likeliest tokens' logits
    r.ablation_p("zero")   # [L, H]: p of the prediction with that head knocked out

It computes in this process through the native module (src/inspect/run.hpp), the same code the
`qkv inspect` command runs, so the numbers are exactly the command's; `doc` is the document
`qkv inspect --format json` writes (schema: docs/inspect.md), built when first asked for.
"""

from __future__ import annotations

import json
import os
from html import escape
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from . import _qkv


def _text(piece: bytes) -> str:
    # A byte-fallback piece may be part of a UTF-8 character: shown as U+FFFD, as the page and JSON do.
    return piece.decode("utf-8", errors="replace")


class Inspection:
    """One inspection: its numbers as NumPy arrays, the page (``html``) and the JSON document
    (``doc``). Displays as the page in Jupyter."""

    def __init__(self, report: "_qkv.InspectReport"):
        self._r = report
        self._html: Optional[str] = None
        self._doc: Optional[Dict[str, Any]] = None

    # ---- Jupyter ----
    def _repr_html_(self) -> str:
        # The page runs its own script: an iframe keeps it apart from the notebook's.
        return (f'<iframe srcdoc="{escape(self.html, quote=True)}" style="width:100%;height:900px;border:0" '
                'sandbox="allow-scripts"></iframe>')

    @property
    def html(self) -> str:
        """The page (one self-contained HTML file, as `qkv inspect` writes index.html)."""
        if self._html is None:
            self._html = self._r.html()
        return self._html

    @property
    def doc(self) -> Dict[str, Any]:
        """The JSON document of `qkv inspect --format json` (every pattern as nested lists: large
        for long prompts; the array accessors below do not build it)."""
        if self._doc is None:
            self._doc = json.loads(self._r.json())
        return self._doc

    def save(self, path: str) -> None:
        """Writes the page to ``path``."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html)

    def write_page(self, folder: str) -> str:
        """Writes folder/index.html and folder/layer_<l>.png as `qkv inspect` does; returns the page's path."""
        return self._r.write_page(os.fspath(folder))

    # ---- numbers ----
    @property
    def shape(self) -> Dict[str, int]:
        """{"S": tokens, "L": layers, "H": heads}."""
        return {"S": self._r.S, "L": self._r.L, "H": self._r.H}

    @property
    def tokens(self) -> List[str]:
        return [_text(t[1]) for t in self._r.tokens()]

    @property
    def token_ids(self) -> np.ndarray:
        return np.array([t[0] for t in self._r.tokens()], dtype=np.int64)

    @property
    def next_tokens(self) -> List[Dict[str, Any]]:
        """The ten likeliest next tokens: [{id, text, prob, logit}] (empty for an encoder)."""
        return [{"id": i, "text": _text(t), "prob": p, "logit": z} for i, t, p, z in self._r.next_tokens()]

    def pattern(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s attention weights [H, S, S] (row i: query i over keys), float32."""
        return self._r.pattern(int(layer))

    def baseline_pattern(self, layer: int) -> Optional[np.ndarray]:
        """With heads ablated (``ablate=``): layer ``layer``'s weights [H, S, S] on the same prompt
        without the ablation (``pattern(layer) - baseline_pattern(layer)`` is what the knock-out
        changed); None when nothing is ablated."""
        return self._r.baseline_pattern(int(layer))

    def scores(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s raw scores [H, S, S], float32; -inf where masked."""
        return self._r.scores(int(layer))

    @property
    def delta_norm(self) -> np.ndarray:
        """[L, H, S]: |Δe_h|, the length of the change head h proposes for each token's embedding
        (the vectors themselves: qkv.Model.trace)."""
        return self._r.delta_norm()

    @property
    def block_delta_norm(self) -> np.ndarray:
        """[L, S]: |Σ_h Δe_h|, the attention block's whole change per token."""
        return self._r.block_delta_norm()

    @property
    def attribution(self) -> Optional[np.ndarray]:
        """[T, L, H]: head (l, h)'s direct push on the logit of next_tokens[t] (None without a head)."""
        return self._r.attribution()

    def ablation_p(self, kind: str = "zero") -> Optional[np.ndarray]:
        """[L, H]: the prediction's probability with that head knocked out ("zero" or "mean"); None
        when the table was not computed."""
        return self._ablation(kind, "p_predicted")

    def ablation_loss(self, kind: str = "zero") -> Optional[np.ndarray]:
        """[L, H]: the prompt's mean next-token loss with that head knocked out."""
        return self._ablation(kind, "loss")

    def ablation_top(self, kind: str = "zero") -> Optional[np.ndarray]:
        """[L, H] int64: the next token the model predicts with that head knocked out."""
        a = self._ablation(kind, "top")
        return None if a is None else a.astype(np.int64)

    def _ablation(self, kind: str, key: str) -> Optional[np.ndarray]:
        if kind not in ("zero", "mean"):
            raise ValueError(f"[qkv.Inspection] kind: {kind!r} is not 'zero' or 'mean'")
        return self._r.ablation(kind, key) if self._r.has_ablation() else None


def inspect(model: str, text: Optional[str] = None, *, tokens: Optional[Sequence[int]] = None,
            tokenizer: Optional[str] = None, config: Optional[str] = None, ablate: Sequence[str] = (),
            ablation_table: str = "auto") -> Inspection:
    """Inspects ``model`` (a llama2.c .bin, a .safetensors, a Hugging Face or sentence-transformers
    folder) on ``text`` — or on token ids ``tokens`` for a model without a tokenizer qkv reads —
    as `qkv inspect` does, in this process, and returns an :class:`Inspection`. ``tokenizer`` and
    ``config``: as the command's flags (default: the files beside the model). ``ablate``: heads to
    knock out, "L.H" or "L.H:mean"; ``ablation_table``: "auto", "on" or "off" (docs/inspect.md).
    Bad arguments raise ValueError naming the argument."""
    if (text is None) == (tokens is None):
        raise ValueError("[qkv.inspect] give exactly one of text and tokens")
    if tokens is not None and len(tokens) == 0:
        raise ValueError("[qkv.inspect] tokens: empty (give at least one token id)")
    ids = [] if tokens is None else [int(t) for t in tokens]
    return Inspection(_qkv.inspect(os.fspath(model), "" if tokenizer is None else os.fspath(tokenizer),
                                   "" if config is None else os.fspath(config), "" if text is None else text,
                                   ids, [str(a) for a in ablate], ablation_table))
