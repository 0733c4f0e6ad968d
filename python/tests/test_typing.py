"""Editors see signatures and docstrings: the package is typed (py.typed, annotations) and the
native module ships its generated stub (_qkv.pyi)."""

import ast
import inspect
import os

import qkv
import qkv.torch


def test_sdpa_signature_is_torchs():
    # torch.nn.functional.scaled_dot_product_attention's documented parameters and defaults.
    want = [("query", inspect.Parameter.empty), ("key", inspect.Parameter.empty), ("value", inspect.Parameter.empty),
            ("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None), ("enable_gqa", False)]
    for fn in (qkv.scaled_dot_product_attention, qkv.torch.scaled_dot_product_attention):
        got = [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]
        assert got == want, fn


def test_public_api_has_docstrings_and_annotations():
    for name in qkv.__all__:
        obj = getattr(qkv, name)
        assert inspect.getdoc(obj), name
        if inspect.isfunction(obj):
            assert inspect.signature(obj).return_annotation is not inspect.Signature.empty, name


def test_stubs_ship_with_the_package():
    root = os.path.dirname(qkv.__file__)
    assert os.path.exists(os.path.join(root, "py.typed"))
    with open(os.path.join(root, "_qkv.pyi")) as f:
        tree = ast.parse(f.read())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert {"attention", "attention_varlen", "attention_backward", "MultiHeadAttention", "set_num_threads"} <= names
