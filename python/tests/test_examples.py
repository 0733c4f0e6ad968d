"""Every Python program in examples/python runs and passes its own check (each asserts its result against
torch or a per-sequence recomputation). The C++ examples run under ctest (examples/CMakeLists.txt)."""

import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python")


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".py")))
def test_example_runs(name):
    if name == "torch_dropin.py":
        pytest.importorskip("torch")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, name)], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr
