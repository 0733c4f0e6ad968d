#!/usr/bin/env bash
# The exit codes `qkv --help` documents are the ones the tool returns:
#   exit_codes.sh QKV CORPUS
# Each code is read from the help text, then a run that should end with it is made.
set -uo pipefail
qkv=$1 data=$2
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$dir"' EXIT

help=$("$qkv" --help | tr '\n' ' ')
codes=$(grep -oE 'Exit codes: [^.]*\.' <<<"$help") || fail "qkv --help documents no exit codes"
echo "$codes"
# expect CODE WHAT CMD...: the help names CODE as WHAT, and CMD exits with CODE.
expect() {
  local code=$1 what=$2; shift 2
  grep -qE "[ ;]$code $what" <<<"$codes" || fail "the help does not say '$code $what'"
  "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  echo "$code $what: qkv ${*:2} exited $rc"
  [[ $rc == "$code" ]] || fail "exit code $rc, the help says $code"
}
expect 0 success "$qkv" params --preset gpt2
expect 1 error "$qkv" generate --model "$dir/missing.bin"
expect 2 "usage error" "$qkv" params --no-such-option
tiny=(--layers 1 --heads 2 --d-model 16 --context 16 --batch 2 --eval-batches 1 --eval-interval 1000 --quiet)
# /proc/self takes no new file: the lock file's open() fails (EACCES/ENOENT) before any training.
expect 3 "I/O error" "$qkv" train --data "$data" --out /proc/self "${tiny[@]}" --steps 10
grep -q "cannot write in the folder" "$dir/err" || fail "3: $(cat "$dir/err")"
# 11 bytes where a llama2.c checkpoint has a 28-byte header.
printf 'not a model' >"$dir/short.bin"
expect 4 "file format error" "$qkv" generate --model "$dir/short.bin" --tokenizer "$dir/short.bin"
grep -q "shorter than the 28-byte header" "$dir/err" || fail "4: $(cat "$dir/err")"
# A learning rate of 1e30 from the first step: the weights overflow float and the loss is NaN.
expect 5 "non-finite numbers" "$qkv" train --data "$data" --out "$dir/diverge" "${tiny[@]}" --steps 20 --lr 1e30 --warmup 0
grep -q "training diverged" "$dir/err" || fail "5: $(cat "$dir/err")"

# "129, 130, 143: qkv train stopped by SIGHUP, SIGINT, SIGTERM": the n-th code goes with the n-th signal.
numbers=($(grep -oE '[0-9]+, [0-9]+, [0-9]+: qkv train stopped by' <<<"$codes" | grep -oE '^[0-9, ]+' | tr -d ','))
signals=($(grep -oE 'stopped by SIG[A-Z]+, SIG[A-Z]+, SIG[A-Z]+' <<<"$codes" | grep -oE 'SIG[A-Z]+'))
[[ ${#numbers[@]} == 3 && ${#signals[@]} == 3 ]] || fail "the help does not pair three codes with three signals"
for k in 0 1 2; do
  "$qkv" train --data "$data" --out "$dir/run$k" --layers 1 --heads 2 --d-model 16 --context 16 --batch 2 \
      --eval-batches 1 --eval-interval 1000 --steps 1000000 --decay-steps 1000 >"$dir/out" 2>"$dir/err" &
  pid=$!
  for _ in $(seq 200); do grep -q '^qkv train:' "$dir/err" && break; sleep 0.1; done
  sleep 0.5
  kill -"${signals[k]#SIG}" "$pid"
  wait "$pid"
  rc=$?
  echo "${signals[k]}: qkv train exited $rc"
  [[ $rc == "${numbers[k]}" ]] || fail "after ${signals[k]}: exit code $rc, the help says ${numbers[k]}"
done
echo ok
