#!/usr/bin/env bash
# Regression tests of issue #16 (defects a hostile new user found in the qkv tool), one per case:
#   hardening.sh CASE QKV SOURCE_DIR
# Each case prints what it ran and exits non-zero with "FAIL: ..." when the tool misbehaves. Every
# run has a `timeout` so that a tool that blocks (a FIFO) or loops fails the test instead of
# hanging it. Models and corpora are tiny: every case runs in a few seconds.
set -uo pipefail
case_name=$1 qkv=$2 src=$3
data=$src/data/tinyshakespeare/input.txt
model=$src/data/models/stories260K/stories260K.bin
tok=$src/data/models/stories260K/tok512.bin
dir=$(mktemp -d)
trap 'jobs -p | xargs -r kill 2>/dev/null; rm -rf "$dir"' EXIT
tiny=(--layers 1 --heads 2 --d-model 16 --context 16 --batch 2 --eval-batches 1 --eval-interval 1000 --quiet)

fail() { echo "FAIL: $*"; for f in "$dir"/out "$dir"/err; do [[ -f $f ]] && { echo "--- $f"; head -c 3000 "$f"; }; done; exit 1; }
# run RC CMD...: runs the tool (20 s at most) with stdout/stderr in $dir/out, $dir/err; checks the exit code.
run() {
  local want=$1; shift
  timeout 20 "$@" >"$dir/out" 2>"$dir/err"
  local rc=$?
  local cmd="${*:2}"
  echo "ran: ${cmd:0:300} (exit $rc)"
  [[ $rc == "$want" ]] || fail "exit code $rc, expected $want"
}
# has FILE REGEX: the file matches the extended regex.
has() { grep -Eq -- "$2" "$dir/$1" || fail "$1 does not match /$2/"; }
# one_error: the error is one line "qkv: error: ...".
one_error() { [[ $(wc -l <"$dir/err") == 1 ]] && grep -q '^qkv: error: ' "$dir/err" || fail "the error is not one line 'qkv: error: ...'"; }
# wait_for FILE REGEX: up to 20 s until the file matches.
wait_for() { for _ in $(seq 200); do grep -Eq -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; fail "$1 never matched /$2/"; }

case $case_name in

# 1. Weights that overflow float (3e38 everywhere in layer 0's w1: finite, so the loader takes
# them) give NaN logits: generation stops with an error naming the position (exit 5, non-finite
# numbers), greedy or sampled, instead of printing <unk> forever or reading past the sampler's
# empty candidate list.
nan_logits)
  python3 - "$model" "$dir/nan.bin" <<'EOF'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
C, Hd, L, H, Hkv, V, P = struct.unpack("<7i", b[:28])
D = C // H
# llama2.c order: wte, rms_att, wq, wk, wv, wo, rms_ffn, then w1 (layer 0 first)
at = 28 + 4 * (V * C + L * C + L * H * D * C + 2 * L * Hkv * D * C + L * C * H * D + L * C)
b[at:at + 4 * Hd * C] = struct.pack("<f", 3e38) * (Hd * C)
open(sys.argv[2], "wb").write(b)
EOF
  for sampling in "--temperature 0" "--temperature 1 --top-p 0.9" "--temperature 0.8 --top-p 0" "--top-k 5"; do
    run 5 "$qkv" generate --model "$dir/nan.bin" --tokenizer "$tok" --prompt "Once upon" --steps 50 --seed 3 $sampling
    has err "logits at position [0-9]+ are not finite"
    one_error
    grep -q '<unk>' "$dir/out" && fail "printed <unk>"
  done ;;

