#!/usr/bin/env bash
# On the GPU machine, in one device call: build, the GPU tests of the serving path, then the open
# issues' figures in priority order, each skipped (and said so) when less of the call's time is
# left than it needs. Logs per step go to build-gpu/figures, packed after each step into
# $OUT/figures.tgz (one file: the device returns few); the last lines of each step's log are
# printed as it ends, and every failed test's name and first lines of its failure.
#   device tool: carry [".deps", "tests/fixtures/.cache/qwen3-tokenizer"],
#                command "scripts/gpu-figures.sh [SECONDS]" (default 540: the call's budget)
set -u
cd "$(dirname "$0")/.."
budget="${1:-540}"
logs=build-gpu/figures
rm -rf "$logs"
mkdir -p "$logs"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
# step NEED NAME TAIL CMD...: runs CMD when NEED seconds are left, limited to what is left.
step() {
  local need=$1 name=$2 lines=$3
  shift 3
  if [ "$(left)" -lt "$need" ]; then echo "== $name skipped: $(left) s left"; return; fi
  timeout $(($(left) - 5)) "$@" > "$logs/$name.log" 2>&1
  echo "== $name rc=$? at $(($(date +%s) - t0)) s"
  tail -"$lines" "$logs/$name.log"
  grep -q '^\[  FAILED  \]' "$logs/$name.log" && grep -A8 'Failure$' "$logs/$name.log" | cut -c1-300 | head -150
  [ -n "${OUT:-}" ] && tar czf "$OUT/figures.tgz" -C "$logs" .
}
scripts/gpu-build.sh "$logs/build" petrel petrel_tests || exit 1
echo "== build at $(($(date +%s) - t0)) s"
P=build-gpu/src/petrel
S=(--synthetic qwen3.5-35b-a3b --prefill 16 --decode-context 0)
TOK=tests/fixtures/.cache/qwen3-tokenizer
step 60 tests 4 build-gpu/tests/petrel_tests --gtest_brief=1 \
  --gtest_filter='*CudaGguf*:*CudaFp8*:*CudaDecodeStep*:*CudaDecodeGraph*:*CudaFixture*:*CudaSampler*:*CudaPrefix*:*CudaLinear*:*CudaMoe*:CudaOps.Linear*:*CudaBatched*:*CudaScheduler*:*CudaMtp*'
# The serving figures count each request's 128-token prompt: prefill T=128 prices it.
step 60 serving 8 $P bench --synthetic qwen3.5-35b-a3b --prefill 16,128 --decode-context 0 --weights int4 --runs 3 \
  --concurrency 1,8,32,64
# The same without the prefill burst (a step reads no more prompt tokens with no row decoding).
step 60 serving-noburst 3 $P bench --synthetic qwen3.5-35b-a3b --prefill 16 --decode-context 0 --weights int4 --runs 3 \
  --concurrency 32,64 --serving-burst 512
step 60 breakdown 110 $P bench "${S[@]}" --weights int4 --runs 1 --breakdown --breakdown-batch 32
step 60 mtp-k2 30 $P bench "${S[@]}" --weights int4 --runs 3 --speculative mtp --draft-tokens 2 --draft-accept-rate 1 \
  --breakdown
step 60 mtp-k3 4 $P bench "${S[@]}" --weights int4 --runs 3 --speculative mtp --draft-tokens 3 --draft-accept-rate 1
step 90 http 4 python3 scripts/serve-bench.py --petrel $P --model '' --concurrency 64 --tokens 128 --runs 3 \
  --ban 151643,151645 -- --synthetic qwen3.5-35b-a3b --tokenizer $TOK --quantize int4 --context 512
G=(--synthetic qwen3.5-35b-a3b --prefill 8192 --decode-context 0 --runs 3)
for w in int4 q4_k_m q4_0; do step 45 "gguf-$w" 4 $P bench "${G[@]}" --weights $w; done
for w in bf16 fp8; do step 45 "$w-8192" 4 $P bench "${G[@]}" --weights $w; done
step 60 fp8-serving 3 $P bench "${S[@]}" --weights fp8 --runs 3 --concurrency 64
step 60 bf16 3 $P bench "${S[@]}" --weights bf16 --runs 3 --concurrency 64
step 60 structured 3 $P bench "${S[@]}" --weights int4 --runs 3 --concurrency 64 \
  --json-schema tests/fixtures/schemas/record.json --tokenizer $TOK
step 100 arrivals 8 $P bench "${S[@]}" --weights int4 --runs 1 --concurrency 64 --arrivals 8192 --arrival-every 1 \
  --arrival-count 4
step 100 multi-turn 14 $P bench --synthetic qwen3.5-35b-a3b --weights int4 --multi-turn --runs 2
step 60 mtp-serving 4 $P bench "${S[@]}" --weights int4 --runs 3 --concurrency 1,32 --speculative mtp --draft-tokens 3
# A chat whose answers make most of each turn (256-token questions, 1,792-token answers) and whose
# user reads for a second before the next: the cache replays each answer meanwhile.
step 200 multi-turn-replies 14 $P bench --synthetic qwen3.5-35b-a3b --weights int4 --multi-turn --reply-tokens 1792 \
  --turn-gap-ms 1000 --runs 2
