#!/usr/bin/env python3
"""Reads the TILES lines of the attention stamps probe (a petrel bench run's output) and prints, for
each launch of KIND (cluster or short), the median of each stamp over its blocks in us after the
launch's median PDL wait. Blocks are grouped into launches by their wait stamps (a launch's blocks
leave the wait together; launches are microseconds apart), not by the printed index, which mixes
launches whose blocks enter interleaved. Usage: probe-tiles.py FILE KIND"""
import statistics, sys

kind = sys.argv[2]
blocks = []
for line in open(sys.argv[1]):
    if line.startswith("TILES " + kind):
        f = line.split()
        blocks.append(dict(zip(f[4::2], map(int, f[5::2]))))
blocks.sort(key=lambda b: b["wait"])
launches, cur = [], [blocks[0]]
for b in blocks[1:]:
    if b["wait"] - cur[-1]["wait"] > 1500:
        launches.append(cur)
        cur = []
    cur.append(b)
launches.append(cur)
for bl in launches:
    ref = statistics.median(b["wait"] for b in bl)
    keys = [k for k in bl[0] if k not in ("keys", "tiles")]
    print(f"{len(bl):3d} blocks, {bl[0]['keys']} keys: " +
          ", ".join(f"{k} {statistics.median((b[k] - ref) / 1e3 for b in bl):.2f}" for k in keys) +
          f" | last end {max((b['end'] - ref) / 1e3 for b in bl):.2f}")
