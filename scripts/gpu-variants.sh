#!/usr/bin/env bash
# On the GPU machine: decode speed of several code variants in one call, so that one device
# session can compare many. Each argument is a patch (`git diff` output, e.g. an untracked
# variants/*.diff) applied to the tree in turn; the tree as it is runs first as "base". Each
# variant is built incrementally in build-gpu (only the files it touches recompile) and timed with
# `petrel bench --synthetic qwen3.5-35b-a3b --weights W --prefill 512 --breakdown`; the patch is
# reverted before the next. Ends with a table: tok/s at each context and the kernels' shares.
# Usage: scripts/gpu-variants.sh [--weights int4|bf16] [--bench-args "..."] PATCH...
set -uo pipefail
cd "$(dirname "$0")/.."
weights=int4
bench_args="--decode-context 0,4096"
patches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --weights) weights="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    *) patches+=("$1") ;;
  esac
  shift
done
logs="${OUT:-build-gpu}"
mkdir -p "$logs"
for p in "${patches[@]}"; do
  git apply --check "$p" || { echo "patch $p does not apply to this tree" >&2; exit 2; }
done

# Builds and times the current tree as variant $1 (JSON into $logs/variant-$1.json).
run_variant() {
  local name="$1"
  if ! scripts/gpu-build.sh "$logs" > /dev/null; then
    echo "$name: build failed"; grep -E "error" "$logs/build.log" | head -10
    return 1
  fi
  ./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 512 --breakdown \
    $bench_args --json > "$logs/variant-$name.json" 2> "$logs/variant-$name.err" \
    || { echo "$name: bench failed"; tail -3 "$logs/variant-$name.err"; return 1; }
}

names=(base)
run_variant base
for p in "${patches[@]}"; do
  name="$(basename "$p" .diff)"
  names+=("$name")
  git apply "$p" && run_variant "$name"
  git apply -R "$p" || { echo "could not revert $p" >&2; exit 1; }
done
scripts/gpu-build.sh "$logs" > /dev/null  # leave build-gpu matching the tree

echo
echo "== Petrel variants ($weights, median of 5) =="
python3 - "$logs" "${names[@]}" <<'PY'
import json, os, sys
logs, names = sys.argv[1], sys.argv[2:]
for name in names:
    path = os.path.join(logs, f"variant-{name}.json")
    if not os.path.exists(path):
        print(f"{name:28s} (no result)")
        continue
    d = json.load(open(path))
    row = " | ".join(f"tg@{q['context']} {q['tok_per_s']:.1f} [{q['min']:.1f}-{q['max']:.1f}]" for q in d["decode"])
    print(f"{name:28s} {row}")
    g = d["breakdown"].get("graph")
    if g:
        short = lambda k: k.replace("(petrel::cuda::WFormat)", "F").replace("_kernel", "")[:24]
        top = ", ".join(f"{short(r['kernel'])} {r['us']:.0f}" for r in g["kernels"][:6])
        print(f"{'':28s} step {g['step_us']:.0f} us: {top}")
PY
