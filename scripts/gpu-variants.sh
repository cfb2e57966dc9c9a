#!/usr/bin/env bash
# On the GPU machine: decode speed of several code variants in one call, so that one device
# session can compare many. Each argument is a variant folder (variants/NAME/, ignored by git:
# device tool carry [".deps", "variants"]) holding whole files at their paths in the tree
# (variants/NAME/src/backend/cuda/linear.cu); they
# replace the tree's files in turn (no git or patch needed there), and the tree as it is runs first
# as "base". Each variant is built incrementally in build-gpu (only the files it changes recompile)
# and timed with `petrel bench --synthetic qwen3.5-35b-a3b --weights W --prefill 512 --breakdown`;
# the tree's files are put back before the next (build-gpu keeps the last variant's binaries until
# the next build, which scripts/gpu-build.sh's source sums make recompile them). Ends with a table:
# tok/s at each context (a variant's also as a change against base), the kernels' shares of the
# step, and when each kernel of a DeltaNet layer ends after the one before (and of an attention
# layer), for each decode context traced.
# With --tests FILTER each variant also runs those GPU tests (gtest filter) and the table shows
# how many passed: an unmeasured variant is checked and timed in one call. With --sass REGEX the
# table also shows the SASS opcode counts of the kernels matching REGEX (scripts/sass-ops.py): a
# stand-in pass must run the real pass's instructions, so its loops must stay one copy.
# Usage: scripts/gpu-variants.sh [--weights int4|bf16] [--bench-args "..."] [--tests FILTER]
#        [--sass REGEX] VARIANT_DIR...
# scripts/make-variant.sh NAME REV writes such a folder from a git revision or branch. Under the
# device tool the per-variant JSON, test and error files come back packed in $OUT/variants.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
weights=int4
bench_args="--decode-context 0,4096"
tests=""
sass=""
variants=()
while [ $# -gt 0 ]; do
  case "$1" in
    --weights) weights="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    --tests) tests="$2"; shift ;;
    --sass) sass="$2"; shift ;;
    *) variants+=("${1%/}") ;;
  esac
  shift
done
logs="${OUT:-build-gpu}"
mkdir -p "$logs"
backup="$(mktemp -d)"  # the tree's own copies of the files a variant replaces
for v in "${variants[@]}"; do
  [ -d "$v" ] || { echo "variant $v is not a folder" >&2; exit 2; }
  (cd "$v" && find . -type f) | while read -r f; do
    [ -f "$f" ] || { echo "variant $v replaces $f, which the tree does not have" >&2; exit 2; }
  done || exit 2
done

