#!/usr/bin/env bash
# The main job, from a fresh machine: installs what is missing, builds the qkv tool, and shows what
# it does: the parameter count of GPT-3's attention (the figures of seed 004), then one attention
# block (random weights, one token per word) on the seed sentence, its pattern printed as a grid; then the
# default model (stories260K): `qkv inspect` draws every head of that model on the seed sentence, a page
# that opens from disk. The last line is the page's path.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j2 --target qkv_cli >/dev/null

echo "== qkv params --preset gpt3"
./build/qkv params --preset gpt3

echo
echo "== qkv attend --text \"a fluffy blue creature roamed the verdant forest\""
./build/qkv attend --text "a fluffy blue creature roamed the verdant forest"

echo
echo "== qkv generate --prompt \"Once upon a time, there was a little dog\" --temperature 0.8 --seed 42"
echo "   (stories260K, a real Llama-style model trained by Andrej Karpathy on TinyStories; data/models/)"
./build/qkv generate --prompt "Once upon a time, there was a little dog" --temperature 0.8 --seed 42 --steps 256

prompt="a fluffy blue creature roamed the verdant forest"

echo
echo "== qkv inspect --model data/models/stories260K/stories260K.bin --prompt \"$prompt\" --out build/inspect"
page=$(./build/qkv inspect --model data/models/stories260K/stories260K.bin --prompt "$prompt" --out build/inspect)
echo "every layer and head of stories260K on that prompt; open it in a browser:"
realpath "$page"
