#!/usr/bin/env bash
# On the GPU machine, with a stamp probe applied (a commit that makes kernels print
# "STAMP <launch> <block> <name> <value> ..." lines; probes are kept as reverted commits, listed in
# docs/performance.md): builds petrel, runs a short int4 decode bench, and prints per launch the
# median [max] over its blocks of each field (times in us after the block's PDL wait).
# Usage: scripts/probe-stamps.sh [BENCH ARGS]  (default "--prefill 16 --decode-context 0")
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${OUT:-build-gpu}"
scripts/gpu-build.sh "$logs" petrel || exit 1
bench_args="${*:---prefill 16 --decode-context 0}"  # a probe of a long-context kernel: "--decode-context 4096"
./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights int4 $bench_args > "$logs/stamps.txt" 2>&1
grep -v STAMP "$logs/stamps.txt" | grep decode
python3 - "$logs/stamps.txt" <<'PY'
import statistics, sys
launches = {}
for line in open(sys.argv[1]):
    if not line.startswith("STAMP"):
        continue
    f = line.split()
    launches.setdefault(f[1], []).append(dict(zip(f[3::2], map(float, f[4::2]))))
for name, blocks in sorted(launches.items()):
    keys = list(blocks[0])
    print(f"{name:12} {len(blocks):3} blocks  " +
          "  ".join(f"{k} {statistics.median(b[k] for b in blocks):.2f} [{max(b[k] for b in blocks):.2f}]" for k in keys))
PY
