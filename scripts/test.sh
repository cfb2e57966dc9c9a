#!/usr/bin/env bash
# Installs what is missing, builds everything (CUDA code too when nvcc is present, for one
# architecture to keep it quick), fetches test data and runs the whole test suite, then each
# fuzz target for 45 s (scripts/fuzz.sh). GPU tests report themselves skipped when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh -DPETREL_CUDA_ARCHS=90a-real
scripts/fetch-test-data.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"
scripts/fuzz.sh all 45
