#!/usr/bin/env bash
# The main job: install what is missing, build, and run a small checkpoint from tests/fixtures/
# (a random-weight Qwen3.5-MoE in its released VLM-wrapped layout) on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
model=tests/fixtures/models/qwen35moe-vlm-fused
./build/src/petrel inspect "$model"
./build/src/petrel run "$model" --prompt-ids 16,241,103,7,58,201,99,12,150,33,87,64 -n 24 --temperature 0 --output-ids
