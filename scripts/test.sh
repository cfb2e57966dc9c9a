#!/usr/bin/env bash
# Installs what is missing, builds everything (CUDA code too when nvcc is present, for one
# architecture to keep it quick), fetches test data, runs each
# fuzz target for 40 s (scripts/fuzz.sh), then the whole test suite. GPU tests report themselves
# skipped when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DPETREL_CUDA_ARCHS=90a-real
scripts/fetch-test-data.sh
scripts/fuzz.sh all 40
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