# 7. SIGINT, SIGTERM and SIGHUP each save a checkpoint and exit 128 + the signal; --resume goes on.
# --checkpoint-interval also takes minutes.
signals)
  for sig in INT:130 TERM:143 HUP:129; do
    name=${sig%%:*} want=${sig##*:}
    # Remove the last round's err first: the background shell truncates it only when it gets to
    # run, and wait_for must not match the previous process's banner (a race seen under ASan).
    rm -rf "$dir/run" "$dir/out" "$dir/err"
    "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 1000000 --decay-steps 1000 >"$dir/out" 2>"$dir/err" &
    pid=$!
    wait_for "$dir/err" "^qkv train:"
    sleep 0.5
    kill -"$name" "$pid"
    wait "$pid"
    rc=$?
    echo "SIG$name: exit $rc"
    [[ $rc == "$want" ]] || fail "exit code $rc after SIG$name, expected $want"
    has err "interrupted by SIG$name: checkpoint saved"
    step=$(sed -n 's/^stopped at step \([0-9]*\):.*/\1/p' "$dir/out")
    [[ -n $step && -f $dir/run/checkpoint.safetensors ]] || fail "no checkpoint after SIG$name"
    ls "$dir/run" | grep -q '\.tmp' && fail "a temporary file was left behind"
    run 0 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --resume --steps $((step + 2)) --decay-steps 1000
    has out "^done at step $((step + 2)):"
  done ;;

checkpoint_minutes)
  # 0.01 minutes: a checkpoint every 0.6 s of wall time, long before step 1,000,000.
  "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 1000000 --checkpoint-interval 0.01m >"$dir/out" 2>"$dir/err" &
  pid=$!
  for _ in $(seq 200); do [[ -f $dir/run/checkpoint.safetensors ]] && break; sleep 0.1; done
  [[ -f $dir/run/checkpoint.safetensors ]] || fail "no checkpoint within 20 s with --checkpoint-interval 0.01m"
  kill -TERM "$pid"; wait "$pid"
  run 2 "$qkv" train --data "$data" --out "$dir/x" --checkpoint-interval 10q
  has err "--checkpoint-interval: expected a number of steps >= 1 or of minutes > 0 such as 10m, got '10q'"
  run 0 "$qkv" train --help
  has out "10m" ;;

# 8. A second run on a folder another run is writing is refused, naming the folder and the pid.
lock)
  "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 1000000 >"$dir/out1" 2>"$dir/err1" &
  pid=$!
  wait_for "$dir/err1" "^qkv train:"
  run 1 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 10
  has err "--out '$dir/run': another qkv train \\(pid $pid\\) is writing to this folder"
  one_error
  run 1 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 10 --resume
  has err "another qkv train \\(pid $pid\\)"
  kill -INT "$pid"; wait "$pid"
  # Once the first has finished, the folder is free again.
  run 0 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --resume --steps 1000000 --time-limit 0.001 ;;

# 10. What qkv train writes, qkv generate reads: model.safetensors + model.json + tokenizer.json.
train_then_generate)
  for kind in "--tokenizer chars" "--tokenizer bpe --bpe-vocab 300"; do
    rm -rf "$dir/run"
    run 0 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 3 $kind
    run 0 "$qkv" generate --model "$dir/run/model.safetensors" --tokenizer "$dir/run/tokenizer.json" \
        --prompt "ROMEO:" --steps 12 --temperature 0
    has out "^ROMEO:"
    [[ $(head -c 1000 "$dir/out" | wc -l) -ge 1 ]] || fail "no text"
    # The tokenizer beside the model is found by itself; an empty prompt starts from "\n".
    run 0 "$qkv" generate --model "$dir/run/model.safetensors" --steps 12 --seed 5
    # Issue #24: the folder stands for its model, and inspect finds the same tokenizer in it.
    run 0 "$qkv" generate --model "$dir/run" --prompt "ROMEO:" --steps 12 --temperature 0
    has out "^ROMEO:"
    run 0 "$qkv" inspect --model "$dir/run" --prompt "ROMEO: and" --out "$dir/page"
    [[ -s "$dir/page/index.html" && -s "$dir/page/layer_0.png" ]] || fail "inspect wrote no page"
  done
  # A llama2.c tokenizer for the trained model, and the JSON one for a llama2.c model: each error
  # says which format the file was read as.
  run 1 "$qkv" generate --model "$dir/run/model.safetensors" --tokenizer "$tok"
  has err "read as a llama2.c tokenizer.bin"
  one_error
  # The training checkpoint is not the model to run: the error points at the one beside it.
  run 1 "$qkv" generate --model "$dir/run/checkpoint.safetensors"
  has err "a qkv train checkpoint .*the model to run is model.safetensors beside it"
  run 1 "$qkv" generate --tokenizer "$dir/run/tokenizer.json"
  has err "read as qkv train's tokenizer.json.*300 tokens, but the model's vocabulary has 512"
  one_error ;;

