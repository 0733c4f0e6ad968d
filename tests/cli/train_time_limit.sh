#!/usr/bin/env bash
# `qkv train --time-limit`: a run with far more steps than fit stops after the limit at a step
# 0 < N < --steps, validates there (the last loss.csv row is step N with a validation loss), saves
# the checkpoint and exits 0 with "time limit reached at step N"; `--resume` continues from N.
#   Usage: train_time_limit.sh QKV DATA
set -u
qkv=$1 data=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--data "$data" --out "$dir/run" --layers 1 --heads 1 --d-model 16 --context 16 --batch 2 --eval-batches 1
      --eval-interval 100000 --decay-steps 1000 --quiet)
start=$(date +%s)
"$qkv" train "${args[@]}" --steps 100000000 --time-limit 0.02 >"$dir/out" 2>"$dir/err" ||
  { echo "exit code $? with --time-limit"; cat "$dir/err"; exit 1; }
took=$(($(date +%s) - start))
step=$(sed -n 's/^time limit reached at step \([0-9]*\):.*/\1/p' "$dir/out")
[[ -n $step && $step -gt 0 && $step -lt 100000000 ]] || { echo "no 'time limit reached at step N'"; cat "$dir/out" "$dir/err"; exit 1; }
# 0.02 minutes = 1.2 s; the bound only catches a run that ignored the limit (100M steps take hours).
[[ $took -lt 60 ]] || { echo "the run took $took s with a 1.2 s limit"; exit 1; }
last=$(tail -n 1 "$dir/run/loss.csv")
[[ $last == "$step,"* ]] || { echo "last loss.csv row is not step $step: $last"; exit 1; }
val=$(cut -d, -f4 <<<"$last")
[[ -n $val ]] || { echo "no validation loss at the stop: $last"; exit 1; }
[[ -f $dir/run/checkpoint.safetensors && ! -e $dir/run/checkpoint.safetensors.tmp ]] || { echo "no checkpoint"; exit 1; }
"$qkv" train "${args[@]}" --resume --steps $((step + 2)) >"$dir/out2" 2>"$dir/err2" ||
  { echo "resume failed"; cat "$dir/err2"; exit 1; }
grep -q "^done at step $((step + 2)):" "$dir/out2" || { echo "resume did not reach step $((step + 2))"; cat "$dir/out2"; exit 1; }
echo "stopped by the time limit at step $step (validation loss $val), resumed to step $((step + 2))"
