#!/usr/bin/env bash
# On a GPU machine: build (sm_90a + portable PTX), run every GPU test and the benchmark, and end
# with a short table. Where apt is unavailable (the device tool's GPU machine), run
# scripts/vendor-deps.sh on a Debian machine first and bring .deps along (device tool: carry
# [".deps"], command "scripts/gpu-check.sh"). Logs go to $OUT when set, else build-gpu/.
# Usage: scripts/gpu-check.sh [--skip-bench] [--tests GTEST_FILTER] [--weights "int4 bf16"] [--bench-args "..."]
#        [--ab "BENCH FLAGS"]  (each weight format timed again with these flags: an A/B in one build)
set -uo pipefail
cd "$(dirname "$0")/.."
skip_bench=0
bench_args=""
weights="int4 bf16"
tests="*Cuda*"
ab=""
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-bench) skip_bench=1 ;;
    --bench-args) bench_args="$2"; shift ;;
    --weights) weights="$2"; shift ;;
    --tests) tests="$2"; shift ;;
    --ab) ab="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
logs="${OUT:-build-gpu}"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
scripts/gpu-build.sh "$logs" || exit 1

timeout 420 ./build-gpu/tests/petrel_tests --gtest_filter="$tests" --gtest_brief=1 > "$logs/gpu-tests.log" 2>&1
tests_rc=$?
grep -E "FAILED|Failure|note:|Expected|Which is|actual|PASSED|SKIPPED" "$logs/gpu-tests.log" | head -60

bench_rc=0
if [ $skip_bench -eq 0 ]; then
  for w in $weights; do
    timeout 240 ./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights $w $bench_args --json > "$logs/bench-$w.json" 2> "$logs/bench-$w.err" || bench_rc=1
    [ -n "$ab" ] && { timeout 240 ./build-gpu/src/petrel bench --synthetic qwen3.5-35b-a3b --weights $w $bench_args $ab --json > "$logs/bench-$w-ab.json" 2> "$logs/bench-$w-ab.err" || bench_rc=1; }
  done
fi

echo
echo "== Petrel GPU check =="
passed=$(grep -oE "\[  PASSED  \] [0-9]+" "$logs/gpu-tests.log" | grep -oE "[0-9]+$" || echo 0)
failed=$(grep -cE "^\[  FAILED  \] .*\(" "$logs/gpu-tests.log" || true)
echo "GPU tests: ${passed:-0} passed, ${failed:-0} failed (exit $tests_rc)"
if [ $skip_bench -eq 0 ]; then
  runs=""
  for w in $weights; do runs="$runs $w"; [ -n "$ab" ] && runs="$runs $w-ab"; done
  for w in $runs; do
    python3 - "$logs/bench-$w.json" "$w" <<'PY' || { echo "bench $w failed:"; tail -5 "$logs/bench-$w.err"; }
import json, sys
d = json.load(open(sys.argv[1]))
row = [f"{sys.argv[2]:7s}"]
for p in d["prefill"]:
    row.append(f"pp{p['tokens']} {p['tok_per_s']:.0f}/s")
for q in d["decode"]:
    row.append(f"tg@{q['context']} {q['tok_per_s']:.1f}/s ({100*q['fraction_of_bandwidth']:.0f}% BW)")
print(" | ".join(row))
for q in d["decode"]:  # each run in the order it ran: drift, outliers
    if "runs_tok_per_s" in q:
        print(f"  tg@{q['context']} runs: " + " ".join(f"{v:.1f}" for v in q["runs_tok_per_s"]))
for r in d.get("serving", []):
    print(f"  serving: {r['concurrency']:3d} concurrent greedy streams {r['tok_per_s']:8.1f} tok/s [{r['min']:.1f}-{r['max']:.1f}]")
if "breakdown" in d:
    b = d["breakdown"]
    for name, rows in (("decode step", b["decode"]), (f"batched step of {b['batch_size']}", b["batch"]),
                       (f"prefill of {b['prefill_tokens']}", b["prefill"])):
        total = sum(r["us"] for r in rows)
        print(f"  {name}, ops timed one by one: {total:.0f} us")
        for r in rows[:14]:
            print(f"    {r['op']:28s} {r['us']:9.1f} us {100 * r['us'] / total:5.1f}%")
    for g in b.get("graphs", [])[1:]:  # the other contexts' steps in one line each
        print(f"  decode step at context {g['context']} in a replayed graph: {g['step_us']:.0f} us, "
              f"kernels busy {g['busy_us']:.0f} us")
    if b.get("graphs"):
        g = b["graphs"][0]
        print(f"  decode step at context {g['context']} in a replayed graph: {g['step_us']:.0f} us, "
              f"kernels busy {g['busy_us']:.0f} us, idle {g['step_us'] - g['busy_us']:.0f} us, {g['launches']:.0f} launches")
        print("    (per kernel: its share of the step's critical path)")
        for r in g["kernels"][:18]:
            print(f"    {r['kernel'][:48]:48s} {r['us']:8.1f} us x{r['launches']:.0f}")
        tl = g.get("timeline", [])
        starts = [i for i, k in enumerate(tl) if k["kernel"].startswith("deltanet_decode")]
        if len(starts) > 5:  # one DeltaNet layer mid-model, from its input projections on
            first, done = starts[4] - 1, tl[starts[4] - 2]["end_us"]
            print("  one DeltaNet layer of that step (us: start, end, own share; blocks x threads, registers,")
            print("  shared KB; 'beside': a block fits on an SM beside one of the previous kernel's):")
            for k in tl[first:first + 8]:
                s, e = k["start_us"], k["end_us"]
                print(f"    {k['kernel'][:44]:44s} {s:8.1f} {e:8.1f} {e - max(s, done):6.1f}  "
                      f"{k['blocks']:4d}x{k['threads']:<4d} {k['registers']:3d} {k['shared_kb']:6.1f}"
                      f"{'  beside' if k['fits_beside_previous'] else ''}")
                done = max(done, e)
PY
  done
fi
[ $tests_rc -eq 0 ] && [ $bench_rc -eq 0 ]