# 11. --resume reads the model and run settings from the checkpoint; the schedule may change; a
# flag given with another value is named with both values, in one short line.
resume_flags)
  run 0 "$qkv" train --data "$data" --out "$dir/run" "${tiny[@]}" --steps 2
  run 0 "$qkv" train --data "$data" --out "$dir/run" --resume --steps 4 --lr 5e-4 --quiet --eval-batches 1
  has out "^done at step 4:"
  has err "resuming with a changed schedule: lr 0.001 -> 0.0005"
  run 1 "$qkv" train --data "$data" --out "$dir/run" --resume --steps 6 --layers 2 --batch 3
  has err "--layers 2 \\(the checkpoint has 1\\), --batch 3 \\(the checkpoint has 2\\)"
  one_error
  [[ $(wc -c <"$dir/err") -lt 300 ]] || fail "the error is longer than 300 characters" ;;

# 13 and 15. A FIFO, a folder, a missing file or a device as --model, --tokenizer, --data or
# --config: the error names the argument and what the path is, at once (a FIFO never blocks).
file_kinds)
  mkfifo "$dir/fifo"
  mkdir "$dir/folder"
  for arg in "generate --model" "generate --tokenizer" "generate --config" "inspect --prompt a --out $dir/i --model" \
             "inspect --prompt a --out $dir/i --tokenizer" "train --out $dir/t --data" "train --out $dir/t --data $data --config"; do
    for what in "fifo:is a FIFO, not a regular file" "missing:no such file or directory" \
                "folder/x.bin:no such file or directory" "/dev/null:is a character device, not a regular file"; do
      path=${what%%:*} why=${what#*:}
      [[ $path == /* ]] || path=$dir/$path
      flag=${arg##* }
      run 1 "$qkv" $arg "$path"
      has err "$flag '$path': $why"
      one_error
    done
  done
  # A folder is refused where a file is read (a model folder is fine: it stands for its model.safetensors).
  for arg in "generate --tokenizer" "generate --config" "train --out $dir/t --data" "train --out $dir/t --data $data --config"; do
    run 1 "$qkv" $arg "$dir/folder"
    has err "${arg##* } '$dir/folder': is a directory"
    one_error
  done
  run 1 "$qkv" generate --model "$dir/folder"
  has err "$dir/folder/model.safetensors': no such file"
  # A file this user may not read (as root, the check runs the tool as nobody).
  if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
    echo secret >"$dir/secret"
    chmod 600 "$dir/secret"
    chmod 755 "$dir"
    run 1 setpriv --reuid=65534 --regid=65534 --clear-groups "$qkv" generate --tokenizer "$dir/secret"
    has err "--tokenizer '$dir/secret': permission denied"
    one_error
  fi ;;

# 14. Unknown commands and options are named; qkv help [command] prints help.
unknown_command)
  run 2 "$qkv" frobnicate
  has err "^qkv: error: unknown command 'frobnicate'; the commands are: params, attend, train, inspect, generate, ([a-z]+, )*help"
  run 2 "$qkv" --threads 2 frobnicate --x
  has err "unknown command 'frobnicate'"
  run 2 "$qkv" --frobnicate
  has err "--frobnicate"
  run 2 "$qkv" generate --frobnicate 3
  has err "--frobnicate"
  run 2 "$qkv" train --data x --out y --lr 1 --frobnicate
  has err "--frobnicate"
  run 0 "$qkv" help
  has out "^Subcommands:|^SUBCOMMANDS:"
  run 0 "$qkv" help generate
  has out "--temperature"
  ! grep -q -- "--data" "$dir/out" || fail "qkv help generate printed train's options"
  run 2 "$qkv" help frobnicate
  has err "unknown command 'frobnicate'" ;;

# 16. Labels are cut at character boundaries and padded by display width (wide = 2 columns,
# combining = 0); generate echoes a prompt's non-ASCII characters (only control bytes are dropped).
# The column check is python/tests/test_cli_hardening.py (it measures with unicodedata).
utf8)
  run 0 "$qkv" attend --text "日本語の文章です café ñandú"
  iconv -f UTF-8 -t UTF-8 "$dir/out" >/dev/null || fail "attend printed invalid UTF-8"
  run 0 "$qkv" generate --prompt "Café 猫 naïve" --steps 30 --temperature 0
  has out "^Café 猫 naïve" ;;

# 18. Each bad training value is named with the value given; bad QKV_NUM_THREADS / QKV_ISA are errors.
bad_values)
  run 2 "$qkv" train --data "$data" --out "$dir/t" --lr nan --beta1 1.5 --warmup -5 --clip -1
  has err "--lr: must be a finite number > 0, got nan; --warmup: must be >= 0 steps, got -5; --beta1: must be in \\[0, 1\\), got 1.5; --clip: must be a finite number >= 0 \\(0: off\\), got -1"
  one_error
  run 2 "$qkv" train --data "$data" --out "$dir/t" --lr inf
  has err "--lr: must be a finite number > 0, got inf"
  QKV_NUM_THREADS=abc run 1 "$qkv" params --preset gpt2
  has err "QKV_NUM_THREADS: must be a whole number in \\[1, 65536\\], got 'abc'"
  one_error
  QKV_NUM_THREADS=0 run 1 "$qkv" attend
  has err "QKV_NUM_THREADS.*got '0'"
  QKV_ISA=bogus run 1 "$qkv" attend
  has err "QKV_ISA: must be one of scalar, avx2, avx512, avx512_vnni, avx512_bf16, got 'bogus'"
  one_error
  QKV_ISA=scalar QKV_NUM_THREADS=1 run 0 "$qkv" attend ;;

# 19. An --out that cannot be written is refused before training; a write that fails (a file size
# limit stands in for a full disk) removes its temporary; attend caps its grid.
out_checks)
  run 3 "$qkv" train --data "$data" --out /proc/self "${tiny[@]}" --steps 100000
  has err "--out '/proc/self': cannot write in the folder"
  grep -q "^qkv train:" "$dir/err" && fail "training started before --out was checked"
  # 24 kB: the lock file fits, the checkpoint (≈ 4,700 weights and two AdamW moments each, ≈ 56 kB) does not.
  (ulimit -f 24; exec timeout 20 "$qkv" train --data "$data" --out "$dir/full" "${tiny[@]}" --steps 2) \
    >"$dir/out" 2>"$dir/err"
  rc=$?
  echo "under ulimit -f 24: exit $rc"
  [[ $rc == 3 ]] || fail "exit code $rc under a 24 kB file size limit, expected 3 (an I/O error)"
  has err "write failed.*File too large \\(the temporary was removed\\)"
  ls -a "$dir/full"
  ls -a "$dir/full" | grep -q '\.tmp' && fail "a temporary file was left behind"
  words=$(python3 -c "print(' '.join('w%d' % i for i in range(2000)))")
  run 0 "$qkv" attend --text "$words"
  has out "grid cut to the first 64 of 2000 tokens.*--full prints all 2000 x 2000"
  size=$(wc -c <"$dir/out")
  echo "attend on 2000 words: $size bytes"
  [[ $size -lt 200000 ]] || fail "$size bytes of output for 2000 words" ;;

*) echo "unknown case $case_name"; exit 2 ;;
esac
echo "ok: $case_name"
