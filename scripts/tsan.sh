#!/usr/bin/env bash
# ThreadSanitizer run of qkv's threading (issue #16): builds the preset tsan (build-tsan/) for the threading
# tests only, and runs them:
#   the thread pool (tests/core/test_parallel.cpp) and the scratch pool (tests/core/test_scratch.cpp);
#   concurrent callers (tests/core/test_concurrent_callers.cpp: several std::threads running attention
#   forward and backward and decoding models at once);
#   the threaded kernels, each on 1, 2, 3 (and 5) threads with equal bits required: the flash forward and
#   decode (Flash.BitIdenticalAcrossThreadCounts, Flash.ConcurrentCallersGetTheirOwnResults), the backward
#   (BackwardDeterminism.*), dropout (DropoutDeterminism.*), and a model's decode step
#   (Model.DecodeStepOnThreadsEqualsOneThread).
# These tests link only the floors they need (tests/CMakeLists.txt: LINK), so the build compiles the
# floors core to model, not train, inspect or the CLI.
# Any report fails the run (halt_on_error). qkv's parallelism is its own thread pool on std::thread
# and std::atomic (src/core/parallel.cpp), which TSan sees whole: no suppressions.
#
# scripts/test.sh (CI) runs it. The stress tests run fewer rounds under TSan (tests/support/sanitizers.hpp).
# Measured figures: docs/threads.md.
#
# Parallel.ForkedChildComputes is left out here: TSan does not support a child that starts threads
# after a multi-threaded parent forked (it stops such a child); the ordinary build runs it.
#
#   scripts/tsan.sh            (JOBS=n for the build's parallelism, default 2)
set -euo pipefail
cd "$(dirname "$0")/.."

export QKV_NUM_THREADS="${QKV_NUM_THREADS:-2}"
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"

cmake --preset tsan
cmake --build --preset tsan -j"${JOBS:-2}" --target test_parallel test_scratch test_concurrent_callers \
  test_flash test_backward test_dropout test_model

build-tsan/tests/test_parallel --gtest_filter=-Parallel.ForkedChildComputes
build-tsan/tests/test_scratch
build-tsan/tests/test_concurrent_callers
build-tsan/tests/test_flash --gtest_filter='Flash.BitIdenticalAcrossThreadCounts:Flash.ConcurrentCallersGetTheirOwnResults'
build-tsan/tests/test_backward --gtest_filter='BackwardDeterminism.*'
build-tsan/tests/test_dropout --gtest_filter='DropoutDeterminism.*'
build-tsan/tests/test_model --gtest_filter='Model.DecodeStepOnThreadsEqualsOneThread'
echo "tsan.sh: no data race reported"
