#!/usr/bin/env bash
# On the GPU machine (torch, transformers): trains petrel-tiny's MTP head on its frozen trunk
# (tools/tiny/train_mtp.py) and packs the model folder into $OUT/models.tgz.NN (15 MB parts: the
# device returns files of at most 16 MiB), to unpack at the repository root with
# `cat models.tgz.* | tar xz` and commit.
#   device tool: command "scripts/gpu-make-models.sh"
set -euo pipefail
cd "$(dirname "$0")/.."
python3 tools/tiny/train_mtp.py --model models/petrel-tiny --time-budget 120
tar czf /tmp/models.tgz models/petrel-tiny
split -b 15m -d /tmp/models.tgz "${OUT:?set by the device tool}/models.tgz."
tar tzvf /tmp/models.tgz
