#!/usr/bin/env bash
# The long fuzz campaign of docs/fuzzing.md: each harness runs until its executions add up to RUNS
# (default 10 M), in slices of at most SLICE seconds (default 600) taken in turn, two harnesses at a
# time, at nice 19 (it takes only the CPU nobody else wants). Every slice resumes from the
# harness's campaign corpus (build-fuzz/campaign/corpus_<h>, plus the seeds of fuzz/corpus/<h>) and
# saves libFuzzer's log with its final statistics as build-fuzz/campaign/logs/<h>.<n>.log; a run
# started again carries on from those logs. A finding stops the campaign with its artifact in
# build-fuzz/campaign/ (replay: build-fuzz/fuzz_<h> FILE). Stopped early (Ctrl-C, or SIGINT to a
# harness), libFuzzer still prints a slice's final statistics. Build the harnesses first:
# scripts/fuzz.sh 0 [HARNESS...]. A harness not built yet is skipped until it is.
#   scripts/fuzz_campaign.sh [HARNESS...]            (RUNS=n SLICE=s)
#   scripts/fuzz_campaign.sh --report [HARNESS...]   (per harness: executions, time, exec/s so far)
set -euo pipefail
cd "$(dirname "$0")/.."
report=0
if [[ "${1:-}" == --report ]]; then report=1; shift; fi
harnesses=("$@")
[[ ${#harnesses[@]} -gt 0 ]] || harnesses=(llama2c tokenizer safetensors config text_tokenizer checkpoint cli)
runs="${RUNS:-10000000}"
slice="${SLICE:-600}"
out=build-fuzz/campaign
mkdir -p "$out/logs"
# As the 24 Nov campaign: llama2c's tiny checkpoints (the 1 MB real one is in the CI run), a few KiB elsewhere.
declare -A max_len=([llama2c]=4096 [tokenizer]=16384 [safetensors]=16384 [config]=4096
                    [text_tokenizer]=4096 [checkpoint]=8192 [cli]=1024)

# Sum of a statistic over a harness's saved logs.
total() {
  cat "$out/logs/$1".*.log 2>/dev/null | awk -v k="stat::$2:" '$1 == k {s += $2} END {print s + 0}'
}
seconds() {  # wall seconds of its slices: executions / exec/s of each slice's final statistics
  cat "$out/logs/$1".*.log 2>/dev/null | awk '$1 == "stat::number_of_executed_units:" {n = $2}
    $1 == "stat::average_exec_per_sec:" && $2 > 0 {s += n / $2} END {printf "%d\n", s}'
}

if [[ $report == 1 ]]; then
  printf '%-16s %12s %8s %8s %7s\n' harness executions seconds exec/s slices
  for h in "${harnesses[@]}"; do
    n=$(total "$h" number_of_executed_units) s=$(seconds "$h")
    printf '%-16s %12d %8d %8d %7d\n' "$h" "$n" "$s" $((s > 0 ? n / s : 0)) \
      "$(find "$out/logs" -name "$h.*.log" | wc -l)"
  done
  exit 0
fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
# Only this run's artifacts are findings: one left from an earlier run (fixed, kept in fuzz/corpus) must not
# stop a resumed campaign at its first slice.
touch "$out/.started"
slice_of() {  # one slice of harness $1
  local h=$1 left=$(( runs - $(total "$1" number_of_executed_units) ))
  local n; n=$(find "$out/logs" -name "$h.*.log" | wc -l)
  mkdir -p "$out/corpus_$h"
  nice -n 19 "build-fuzz/fuzz_$h" -runs="$left" -max_total_time="$slice" -max_len="${max_len[$h]}" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$out/${h}_" "$out/corpus_$h" "fuzz/corpus/$h" \
    >"$out/logs/$h.$n.log" 2>&1 || true
}

while :; do
  todo=()
  for h in "${harnesses[@]}"; do
    [[ -x "build-fuzz/fuzz_$h" ]] || continue
    (( $(total "$h" number_of_executed_units) < runs )) && todo+=("$h")
  done
  [[ ${#todo[@]} -gt 0 ]] || break
  for ((i = 0; i < ${#todo[@]}; i += 2)); do
    slice_of "${todo[i]}" &
    [[ -z "${todo[i + 1]:-}" ]] || slice_of "${todo[i + 1]}" &
    wait
    found=$(find "$out" -maxdepth 1 -newer "$out/.started" \( -name '*_crash-*' -o -name '*_leak-*' \
            -o -name '*_timeout-*' -o -name '*_oom-*' \))
    if [[ -n "$found" ]]; then echo "fuzz_campaign: finding: $found"; exit 1; fi
  done
done
bash "$0" --report "${harnesses[@]}"
