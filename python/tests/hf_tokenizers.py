"""Small real Hugging Face tokenizers, built here with the `tokenizers` library (nothing downloads),
for the tests that compare qkv's BPE with Hugging Face's (python/tests/test_hf_tokenizers.py,
tests/inspect/test_hf.py).

    gpt2_bpe(folder)              GPT-2's layout: ByteLevel pre-tokenizer and decoder, <|endoftext|>
                                  last; tokenizer.json, tokenizer_config.json, vocab.json + merges.txt
    llama_bpe(folder, style)      Llama 1/2's layout: <unk> <s> </s>, then the 256 byte tokens
                                  <0x00> … <0xFF>, then the learned pieces; byte fallback, fuse_unk,
                                  the post-processor "<s> $A"; style "legacy" (the normalizer
                                  [Prepend "▁", Replace " " → "▁"]), "metaspace" (pre-tokenizer
                                  Metaspace, prepend_scheme "first") or "metaspace_split" (split on "▁")

Both are trained by BpeTrainer on TRAIN (English with some accents) and so meet characters they
never saw in CORPUS (CJK, emoji, control bytes): byte-level spells them in bytes, Llama's falls
back to <0xXX>. Each returns the transformers fast tokenizer read back from the folder.
"""
import json

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
import transformers

TRAIN = [
    "Once upon a time there was a little girl named Lily. She loved to play outside in the sunshine.",
    "One day, she saw a big, red ball in the park. It's the best ball she'd ever seen!",
    "They're happy; we've been here, I'll go, you'd say: \"hello world\" 1234 5678 3.14159.",
    "The café served crème brûlée and naïve jalapeño soufflés to the façade's visitors.",
    "def main():\n    print('hello')\n\treturn 0\n\n",
] * 4

# The comparison corpus: unicode, whitespace runs, emojis, control and unusual bytes, contractions,
# added tokens written in the text, SentencePiece's own "▁" and "<0x41>" written literally.
CORPUS = [
    "Once upon a time",
    "Hello world",
    "",
    " ",
    "   ",
    "\n",
    "  leading spaces and trailing   ",
    "multiple     spaces\tand\ttabs\n\nnewlines\r\n",
    "it's we're I'll they've I'd DON'T 's 'll ''s",
    "numbers 12345 3.14159 ½ ² ٣",
    "Ünïcödé façade naïve crème brûlée ÅÆØ",
    "日本語のテキストと한국어",
    "emoji 😀🎉 family 👨‍👩‍👧 flag 🇫🇷 skin 👍🏽",
    "control \x01\x02\x1b[0m \x7f del",
    "nbsp\u00a0here, line\u2028sep, zero\u200bwidth",
    "<|endoftext|> in the middle<|endoftext|>",
    "<s> and </s> written in text",
    "▁ literal metaspace ▁▁ and <0x41> literal",
    "mixed: x=1; y = [2, 3]; print(f\"{x}\")",
    "Lily\u0301 combining",
    "ÿþ\u0100\u0101 bytes-like letters",
]


def gpt2_bpe(folder, vocab_size=420):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=vocab_size - 1, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(["<|endoftext|>"])  # last, as in GPT-2 (50256)
    folder.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    tok.model.save(str(folder))  # vocab.json + merges.txt, the slow GPT2Tokenizer's files
    vocab = json.loads((folder / "vocab.json").read_text())
    vocab["<|endoftext|>"] = tok.token_to_id("<|endoftext|>")  # in GPT-2's vocab.json too
    (folder / "vocab.json").write_text(json.dumps(vocab))
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def llama_bpe(folder, style="legacy", vocab_size=600):
    learned = Tokenizer(models.BPE())
    learned.normalizer = normalizers.Replace(" ", "▁")
    learned.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=vocab_size - 259, show_progress=False))
    state = json.loads(learned.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in sorted(state["vocab"], key=state["vocab"].get):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in state["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if style == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=style == "metaspace_split")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder.mkdir(parents=True, exist_ok=True)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")
    fast.save_pretrained(str(folder))
    return transformers.AutoTokenizer.from_pretrained(str(folder))
