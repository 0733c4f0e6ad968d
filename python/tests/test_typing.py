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


def test_stub_is_generated_from_the_module_it_ships_with():
    # Every public function and class of the installed qkv._qkv, and every public method and property of each
    # class, is in the stub beside it. python/CMakeLists.txt generates the stub by importing the very module it
    # has just built; a stub generated from another copy of the module fails this comparison.
    from qkv import _qkv
    with open(os.path.join(os.path.dirname(_qkv.__file__), "_qkv.pyi")) as f:
        tree = ast.parse(f.read())
    top = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    top |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    public = {n for n in dir(_qkv) if not n.startswith("_") and (callable(getattr(_qkv, n)) or isinstance(getattr(_qkv, n), type))}
    assert public - top == set()
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for name in public:
        cls = getattr(_qkv, name)
        if not isinstance(cls, type) or name not in classes:
            continue
        members = {m.name for m in classes[name].body if isinstance(m, (ast.FunctionDef, ast.ClassDef))}
        members |= {t.id for m in classes[name].body if isinstance(m, ast.Assign) for t in m.targets
                    if isinstance(t, ast.Name)}
        members |= {m.target.id for m in classes[name].body if isinstance(m, ast.AnnAssign)
                    and isinstance(m.target, ast.Name)}
        own = {m for m in vars(cls) if not m.startswith("_")}
        assert own - members == set(), name
