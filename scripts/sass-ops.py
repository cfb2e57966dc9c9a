#!/usr/bin/env python3
"""Where the CUDA toolkit's cuobjdump is (the GPU machine): the SASS opcodes of each kernel whose
shortened name matches a regex, counted, so that a change can be checked to keep one copy of a loop
(a stand-in pass runs the real pass's instructions only if the compiler made no second copy).
scripts/kernel-sizes.sh gives sizes where no cuobjdump is installed.

Usage: scripts/sass-ops.py REGEX OBJECT... [--ops IDP,REDUX,BAR,...]
Prints per kernel: its instruction count and the count of each listed opcode (mnemonic before
the first dot, so IDP.4A.S32 counts as IDP)."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

DEFAULT_OPS = "IDP,REDUX,BAR,LDS,LDGSTS,UBLKCP,SHFL,MUFU"
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)")
FUNCTION = re.compile(r"Function : (\S+)")


def cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = shutil.which("nvcc")
    near = os.path.join(os.path.dirname(nvcc), "cuobjdump") if nvcc else ""
    return near if near and os.path.exists(near) else None


def short_names(mangled):
    """The names as scripts/kernel-sizes.sh prints them, demangled in one c++filt call."""
    names = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
    shorts = []
    for name in names[:len(mangled)]:
        for long, brief in (("petrel::cuda::", ""), ("(anonymous namespace)::", ""), ("(WFormat)", "F"),
                            ("(GemvEpilogue)", "E")):
            name = name.replace(long, brief)
        shorts.append(re.sub(r"^void |\(.*", "", name))
    return shorts


def kernels(sass):
    """(mangled name, Counter of mnemonics) for each function in cuobjdump -sass output."""
    name, ops = None, collections.Counter()
    for line in sass.splitlines():
        m = FUNCTION.search(line)
        if m:
            if name:
                yield name, ops
            name, ops = m.group(1), collections.Counter()
            continue
        m = INSTRUCTION.search(line)
        if name and m:
            ops[m.group(1)] += 1
    if name:
        yield name, ops


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("regex")
    ap.add_argument("objects", nargs="+")
    ap.add_argument("--ops", default=DEFAULT_OPS)
    a = ap.parse_args()
    tool = cuobjdump()
    if not tool:
        print("sass-ops: no cuobjdump on this machine (scripts/kernel-sizes.sh gives sizes without it)")
        return 0
    pattern, wanted = re.compile(a.regex), a.ops.split(",")
    for obj in a.objects:
        out = subprocess.run([tool, "-sass", obj], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"sass-ops: cuobjdump -sass {obj} failed: {out.stderr.strip()[:200]}", file=sys.stderr)
            continue
        found = list(kernels(out.stdout))
        for name, (_, ops) in zip(short_names([m for m, _ in found]), found):
            if pattern.search(name):
                counts = ", ".join(f"{op} {ops[op]}" for op in wanted)
                print(f"{name}: {sum(ops.values())} instructions; {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
