#!/usr/bin/env bash
# Builds the libFuzzer harnesses (fuzz/CMakeLists.txt: clang, -fsanitize=fuzzer,address,undefined;
# the main build is g++) into build-fuzz/ and runs each for SECONDS (default 15) from its seed
# corpus fuzz/corpus/<harness>/ (plus the real stories260K files of data/models/). New inputs go to
# build-fuzz/corpus_<harness>/, so runs build on each other; a finding stops with a crash file in
# build-fuzz/ and a non-zero exit. SECONDS 0 only builds. docs/fuzzing.md: harnesses, campaign.
#   scripts/fuzz.sh [SECONDS [HARNESS...]]
# fuzz_cli links the library of a g++ build: QKV_LIB_BUILD (default build/, preset default; its
# targets qkv and qkv_inspect are built here if needed).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-15}"
shift || true
harnesses=("$@")
[[ ${#harnesses[@]} -gt 0 ]] || harnesses=(llama2c tokenizer safetensors config text_tokenizer checkpoint cli)
out=build-fuzz
lib_build="${QKV_LIB_BUILD:-build}"

targets=()
for h in "${harnesses[@]}"; do
  [[ -f "fuzz/fuzz_$h.cpp" ]] || { echo "fuzz: no harness fuzz/fuzz_$h.cpp" >&2; exit 2; }
  targets+=("fuzz_$h")
done
if [[ " ${harnesses[*]} " == *" cli "* ]]; then
  [[ -f "$lib_build/CMakeCache.txt" || "$lib_build" != build ]] || cmake --preset default >/dev/null
  cmake --build "$lib_build" -j2 --target qkv qkv_inspect
fi
cmake -S fuzz -B "$out" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DQKV_LIB_BUILD="$PWD/$lib_build" >/dev/null
cmake --build "$out" -j2 --target "${targets[@]}"
[[ "$secs" != 0 ]] || exit 0

# The real files too: the stories260K checkpoint, and its tokenizer prefixed with the two bytes
# that choose its vocabulary size (512 - 3) in fuzz_tokenizer.
for h in "${harnesses[@]}"; do mkdir -p "$out/corpus_$h"; done
[[ ! -d "$out/corpus_llama2c" ]] || cp data/models/stories260K/stories260K.bin "$out/corpus_llama2c/"
[[ ! -d "$out/corpus_tokenizer" ]] ||
  { printf '\xfd\x01'; cat data/models/stories260K/tok512.bin; } >"$out/corpus_tokenizer/tok512.bin"

# The longest input each harness is given: the real checkpoint for llama2c, a few KiB elsewhere.
declare -A max_len=([llama2c]=1100000 [tokenizer]=16384 [safetensors]=16384 [config]=4096
                    [text_tokenizer]=4096 [checkpoint]=8192 [cli]=1024)
for h in "${harnesses[@]}"; do rm -f "$out/${h}"_{crash,leak,timeout,oom}-*; done
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
for h in "${harnesses[@]}"; do
  log="$out/fuzz_$h.log"
  "$out/fuzz_$h" -max_total_time="$secs" -max_len="${max_len[$h]}" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$out/${h}_" "$out/corpus_$h" "fuzz/corpus/$h" >"$log" 2>&1 || true
  echo "fuzz: fuzz_$h ${secs}s: $(grep -E "^#[0-9]+[[:space:]]+DONE" "$log" | sed -E 's/ +/ /g' || echo "no DONE line")"
  found=$(find "$out" -maxdepth 1 -name "${h}_crash-*" -o -name "${h}_leak-*" -o -name "${h}_timeout-*" -o -name "${h}_oom-*")
  if [[ -n "$found" ]]; then
    grep -E "^==[0-9]+== ?ERROR|^SUMMARY|deadly signal|out-of-memory|timeout" "$log" | head -5
    echo "fuzz: fuzz_$h found: $found (log: $log)"
    exit 1
  fi
done
echo "fuzz: no findings"
