"""Sums an Nsight Compute CSV (gpu__time_duration, dram__bytes_read) per kernel name and decode step."""
import csv
import re
import sys
from collections import defaultdict

rows = [r for r in csv.DictReader(line for line in open(sys.argv[1]) if line.startswith('"'))]
time_ns, dram, count = defaultdict(float), defaultdict(float), defaultdict(int)
ids = set()
for r in rows:
    name = re.sub(r"<[^<>]*>$", "", r["Kernel Name"].split("(")[0].strip()).split("::")[-1].replace("void ", "")
    value = float(r["Metric Value"].replace(",", ""))
    unit = r["Metric Unit"]
    if r["Metric Name"] == "gpu__time_duration.sum":
        scale = {"ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
        time_ns[name] += value * scale
        count[name] += 1
    else:
        scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}.get(unit, 1)
        dram[name] += value * scale
# Every decode step ends in one argmax: report per step.
steps = max(1, count.get("argmax_kernel", 1))
for d in (time_ns, dram):
    for k in d:
        d[k] /= steps
total = sum(time_ns.values())
print(f"per decode step, averaged over {steps} steps")
print(f"{'kernel':32s} {'launches':>8s} {'time us':>10s} {'share':>6s} {'DRAM MB':>9s} {'GB/s':>7s}")
for name in sorted(time_ns, key=lambda n: -time_ns[n]):
    t = time_ns[name]
    print(f"{name:32s} {count[name] / steps:8.0f} {t / 1e3:10.1f} {100 * t / total:5.1f}% {dram[name] / 1e6:9.1f} "
          f"{dram[name] / t if t else 0:7.0f}")
print(f"{'total':32s} {sum(count.values()) / steps:8.0f} {total / 1e3:10.1f}        {sum(dram.values()) / 1e6:9.1f} "
      f"{sum(dram.values()) / total:7.0f}")
