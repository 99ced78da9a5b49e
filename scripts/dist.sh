#!/usr/bin/env bash
# Builds the self-contained bundle (after `make setup`):
#   dist/plinth/bin/plinth          the server, debug info stripped
#   dist/plinth/lib/                libonnxruntime.so (found beside the binary, no
#                                   ORT_DYLIB_PATH needed) and the slim libtorch the
#                                   binary links (found through its $ORIGIN/../lib run path)
# Nothing else from the build tree; copy the folder anywhere and run bin/plinth.
#
# Usage: scripts/dist.sh [OUT]   (default dist/plinth)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist/plinth}
[[ -x target/release/plinth && -e .venv/libonnxruntime.so ]] || { echo "run \`make setup\` first" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
strip --strip-debug -o "$out/bin/plinth" target/release/plinth
cp -L .venv/libonnxruntime.so "$out/lib/libonnxruntime.so"
cp -L .cache/libtorch/lib/*.so* "$out/lib/"
echo "bundle in $out ($(du -sh "$out" | cut -f1))"
