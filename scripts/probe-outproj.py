#!/usr/bin/env python3
"""Reads the OUTP lines of the output-projection stamps probe (a petrel bench run's output) and
prints, for each probed launch, the blocks that start before its median wait (early) and those
that start after it (late): their count, and the median [max] of each stamp in us after the
launch's median wait. Usage: probe-outproj.py FILE"""
import collections, statistics, sys

launches = collections.defaultdict(list)
for line in open(sys.argv[1]):
    if line.startswith("OUTP"):
        f = line.split()
        b = dict(zip(f[2::2], map(int, f[3::2])))
        launches[int(f[1])].append(b)
for idx, bl in sorted(launches.items()):
    ref = statistics.median(b["wait"] for b in bl)
    last = max(b["end"] for b in bl)
    print(f"launch {idx}: {len(bl)} blocks, last end {(last - ref) / 1e3:.2f} us after the median wait")
    for name, group in (("early", [b for b in bl if b["enter"] < ref]), ("late", [b for b in bl if b["enter"] >= ref])):
        if not group:
            continue
        ids = sorted(b["block"] for b in group)
        cols = ", ".join(f"{k} {statistics.median((b[k] - ref) / 1e3 for b in group):.2f} [{max((b[k] - ref) / 1e3 for b in group):.2f}]"
                         for k in ("enter", "wait", "staged", "landed", "dots", "end") if k in group[0])
        print(f"  {name}: {len(group)} blocks (ids {ids[0]}-{ids[-1]}): {cols}")
