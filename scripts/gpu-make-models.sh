#!/usr/bin/env bash
# On the GPU machine (torch, transformers): makes what only torch can make and packs it into
# $OUT/models.tgz.NN (15 MB parts: the device returns files of at most 16 MiB), to unpack at the
# repository root with `cat models.tgz.* | tar xz` and commit: petrel-tiny's MTP head
# (tools/tiny/train_mtp.py), the bf16 fixtures of llama.cpp's qwen3moe and qwen3 architectures
# (tools/make_fixtures.py --only) and their GGUF conversions (tools/gguf/make_converter_fixtures.py,
# with the converter scripts/vendor-deps.sh copied into .deps).
#   device tool: carry [".deps"], command "scripts/gpu-make-models.sh"
set -uo pipefail  # each step runs even if one before it failed: one call makes all it can
cd "$(dirname "$0")/.."
fixtures=qwen3moe-sparse,qwen3-dense
python3 tools/tiny/train_mtp.py --model models/petrel-tiny --time-budget 120 || echo "== train_mtp FAILED"
python3 tools/make_fixtures.py --out tests/fixtures/models --only "$fixtures" || echo "== make_fixtures FAILED"
python3 tools/gguf/make_converter_fixtures.py --llama-cpp .deps/llama.cpp-gguf --only "$fixtures" ||
  echo "== make_converter_fixtures FAILED"
files=(models/petrel-tiny)
for f in ${fixtures//,/ }; do files+=(tests/fixtures/models/"$f" tests/fixtures/gguf/models/"$f"-*.gguf); done
tar czf /tmp/models.tgz --ignore-failed-read "${files[@]}"
split -b 15m -d /tmp/models.tgz "${OUT:?set by the device tool}/models.tgz."
tar tzvf /tmp/models.tgz
