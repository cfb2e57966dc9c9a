#!/usr/bin/env bash
# A/B of `petrel bench` between a base revision and the working tree, on one GPU machine in one
# call: both are built, then benched in alternation (base, tree, base, tree, ...) so drift hits
# both alike, and a table of every run ends the output.
#   Here (git):        scripts/gpu-ab.sh prepare REV        # writes build-ab/base.tar
#   GPU machine:       scripts/gpu-ab.sh run [--rounds N] [-- BENCH ARGS]
# Under the device tool carry [".deps", "build-ab"]. Default bench args: int4, --concurrency 1,8,32.
# A run that fails is reported with the last line of its stderr and counted, so intermittent
# failures show as a rate per side.
set -uo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
shift || true
case "$mode" in
  prepare)
    [ $# -eq 1 ] || { echo "usage: scripts/gpu-ab.sh prepare REV" >&2; exit 2; }
    git rev-parse --verify --quiet "$1^{commit}" > /dev/null || { echo "gpu-ab: no revision $1" >&2; exit 2; }
    mkdir -p build-ab
    # The whole tree but the fixtures and models (the bench needs neither).
    git archive "$1" -o build-ab/base.tar -- . ':(exclude)tests/fixtures' ':(exclude)models'
    git rev-parse --short "$1" > build-ab/base.rev
    echo "build-ab/base.tar: $(cat build-ab/base.rev)"
    ;;
  run)
    rounds=2
    bench=(--synthetic qwen3.5-35b-a3b --weights int4 --concurrency 1,8,32)
    while [ $# -gt 0 ]; do
      case "$1" in
        --rounds) rounds="$2"; shift ;;
        --) shift; bench=(--synthetic qwen3.5-35b-a3b "$@"); break ;;
        *) echo "gpu-ab: unknown argument $1" >&2; exit 2 ;;
      esac
      shift
    done
    [ -f build-ab/base.tar ] || { echo "gpu-ab: no build-ab/base.tar (run 'prepare REV' first)" >&2; exit 2; }
    logs="$(realpath -m "${OUT:-build-ab}/ab")"
    mkdir -p "$logs"
    rm -rf build-ab/base && mkdir -p build-ab/base && tar -xf build-ab/base.tar -C build-ab/base
    [ -d .deps ] && ln -sfn "$PWD/.deps" build-ab/base/.deps
    (cd build-ab/base && scripts/gpu-build.sh "$logs/base-build" petrel) || { echo "gpu-ab: the base does not build" >&2; exit 1; }
    scripts/gpu-build.sh "$logs/tree-build" petrel || { echo "gpu-ab: the tree does not build" >&2; exit 1; }
    for r in $(seq 1 "$rounds"); do
      for side in base tree; do
        bin=build-gpu/src/petrel
        [ $side = base ] && bin=build-ab/base/build-gpu/src/petrel
        if ! timeout 300 "$bin" bench "${bench[@]}" --json > "$logs/$side-$r.json" 2> "$logs/$side-$r.err"; then
          echo "$side run $r failed: $(tail -1 "$logs/$side-$r.err")"
          rm -f "$logs/$side-$r.json"
        fi
      done
    done
    echo "== A/B: base $(cat build-ab/base.rev 2>/dev/null) vs the tree, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null) =="
    python3 - "$logs" "$rounds" <<'PY'
import json, os, sys
logs, rounds = sys.argv[1], int(sys.argv[2])
for side in ("base", "tree"):
    ok = 0
    for r in range(1, rounds + 1):
        path = f"{logs}/{side}-{r}.json"
        if not os.path.exists(path):
            print(f"{side} {r}: failed")
            continue
        ok += 1
        d = json.load(open(path))
        row = [f"{side} {r}:"]
        row += [f"pp{p['tokens']} {p['tok_per_s']:.0f}" for p in d.get("prefill", [])]
        row += [f"tg@{q['context']} {q['tok_per_s']:.1f}" for q in d.get("decode", [])]
        row += [f"c{s['concurrency']} {s['tok_per_s']:.0f}" for s in d.get("serving", [])]
        print(" | ".join(row))
    print(f"{side}: {ok} of {rounds} runs completed")
PY
    ;;
  *)
    echo "usage: scripts/gpu-ab.sh prepare REV | run [--rounds N] [-- BENCH ARGS]" >&2
    exit 2
    ;;
esac
