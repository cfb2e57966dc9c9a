#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu-build.sh): why each one-token decode kernel's warps wait.
# Nsight Compute measures the per-reason stall ratios (cycles a warp spends waiting, per issued
# instruction) of every launch of the decode kernels in a short `petrel bench` run; the table gives,
# per kernel, the median time and the largest reasons over its decode launches (the launches whose
# grid matches the kernel's last one, which leaves out a router's prefill launches).
# CACHE is Nsight's --cache-control: "all" (default) flushes caches before each replay pass, "none"
# keeps them (later passes then see warm instruction and data caches).
# Usage: scripts/gpu-ncu-stalls.sh [REGEX] [COUNT] [CACHE] [WEIGHTS: int4 or bf16]
set -uo pipefail
cd "$(dirname "$0")/.."
regex="${1:-gemv_async|router_staged|gate_up_async|down_async|deltanet_decode|attention_partial}"
count="${2:-400}"; cache="${3:-all}"; weights="${4:-int4}"
logs="${OUT:-build-gpu}"
csv="$logs/ncu-stalls-$cache.csv"
run=(./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 16 --decode-context 0
     --decode-tokens 2 --runs 1 --no-cuda-graphs)
ncu --clock-control none --cache-control "$cache" --kernel-name "regex:$regex" --launch-count "$count" \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,gpu__time_duration.sum,launch__grid_size,smsp__inst_executed.sum" \
  --csv "${run[@]}" > "$csv" 2> "$csv.err" || { tail -5 "$csv.err"; exit 1; }
echo "== stall reasons per issued instruction (cache control: $cache, $weights) =="
python3 - "$csv" <<'PY'
import csv, sys, re, statistics
from collections import defaultdict, OrderedDict
launches = OrderedDict()
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    m = launches.setdefault(r["ID"], {"name": re.sub(r"\(.*", "", r["Kernel Name"]).replace("void ", "")})
    m[r["Metric Name"]] = float(r["Metric Value"].replace(",", "") or 0)
by = defaultdict(list)
for m in launches.values():
    by[m["name"]].append(m)
for name, ms in by.items():
    grid = ms[-1]["launch__grid_size"]
    ms = [m for m in ms if m["launch__grid_size"] == grid]
    med = lambda key: statistics.median(m.get(key, 0.0) for m in ms)
    stalls = {k: med(k) for k in ms[0] if k.startswith("smsp__average_warps_issue_stalled_")}
    total = sum(stalls.values())
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:6]
    print(f"{name[:60]:60s} {len(ms):4d} launches, grid {grid:.0f}, {med('gpu__time_duration.sum') / 1e3:7.2f} us, "
          f"{med('smsp__inst_executed.sum'):9.0f} inst, {total:6.1f} stall cycles/inst")
    print("    " + ", ".join(f"{k.split('stalled_')[1].split('_per_issue')[0]} {100 * v / total:4.1f}%" for k, v in top))
PY
