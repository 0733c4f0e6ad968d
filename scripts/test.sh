#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, builds with warnings as
# errors (preset ci) and runs every test, then builds again under AddressSanitizer + UBSan (preset
# asan) and runs every test there too, and the threading tests under ThreadSanitizer (preset tsan).
# Later parts of the project append their suites below.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

# Two cores on the project's machines: never oversubscribe them.
export QKV_NUM_THREADS="${QKV_NUM_THREADS:-2}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

echo "== build and test: preset ci (warnings are errors)"
cmake --preset ci
cmake --build --preset ci -j2
ctest --preset ci -j2

echo "== build and test: preset asan (AddressSanitizer + UndefinedBehaviorSanitizer)"
cmake --preset asan
cmake --build --preset asan -j2
ctest --preset asan -j2

echo "== ThreadSanitizer: the thread pool, the scratch pool, concurrent callers (scripts/tsan.sh, docs/threads.md)"
bash scripts/tsan.sh

echo "== Python package: pip install . (the wheel: module, qkv command), then pytest"
# The same CMake project through scikit-build-core; build-python/ keeps the build between runs.
python3 -m pip install . -q --no-build-isolation -Cbuild-dir=build-python \
  -Ccmake.define.QKV_BUILD_TESTS=OFF -Ccmake.define.QKV_BUILD_BENCH=OFF
python3 -m pytest -q python/tests

echo "== fuzz every parser (7 libFuzzer harnesses, docs/fuzzing.md), 15 s each; fuzz_cli links build-ci's library"
QKV_LIB_BUILD=build-ci bash scripts/fuzz.sh 15
