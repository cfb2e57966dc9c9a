#!/usr/bin/env bash
# The main job: install what is missing, build, and ask the bundled petrel-tiny model (a 7.7M-
# parameter Qwen3.5-MoE trained by tools/tiny on exact tasks) a question on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
./build/src/petrel inspect models/petrel-tiny
./build/src/petrel run models/petrel-tiny -p "${1:-What is 48213 + 9377?}" --device cpu
