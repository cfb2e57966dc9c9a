#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu-build.sh): one launch of the decode kernel matching REGEX
# (the SKIP-th, default 3) seen instruction by instruction by Nsight Compute: executed instructions
# per warp by opcode and the SASS lines with the most stall samples (scripts/ncu_sass.py). The raw
# source page is kept as $OUT/sass-REGEX.csv.
# Usage: scripts/gpu-ncu-sass.sh REGEX [SKIP] [WEIGHTS: int4 or bf16]
set -uo pipefail
cd "$(dirname "$0")/.."
regex="$1"; skip="${2:-3}"; weights="${3:-int4}"
logs="${OUT:-build-gpu}"
csv="$logs/sass-${regex//[^A-Za-z0-9_]/_}.csv"
run=(./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 16 --decode-context 0
     --decode-tokens 2 --runs 1 --no-cuda-graphs)
ncu --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --section SourceCounters \
  --section LaunchStats --page source --print-source sass --csv "${run[@]}" > "$csv" 2> "$csv.err" \
  || { tail -5 "$csv.err"; exit 1; }
warps=$(ncu --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 \
  --metrics launch__grid_size,launch__block_size --csv "${run[@]}" 2> /dev/null | python3 -c '
import csv, sys
m = {r["Metric Name"]: float(r["Metric Value"].replace(",", "")) for r in csv.DictReader(l for l in sys.stdin if l.startswith("\""))}
print(int(m["launch__grid_size"] * m["launch__block_size"] // 32))')
echo "== $regex (launch $skip, $weights) =="
python3 scripts/ncu_sass.py "$csv" "$warps" 25
