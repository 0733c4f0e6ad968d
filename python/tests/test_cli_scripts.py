"""Issue #23: the qkv command for scripts, as pip installs it.

`--json` documents are checked against values computed here (hand counts, the Python tokenizer,
the plain text output); `--prompt -` against `--prompt TEXT`; the installed binary finds the model
shipped with the wheel from any folder, by its own location and not by a path of the source tree.
"""

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

QKV = shutil.which("qkv")
pytestmark = pytest.mark.skipif(QKV is None, reason="the qkv command is not on PATH")
ROOT = pathlib.Path(__file__).resolve().parents[2]
STORIES = ROOT / "data" / "models" / "stories260K"
GREEDY_200 = ROOT / "tests" / "golden" / "llama2c_stories260K_greedy_200.txt"


def run(*args, stdin=None, cwd=None, exe=None, env=None):
    r = subprocess.run([exe or QKV, *args], input=stdin, capture_output=True, timeout=120, cwd=cwd, env=env)
    print(r.stdout.decode("utf-8", "replace")[:3000], r.stderr.decode("utf-8", "replace"))
    return r


def run_json(*args, stdin=None):
    r = run(*args, "--json", stdin=stdin)
    assert r.returncode == 0
    return json.loads(r.stdout)  # the whole of stdout is one document


def test_params_json_gpt3_counts_by_hand():
    d, dh, h, layers, vocab, ctx = 12288, 128, 96, 96, 50257, 2048
    head = dh * d  # one of W_Q, W_K, value-down, value-up
    doc = run_json("params", "--preset", "gpt3")
    assert set(doc) == {"configuration", "per_head", "per_block", "all_blocks", "model"}
    assert doc["per_head"] == {"query": head, "key": head, "value_down": head, "value_up": head, "total": 4 * head}
    assert doc["per_head"]["total"] == 6_291_456  # 3Blue1Brown's figure for one GPT-3 head
    block = h * 4 * head
    biases = 3 * h * dh + d  # GPT-3 has biases: on each head's query, key and value, and on the output
    assert doc["per_block"] == {"weights": block, "biases": biases, "total": block + biases}
    assert doc["all_blocks"] == {"weights": layers * block, "total": layers * (block + biases)}
    assert doc["all_blocks"]["weights"] == 57_982_058_496  # seed 004: the weights of all 96 blocks
    c = doc["configuration"]
    assert (c["d_model"], c["d_head"], c["heads"], c["kv_heads"], c["layers"], c["vocab"], c["context"]) == (
        d, dh, h, h, layers, vocab, ctx)
    m = doc["model"]
    assert m["token_embedding"] == vocab * d and m["positions"] == ctx * d
    assert m["attention"] == layers * (block + biases)
    assert m["total"] == sum(m[k] for k in ("token_embedding", "positions", "attention", "mlp", "norms", "unembedding"))
    assert m["total"] == 174_604_259_328


def test_params_json_gqa_and_no_model_total():
    # 32 query heads sharing 8 kv heads of 128: 2·4096·4096 + 2·8·128·4096 weights per block.
    doc = run_json("params", "--d-model", "4096", "--heads", "32", "--kv-heads", "8")
    assert doc["per_block"]["weights"] == 2 * 4096 * 4096 + 2 * 8 * 128 * 4096 == 41_943_040
    assert doc["model"] is None  # no --d-ff / --vocab: no whole-model count


