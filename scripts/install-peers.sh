#!/usr/bin/env bash
# The optional benchmark peer llama.cpp for bench/decode_peers.py and bench/llamacpp_peer.py: PyPI's
# llama-cpp-python, which compiles llama.cpp from source for this CPU (GGML_NATIVE), and the `gguf` writer
# the scripts use to hand it the same weights as qkv. Neither the demo nor the tests need it.
# Only the library is built (no llama.cpp tests, examples, tools or server): about 18 minutes on one of this
# machine kind's 2 cores at nice 19, 193 compile steps. Idempotent: nothing is done when both import.
set -euo pipefail

if python3 -c "import llama_cpp, gguf" 2>/dev/null; then
  echo "install-peers: llama-cpp-python and gguf are installed"
  exit 0
fi
# llama-cpp-python: the version BENCHMARKS.md names.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
-DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF ${CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
echo "install-peers: pip install llama-cpp-python==0.3.36 gguf==0.19.0 (compiles llama.cpp; ≈ 10–20 min)"
python3 -m pip install -q "gguf==0.19.0" "llama-cpp-python==0.3.36"
python3 -c "import llama_cpp, gguf; print('install-peers: llama.cpp', llama_cpp.__version__)"