# Builds and times the current tree as variant $1 (JSON into $logs/variant-$1.json).
run_variant() {
  local name="$1"
  local targets=(petrel)  # not bench/: a variant need not build it; the tests only where they run
  [ -n "$tests" ] && targets+=(petrel_tests)
  if ! scripts/gpu-build.sh "$logs" "${targets[@]}" > /dev/null; then
    echo "$name: build failed"; grep -E "error" "$logs/build.log" | head -10
    return 1
  fi
  [ -n "$sass" ] && scripts/sass-ops.py "$sass" build-gpu/src/CMakeFiles/petrel_lib.dir/backend/cuda/*.cu.o \
    > "$logs/variant-$name.sass" 2>&1
  # A variant that hangs (a copy barrier never completing) costs 3 minutes, not the device call.
  timeout 180 ./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights "$weights" --prefill 512 --breakdown \
    $bench_args --json > "$logs/variant-$name.json" 2> "$logs/variant-$name.err" \
    || { echo "$name: bench failed"; tail -3 "$logs/variant-$name.err"; return 1; }
  [ -z "$tests" ] && return 0
  timeout 300 ./build-gpu/tests/petrel_tests --gtest_filter="$tests" --gtest_brief=1 > "$logs/variant-$name.tests" 2>&1
  grep -E "^\[  FAILED  \] .*\(" "$logs/variant-$name.tests" | head -5
}

names=(base)
run_variant base
for v in "${variants[@]}"; do
  name="$(basename "$v")"
  names+=("$name")
  files=$(cd "$v" && find . -type f)
  rm -rf "$backup" && mkdir -p "$backup"
  for f in $files; do mkdir -p "$backup/$(dirname "$f")" && cp -p "$f" "$backup/$f" && cp "$v/$f" "$f"; done
  run_variant "$name"
  for f in $files; do cp "$backup/$f" "$f"; done  # a fresh time stamp: ninja rebuilds what it built from the variant
done
# build-gpu is left as the last variant built it; the next build (gpu-check.sh, gpu-build.sh), in
# this call or a later one, finds the tree's files differ from the sums of that build and
# recompiles them.

echo
echo "== Petrel variants ($weights, median of 5) =="
python3 - "$logs" "${names[@]}" <<'PY'
import json, os, re, sys
logs, names = sys.argv[1], sys.argv[2:]
base = {}  # the tree's tok/s by context: each variant's rates are also given against it

def against(name, q):  # " +x.x%" against base at q's context ("" for base itself)
    b = base.get(q["context"])
    return f" {100 * (q['tok_per_s'] / b - 1):+.1f}%" if name != names[0] and b else ""

for name in names:
    path = os.path.join(logs, f"variant-{name}.json")
    if not os.path.exists(path) or os.path.getsize(path) == 0:  # bench failed: see variant-NAME.err
        print(f"{name:28s} (no result)")
        continue
    d = json.load(open(path))
    if name == names[0]:
        base = {q["context"]: q["tok_per_s"] for q in d["decode"]}
    row = " | ".join(f"tg@{q['context']} {q['tok_per_s']:.1f} [{q['min']:.1f}-{q['max']:.1f}]{against(name, q)}"
                     for q in d["decode"])
    tests = os.path.join(logs, f"variant-{name}.tests")
    if os.path.exists(tests):
        text = open(tests).read()
        passed = re.search(r"\[  PASSED  \] (\d+)", text)
        failed = len(re.findall(r"^\[  FAILED  \] .*\(", text, re.M))
        row += f" | tests {passed.group(1) if passed else 0} passed, {failed} failed"
    print(f"{name:28s} {row}")
    if all("runs_tok_per_s" in q for q in d["decode"]):  # each run in the order it ran: drift, outliers
        print(f"{'':28s} runs " + " | ".join(f"tg@{q['context']} " + " ".join(f"{v:.1f}" for v in q["runs_tok_per_s"])
                                              for q in d["decode"]))
    sass = os.path.join(logs, f"variant-{name}.sass")
    if os.path.exists(sass):
        for line in open(sass).read().splitlines():
            print(f"{'':28s} sass {line}")
    for g in d["breakdown"].get("graphs", []):
        short = lambda k: k.replace("(petrel::cuda::WFormat)", "F").replace("_kernel", "")[:24]
        top = ", ".join(f"{short(r['kernel'])} {r['us']:.0f}" for r in g["kernels"][:6])
        print(f"{'':28s} ctx {g.get('context', 0)}: step {g['step_us']:.0f} us: {top}")
        # A layer from the down before its mixer's anchor kernel (any kernel named deltanet*, or
        # the partial, short or cluster attention) to the down after it: how long each kernel ends after the one
        # before, by the kernels' own names (they vary with the code), medians over the layers
        # whose kernels match the most common sequence.
        tl = g.get("timeline", [])
        med = lambda v: sorted(v)[len(v) // 2]
        for label, anchor in (("DeltaNet layer", ("deltanet",)), ("attention layer", ("attention_partial", "attention_short", "attention_cluster"))):
            spans = {}
            for i, k in enumerate(tl):
                if not k["kernel"].startswith(anchor):
                    continue
                j, m = i - 1, i + 1
                while j > 0 and not tl[j]["kernel"].startswith("down"): j -= 1
                while m < len(tl) - 1 and not tl[m]["kernel"].startswith("down"): m += 1
                if tl[j]["kernel"].startswith("down") and tl[m]["kernel"].startswith("down"):
                    seq = tl[j:m + 1]
                    spans.setdefault(tuple(short(x["kernel"]) for x in seq), []).append([x["end_us"] for x in seq])
            if spans:
                kernels, ends = max(spans.items(), key=lambda kv: len(kv[1]))
                steps = [med([e[p + 1] - e[p] for e in ends]) for p in range(len(kernels) - 1)]
                print(f"{'':28s} {label} {med([e[-1] - e[0] for e in ends]):.1f} us: " +
                      ", ".join(f"{n.split('<')[0]} +{s:.1f}" for n, s in zip(kernels[1:], steps)))
PY
# A device call brings back at most 8 files from $OUT (read-only where they land: extract with
# `tar xzf .../variants.tgz -C DIR`).
if [ -n "${OUT:-}" ]; then
  (cd "$logs" && tar czf variants.tgz variant-* && rm -f variant-*)
fi
