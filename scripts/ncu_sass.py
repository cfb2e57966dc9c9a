"""Reads Nsight Compute's source page (--page source --print-source sass --csv) of one launch and
prints where its warps spend their time: executed instructions per warp by opcode, and the SASS
lines that collect the most stall samples (a stall is charged to the instruction that waits)."""
import csv
import sys
from collections import Counter

path, warps = sys.argv[1], int(sys.argv[2])
rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
header_at = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
header, sass = rows[header_at], rows[header_at + 1:]
samples_col = header.index("Warp Stall Sampling (All Samples)")
executed_col = header.index("Instructions Executed")
samples = [int(r[samples_col] or 0) for r in sass]
executed = [int(r[executed_col] or 0) for r in sass]
total_samples = max(1, sum(samples))
print(f"{len(sass)} SASS instructions, {sum(executed) / warps:.0f} executed per warp ({warps} warps), "
      f"{sum(samples)} stall samples")
ops = Counter()
for r, n in zip(sass, executed):
    words = r[1].split()
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    ops[op.split(".")[0]] += n
print("per warp: " + ", ".join(f"{op} {n / warps:.0f}" for op, n in ops.most_common(16)))
print(f"{'line':>5} {'samples':>8} {'exec/warp':>9}  instruction")
for i in sorted(range(len(sass)), key=lambda i: -samples[i])[:int(sys.argv[3]) if len(sys.argv) > 3 else 25]:
    if samples[i] == 0:
        break
    print(f"{i:5d} {samples[i]:5d} {100 * samples[i] / total_samples:2.0f}% {executed[i] / warps:9.1f}  {sass[i][1].strip()[:90]}")
