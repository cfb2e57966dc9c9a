#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu-build.sh): Nsight Compute's view of the decode kernels whose
# name matches REGEX, in one short `petrel bench` run launched kernel by kernel. First a table of
# every matching launch (time, DRAM and issue use, instructions), then the detailed sections
# (warp stalls, scheduler, memory) of the longest one and of launch FOCUS (default: the first).
# Usage: scripts/gpu-ncu.sh REGEX [COUNT] [FOCUS] [WEIGHTS: int4 or bf16]
set -uo pipefail
cd "$(dirname "$0")/.."
regex="$1"; count="${2:-90}"; focus="${3:-0}"; weights="${4:-int4}"
logs="${OUT:-build-gpu}"
run=(./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 16 --decode-context 0
     --decode-tokens 2 --runs 1 --no-cuda-graphs)
metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,launch__grid_size,launch__block_size
ncu --clock-control none --kernel-name "regex:$regex" --launch-count "$count" --metrics "$metrics" --csv "${run[@]}" \
  > "$logs/ncu-table.csv" 2> "$logs/ncu-table.err" || { tail -5 "$logs/ncu-table.err"; exit 1; }
longest=$(python3 - "$logs/ncu-table.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"'))]
by = collections.OrderedDict()
for r in rows:
    by.setdefault(r["ID"], {"name": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
best, best_t = 0, -1.0
print(f"{'id':>4} {'kernel':40s} {'us':>8} {'dram%':>6} {'issue%':>6} {'inst':>10} grid x block", file=sys.stderr)
for i, (k, m) in enumerate(by.items()):
    t = float(m["gpu__time_duration.sum"].replace(",", "")) / 1000.0
    if t > best_t: best, best_t = i, t
    print(f"{i:4d} {m['name'][:40]:40s} {t:8.1f} {m['dram__throughput.avg.pct_of_peak_sustained_elapsed']:>6} "
          f"{m['smsp__issue_active.avg.pct_of_peak_sustained_active']:>6} {m['smsp__inst_executed.sum']:>10} "
          f"{m['launch__grid_size']} x {m['launch__block_size']}", file=sys.stderr)
print(best)  # the one line on stdout: the longest launch
PY
)
for skip in "$longest" "$focus"; do
  echo "== launch $skip of the matching kernels =="
  ncu --clock-control none --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
    "${run[@]}" 2> /dev/null | sed -n '/Section: GPU Speed Of Light/,$p' | grep -vE "^\s*$|----" | head -90
done
