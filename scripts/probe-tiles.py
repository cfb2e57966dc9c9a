#!/usr/bin/env python3
"""Reads the TILES lines of the attention-tiles probe (a petrel bench run's output) and prints, for
each probed attention_cluster launch, its blocks' stamps beside those of the input projections
that ran just before it, in us after that projection launch's first block entered:
min / median / max over blocks."""
import statistics, sys

launches = {}  # (kind, idx) -> list of {field: ns}
for line in open(sys.argv[1]):
    if not line.startswith("TILES"):
        continue
    f = line.split()
    kind, idx = f[1], int(f[2])
    fields = dict(zip(f[4::2], map(int, f[5::2])))
    launches.setdefault((kind, idx), []).append(fields)

def summary(blocks, key, ref):
    v = sorted((b[key] - ref) * 1e-3 for b in blocks if b.get(key))
    return f"{key} {v[0]:.2f} / {statistics.median(v):.2f} / {v[-1]:.2f}" if v else f"{key} -"

projs = [(min(b["enter"] for b in bl), max(b["end"] for b in bl), bl) for (k, _), bl in launches.items() if k == "inproj"]
for (kind, idx), blocks in sorted(launches.items()):
    if kind != "cluster":
        continue
    first_wait = min(b["wait"] for b in blocks)
    before = [p for p in projs if p[1] <= first_wait]
    if not before:
        print(f"cluster launch {idx}: no input projections found before it")
        continue
    ref, _, proj = max(before, key=lambda p: p[1])
    print(f"cluster launch {idx} ({len(blocks)} blocks, {blocks[0]['keys']} keys, {blocks[0]['tiles']} tiles a block);"
          f" us after the projections' first block entered, min / median / max:")
    print("  projections (%d blocks): " % len(proj) + ", ".join(summary(proj, k, ref) for k in ("enter", "wait", "landed", "end")))
    print("  cluster:                 " + ", ".join(summary(blocks, k, ref) for k in ("enter", "issued", "wait", "t0", "t1", "end")))
