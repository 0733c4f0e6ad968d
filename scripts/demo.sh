#!/usr/bin/env bash
# The main job, from a fresh machine: installs what is missing, builds the qkv tool, and shows what
# it does: the parameter count of GPT-3's attention (the figures of seed 004).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j2 --target qkv_cli >/dev/null

echo "== qkv params --preset gpt3"
./build/qkv params --preset gpt3