@pytest.mark.parametrize("arch", ["bert_mlm", "llama_gqa_untied", "gpt2"])
def test_params_config_counts_what_transformers_counts(arch, tmp_path):
    """`qkv params --config` lists the tensors qkv train trains; their total is transformers' own count of the
    same configuration (tied weights counted once), exact."""
    transformers = pytest.importorskip("transformers")
    if arch == "bert_mlm":
        folder = ROOT / "tests" / "train" / "golden" / "bert_mlm"  # a BertForMaskedLM folder
        hf = transformers.BertForMaskedLM(transformers.BertConfig.from_pretrained(folder))
    else:
        if arch == "gpt2":
            cfg = transformers.GPT2Config(n_embd=48, n_layer=3, n_head=4, vocab_size=97, n_positions=40)
            hf = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=3,
                                           num_attention_heads=6, num_key_value_heads=2, vocab_size=97,
                                           max_position_embeddings=64, tie_word_embeddings=False)
            hf = transformers.LlamaForCausalLM(cfg)
        folder = tmp_path / arch
        cfg.save_pretrained(folder)
    doc = run_json("params", "--config", str(folder))
    assert doc["total"] == hf.num_parameters()
    assert doc["total"] == sum(t["count"] for t in doc["other"]) + doc["configuration"]["n_layers"] * doc["layer_total"]
    if arch != "bert_mlm":  # a decoder: the scorekeeping from sizes alone gives the same whole-model total
        c = doc["configuration"]
        flags = ["--d-model", str(c["dim"]), "--heads", str(c["n_heads"]), "--kv-heads", str(c["n_kv_heads"]),
                 "--layers", str(c["n_layers"]), "--hidden-dim", str(c["hidden_dim"]), "--vocab", str(c["vocab_size"]),
                 "--context", str(c["seq_len"]), "--mlp", "swiglu" if c["mlp"] == "swiglu" else "gelu",
                 "--norm", c["norm"], "--positions", c["pos"], "--bias" if c["bias"] else "--no-bias",
                 "--tied" if c["tied_embeddings"] else "--untied"]
        assert run_json("params", *flags)["model"]["total"] == doc["total"]


def test_params_config_refuses_size_flags():
    r = run("params", "--config", str(ROOT / "tests" / "train" / "golden" / "bert_mlm"), "--layers", "3")
    assert r.returncode == 1 and b"--layers cannot change it" in r.stderr


def test_generate_json_equals_the_plain_text_and_the_tokenizer():
    prompt = "Once upon a time, there was a dog"
    args = ("generate", "--prompt", prompt, "--temperature", "0", "--steps", "60", "--seed", "7")
    plain = run(*args)
    assert plain.returncode == 0
    doc = run_json(*args)
    assert set(doc) == {"text", "tokens", "pieces", "prompt_tokens", "generated", "timings", "settings"}
    assert doc["text"] + "\n" == plain.stdout.decode("utf-8")
    assert "".join(doc["pieces"]) == doc["text"]
    # Positions 0..59 each predict their successor: BOS, then 60 tokens whose pieces are printed.
    assert len(doc["tokens"]) == len(doc["pieces"]) == doc["prompt_tokens"] + doc["generated"] == 61
    import qkv

    tok = qkv.Tokenizer.load(str(STORIES / "tok512.bin"), 512)
    ids = tok.encode(prompt, bos=True)
    assert doc["tokens"][:len(ids)] == ids and doc["prompt_tokens"] == len(ids)
    assert set(doc["timings"]) == {"prefill_seconds", "decode_seconds", "prefill_tokens_per_second",
                                   "decode_tokens_per_second"}
    assert all(v >= 0 for v in doc["timings"].values())
    s = doc["settings"]
    assert (s["prompt"], s["steps"], s["temperature"], s["top_p"], s["top_k"], s["seed"], s["weights"]) == (
        prompt, 60, 0.0, 0.9, 0, 7, "f32")
    assert pathlib.Path(s["model"]).name == "stories260K.bin" and pathlib.Path(s["tokenizer"]).name == "tok512.bin"


def test_prompt_from_stdin_equals_prompt_flag(tmp_path):
    text = "Lily and Ben saw a big 猫"
    gen = ("generate", "--temperature", "0", "--steps", "50")
    a, b = run(*gen, "--prompt", "-", stdin=(text + "\n").encode()), run(*gen, "--prompt", text)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith(text.encode())
    a, b = run("attend", "--prompt", "-", stdin=text.encode()), run("attend", "--prompt", text)
    assert a.returncode == 0 and a.stdout == b.stdout
    for name, how in (("stdin", ("--prompt", "-")), ("flag", ("--prompt", text))):
        r = run("inspect", *how, "--out", str(tmp_path / name), "--format", "json",
                stdin=(text + "\r\n").encode() if name == "stdin" else None)
        assert r.returncode == 0
    assert json.loads((tmp_path / "stdin" / "inspect.json").read_text())["tokens"] == \
        json.loads((tmp_path / "flag" / "inspect.json").read_text())["tokens"]


