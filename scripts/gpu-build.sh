#!/usr/bin/env bash
# Builds Petrel on the GPU machine into build-gpu (sm_90a + portable PTX), using vendored
# dependencies from .deps when present (see scripts/vendor-deps.sh). Logs go to $1; further
# arguments name the targets to build (all by default).
set -uo pipefail
cd "$(dirname "$0")/.."
logs="${1:-build-gpu}"
targets=("${@:2}")
mkdir -p "$logs"
prefix=()
[ -d .deps/usr ] && prefix=(-DCMAKE_PREFIX_PATH="$PWD/.deps/usr")
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPETREL_NATIVE=OFF \
  -DPETREL_CUDA_ARCHS="90a-real;80-virtual" "${prefix[@]}" > "$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
# The device copies the tree with its own time stamps, older than binaries an earlier call may
# have built from other contents (the tree edited between calls): every source whose contents
# differ from the last build's gets a fresh time stamp, so that ninja rebuilds it.
sums=build-gpu/source-sums
[ -f "$sums" ] && md5sum --quiet -c "$sums" 2> /dev/null | sed -n 's/: FAILED.*$//p' | xargs -r touch -c
cmake --build build-gpu -j"$(nproc)" ${targets[@]:+--target "${targets[@]}"} > "$logs/build.log" 2>&1 || { grep -E "error|Error" "$logs/build.log" | head -40; exit 1; }
find src include tests CMakeLists.txt -type f -print0 | xargs -0 md5sum > "$sums"
