#!/usr/bin/env bash
# Ctrl-C during `qkv train`: the run saves a checkpoint and exits 130 (128 + SIGINT, so scripts can
# tell an interrupted run) with "stopped at step N";
# `--resume` then continues from step N to the new --steps.   Usage: train_sigint.sh QKV DATA
set -u
qkv=$1 data=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--data "$data" --out "$dir/run" --layers 1 --heads 1 --d-model 16 --context 16 --batch 2 --eval-batches 1 --decay-steps 1000 --quiet)
"$qkv" train "${args[@]}" --steps 1000000 >"$dir/out" 2>"$dir/err" &
pid=$!
for _ in $(seq 600); do grep -q "^qkv train:" "$dir/err" && break; sleep 0.1; done
sleep 1
kill -INT "$pid"
wait "$pid"
rc=$?
[[ $rc == 130 ]] || { echo "exit code $rc after SIGINT, expected 130"; cat "$dir/err"; exit 1; }
step=$(sed -n 's/^stopped at step \([0-9]*\):.*/\1/p' "$dir/out")
[[ -n $step && -f $dir/run/checkpoint.safetensors && -z $(ls "$dir/run" | grep '\.tmp') ]] ||
  { echo "no 'stopped at step' or no checkpoint"; cat "$dir/out" "$dir/err"; exit 1; }
"$qkv" train "${args[@]}" --resume --steps $((step + 2)) >"$dir/out2" 2>"$dir/err2" ||
  { echo "resume failed"; cat "$dir/err2"; exit 1; }
grep -q "^done at step $((step + 2)):" "$dir/out2" || { echo "resume did not reach step $((step + 2))"; cat "$dir/out2"; exit 1; }
echo "interrupted at step $step, resumed to step $((step + 2))"
