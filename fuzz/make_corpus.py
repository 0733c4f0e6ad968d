#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses into fuzz/corpus/<harness>/ (committed; rerun only
to change a seed). Each corpus holds small valid examples of its format and a few edge cases; the
real stories260K checkpoint and tok512 tokenizer are added by scripts/fuzz.sh from data/models/."""
import json
import os
import struct
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(harness, name, data):
    os.makedirs(os.path.join(root, harness), exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(root, harness, name), "wb") as f:
        f.write(data)


def ones(n):
    return struct.pack("<%df" % n, *([1.0] * n))


def safetensors(tensors, metadata=None, pad=True):
    """tensors: (name, dtype, shape, raw bytes or None for ones). Header padded to 8 like the writers."""
    header, data = {}, b""
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        n = 1
        for d in shape:
            n *= d
        raw = ones(n) if raw is None else raw
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


# llama2.c checkpoints: 7 int32 (dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 5, seq_len 4)
# then the f32 weights; a negative vocab_size means an untied classifier follows.
def llama2c(vocab, extra=0, heads=(2, 1)):
    n = 5 * 8 + 8 + 64 + 32 + 32 + 64 + 8 + 3 * 128 + 8 + 4 * 4 + extra
    return struct.pack("<7i", 8, 16, 1, heads[0], heads[1], vocab, 4) + ones(n)


put("llama2c", "tiny.bin", llama2c(5))
put("llama2c", "tiny_untied.bin", llama2c(-5, extra=5 * 8))
put("llama2c", "header_only.bin", struct.pack("<7i", 8, 16, 1, 2, 1, 5, 4))
put("llama2c", "gqa_mismatch.bin", llama2c(5, heads=(2, 3)))

# llama2.c tokenizers: 2 bytes (vocab_size - 3, little-endian) chosen by the harness, then
# max_token_length and vocab_size × (f32 score, int32 length, bytes).
def tok(pieces, max_len=None):
    body = struct.pack("<i", max_len if max_len is not None else max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        body += struct.pack("<fi", -float(i), len(p)) + p
    return struct.pack("<H", len(pieces) - 3) + body


byte_pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
put("tokenizer", "bytes_and_words.bin", tok(byte_pieces + [b" ", b"a", b"b", b"ab", b" ab", b"\xc3\xa9"]))
put("tokenizer", "three.bin", tok([b"<unk>", b"<s>", b"</s>"]))
put("tokenizer", "empty_pieces.bin", tok([b"", b"", b"", b""], max_len=0))

# Hugging Face BPE tokenizer.json files (Tokenizer::load tells them by content), with the same two
# bytes in front: GPT-2's byte-level style, Llama's legacy normalizer and its Metaspace pre-tokenizer.
def hf_bpe(vocab, merges, **rest):
    body = {"model": {"type": "BPE", "dropout": None, "unk_token": rest.pop("unk", None), "byte_fallback": rest.pop(
        "byte_fallback", False), "fuse_unk": True, "vocab": vocab, "merges": merges}}
    body.update(rest)
    return struct.pack("<H", len(vocab) - 3) + json.dumps(body, ensure_ascii=False).encode()


def added(*names):
    return [{"id": i, "content": n, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True} for i, n in enumerate(names)]


gpt2_vocab = {t: i for i, t in enumerate(["<|endoftext|>", "\u0120", "a", "b", "\u0120a", "ab", "\u0120ab", "\u00c3",
                                          "\u00a9", "\u00c3\u00a9", "'", "s", "'s", "\u010a"])}
put("tokenizer", "hf_gpt2.json", hf_bpe(gpt2_vocab, ["\u0120 a", "a b", "\u0120a b", "\u00c3 \u00a9", "' s"],
                                        added_tokens=added("<|endoftext|>"), normalizer=None,
                                        pre_tokenizer={"type": "ByteLevel", "add_prefix_space": False,
                                                       "trim_offsets": True, "use_regex": True},
                                        post_processor={"type": "ByteLevel"}))
sp_vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
sp_vocab.update({"<0x%02X>" % b: 3 + b for b in range(256)})
sp_vocab.update({t: 259 + i for i, t in enumerate(["\u2581", "a", "\u2581a", "n", "\u2581an"])})
template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                     {"Sequence": {"id": "A", "type_id": 0}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
put("tokenizer", "hf_llama_legacy.json", hf_bpe(
    sp_vocab, [["\u2581", "a"], ["\u2581a", "n"]], unk="<unk>", byte_fallback=True,
    added_tokens=added("<unk>", "<s>", "</s>"), pre_tokenizer=None, post_processor=template,
    normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}))
put("tokenizer", "hf_llama_metaspace.json", hf_bpe(
    sp_vocab, ["\u2581 a", "\u2581a n"], unk="<unk>", byte_fallback=True, added_tokens=added("<unk>", "<s>", "</s>"),
    normalizer=None, post_processor=template,
    pre_tokenizer={"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}))
put("tokenizer", "gpt2_vocab.json", struct.pack("<H", len(gpt2_vocab) - 3) + json.dumps(gpt2_vocab).encode())
put("tokenizer", "gpt2_merges.txt", struct.pack("<H", len(gpt2_vocab) - 3) + "#version: 0.2\n\u0120 a\na b\n".encode())

# Model safetensors: the first byte picks the config the harness checks against (0: Llama-like,
# 1: GPT-2-like), the rest is the file, in qkv's own names and in both Hugging Face layouts.
F = "F32"
llama = [("tok_embeddings.weight", F, (5, 8), None)] + [("layers.0." + n, F, s, None) for n, s in [
    ("attention_norm.weight", (8,)), ("attention.wq.weight", (8, 8)), ("attention.wk.weight", (4, 8)),
    ("attention.wv.weight", (4, 8)), ("attention.wo.weight", (8, 8)), ("ffn_norm.weight", (8,)),
    ("feed_forward.w1.weight", (16, 8)), ("feed_forward.w2.weight", (8, 16)),
    ("feed_forward.w3.weight", (16, 8))]] + [("norm.weight", F, (8,), None)]
put("safetensors", "llama.st", b"\x00" + safetensors(llama))
hf_llama = [("model.embed_tokens.weight", F, (5, 8), None)] + [("model.layers.0." + n, F, s, None) for n, s in [
    ("input_layernorm.weight", (8,)), ("self_attn.q_proj.weight", (8, 8)), ("self_attn.k_proj.weight", (4, 8)),
    ("self_attn.v_proj.weight", (4, 8)), ("self_attn.o_proj.weight", (8, 8)),
    ("post_attention_layernorm.weight", (8,)), ("mlp.gate_proj.weight", (16, 8)),
    ("mlp.down_proj.weight", (8, 16)), ("mlp.up_proj.weight", (16, 8))]] + [("model.norm.weight", F, (8,), None)]
put("safetensors", "hf_llama.st", b"\x00" + safetensors(hf_llama))
hf_gpt2 = [("wte.weight", F, (5, 8), None), ("wpe.weight", F, (4, 8), None)] + [("h.0." + n, F, s, None) for n, s in [
    ("ln_1.weight", (8,)), ("ln_1.bias", (8,)), ("attn.c_attn.weight", (8, 24)), ("attn.c_attn.bias", (24,)),
    ("attn.c_proj.weight", (8, 8)), ("attn.c_proj.bias", (8,)), ("ln_2.weight", (8,)), ("ln_2.bias", (8,)),
    ("mlp.c_fc.weight", (8, 16)), ("mlp.c_fc.bias", (16,)), ("mlp.c_proj.weight", (16, 8)),
    ("mlp.c_proj.bias", (8,)), ("attn.bias", (1, 1, 4, 4))]] + [
    ("ln_f.weight", F, (8,), None), ("ln_f.bias", F, (8,), None), ("lm_head.weight", F, (5, 8), None)]
put("safetensors", "hf_gpt2.st", b"\x01" + safetensors(hf_gpt2))
put("safetensors", "bf16_embedding.st", b"\x00" + safetensors(
    [("tok_embeddings.weight", "BF16", (5, 8), b"\x80\x3f" * 40)] + llama[1:]))
put("safetensors", "empty_header.st", b"\x00" + struct.pack("<Q", 2) + b"{}")

# Model configurations: qkv's model.json (config_to_json's keys) and Hugging Face config.json.
qkv_llama = {"dim": 8, "hidden_dim": 16, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1, "vocab_size": 5,
             "seq_len": 4, "pos": "rotary", "norm": "rmsnorm", "mlp": "swiglu", "tied_embeddings": True,
             "bias": False, "norm_eps": 1e-5, "rope_theta": 10000.0}
put("config", "model_llama.json", json.dumps(qkv_llama, indent=2))
put("config", "model_gpt2.json", json.dumps(dict(qkv_llama, pos="learned", norm="layernorm", mlp="gelu",
                                                 tied_embeddings=False, bias=True, n_kv_heads=2)))
put("config", "model_sizes_only.json", json.dumps({k: qkv_llama[k] for k in list(qkv_llama)[:7]}))
put("config", "model_gelu_exact_no_pos.json", json.dumps(dict(qkv_llama, pos="none", mlp="gelu_exact")))
put("config", "hf_gpt2_config.json", json.dumps({
    "model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, "n_positions": 4, "vocab_size": 5,
    "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False}, indent=2))
put("config", "hf_llama_config.json", json.dumps({
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
    "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 5, "max_position_embeddings": 4,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": 4,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "rope_scaling": None,
    "tie_word_embeddings": True}, indent=2))
put("config", "hf_llama_old_rope.json", json.dumps({
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
    "num_hidden_layers": 1, "vocab_size": 5, "max_position_embeddings": 4, "rope_theta": 500000.0}))

# Regressions of the findings (docs/fuzzing.md): JSON nested deeper than qkv's limit of 64 (a
# million levels overflowed the stack in dump()), here 100 levels, small enough to keep.
put("config", "regress_nested.json", '{"dim": ' + "[" * 100 + "]" * 100 + "}")

# The tokenizer JSON of qkv train (src/model/text_tokenizer.hpp): chars and byte-level BPE; merge r
# makes token 256 + r from two earlier ids.
put("text_tokenizer", "chars.json", json.dumps({"kind": "chars", "chars": sorted(set("First Citizen:\nBefore we proceed, hear me speak."))}))
put("text_tokenizer", "chars_unicode.json", json.dumps({"kind": "chars", "chars": ["\n", " ", "a", "\u00e9", "\u732b", "\U0001F600"]}))
put("text_tokenizer", "bpe.json", json.dumps({"kind": "bpe", "merges": [[116, 104], [256, 101], [32, 257], [101, 114], [32, 97]]}))
put("text_tokenizer", "bpe_no_merges.json", '{"kind":"bpe","merges":[]}')
# Regression: 40 merges that each double a token asked for 2^41 bytes.
put("text_tokenizer", "regress_doubling_merges.json",
    json.dumps({"kind": "bpe", "merges": [[97, 97]] + [[256 + i, 256 + i] for i in range(40)]}))
put("text_tokenizer", "bpe_text.txt", "the other there; \xff\x00 and\tthe\n".encode("latin-1"))

# Training checkpoints (src/model/safetensors.hpp): F32 parameters and optimiser moments, the
# U64 RNG state, the I64 step and string metadata, as qkv train writes them.
put("checkpoint", "train.st", safetensors([
    ("optimizer.m", F, (6,), None), ("optimizer.v", F, (6,), None), ("train.rng", "U64", (4,), struct.pack("<4Q", 1, 2, 3, 4)),
    ("train.step", "I64", (1,), struct.pack("<q", 7)), ("transformer.wte.weight", F, (3, 2), None)],
    metadata={"format": "qkv-train-1", "model": '{"layers":1}', "tokenizer": '{"kind":"bpe","merges":[]}'}))
put("checkpoint", "dtypes.st", safetensors([
    ("b", "BOOL", (2,), b"\x01\x00"), ("h", "BF16", (1, 2), b"\x80\x3f\x00\x40"), ("i", "I32", (1,), b"\x01\x00\x00\x00"),
    ("d", "F64", (1,), struct.pack("<d", 0.5)), ("e", F, (0, 3), b"")], pad=False))

# Command lines of qkv, one argv word per line (argv[0] "qkv" is implied).
lines = {
    "generate.txt": ["generate", "--prompt", "Once upon a time", "-n", "64", "-t", "0.8", "-p", "0.9", "--top-k", "40", "-s", "7"],
    "generate_model.txt": ["--threads", "2", "generate", "--model", "m.safetensors", "--config", "c.json", "--tokenizer",
                           "tok.bin", "--weights", "bf16", "--gemm-inputs", "f32", "-i", "caf\u00e9"],
    "train.txt": ["train", "--data", "input.txt", "--out", "runs/x", "--layers", "2", "--heads", "2", "--d-model", "64",
                  "--context", "32", "--tokenizer", "bpe", "--bpe-vocab", "512", "--lr", "1e-3", "--bias", "--quiet"],
    "train_resume.txt": ["train", "--data=input.txt", "--out=runs/x", "--resume", "--steps", "10", "--time-limit", "0.5",
                         "--decay-steps", "20", "--clip", "1", "--val-fraction", "0.1", "--seed", "3"],
    "params.txt": ["params", "--preset", "gpt2", "--layers", "24", "--d-ff", "3072", "--vocab", "50257", "--norm", "rmsnorm"],
    "attend.txt": ["attend", "--text", "the cat sat", "--d-model", "16", "--heads", "2", "--d-head", "8", "--no-causal"],
    "inspect.txt": ["inspect", "--prompt", "Once", "--out", "out", "--format", "json"],
    "help.txt": ["train", "--help"],
    "version.txt": ["--version"],
    "unknown.txt": ["frobnicate", "--x"],
    # For scripts (issue #23): text from stdin, JSON output, completion scripts.
    "generate_json_stdin.txt": ["generate", "--prompt", "-", "--json", "--temperature", "0"],
    "params_json.txt": ["params", "--preset", "gpt3", "--json"],
    "attend_json_stdin.txt": ["attend", "--prompt", "-", "--json", "--heads", "2"],
    "inspect_stdin.txt": ["inspect", "--prompt=-", "--out", "out"],
    "completion.txt": ["completion", "zsh"],
    "help_command.txt": ["help", "completion"],
    # Regression: a flag's value that is not one ("stoll" escaped CLI11's usage errors).
    "regress_flag_value.txt": ["params", "--preset", "gpt2", "--no-bias=input.txt"],
    # Regression: a number out of range given to a negated flag ("stoll" as std::out_of_range).
    "regress_negated_flag_range.txt": ["params", "--preset", "gpt2", "--no-bias=99999999999999999999"],
}
for name, words in lines.items():
    put("cli", name, "\n".join(words))

print("seeds written under", root, file=sys.stderr)
