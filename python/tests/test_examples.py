"""Every Python program in examples/python runs and passes its own check (each asserts its result against
torch or a per-sequence recomputation), and README's Python block runs as a reader would paste it. The C++
examples run under ctest (examples/CMakeLists.txt)."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
EXAMPLES = os.path.join(ROOT, "examples", "python")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")))
def test_example_runs(name):
    if name == "torch_dropin.py":
        pytest.importorskip("torch")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr


def test_readme_python_block_runs():
    """The README's drop-in block: torch's SDPA through qkv, the autograd op and qkv.attention, on the
    tensors it defines. The block is checked against torch here (same inputs, fp32; 1e-5 covers the
    different summation orders of two exact-softmax kernels at S = 512)."""
    torch = pytest.importorskip("torch")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 1, "README.md should hold exactly one Python block"
    scope = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    q, k, v = scope["q"], scope["k"], scope["v"]
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(scope["out"], want, atol=1e-5) and torch.allclose(scope["y"], want, atol=1e-5)
    assert tuple(scope["res"].pattern.shape) == (1, 8, 512, 512)