def test_stdin_that_is_not_utf8_names_the_line():
    r = run("attend", "--prompt", "-", stdin=b"first line\nsecond \xc3( line\n")
    assert r.returncode == 1
    assert r.stderr.decode() == ("qkv: error: [qkv attend] --prompt -: stdin is not UTF-8: line 2, character 8 "
                                 "starts with the byte 0xC3\n")


def test_attend_json_matches_the_printed_grid():
    words = "a fluffy blue creature roamed the verdant forest".split()
    args = ("attend", "--prompt", " ".join(words), "--heads", "2", "--seed", "3")
    doc = run_json(*args)
    assert set(doc) == {"tokens", "d_model", "heads", "d_head", "seed", "causal", "pattern", "delta_norm"}
    assert doc["tokens"] == words and doc["heads"] == 2 and doc["seed"] == 3 and doc["causal"] is True
    T = len(words)
    grid_lines = run(*args).stdout.decode().splitlines()
    for h, rows in enumerate(doc["pattern"]):
        assert len(rows) == T and all(len(r) == T for r in rows)
        for i, row in enumerate(rows):  # query i
            assert sum(row) == pytest.approx(1.0, abs=1e-12)
            assert all(row[j] == 0.0 for j in range(i + 1, T))  # causal: no later key
        # The text grid: row = key j, column = query i, 2 decimals, '.' where masked.
        start = grid_lines.index(next(l for l in grid_lines if l.startswith(f"head {h}:"))) + 2
        for j in range(T):
            cells = grid_lines[start + j][10:].split()
            for i in range(T):
                assert cells[i] == ("." if j > i else f"{rows[i][j]:.2f}")
    norms = grid_lines[-T:]
    assert [float(l.split()[-1]) for l in norms] == [round(v, 3) for v in doc["delta_norm"]]


def test_installed_generate_runs_from_another_folder(tmp_path):
    # The wheel installs the model as <prefix>/share/qkv beside <prefix>/bin/qkv.
    r = run("generate", "--temperature", "0", "--steps", "200", cwd=tmp_path)
    assert r.returncode == 0
    assert r.stdout == GREEDY_200.read_bytes()  # llama2.c's published greedy story


def test_installed_binary_finds_the_model_by_its_own_location(tmp_path):
    exe = pathlib.Path(QKV).resolve()
    assert str(ROOT).encode() not in exe.read_bytes(), "the installed qkv holds a path of the source tree"
    shipped = exe.parent.parent / "share" / "qkv"
    assert (shipped / "models" / "stories260K" / "stories260K.bin").is_file()
    # The binary alone in bin/: no model, and the error says where it looked.
    (tmp_path / "bin").mkdir()
    alone = tmp_path / "bin" / "qkv"
    shutil.copy2(exe, alone)
    r = run("generate", "--steps", "10", exe=str(alone), cwd=tmp_path)
    assert r.returncode == 1
    assert str(tmp_path / "share" / "qkv" / "models" / "stories260K" / "stories260K.bin") in r.stderr.decode()
    # With share/qkv beside bin/, as pip and cmake --install lay them out, it runs.
    shutil.copytree(shipped, tmp_path / "share" / "qkv")
    r = run("generate", "--temperature", "0", "--steps", "200", exe=str(alone), cwd="/")
    assert r.returncode == 0 and r.stdout == GREEDY_200.read_bytes()


def test_help_documents_exit_codes_and_completion_lists_commands():
    out = run("--help").stdout.decode()
    assert "Exit codes: 0 success; 1 error" in out and "2 usage error" in out and "129, 130, 143" in out
    commands = {l.split()[0] for l in out.split("Subcommands:\n")[1].split("\n\n")[0].splitlines()}
    assert {"params", "attend", "generate", "inspect", "train", "completion", "help"} <= commands
    script = run("completion", "bash").stdout.decode()
    root = script.split("    '')")[1].split("    params)")[0]  # what `qkv <TAB>` offers
    listed = set(root.split("compgen -W '")[-1].split("'")[0].split())
    assert listed == commands
