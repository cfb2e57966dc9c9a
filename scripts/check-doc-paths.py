#!/usr/bin/env python3
"""Checks that every repository file named in README.md and docs/*.md exists.

A word counts as a repository path when it starts with one of the repository's top-level folders
(src/..., tests/..., scripts/test.sh) or is a bare file name with a source or document extension
(gemv.cuh, serving.md). A path resolves when a tracked file or folder has that name, or a tracked
file that name plus an extension (src/backend/cuda/moe -> src/backend/cuda/moe.cu);
a bare name resolves when a tracked file anywhere has it. Absolute paths, build outputs, fetched
test data and the example file names below are not repository files and are skipped.

Usage: scripts/check-doc-paths.py   (prints each missing path as FILE:LINE: PATH; exit 1 if any)
"""
import os
import re
import subprocess
import sys

# Names the documents use for files that are not in the repository: a user's inputs and outputs
# in command examples, and files of a checkpoint folder that the bundled model lacks.
EXAMPLE_NAMES = {
    "chat.json", "tools.json", "prompt.txt", "notes.txt", "prose.txt", "code.txt", "logits.npy",
    "chat_template.jinja",
}
# Folders that scripts create: build trees and fetched test data.
GENERATED_PREFIXES = ("build/", "build-gpu/", "tests/fixtures/.cache/")
EXTENSIONS = ("cpp", "h", "cu", "cuh", "md", "py", "sh", "mjs", "json", "txt", "jinja", "npy", "patch")


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    os.chdir(root)
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split("\n")
    files = [f for f in files if f]
    tracked = set(files)
    folders = set()
    for f in files:
        parts = f.split("/")
        for i in range(1, len(parts)):
            folders.add("/".join(parts[:i]))
    basenames = {os.path.basename(f) for f in files}
    tops = sorted({f.split("/")[0] for f in files if "/" in f})

    path_re = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in tops) + r")/[\w./*-]*)")
    bare_re = re.compile(r"(?<![\w./-])([\w-]+\.(?:" + "|".join(EXTENSIONS) + r"))(?![\w.])")
    absolute_re = re.compile(r"(?<![\w.])/[\w./-]*(?:\{[^}]*\}[\w./-]*)?")

    def resolves(p):
        p = p.rstrip("/")
        if p.startswith(GENERATED_PREFIXES) or p + "/" in GENERATED_PREFIXES:
            return True
        if p in tracked or p in folders:
            return True
        if p.endswith(".*") or p.endswith("*"):  # src/backend/cuda/op_timer.*, tests/server/*_test.mjs
            stem = p.split("*")[0]
            return any(f.startswith(stem) for f in tracked)
        return any(p + "." + e in tracked for e in EXTENSIONS)

    docs = sorted(f for f in files if f == "README.md" or (f.startswith("docs/") and f.endswith(".md")))
    missing = []
    for doc in docs:
        with open(doc, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        for n, line in enumerate(lines, 1):
            line = absolute_re.sub(" ", line)
            for m in path_re.finditer(line):
                p = m.group(1).rstrip(".,:;")
                if not resolves(p):
                    missing.append((doc, n, p))
            for m in bare_re.finditer(line):
                name = m.group(1)
                if name in basenames or name in EXAMPLE_NAMES:
                    continue
                missing.append((doc, n, name))
    for doc, n, p in missing:
        print(f"{doc}:{n}: {p}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
