#!/usr/bin/env bash
# The C++ package as a user meets it: `cmake --install` the build into a fresh prefix, then build and run
# tests/package/consumer (find_package(qkv CONFIG REQUIRED) + qkv::qkv) against it, and compile the same
# program with pkg-config's flags; the installed qkv command runs its default model. Usage: run.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/qkv/attention.hpp"
test -f "$work/prefix/lib/cmake/qkv/qkvConfig.cmake"

# No qkv source or build path may leak into the installed package files.
if grep -rl -e "$build" -e "$(cd "$src/../.." && pwd)/src" "$work/prefix/lib/cmake" "$work/prefix/lib/pkgconfig"; then
  echo "installed package files name the build or source tree" >&2; exit 1
fi

# The installed qkv runs its default model, installed beside it in share/qkv, from any folder.
if [[ -x "$work/prefix/bin/qkv" ]]; then
  echo "== the installed qkv and its default model"
  test -f "$work/prefix/share/qkv/models/stories260K/stories260K.bin"
  (cd "$work" && "$work/prefix/bin/qkv" generate --temperature 0 --steps 200 2>/dev/null) |
    cmp - "$src/../golden/llama2c_stories260K_greedy_200.txt"
fi

echo "== find_package(qkv) consumer"
cmake -S "$src/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer" >/dev/null
"$work/consumer/consumer"

echo "== pkg-config consumer"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 "$src/consumer/main.cpp" -o "$work/consumer_pc" $(pkg-config --cflags --libs qkv)
"$work/consumer_pc"
