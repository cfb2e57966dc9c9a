#!/usr/bin/env bash
# On the GPU machine, with the stragglers probe applied (gate+up blocks print "STRAGGLE launch block
# smid slot expert enter wait picked issued landed end", absolute ns): builds petrel, runs a short
# int4 decode bench, then says per launch how far the last block's wait, pick, copy issue, landing
# and end trail the median block's, and which SMs, slots and block indices are the last to end.
# Usage: scripts/probe-stragglers.sh [BENCH ARGS]  (default "--prefill 16 --decode-context 0")
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${OUT:-build-gpu}"
scripts/gpu-build.sh "$logs" petrel || exit 1
bench_args="${*:---prefill 16 --decode-context 0}"
./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights int4 $bench_args > "$logs/stragglers.txt" 2>&1
grep -v STRAGGLE "$logs/stragglers.txt" | grep decode
python3 - "$logs/stragglers.txt" <<'PY'
import collections, statistics, sys
launches = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    if f and f[0] == "STRAGGLE":
        launches[int(f[1])].append(dict(block=int(f[2]), sm=int(f[3]), slot=int(f[4]), expert=int(f[5]),
                                         t=[int(v) for v in f[6:12]]))
names = ["enter", "wait", "picked", "issued", "landed", "end"]
trail = collections.defaultdict(list)  # field -> (max - median) per launch, us
last = collections.Counter()
last_sm = collections.Counter()
last_slot = collections.Counter()
for idx, blocks in sorted(launches.items()):
    w0 = min(b["t"][1] for b in blocks)  # the launch's first wait return
    for i, n in enumerate(names):
        vals = [(b["t"][i] - w0) * 1e-3 for b in blocks]
        trail[n].append((statistics.median(vals), max(vals)))
    end = max(blocks, key=lambda b: b["t"][5])
    last[("routed" if end["slot"] < 8 else "shared", end["block"] == 0 and end["slot"] == 0)] += 1
    last_sm[end["sm"]] += 1
    last_slot[end["slot"]] += 1
print(f"{len(launches)} launches; us after the launch's first wait return, median of launches: median block / last block")
for n in names:
    med = statistics.median(m for m, _ in trail[n])
    mx = statistics.median(x for _, x in trail[n])
    print(f"  {n:7} {med:6.2f} / {mx:6.2f}")
print("last block to end (role, is block (0, 0)):", dict(last))
print("SMs most often last:", last_sm.most_common(8))
print("slots most often last:", last_slot.most_common(8))
PY
