"""What `qkv train --arch llama` writes is a Hugging Face folder: transformers' AutoModelForCausalLM and
qkv.Model load it and compute the same logits; `qkv generate` and `qkv inspect` run it with its tokenizer.
A gpt2 run is loaded by qkv.Model with its parameter count equal to the weights trained."""
import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "tinyshakespeare" / "input.txt"
QKV = shutil.which("qkv")
pytestmark = pytest.mark.skipif(QKV is None, reason="the qkv command is not on PATH")

TINY = ["--layers", "2", "--heads", "4", "--d-model", "32", "--context", "32", "--batch", "4", "--steps", "30",
        "--eval-batches", "2", "--quiet"]


def train(out, *flags):
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(out), *TINY, *flags],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return r


def test_llama_folder_loads_in_transformers_with_equal_logits(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "llama"
    train(out, "--arch", "llama", "--kv-heads", "2")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_key_value_heads"] == 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    m = qkv.Model.load(str(out))
    assert m.num_params == sum(p.numel() for p in hf.parameters())
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg["vocab_size"], 32).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    got = m.forward(tokens, all_logits=True)
    err = np.abs(got - want).max()
    print(f"max |logit qkv - transformers| {err:.3g} (max |logit| {np.abs(want).max():.3g})")
    # Both f32 with different summation orders and rotary arithmetic (qkv's angle in f32 as llama2.c,
    # HF's inv_freq in f32, then cos/sin): ~1e-7 on logits of order 1 (seen: 1.8e-7); 1e-5 leaves a
    # margin, and a wrong row order of W_Q/W_K or a missing norm gain errs by ~0.1.
    assert err < 1e-5

    # generate and inspect find the model, its config and its tokenizer in the folder.
    r = subprocess.run([QKV, "generate", "--model", str(out), "--prompt", "ROMEO:", "--steps", "10",
                        "--temperature", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ROMEO:"), r.stderr
    r = subprocess.run([QKV, "inspect", "--model", str(out), "--prompt", "ROMEO: so", "--out", str(tmp_path / "i")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "i" / "index.html").exists()


def test_gpt2_run_loads_with_its_parameter_count(tmp_path):
    out = tmp_path / "gpt2"
    r = train(out, "--arch", "gpt2", "--bias")
    trained = int(r.stderr.split("qkv train: ")[1].split(" parameters")[0])
    m = qkv.Model.load(str(out))
    assert m.num_params == trained
    assert m.config["pos"] == "learned" and m.config["mlp"] == "gelu_exact"
    assert not (out / "config.json").exists()  # a GPT-2 with exact GELU is written under qkv's names only


def test_resume_across_architectures_is_refused_and_nothing_overwritten(tmp_path):
    out = tmp_path / "run"
    train(out, "--arch", "gpt2")
    before = (out / "checkpoint.safetensors").read_bytes()
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(out), "--resume", "--arch", "llama",
                        "--steps", "40", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1
    assert "--arch llama (the checkpoint has gpt2)" in r.stderr, r.stderr
    assert (out / "checkpoint.safetensors").read_bytes() == before
