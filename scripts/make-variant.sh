#!/usr/bin/env bash
# Here, before a device call: writes variants/NAME/ holding REV's copy of every source file that
# differs between the working tree and REV (git revision or branch), the folder
# scripts/gpu-variants.sh times against the tree. Taking every differing file keeps a variant
# buildable when a change spans headers and callers. gpu-variants.sh replaces files, it does not
# add or remove them: a header only the tree has stays in the variant's build (REV's files do not
# include it) and is skipped with a note; any other file only one side has stops the script.
# Usage: scripts/make-variant.sh NAME REV
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: scripts/make-variant.sh NAME REV" >&2; exit 2; }
name="$1" rev="$2"
git rev-parse --verify --quiet "$rev^{commit}" > /dev/null || { echo "make-variant: no revision $rev" >&2; exit 2; }
files=$(git diff --name-only "$rev" -- src include tests)
[ -n "$files" ] || { echo "make-variant: the tree's sources equal $rev" >&2; exit 2; }
kept=()
for f in $files; do
  [ -f "$f" ] || { echo "make-variant: $f is in $rev but not in the tree" >&2; exit 2; }
  if ! git cat-file -e "$rev:$f" 2> /dev/null; then
    case "$f" in
      *.h|*.cuh) echo "make-variant: $f is in the tree only: the variant builds beside it unchanged" >&2; continue ;;
      *) echo "make-variant: $f is in the tree but not in $rev" >&2; exit 2 ;;
    esac
  fi
  kept+=("$f")
done
[ ${#kept[@]} -gt 0 ] || { echo "make-variant: only new headers differ from $rev" >&2; exit 2; }
files="${kept[*]}"
rm -rf "variants/$name"
for f in $files; do
  mkdir -p "variants/$name/$(dirname "$f")"
  git show "$rev:$f" > "variants/$name/$f"
done
echo "variants/$name: ${#kept[@]} files from $rev"
