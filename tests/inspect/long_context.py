"""stories260K at 1,000 tokens: the only trained model the repository carries has a context of 512,
so the 1,000-token page (tests/inspect/test_page.py, bench/inspect_long.py) runs a copy whose
llama2.c header says 1,024. Rotary positions are computed, not learned, so the model runs there; it
was trained on 512, so past that its patterns are extrapolation — real heads, not a claim about
quality. The file's unused freq_cis tables [seq_len, D/2] grow with the header (the loader checks
the size), so zeros are appended for the extra rows."""
import os
import shutil
import struct

STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
PROMPT_1000 = STORY * 32 + "Once upon a time, there was"  # 1,000 tokens with BOS


def stories260k_with_context(model_dir, out_dir, seq_len=1024):
    """Writes out_dir/stories260K.bin (header seq_len raised) and tok512.bin; returns the model's path."""
    os.makedirs(out_dir, exist_ok=True)
    src = open(os.path.join(model_dir, "stories260K.bin"), "rb").read()
    dim, hidden, n_layers, n_heads, n_kv, vocab, old = struct.unpack("<7i", src[:28])
    assert vocab > 0 and seq_len >= old, "a tied classifier (no wcls after freq_cis) and a longer context"
    extra = 2 * (seq_len - old) * (dim // n_heads // 2)  # freq_cis_real and _imag rows
    out = os.path.join(out_dir, "stories260K.bin")
    with open(out, "wb") as f:
        f.write(struct.pack("<7i", dim, hidden, n_layers, n_heads, n_kv, vocab, seq_len))
        f.write(src[28:])
        f.write(b"\0" * (4 * extra))
    shutil.copy(os.path.join(model_dir, "tok512.bin"), os.path.join(out_dir, "tok512.bin"))
    return out
