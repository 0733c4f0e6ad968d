"""qkv.Encoder: sentence embeddings with a BERT-family encoder, read from a sentence-transformers folder.

    import qkv
    enc = qkv.Encoder.load("path/to/all-MiniLM-L6-v2")
    e = enc.embed(["A man is playing a guitar.", "Hi"])   # float32 [2, 384], row i = text i

The encoder is the C++ one of include/qkv/encoder.hpp: WordPiece tokens ([CLS] … [SEP], cut to the
folder's max_seq_length), texts packed without padding and sorted by length into batches, pooled as
the folder's Pooling module says (mean, CLS or max) and L2-normalised when it has Normalize.
"""
import json
from typing import Any, Dict, List, Sequence

import numpy as np

from . import _qkv


class Encoder:
    """A loaded encoder. Calls on one Encoder take turns (the GIL is released while it runs)."""

    def __init__(self, native: Any):
        self._e = native
        self._config: Dict[str, Any] = json.loads(native.config_json())

    @classmethod
    def load(cls, path: str, dtype: str = "f32", num_threads: int = 0) -> "Encoder":
        """A sentence-transformers folder (modules.json, config.json, model.safetensors, tokenizer.json
        or vocab.txt, sentence_bert_config.json, the Pooling module's config.json).

        dtype: 'f32' (exact against transformers), or 'bf16': projection matrices and GEMM inputs
        rounded to bfloat16 (f32 accumulation; norms, attention and pooling in float32).
        num_threads: 0 uses qkv.num_threads()."""
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0:
            raise ValueError(f"[qkv.Encoder.load] num_threads: must be an integer >= 0, got {num_threads!r}")
        return cls(_qkv.Encoder(str(path), str(dtype), num_threads))

    @property
    def config(self) -> Dict[str, Any]:
        """The model's qkv Config as a dict (causal False, post_norm True for BERT)."""
        return dict(self._config)

    @property
    def dim(self) -> int:
        """The embedding width."""
        return int(self._e.dim)

    @property
    def max_seq_length(self) -> int:
        """Tokens per text at most, [CLS] and [SEP] included (sentence_bert_config.json)."""
        return int(self._e.max_seq_length)

    @property
    def pooling(self) -> str:
        """'mean', 'cls' or 'max', as the folder's Pooling module says."""
        return str(self._e.pooling)

    @property
    def normalize(self) -> bool:
        """Whether embeddings are L2-normalised (the folder has a Normalize module)."""
        return bool(self._e.normalize)

    def tokenize(self, text: str) -> List[int]:
        """[CLS] WordPiece ids [SEP] of text, cut to max_seq_length tokens."""
        return list(self._e.tokenize(str(text)))

    def embed(self, texts: Sequence[str], batch: int = 32) -> np.ndarray:
        """float32 [len(texts), dim]: row i is the embedding of texts[i]."""
        if isinstance(texts, str):
            raise TypeError("[qkv.Encoder.embed] texts: must be a list of strings, got one str")
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"[qkv.Encoder.embed] batch: must be an integer >= 1, got {batch!r}")
        items = [str(t) for t in texts]
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._e.embed(items, batch)
