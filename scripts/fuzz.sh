#!/usr/bin/env bash
# Builds the libFuzzer harnesses of the model loaders with clang (-fsanitize=fuzzer,address,undefined;
# the main build is g++) into build-fuzz/, and runs each for SECONDS (default 20) from a seed corpus of
# the real files. A finding stops with a crash file in build-fuzz/ and a non-zero exit.
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"
out=build-fuzz
mkdir -p "$out"
srcs=(src/core/types.cpp src/model/config.cpp src/model/hf_layout.cpp src/model/weights.cpp src/model/mapped_file.cpp
      src/model/load_llama2c.cpp src/model/safetensors.cpp src/model/tokenizer.cpp)
flags=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc -I.)
for h in llama2c safetensors tokenizer; do
  if [[ ! "$out/fuzz_$h" -nt "fuzz/fuzz_$h.cpp" ]] || [[ -n "$(find src/model src/core include/qkv -newer "$out/fuzz_$h" -print -quit)" ]]; then
    echo "fuzz: building fuzz_$h"
    clang++ "${flags[@]}" "fuzz/fuzz_$h.cpp" "${srcs[@]}" -o "$out/fuzz_$h"
  fi
done

# Seed corpora: the real files (the tokenizer's prefixed with its vocabulary size, the safetensors
# with the config-choosing byte), kept in build-fuzz so runs build on each other.
mkdir -p "$out/corpus_llama2c" "$out/corpus_safetensors" "$out/corpus_tokenizer"
cp data/models/stories260K/stories260K.bin "$out/corpus_llama2c/stories260K.bin"
{ printf '\xfd\x01'; cat data/models/stories260K/tok512.bin; } >"$out/corpus_tokenizer/tok512.bin"
python3 - "$out/corpus_safetensors" <<'PY'
import sys, json, struct
import numpy as np
def st(tensors):
    header, data, at = {}, b"", 0
    for name, shape in tensors:
        n = int(np.prod(shape)) * 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        data += np.ones(shape, "<f4").tobytes(); at += n
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data
llama = [("tok_embeddings.weight", (5, 8))] + [(f"layers.0.{n}", s) for n, s in [
    ("attention_norm.weight", (8,)), ("attention.wq.weight", (8, 8)), ("attention.wk.weight", (4, 8)),
    ("attention.wv.weight", (4, 8)), ("attention.wo.weight", (8, 8)), ("ffn_norm.weight", (8,)),
    ("feed_forward.w1.weight", (16, 8)), ("feed_forward.w2.weight", (8, 16)), ("feed_forward.w3.weight", (16, 8))]] + [("norm.weight", (8,))]
open(sys.argv[1] + "/llama.st", "wb").write(b"\x00" + st(llama))
# The same two shapes as Hugging Face checkpoints (Llama for config byte 0, GPT-2 for byte 1), and
# Hugging Face config.json files for the config parser.
hf_llama = [("model.embed_tokens.weight", (5, 8))] + [(f"model.layers.0.{n}", s) for n, s in [
    ("input_layernorm.weight", (8,)), ("self_attn.q_proj.weight", (8, 8)), ("self_attn.k_proj.weight", (4, 8)),
    ("self_attn.v_proj.weight", (4, 8)), ("self_attn.o_proj.weight", (8, 8)), ("post_attention_layernorm.weight", (8,)),
    ("mlp.gate_proj.weight", (16, 8)), ("mlp.down_proj.weight", (8, 16)), ("mlp.up_proj.weight", (16, 8))]] + [
    ("model.norm.weight", (8,))]
open(sys.argv[1] + "/hf_llama.st", "wb").write(b"\x00" + st(hf_llama))
hf_gpt2 = [("wte.weight", (5, 8)), ("wpe.weight", (4, 8))] + [(f"h.0.{n}", s) for n, s in [
    ("ln_1.weight", (8,)), ("ln_1.bias", (8,)), ("attn.c_attn.weight", (8, 24)), ("attn.c_attn.bias", (24,)),
    ("attn.c_proj.weight", (8, 8)), ("attn.c_proj.bias", (8,)), ("ln_2.weight", (8,)), ("ln_2.bias", (8,)),
    ("mlp.c_fc.weight", (8, 16)), ("mlp.c_fc.bias", (16,)), ("mlp.c_proj.weight", (16, 8)), ("mlp.c_proj.bias", (8,)),
    ("attn.bias", (1, 1, 4, 4))]] + [("ln_f.weight", (8,)), ("ln_f.bias", (8,)), ("lm_head.weight", (5, 8))]
open(sys.argv[1] + "/hf_gpt2.st", "wb").write(b"\x01" + st(hf_gpt2))
open(sys.argv[1] + "/hf_gpt2_config.json", "wb").write(b"\x00" + json.dumps({
    "model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, "n_positions": 4, "vocab_size": 5,
    "n_inner": None, "activation_function": "gelu_new", "tie_word_embeddings": False}).encode())
open(sys.argv[1] + "/hf_llama_config.json", "wb").write(b"\x00" + json.dumps({
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
    "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 5, "max_position_embeddings": 4,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": True}).encode())
PY
# A tiny llama2.c checkpoint too (dim 8, hidden 16, 1 layer, 2 heads, 1 kv head, vocab 5, seq_len 4),
# so that mutations reach the header checks quickly.
python3 -c "
import struct, sys
n = 5*8 + 8 + 64 + 32 + 32 + 64 + 8 + 3*128 + 8 + 4*4
sys.stdout.buffer.write(struct.pack('<7i', 8, 16, 1, 2, 1, 5, 4) + struct.pack('<%df' % n, *([0.5] * n)))
" >"$out/corpus_llama2c/tiny.bin"

rm -f "$out"/crash_*
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
for h in llama2c safetensors tokenizer; do
  echo "fuzz: fuzz_$h for ${secs}s"
  "$out/fuzz_$h" -max_total_time="$secs" -max_len=1100000 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix="$out/crash_${h}_" "$out/corpus_$h" 2>&1 | grep -E "^(stat::number_of_executed_units|INFO: Done|==[0-9]+==ERROR|SUMMARY)" || true
  if ls "$out"/crash_"${h}"_* >/dev/null 2>&1; then echo "fuzz: fuzz_$h found a crash: $(ls "$out"/crash_"${h}"_*)"; exit 1; fi
done
echo "fuzz: no findings"
