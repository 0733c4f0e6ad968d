#!/usr/bin/env bash
# GPT-2 and Llama-style models of the same size (804,096 and 808,192 parameters) trained on tiny Shakespeare
# side by side, so both see the same machine load: nanoGPT's recipe (4 layers, width 128, 4 heads, context 64,
# batch 12, 2000 steps), validation on 200 fixed batches every 250 steps. Llama: rotary, RMSNorm, SwiGLU of
# hidden 392, 4 query heads on 2 key/value heads.
#   bash bench/results/train_arch_shakespeare/run.sh BUILD_DIR OUT_DIR SEED
set -eu
root=$(cd "$(dirname "$0")/../../.." && pwd)
q=$1/qkv out=$2 seed=$3 data=$root/data/tinyshakespeare/input.txt
export QKV_NUM_THREADS=2 OMP_WAIT_POLICY=PASSIVE
common=(--data "$data" --steps 2000 --eval-interval 250 --eval-batches 200 --checkpoint-interval 2000 --seed "$seed" --quiet)
"$q" train "${common[@]}" --out "$out/gpt2_$seed" &
a=$!
"$q" train "${common[@]}" --out "$out/llama_$seed" --arch llama --kv-heads 2 --hidden-dim 392 &
b=$!
wait $a $b
