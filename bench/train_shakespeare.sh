#!/usr/bin/env bash
# nanoGPT's small CPU configuration for character-level Shakespeare, trained by qkv and by its
# PyTorch eager twin (bench/train_gpt_torch.py) one after the other in the same run: 4 layers,
# 4 heads, width 128, context 64, batch 12, 2000 steps, lr 1e-3 → 1e-4 (warmup 100, cosine),
# AdamW(0.9, 0.99, wd 0.1), clip 1.0, no dropout, no biases, exact GELU, tied embeddings; the same
# batches (drawn from SEED's stream, as are the initial weights).
#
#   bench/train_shakespeare.sh [BUILD_DIR] [OUT_DIR] [STEPS] [SEED]   (defaults: build, bench/out, 2000, 1337)
#
# Prints the final validation loss (mean over 200 fixed validation batches) and training steps
# per second (evaluation excluded) of both, 2 threads each, OMP_WAIT_POLICY=PASSIVE.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
out=${2:-$root/bench/out}
steps=${3:-2000}
seed=${4:-1337}
data=$root/data/tinyshakespeare/input.txt
export OMP_WAIT_POLICY=PASSIVE QKV_NUM_THREADS=2
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; $(nproc) cores; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$out/qkv"
mkdir -p "$out"
"$build/qkv" train --data "$data" --out "$out/qkv" --steps "$steps" --eval-interval 250 --eval-batches 200 \
  --checkpoint-interval "$steps" --seed "$seed" | tee "$out/qkv.txt"
python3 "$root/bench/train_gpt_torch.py" --data "$data" --steps "$steps" --eval-interval 250 --eval-batches 200 \
  --seed "$seed" --threads 2 --json "$out/torch.json" | tee "$out/torch.txt"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
q = open(f"{out}/qkv.txt").read().split()
qsps = float(q[q.index("steps/s") - 1])
qval = float(q[q.index("loss") + 1].rstrip(","))
t = json.load(open(f"{out}/torch.json"))
print(f"qkv   {qsps:7.2f} steps/s  val {qval:.4f}")
print(f"torch {t['steps_per_s']:7.2f} steps/s  val {t['val_curve'][-1][1]:.4f}")
print(f"ratio {qsps / t['steps_per_s']:.2f}x")
PY
