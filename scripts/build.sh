#!/usr/bin/env bash
# Configures and builds Petrel into build/ (extra arguments go to cmake, e.g. -DPETREL_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
