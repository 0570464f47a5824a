#!/usr/bin/env bash
# Installs what fsdp-mlir needs on Debian 12 and configures the build tree.
# Safe to run any number of times: it installs only missing packages and
# reconfigures only when needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FSDP_BUILD_DIR:-$ROOT/build}"

PACKAGES=(cmake ninja-build g++ python3 ccache
          llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
          libgtest-dev zlib1g-dev nlohmann-json3-dev libxxhash-dev
          flatbuffers-compiler libflatbuffers-dev libcli11-dev clang
          libopenmpi-dev openmpi-bin util-linux libisal-dev
          python3-venv python3-dev fio)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python packages the tests use: xxhash (the hostile-checkpoint suite
# re-signs integrity indexes with xxh3-64).
if ! python3 -c "import xxhash" 2>/dev/null; then
  echo "setup: installing the Python package xxhash"
  python3 -m pip install -q xxhash 2>/dev/null ||
    python3 -m pip install -q --break-system-packages xxhash
fi

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -G Ninja -S "$ROOT" -B "$BUILD" \
    -DCMAKE_BUILD_TYPE=Release \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DLLVM_EXTERNAL_LIT=/usr/lib/llvm-22/bin/lit
fi
