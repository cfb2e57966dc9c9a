#!/usr/bin/env bash
# On the GPU machine: per-kernel time of one batch-1 decode step (Nsight Compute, clocks left
# alone), summed per kernel name with the DRAM bytes each read. Prints a table, slowest first.
# Usage: scripts/gpu-profile.sh [--weights int4|bf16] [--context N]
set -uo pipefail
cd "$(dirname "$0")/.."
weights=int4
context=0
while [ $# -gt 0 ]; do
  case "$1" in
    --weights) weights="$2"; shift ;;
    --context) context="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
logs="${OUT:-build-gpu}"
scripts/gpu-build.sh "$logs" || exit 1
# Every step the bench runs is profiled; the summary averages per step (one argmax each).
ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
  -k regex:'^(?!random|fill|quantize|copy)' \
  ./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 1 \
  --decode-context "$context" --decode-tokens 1 --runs 1 --no-cuda-graphs \
  > "$logs/ncu-$weights.csv" 2> "$logs/ncu-$weights.err" || { tail -5 "$logs/ncu-$weights.err"; exit 1; }
python3 scripts/ncu_summary.py "$logs/ncu-$weights.csv"
