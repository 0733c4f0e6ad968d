"""Hugging Face BPE tokenizers read by qkv: GPT-2's byte-level BPE and Llama's SentencePiece-style BPE
with byte fallback, and Hugging Face folders generating and inspected from text prompts.

Oracle: Hugging Face tokenizers (through transformers' fast tokenizer) on the same files, built by
hf_tokenizers.py; ids and decoded text must be equal exactly. Generation: transformers' greedy
generate on the same random checkpoint (hf_tiny.py) gives the same token ids and text.
"""
import json
import random
import shutil
import subprocess

import pytest
import torch

import qkv

from hf_tiny import gpt2, llama
from hf_tokenizers import CORPUS, gpt2_bpe, llama_bpe

STYLES = ["gpt2", "legacy", "metaspace", "metaspace_split"]


def make(style, folder):
    return gpt2_bpe(folder) if style == "gpt2" else llama_bpe(folder, style)


@pytest.fixture(scope="module", params=STYLES)
def pair(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    hf = make(request.param, folder)
    return request.param, folder, hf, qkv.Tokenizer.load(str(folder / "tokenizer.json"), len(hf))


def check_text(hf, tok, text):
    want = hf(text)["input_ids"]
    assert tok.encode(text) == want, text
    assert tok.encode(text, bos=False) == hf(text, add_special_tokens=False)["input_ids"], text
    if want:  # decode refuses an empty list (GPT-2 encodes "" as [])
        assert tok.decode(want) == hf.decode(want, skip_special_tokens=True), text


def test_corpus_equals_hugging_face(pair):
    style, _, hf, tok = pair
    assert tok.format == "hf_bpe" and tok.vocab_size == len(hf)
    assert tok.eos_id == hf.eos_token_id
    assert tok.bos_id == (-1 if style == "gpt2" else hf.bos_token_id)  # GPT-2's post-processor adds none
    for text in CORPUS:
        check_text(hf, tok, text)


def test_random_strings_equal_hugging_face(pair):
    # Strings drawn from letters, digits, punctuation, spaces of several kinds, accents, CJK, emoji,
    # apostrophes and control bytes: the word split's edge cases in every order.
    _, _, hf, tok = pair
    pool = list("aZé ß'sdtmlrev0 9.,!?-_\t\n\r  \u00a0\u3000日本😀👍🏽\u0301\x01\x7f▁<>/") + ["'s", "'ll", "<s>", "</s>",
                                                                                        "<|endoftext|>", "   "]
    rng = random.Random(7)
    for _ in range(400):
        check_text(hf, tok, "".join(rng.choice(pool) for _ in range(rng.randint(1, 30))))


def test_long_text_equals_hugging_face(pair):
    # ~1,000 tokens in one text (one word for the legacy normalizer: the merge heap's size).
    _, _, hf, tok = pair
    text = " ".join(CORPUS * 6)
    assert len(hf(text)["input_ids"]) > 1000
    check_text(hf, tok, text)


def test_folder_and_gpt2_files_read_alike(tmp_path):
    hf = gpt2_bpe(tmp_path)
    V = len(hf)
    from_json = qkv.Tokenizer.load(str(tmp_path / "tokenizer.json"), V)
    from_folder = qkv.Tokenizer.load(str(tmp_path), V)  # the folder: its tokenizer.json
    from_vocab = qkv.Tokenizer.load(str(tmp_path / "vocab.json"), V)
    from_merges = qkv.Tokenizer.load(str(tmp_path / "merges.txt"), V)
    (tmp_path / "tokenizer.json").unlink()
    from_files = qkv.Tokenizer.load(str(tmp_path), V)  # a folder with vocab.json + merges.txt only
    for text in CORPUS:
        want = hf(text)["input_ids"]
        for t in (from_json, from_folder, from_vocab, from_merges, from_files):
            assert t.encode(text) == want, text
    assert from_files.eos_id == hf.eos_token_id


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_greedy_generation_from_folder_equals_transformers(tmp_path, kind):
    hf = gpt2_bpe(tmp_path) if kind == "gpt2" else llama_bpe(tmp_path)
    V = len(hf)
    if kind == "gpt2":
        ref = gpt2(tmp_path, seed=5, vocab_size=V, bos_token_id=hf.eos_token_id, eos_token_id=hf.eos_token_id)
        emb = ref.transformer.wte.weight  # tied: the unembedding too
    else:
        ref = llama(tmp_path, seed=5, vocab_size=V)
        emb = ref.lm_head.weight
    # Tokens that decode to one control character get a zero unembedding row: their logit is 0,
    # below the largest of ~500 random logits, so greedy never picks them and every generated
    # piece is printed (qkv generate, as llama2.c, prints no lone control byte).
    control = [i for i in range(V) if len(s := hf.decode([i])) == 1 and (ord(s) < 32 and not s.isspace() or s == "\x7f")]
    with torch.no_grad():
        emb[control] = 0
    ref.save_pretrained(str(tmp_path))
    prompt = "Once upon a time, Lily's café 😀"
    ids = hf(prompt)["input_ids"]
    steps = 30  # positions, llama2.c's way: the prompt's tokens after the first, then steps − n + 1 samples
    with torch.no_grad():
        want = ref.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                            max_new_tokens=steps - len(ids) + 1, do_sample=False, pad_token_id=hf.eos_token_id)[0].tolist()
    want_text = hf.decode(want, skip_special_tokens=True)

    model = qkv.Model.load(str(tmp_path))
    tok = qkv.Tokenizer.load(str(tmp_path), model.config["vocab_size"])
    assert model.generate(tok, prompt, steps=steps, temperature=0) == want_text

    exe = shutil.which("qkv")
    if exe is None:
        pytest.skip("the qkv program is not on PATH")
    r = subprocess.run([exe, "generate", "--model", str(tmp_path), "--prompt", prompt, "--steps", str(steps),
                        "--temperature", "0", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tokens"] == want  # a sampled EOS is listed, as transformers lists it
    assert doc["text"] == want_text

    out = tmp_path / "page"
    r = subprocess.run([exe, "inspect", "--model", str(tmp_path), "--prompt", prompt, "--out", str(out), "--format",
                        "json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    page = json.loads((out / "inspect.json").read_text())
    assert [t["id"] for t in page["tokens"]] == ids
    with torch.no_grad():
        p = torch.softmax(ref(torch.tensor([ids])).logits[0, -1].double(), -1)
    assert page["next_tokens"][0]["id"] == int(p.argmax())
    assert qkv.inspect(str(tmp_path), prompt).doc["tokens"] == page["tokens"]  # in process, the same
    # The page is JSON: a piece that is not UTF-8 on its own (a lone byte) shows as U+FFFD.
    assert page["next_tokens"][0]["text"] == tok.piece(ids[-1], int(p.argmax())).decode("utf-8", "replace")
    print(f"{kind}: {len(ids)} prompt tokens, {len(want) - len(ids)} generated: {want_text!r}")


def bpe_json(tmp_path):
    llama_bpe(tmp_path)
    return json.loads((tmp_path / "tokenizer.json").read_text())


def refused(tmp_path, doc, *named, vocab=600, name="tokenizer.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ValueError) as e:
        qkv.Tokenizer.load(str(path), vocab)
    print(e.value)
    for n in (str(path),) + named:
        assert n in str(e.value)


@pytest.mark.parametrize("change, named", [
    (lambda j: j["model"].update(dropout=0.1), ['"model.dropout" is 0.1']),
    (lambda j: j["model"].update(continuing_subword_prefix="##"), ['"model.continuing_subword_prefix" is "##"']),
    (lambda j: j["model"].update(unk_token="<nope>"), ['"model.unk_token" is "<nope>"', "not in model.vocab"]),
    (lambda j: j["model"]["vocab"].update({"▁x": -3}), ['"model.vocab.▁x" is -3', "token id"]),
    (lambda j: j["model"]["merges"].append(["▁zz", "qq"]), ['"▁zz" + "qq"', "not in the vocabulary"]),
    (lambda j: j["model"]["merges"].append(7), ['"model.merges[', '" is 7']),
    (lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "x"}}), ['"pre_tokenizer" is {', '"type":"Split"']),
    (lambda j: j.update(normalizer={"type": "NFKC"}), ['"normalizer" is {"type":"NFKC"}']),
    (lambda j: j["added_tokens"][0].update(lstrip=True), ['"added_tokens[0].lstrip" is true']),
    (lambda j: j["post_processor"].update(single=[{"Sequence": {"id": "A", "type_id": 0}}] * 2),
     ['"post_processor.single"']),
    (lambda j: j["model"]["vocab"].update({"dup": 5}), ["id 5 is given to"]),
])
def test_bad_tokenizer_json_is_named(tmp_path, change, named):
    doc = bpe_json(tmp_path)
    change(doc)
    refused(tmp_path, doc, *named)


def test_bad_gpt2_files_are_named(tmp_path):
    gpt2_bpe(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    merges = (tmp_path / "merges.txt").read_text()
    refused(tmp_path, merges + "a b c\n", "line", '"a b c" is not two tokens', vocab=420, name="merges.txt")
    (tmp_path / "merges.txt").write_text(merges)
    refused(tmp_path, (tmp_path / "vocab.json").read_text(), "420 tokens, but the model's vocabulary has 500", vocab=500,
            name="vocab.json")
    (tmp_path / "merges.txt").unlink()
    refused(tmp_path, (tmp_path / "vocab.json").read_text(), "merges.txt", vocab=420, name="vocab.json")


def test_vocab_mismatch_is_named(tmp_path):
    llama_bpe(tmp_path)
    with pytest.raises(ValueError, match="600 tokens, but the model's vocabulary has 500"):
        qkv.Tokenizer.load(str(tmp_path / "tokenizer.json"), 500)
