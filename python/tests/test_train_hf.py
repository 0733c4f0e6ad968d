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


def logits_vs_transformers(out, seed=0):
    """The folder loaded by transformers and by qkv.Model: (transformers model, qkv model, max |logit
    difference| over 32 random tokens)."""
    import torch
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32).eval()
    m = qkv.Model.load(str(out))
    tokens = np.random.default_rng(seed).integers(0, hf.config.vocab_size, 32).tolist()
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0].numpy()
    err = float(np.abs(m.forward(tokens, all_logits=True) - want).max())
    print(f"max |logit qkv - transformers| {err:.3g} (max |logit| {np.abs(want).max():.3g})")
    return hf, m, err


def test_llama_folder_loads_in_transformers_with_equal_logits(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "llama"
    train(out, "--arch", "llama", "--kv-heads", "2")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_key_value_heads"] == 2
    hf, m, err = logits_vs_transformers(out)
    assert m.num_params == sum(p.numel() for p in hf.parameters())
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
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu"  # HF's exact (erf) GELU


@pytest.mark.parametrize("bias", [True, False])
def test_gpt2_folder_loads_in_transformers_with_equal_logits(tmp_path, bias):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2"
    r = train(out, "--arch", "gpt2", *(["--bias"] if bias else []))
    trained = int(r.stderr.split("qkv train: ")[1].split(" parameters")[0])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["activation_function"] == "gelu"
    hf, m, err = logits_vs_transformers(out)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    n_hf = sum(p.numel() for p in hf.parameters())
    assert m.num_params == n_hf
    # HF's GPT-2 always has biases: a run without them is written with zero biases, the rest as trained.
    if bias:
        assert n_hf == trained
    else:
        C, L, Hd = 32, 2, 4 * 32
        assert n_hf == trained + L * (2 * C + 3 * C + C + Hd + C) + C  # ln_1, ln_2, c_attn, c_proj, c_fc, mlp.c_proj; ln_f
        assert all(float(p.abs().max()) == 0.0 for n, p in hf.named_parameters() if n.endswith(".bias"))
    # Both f32 with different summation orders (and qkv's exact GELU through an erf polynomial of
    # 1.5e-7 absolute error): ~1e-7 on logits of order 1; 1e-5 leaves a margin, while a W_Q/W_K/W_V
    # block of c_attn in the wrong place or an untransposed Conv1D weight errs by ~0.1.
    assert err < 1e-5

    # `qkv generate` finds the model, its config and its tokenizer in the folder; its greedy tokens
    # are argmaxes of transformers' logits over the same ids: each token's logit is within 2e-5
    # (twice the 1e-5 bound above: qkv's max and its pick each off by at most that) of the row's
    # largest, and a near-tie is the only way the two picks may differ.
    import torch
    r = subprocess.run([QKV, "generate", "--model", str(out), "--prompt", "ROMEO:", "--steps", "24",
                        "--temperature", "0", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    ids, p0 = doc["tokens"], doc["prompt_tokens"]
    assert doc["text"].startswith("ROMEO:") and doc["generated"] > 0 and len(ids) == p0 + doc["generated"]
    with torch.no_grad():
        want = hf(torch.tensor([ids[:-1]])).logits[0].numpy()
    for p in range(p0, len(ids)):
        row = want[p - 1]
        assert row[ids[p]] >= row.max() - 2e-5, (p, ids[p], int(row.argmax()), float(row.max() - row[ids[p]]))


def test_resume_across_architectures_is_refused_and_nothing_overwritten(tmp_path):
    out = tmp_path / "run"
    train(out, "--arch", "gpt2")
    before = (out / "checkpoint.safetensors").read_bytes()
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(out), "--resume", "--arch", "llama",
                        "--steps", "40", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 1
    assert "--arch llama (the checkpoint has gpt2)" in r.stderr, r.stderr
    assert (out / "checkpoint.safetensors").read_bytes() == before


def test_init_fine_tunes_a_hugging_face_llama_folder(tmp_path):
    """A LlamaForCausalLM that transformers wrote (save_pretrained), with stories260K's llama2.c
    tokenizer beside it, fine-tuned by `qkv train --init`: the validation loss falls, and the result
    is again a folder that transformers loads, with qkv's logits."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    base = tmp_path / "base"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(base))
    shutil.copy(ROOT / "data" / "models" / "stories260K" / "tok512.bin", base / "tokenizer.bin")
    out = tmp_path / "ft"
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(out), "--init", str(base), "--context", "32",
                        "--batch", "8", "--steps", "40", "--eval-batches", "4", "--eval-interval", "40", "--lr",
                        "3e-3", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = [line.split(",") for line in (out / "loss.csv").read_text().splitlines()]
    col = rows[0].index("val_loss")
    vals = [float(row[col]) for row in rows[1:] if row[col] not in ("", "nan")]
    print(f"validation loss {vals[0]:.4f} before, {vals[-1]:.4f} after 40 steps")
    # A random init predicts ~uniformly (ln 512 = 6.24); 40 AdamW steps at 3e-3 learn the corpus' most
    # frequent tokens, a fall of well over 0.5 nats (seen: see the printed figures).
    assert vals[-1] < vals[0] - 0.5
    assert (out / "tokenizer.bin").read_bytes() == (base / "tokenizer.bin").read_bytes()
    hf, m, err = logits_vs_transformers(out, seed=1)
    assert m.num_params == sum(p.numel() for p in hf.parameters())
    assert err < 1e-5  # as test_llama_folder_loads_in_transformers_with_equal_logits
