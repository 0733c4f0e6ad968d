"""The version is written once, in CMakeLists.txt's project(qkv VERSION …): the module, the installed
package metadata (pyproject.toml reads it by regex) and `qkv --version` all report that value."""

import os
import re
import shutil
import subprocess

import qkv

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def cmake_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(qkv VERSION ([0-9.]+)", text).group(1)


def test_module_version_is_cmakes():
    assert qkv.__version__ == cmake_version()


def test_command_version_is_cmakes():
    exe = shutil.which("qkv")
    assert exe, "qkv is not on PATH"
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == f"qkv {cmake_version()}"
