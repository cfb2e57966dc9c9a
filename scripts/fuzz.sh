#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ into build-fuzz/ (clang, PETREL_FUZZ=ON) and runs each for
# SECONDS (default 60) over its working corpus build-fuzz/corpus/TARGET, seeded from
# fuzz/corpus/TARGET. Fails on the first crash; libFuzzer saves the input that caused it as
# build-fuzz/crashes/TARGET/crash-* (fuzz/README.md says how to replay it).
#   scripts/fuzz.sh [TARGET|all] [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(request_to_ids_fuzz tool_call_parser_fuzz checkpoint_load_fuzz safetensors_header_fuzz gguf_file_fuzz http_request_parser_fuzz
         json_schema_fuzz)
if [ "${1:-all}" != all ]; then targets=("$1"); fi
seconds=${2:-60}

cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DPETREL_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1
for t in "${targets[@]}"; do
  corpus=build-fuzz/corpus/$t crashes=build-fuzz/crashes/$t log=build-fuzz/logs/$t.log
  mkdir -p "$corpus" "$crashes" build-fuzz/logs
  cp fuzz/corpus/"$t"/* "$corpus"/
  case $t in
    request_to_ids_fuzz | tool_call_parser_fuzz | json_schema_fuzz) dict=fuzz/dict/request.dict ;;
    http_request_parser_fuzz) dict=fuzz/dict/http.dict ;;
    gguf_file_fuzz) dict=fuzz/dict/gguf.dict ;;
    *) dict=fuzz/dict/checkpoint.dict ;;
  esac
  echo "fuzzing $t for ${seconds}s (log: $log)"
  if ! build-fuzz/fuzz/"$t" -max_total_time="$seconds" -timeout=30 -print_final_stats=1 -dict="$dict" \
       -artifact_prefix="$crashes"/ "$corpus" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "$t: crashed; the input is in $crashes/" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "$t: no crash in $runs runs, corpus $(ls "$corpus" | wc -l) inputs"
done
