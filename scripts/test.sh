#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what is missing, builds with warnings as
# errors (preset ci) and runs every test, then builds again under AddressSanitizer + UBSan (preset
# asan) and runs every test there too, and the threading tests under ThreadSanitizer (preset tsan).
# Later parts of the project append their suites below.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's wall time, printed at the end (also when a phase fails): where CI's time goes.
phases=()
phase_name=""
phase_start=$SECONDS
phase() {  # phase NAME: ends the running phase and starts NAME ("" ends the last)
  [[ -z $phase_name ]] || phases+=("$(printf '%6d s  %s' $((SECONDS - phase_start)) "$phase_name")")
  phase_name=$1
  phase_start=$SECONDS
  [[ -z $phase_name ]] || echo "== $phase_name"
}
report_phases() {
  phase ""
  echo "== test.sh phases (wall time):"
  printf '%s\n' "${phases[@]}"
  printf '%6d s  total\n' "$SECONDS"
}
trap report_phases EXIT

phase "install-deps"
bash scripts/install-deps.sh

# Two cores on the project's machines: never oversubscribe them.
export QKV_NUM_THREADS="${QKV_NUM_THREADS:-2}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

# ccache (when installed), keyed on paths relative to this checkout (CCACHE_BASEDIR, no cwd in the hash), so
# that a fresh clone anywhere on a machine reuses an earlier clone's compilations. (The wheel below cannot
# reuse the ci build's objects: it is Release, without the debug info that would put source paths in it.)
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER="${CMAKE_CXX_COMPILER_LAUNCHER:-ccache}"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"
fi

phase "build: preset ci (warnings are errors)"
cmake --preset ci
cmake --build --preset ci -j2
phase "ctest: preset ci"
ctest --preset ci -j2

phase "build: preset asan (AddressSanitizer + UndefinedBehaviorSanitizer)"
cmake --preset asan
cmake --build --preset asan -j2
phase "ctest: preset asan"
ctest --preset asan -j2

phase "ThreadSanitizer: the pools, concurrent callers, the threaded kernels and decode (scripts/tsan.sh, docs/threads.md)"
bash scripts/tsan.sh

phase "Python package: pip install . (the wheel: module, qkv command)"
# The same CMake project through scikit-build-core; build-python/ keeps the build between runs.
python3 -m pip install . -q --no-build-isolation -Cbuild-dir=build-python \
  -Ccmake.define.QKV_BUILD_TESTS=OFF -Ccmake.define.QKV_BUILD_BENCH=OFF
phase "pytest python/tests"
python3 -m pytest -q python/tests

phase "fuzz every parser (7 libFuzzer harnesses, docs/fuzzing.md), 15 s each; fuzz_cli links build-ci's library"
QKV_LIB_BUILD=build-ci bash scripts/fuzz.sh 15
