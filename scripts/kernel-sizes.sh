#!/usr/bin/env bash
# Here (no GPU needed): the machine code size of each decode kernel, in SASS instructions for
# sm_90a, read from the .text sections of the cubins nvcc writes. A decode kernel runs its body
# once per block, so the instructions it executes are likely fetched cold (docs/design.md, "The
# kernel chain of a layer"); this shows what a change adds before a device call measures it.
# Usage: scripts/kernel-sizes.sh [FILTER_REGEX] [SOURCE.cu...]   (default: every src/backend/cuda/*.cu)
set -euo pipefail
cd "$(dirname "$0")/.."
filter="${1:-.}"
shift || true
sources=("$@")
[ ${#sources[@]} -gt 0 ] || sources=(src/backend/cuda/*.cu)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for src in "${sources[@]}"; do
  nvcc -DPETREL_HAVE_CUDA=1 -I include -I src -O3 -arch=sm_90a -cubin --expt-relaxed-constexpr -std=c++20 \
    -x cu "$src" -o "$out/$(basename "$src" .cu).cubin"
done
python3 - "$filter" "$out"/*.cubin <<'PY'
import re, struct, subprocess, sys
pattern, cubins = re.compile(sys.argv[1]), sys.argv[2:]
rows = []
for path in cubins:
    d = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    entsize, count, strndx = struct.unpack_from("<HHH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * entsize) for i in range(count)]
    names = secs[strndx][4]
    for s in secs:
        name = d[names + s[0]:d.index(b"\0", names + s[0])].decode()
        if name.startswith(".text."):
            rows.append((s[5] // 16, name[len(".text."):]))
demangled = subprocess.run(["c++filt"], input="\n".join(n for _, n in rows), capture_output=True, text=True).stdout.split("\n")
for (size, _), name in sorted(zip(rows, demangled), reverse=True):
    short = name.replace("petrel::cuda::", "").replace("(anonymous namespace)::", "").replace("(WFormat)", "F")
    short = short.replace("(GemvEpilogue)", "E")
    short = re.sub(r"^void |\(.*", "", short)
    if pattern.search(short):
        print(f"{size:7d}  {short}")
PY
