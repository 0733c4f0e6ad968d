#!/usr/bin/env python3
"""Writes tests/golden/walkthrough_*.txt: the numerical walkthrough of seed 003 ("interaction matrices"),
reproduced with numpy exactly as the document runs it.

The document seeds numpy once (np.random.seed(0)) and then calls np.random.randn in this order; every call
draws from the same stream, so each example's inputs depend on all the calls before it:

  1. x   = randn(4, 5)                                    the data matrix
  2. L   = randn(4, 4)                                    a random interaction matrix
  3. L   = randn(4, 4), exp, rows normalised              a random row-stochastic one
  4. R   = randn(5, 6)                                    a right interaction matrix (H1 = 6)
  5. X, W_Q, W_K, W_V = randn(4,5), randn(5,7), randn(5,7), randn(5,6)      attention, E=5, H2=7, H1=6
  6. X, W_Q, W_K, W_V = randn(4,5), randn(5,5), randn(5,5), randn(5,5)      attention, E = H1 = H2 = 5
  7. X, W_Q, W_K, W_V = the same shapes again                               masked (causal) attention

Examples 5-7 are written out: the inputs X, W_Q, W_K, W_V (the document's right-multiplied layout,
Q = X @ W_Q), the intermediates Q, K, V, L before the softmax (Q @ K.T, with -inf above the diagonal when
masked), L after it, and L @ V. The document uses no 1/sqrt(d) scale. Files are text: a line
"NAME ROWS COLS", then ROWS lines of COLS numbers written with repr (round-trips float64 exactly),
'-inf' for minus infinity.

Usage: python3 tools/make_golden_walkthrough.py [OUTPUT_DIR]   (default tests/golden)
"""
import os
import sys

import numpy as np


def attention(X, W_Q, W_K, W_V, masked):
    Q = X @ W_Q
    K = X @ W_K
    V = X @ W_V
    L = Q @ K.T
    if masked:
        mask = np.tril(np.ones(L.shape), k=0)
        L = np.where(mask == 1, L, -np.inf)
    scores = L.copy()
    L = np.exp(L)
    L = L / L.sum(axis=1, keepdims=True)
    return dict(X=X, W_Q=W_Q, W_K=W_K, W_V=W_V, Q=Q, K=K, V=V, L_scores=scores, L=L, LV=L @ V)


def write(path, mats):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("# seed 003 walkthrough, written by tools/make_golden_walkthrough.py; do not edit\n")
        for name, m in mats.items():
            m = np.atleast_2d(m)
            f.write(f"{name} {m.shape[0]} {m.shape[1]}\n")
            for row in m:
                f.write(" ".join(repr(float(v)) for v in row) + "\n")
    os.replace(tmp, path)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "golden")
    os.makedirs(out_dir, exist_ok=True)
    np.random.seed(0)
    T, E = 4, 5
    x = np.random.randn(T, E)                # 1
    L = np.random.randn(T, T)                # 2
    L = np.random.randn(T, T)                # 3
    L = np.exp(L)
    L = L / L.sum(axis=1, keepdims=True)
    H1 = 6
    R = np.random.randn(E, H1)               # 4
    del x, L, R                              # drawn only to keep the stream in step with the document

    T, E, H1, H2 = 4, 5, 6, 7                # 5
    X = np.random.randn(T, E)
    W_Q = np.random.randn(E, H2)
    W_K = np.random.randn(E, H2)
    W_V = np.random.randn(E, H1)
    write(os.path.join(out_dir, "walkthrough_h1_h2.txt"), attention(X, W_Q, W_K, W_V, masked=False))

    T, E = 4, 5                              # 6
    X = np.random.randn(T, E)
    W_Q = np.random.randn(E, E)
    W_K = np.random.randn(E, E)
    W_V = np.random.randn(E, E)
    write(os.path.join(out_dir, "walkthrough_unmasked.txt"), attention(X, W_Q, W_K, W_V, masked=False))

    T, E = 4, 5                              # 7
    X = np.random.randn(T, E)
    W_Q = np.random.randn(E, E)
    W_K = np.random.randn(E, E)
    W_V = np.random.randn(E, E)
    write(os.path.join(out_dir, "walkthrough_masked.txt"), attention(X, W_Q, W_K, W_V, masked=True))


if __name__ == "__main__":
    main()
