#!/usr/bin/env bash
# Runs the qkv tool and checks what it did, for CTest:
#   expect.sh RC STREAM PATTERN -- COMMAND ARGS...
# passes when COMMAND exits with RC and STREAM (stdout | stderr) matches the extended regex PATTERN.
# An error (RC ≠ 0) must also be exactly one line on stderr starting "qkv: error: ".
set -uo pipefail
want_rc="$1" stream="$2" pattern="$3"
shift 4
out="$(mktemp)" err="$(mktemp)"
trap 'rm -f "$out" "$err"' EXIT
"$@" >"$out" 2>"$err"
rc=$?
echo "command: $*  (exit $rc)"
echo "--- stdout"; cat "$out"; echo "--- stderr"; cat "$err"
if [[ "$rc" != "$want_rc" ]]; then echo "FAIL: exit code $rc, expected $want_rc"; exit 1; fi
file="$out"; [[ "$stream" == stderr ]] && file="$err"
if ! grep -Eq -- "$pattern" "$file"; then echo "FAIL: $stream does not match /$pattern/"; exit 1; fi
if [[ "$want_rc" != 0 ]]; then
  lines=$(wc -l <"$err")
  if [[ "$lines" != 1 ]] || ! grep -q '^qkv: error: ' "$err"; then
    echo "FAIL: an error must be one line 'qkv: error: ...' on stderr (got $lines lines)"; exit 1
  fi
fi
echo "ok"
