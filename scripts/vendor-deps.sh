#!/usr/bin/env bash
# Copies the headers, static libraries and CMake package files of Petrel's Debian build
# dependencies into .deps/usr, for building on a machine that has a compiler but no apt access
# (the GPU machine: scripts/gpu-check.sh uses .deps when it is there), and llama.cpp's GGUF
# converter from the shared folder beside the checkout into .deps/llama.cpp-gguf, for the fixture
# tools run there (scripts/gpu-make-models.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps
for pkg in nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libutf8proc-dev; do
  dpkg -L "$pkg" | while read -r f; do
    case "$f" in
      /usr/include/*|/usr/share/cmake/*|/usr/lib/*/cmake/*|/usr/lib/*/*.a|/usr/lib/cmake/*) ;;
      *) continue ;;
    esac
    [ -f "$f" ] || continue
    mkdir -p ".deps$(dirname "$f")"
    cp "$f" ".deps$f"
  done
done
cp -r ../shared/third_party/llama.cpp-gguf .deps/llama.cpp-gguf
du -sh .deps
