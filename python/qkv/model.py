"""qkv.Model and qkv.Tokenizer: run a real trained transformer and look at every head.

    import qkv
    model = qkv.Model.load("data/models/stories260K/stories260K.bin")
    tok = qkv.Tokenizer.load("data/models/stories260K/tok512.bin", model.config["vocab_size"])
    print(model.generate(tok, "Once upon a time", steps=100, temperature=0))   # llama2.c's greedy text
    ids = tok.encode("a fluffy blue creature")
    t = model.trace(ids)                   # every layer's scores, pattern and each head's change
    t.layers[0].pattern[3]                 # head 3 of the first block: [S, S], row i = query i over keys

The model is the one of include/qkv/model.hpp (GPT-2 and Llama families, configured by data):
llama2.c checkpoints, or .safetensors with a config JSON (beside the file, or `config=`). It keeps
its own KV cache: forward() runs the given tokens after the positions already run (reset() starts
over), so generating one token at a time is one query against the cache.

Shapes (S = tokens traced, H = query heads, C = d_model, V = vocabulary), all float32 NumPy:
    forward(tokens)                  logits [V] of the last position ([S, V] with all_logits=True)
    trace(tokens).logits             [S, V]
    trace(tokens).layers[l].scores   [H, S, S]  scale · q_i · k_j for j ≤ i, -inf where masked
                           .pattern  [H, S, S]  softmax of each row of scores
                        .head_delta  [H, S, C]  each head's proposed change to every embedding
                       .block_delta  [S, C]     their sum, the attention block's update (before b_O)
                             .resid  [S, C]     the residual stream after the whole block (attention and MLP)
                                 .q  [H, S, D]  queries after rotary: scores[h, i, j] = q[h, i] · k[h // (H / Hkv), j] / √D
                                 .k  [Hkv, S, D] keys after rotary
    trace(tokens).embed              [S, C]     the residual stream before the first block
    trace(tokens, ablate=[(l, h), (l2, h2, "mean")])  the same with those heads knocked out: their output
                                     zeroed, or replaced by its mean over the positions ("mean")
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np

from . import _qkv


class LayerTrace(NamedTuple):
    """One block of :meth:`Model.trace` (shapes in the module docstring)."""

    scores: np.ndarray
    pattern: np.ndarray
    head_delta: np.ndarray
    block_delta: np.ndarray
    resid: np.ndarray
    q: np.ndarray
    k: np.ndarray


class ModelTrace(NamedTuple):
    """What :meth:`Model.trace` returns: one :class:`LayerTrace` per block, the logits [S, V] and
    the embedding [S, C] (the residual stream before the first block)."""

    layers: List[LayerTrace]
    logits: np.ndarray
    embed: np.ndarray


class Generation(NamedTuple):
    """What :meth:`Model.generate` returns with ``return_stats=True``."""

    text: str              # the prompt, then the continuation, as llama2.c's run prints them
    prompt_tokens: int     # including BOS
    generated: int         # sampled tokens
    prefill_seconds: float
    decode_seconds: float


def _tokens(fn: str, tokens: Sequence[int]) -> List[int]:
    try:
        out = [int(t) for t in np.asarray(tokens).reshape(-1)]
    except (TypeError, ValueError) as e:
        raise TypeError(f"[{fn}] tokens: must be a sequence of integers ({e})") from None
    if not out:
        raise ValueError(f"[{fn}] tokens: empty (give at least one token)")
    return out


def _integer(fn: str, name: str, x: Any) -> int:
    """x as an int (bools and floats refused, as the CLI refuses "2.5" for an integer flag)."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"[{fn}] {name}: must be an integer, got {x!r}")
    return int(x)


def _real(fn: str, name: str, x: Any) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"[{fn}] {name}: must be a number, got {x!r}")
    return float(x)


def _kv_dtype(fn: str, x: Any) -> str:
    """kv_dtype for the C++ call: "" for None (the model's choice); strings checked there."""
    if x is None:
        return ""
    if not isinstance(x, str):
        raise TypeError(f"[{fn}] kv_dtype: must be 'f32', 'bf16', 'int8' or None, got {x!r}")
    return x


class Tokenizer:
    """Any tokenizer qkv reads, told apart by the file's content: llama2.c's tokenizer.bin
    (score-ordered merges, byte fallback, BOS = 1 and EOS = 2), the tokenizer.json ``qkv train``
    writes (characters or byte-level BPE, no BOS/EOS), a Hugging Face WordPiece tokenizer.json, or
    Hugging Face BPE: GPT-2's byte-level BPE (tokenizer.json, or vocab.json + merges.txt) and Llama's
    SentencePiece-style BPE with byte fallback (tokenizer.json), encoding as Hugging Face
    tokenizers does. ``load`` also takes a model folder (the tokenizer in it)."""

    bos = 1
    eos = 2

    def __init__(self, native: Any):
        self._t = native

    @classmethod
    def load(cls, path: str, vocab_size: int) -> "Tokenizer":
        """Reads a tokenizer file for a vocabulary of ``vocab_size`` tokens (an error names the
        format the file was read as)."""
        return cls(_qkv.Tokenizer.load(str(path), int(vocab_size)))

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    @property
    def bos_id(self) -> int:
        """The id encode puts first (llama2.c: 1; Hugging Face BPE: its post-processor's), -1 if none."""
        return self._t.bos_id

    @property
    def eos_id(self) -> int:
        """The id that ends generation (llama2.c: 2; Hugging Face BPE: tokenizer_config.json's
        eos_token, or the post-processor's last special token), -1 if none."""
        return self._t.eos_id

    @property
    def format(self) -> str:
        """"llama2c", "qkv_json", "wordpiece" or "hf_bpe"."""
        return self._t.format

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> List[int]:
        """Token ids of ``text`` ([BOS] first unless ``bos=False``, where the format has one;
        Hugging Face BPE: the BOS its post-processor adds, as ``tokenizer(text)`` gives)."""
        return list(self._t.encode(text, bos, eos))

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of ``tokens`` as generation prints it (llama2.c: a token after BOS drops its
        leading space; Hugging Face BPE in metaspace style: the first piece does, as its decoder's
        Strip; BOS and EOS, where the format has them, print nothing)."""
        ids = _tokens("qkv.Tokenizer.decode", tokens)
        specials = {t for t in (self._t.bos_id, self._t.eos_id) if t >= 0}
        prev = self._t.bos_id if self._t.bos_id >= 0 else 0  # a format without BOS ignores prev
        out = bytearray()
        for t in ids:
            if t not in specials:
                out += self._t.decode(prev, t)
                prev = t
            elif self._t.format != "hf_bpe":  # llama2.c: a token after any BOS drops its space;
                prev = t                        # Hugging Face: only the text's first piece does
        return out.decode("utf-8", errors="replace")

    def piece(self, prev: int, token: int) -> bytes:
        """The bytes of one token following ``prev`` (pieces can split a UTF-8 character)."""
        return self._t.decode(int(prev), int(token))


class BatchGeneration(NamedTuple):
    """What :meth:`Model.generate_batch` returns with ``return_stats=True`` (counts and times summed
    over the prompts; ``decode_seconds`` is the wall time of the lockstep steps)."""
    texts: List[str]
    prompt_tokens: int
    generated: int
    prefill_seconds: float
    decode_seconds: float


class Model:
    """A decoder-only transformer with its own KV cache (see the module docstring).

    Threads: one Model may be shared by several Python threads. Its forward, trace, generate and
    reset take turns (a lock per Model, held for the whole call; the GIL is released meanwhile, so
    other work and other Models run in parallel): each call gives what it would give alone. The
    KV cache is still one per Model: threads interleaving forward() calls continue each other's
    sequence, so give each conversation its own Model.
    """

    def __init__(self, native: Any):
        self._m = native
        self._config: Dict[str, Any] = json.loads(native.config_json())

    @classmethod
    def load(cls, path: str, config: Optional[str] = None, weights: str = "f32",
             gemm_inputs: str = "f32") -> "Model":
        """A llama2.c checkpoint (.bin) or a .safetensors file with its config JSON (qkv's own, or a
        Hugging Face GPT-2 / Llama checkpoint: its model.safetensors, or the folder holding it with
        its config.json).

        weights: 'f32' (exact), or 'bf16' to keep the projection matrices rounded to bfloat16
        (half the memory and bandwidth when decoding; activations stay float32).
        gemm_inputs: 'f32', or 'bf16' (needs weights='bf16'): the prefill also rounds each
        projection's input rows to bfloat16, and the KV cache and attention are bfloat16, as
        PyTorch's bfloat16 mode computes; the fastest prefill, logits within bf16 rounding."""
        return cls(_qkv.Model(str(path), "" if config is None else str(config), str(weights), str(gemm_inputs)))

    @property
    def config(self) -> Dict[str, Any]:
        """The configuration (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len, ...)."""
        return dict(self._config)

    @property
    def num_params(self) -> int:
        return self._m.num_params()

    @property
    def position(self) -> int:
        """Positions already in the KV cache; the next forward() starts there."""
        return self._m.position

    def reset(self) -> None:
        """Empties the KV cache: the next forward() starts at position 0."""
        self._m.reset()

    def forward(self, tokens: Sequence[int], all_logits: bool = False) -> np.ndarray:
        """Runs ``tokens`` after the cached positions: logits [V] of the last ([S, V] if all_logits)."""
        return self._m.forward(_tokens("qkv.Model.forward", tokens), bool(all_logits))

    __call__ = forward

    def trace(self, tokens: Sequence[int], ablate: Sequence[Sequence[Any]] = ()) -> ModelTrace:
        """Runs ``tokens`` from position 0 (cache untouched) and records every layer. ``ablate``:
        heads to knock out, each ``(layer, head)`` (output zeroed) or ``(layer, head, "mean")``
        (output replaced by its mean over the positions); a layer or head out of range is a
        ValueError naming it."""
        heads = []
        for a in ablate:
            kind = a[2] if len(a) == 3 else "zero"
            if len(a) not in (2, 3) or kind not in ("zero", "mean"):
                raise ValueError(f"[qkv.Model.trace] ablate: {a!r} is not (layer, head) or (layer, head, 'zero' | 'mean')")
            heads.append((int(a[0]), int(a[1]), kind == "mean"))
        layers, logits, embed = self._m.trace(_tokens("qkv.Model.trace", tokens), heads)
        return ModelTrace([LayerTrace(**d) for d in layers], logits, embed)

    def generate(self, tokenizer: Tokenizer, prompt: str = "", steps: int = 256, temperature: float = 1.0,
                 top_p: float = 0.9, top_k: int = 0, seed: int = 1, return_stats: bool = False,
                 kv_dtype: str | None = None):
        """llama2.c's generation: ``steps`` positions in all (BOS and the prompt included; 0: the
        whole context), stopping at a sampled EOS (llama2.c: or BOS); temperature 0 is greedy. Returns the text (prompt +
        continuation), or a :class:`Generation` with timings. Uses a cache of its own (this
        model's is untouched); safe to call from several threads at once (see :class:`Model`).

        The arguments follow ``qkv generate``'s rules, checked by the same C++ code, with the same
        messages (ValueError): steps >= 0, temperature in [0, 100], top_p in [0, 1], top_k >= 0,
        seed >= 1. ``prompt`` is a str, or bytes in UTF-8. ``kv_dtype``: the cache's dtype, ``"f32"``,
        ``"bf16"`` (keys and values rounded as they are stored: half the bytes) or ``"int8"`` (each
        row quantised to int8 with an f32 scale, llama.cpp's q8_0 cache: about a quarter of the
        bytes); the text may differ from f32's; None: bf16 with ``gemm_inputs="bf16"``, else f32."""
        fn = "qkv.Model.generate"
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"[{fn}] tokenizer: must be a qkv.Tokenizer, got {type(tokenizer).__name__}")
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            try:
                prompt = bytes(prompt).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"[{fn}] prompt: bytes that are not UTF-8 ({e})") from None
        elif not isinstance(prompt, str):
            raise TypeError(f"[{fn}] prompt: must be str or UTF-8 bytes, got {type(prompt).__name__}")
        steps, top_k, seed = (_integer(fn, n, x) for n, x in (("steps", steps), ("top_k", top_k), ("seed", seed)))
        temperature, top_p = (_real(fn, n, x) for n, x in (("temperature", temperature), ("top_p", top_p)))
        if seed < 1:  # before the C++ call: a negative seed does not fit its unsigned type
            raise ValueError(f"[{fn}] seed: must be ≥ 1 (xorshift's state 0 never changes), got {seed}")
        raw, n_prompt, n_gen, t_pre, t_dec = self._m.generate(tokenizer._t, prompt, steps, temperature, top_p,
                                                               top_k, seed, _kv_dtype(fn, kv_dtype))
        text = raw.decode("utf-8", errors="replace")
        if return_stats:
            return Generation(text, n_prompt, n_gen, t_pre, t_dec)
        return text

    def generate_batch(self, tokenizer: Tokenizer, prompts: Sequence[str], steps: int = 256,
                       temperature: float = 1.0, top_p: float = 0.9, top_k: int = 0, seed: int = 1,
                       return_stats: bool = False, kv_dtype: str | None = None):
        """:meth:`generate` for several prompts at once: each is prefilled alone, then every
        sequence still going gets its next token from one shared step that reads the weights once
        for all of them. Returns the texts in the order of ``prompts`` (or a
        :class:`BatchGeneration`); text i equals ``generate(tokenizer, prompts[i], ...)`` with the
        same arguments (each sequence samples with its own generator seeded by ``seed``) and the
        same ``kv_dtype``. The arguments follow :meth:`generate`'s rules. ``kv_dtype="bf16"``
        halves the cache bytes each shared step reads per sequence, ``"int8"`` quarters them."""
        fn = "qkv.Model.generate_batch"
        if not isinstance(tokenizer, Tokenizer):
            raise TypeError(f"[{fn}] tokenizer: must be a qkv.Tokenizer, got {type(tokenizer).__name__}")
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"[{fn}] prompts: must be a list of str, got {type(prompts).__name__}")
        if len(prompts) == 0:
            raise ValueError(f"[{fn}] prompts: must not be empty")
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise TypeError(f"[{fn}] prompts[{i}]: must be str, got {type(p).__name__}")
        steps, top_k, seed = (_integer(fn, n, x) for n, x in (("steps", steps), ("top_k", top_k), ("seed", seed)))
        temperature, top_p = (_real(fn, n, x) for n, x in (("temperature", temperature), ("top_p", top_p)))
        if seed < 1:
            raise ValueError(f"[{fn}] seed: must be ≥ 1 (xorshift's state 0 never changes), got {seed}")
        raws, n_prompt, n_gen, t_pre, t_dec = self._m.generate_batch(tokenizer._t, list(prompts), steps, temperature,
                                                                     top_p, top_k, seed, _kv_dtype(fn, kv_dtype))
        texts = [r.decode("utf-8", errors="replace") for r in raws]
        if return_stats:
            return BatchGeneration(texts, n_prompt, n_gen, t_pre, t_dec)
        return texts
