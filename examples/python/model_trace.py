"""Run a real model (stories260K) on a sentence and look at every head: its attention pattern and the
change Δe_h it proposes to each token's embedding.

    python3 examples/python/model_trace.py
"""
import os

import numpy as np

import qkv

here = os.path.dirname(os.path.abspath(__file__))
models = os.path.join(here, "..", "..", "data", "models", "stories260K")
model = qkv.Model.load(os.path.join(models, "stories260K.bin"))
tok = qkv.Tokenizer.load(os.path.join(models, "tok512.bin"), model.config["vocab_size"])

ids = tok.encode("a fluffy blue creature roamed the verdant forest")
t = model.trace(ids)
L, (H, S, _) = len(t.layers), t.layers[0].pattern.shape
print(f"{L} layers x {H} heads over {S} tokens")
for li, layer in enumerate(t.layers):
    # Each query row of a pattern is a distribution over the keys before it (causal).
    assert np.allclose(layer.pattern.sum(-1), 1, atol=1e-5)
    prev = [float(np.mean(np.diagonal(layer.pattern[h], offset=-1))) for h in range(H)]
    size = np.linalg.norm(layer.head_delta, axis=-1).mean(axis=-1)  # mean |Δe_h| per head
    print(f"layer {li}: weight on the previous token per head " + " ".join(f"{p:.2f}" for p in prev)
          + " | mean |Δe_h| " + " ".join(f"{s:.2f}" for s in size))
    # The heads' changes add up to the block's change.
    assert np.allclose(layer.head_delta.sum(0), layer.block_delta, atol=1e-4)
print("most likely next token:", repr(tok.decode([int(np.argmax(t.logits[-1]))])))
