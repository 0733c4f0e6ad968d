"""`pip install .` puts the qkv command on PATH (the C++ executable installed into the wheel)."""

import shutil
import subprocess


def test_qkv_command_is_on_path_and_runs():
    exe = shutil.which("qkv")
    assert exe, "qkv is not on PATH: was the package installed with pip install . ?"
    r = subprocess.run([exe, "params", "--preset", "gpt3"], capture_output=True, text=True, timeout=60)
    print(r.stdout)
    assert r.returncode == 0, r.stderr
    # 3Blue1Brown's count for one GPT-3 head: four 128 x 12,288 maps (seed 004).
    assert "6,291,456" in r.stdout


def test_qkv_command_reports_errors_on_stderr():
    r = subprocess.run([shutil.which("qkv") or "qkv", "params", "--preset", "no-such-model"], capture_output=True,
                       text=True, timeout=60)
    print(r.stderr)
    assert r.returncode != 0 and r.stderr.strip()
