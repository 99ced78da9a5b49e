#!/usr/bin/env bash
# Builds the self-contained bundle (after `scripts/setup.sh models`):
#   OUT/bin/plinth                  the server, debug info stripped
#   OUT/lib/                        libonnxruntime.so (found beside the binary, no
#                                   ORT_DYLIB_PATH needed) and the slim libtorch the
#                                   binary links (found through its $ORIGIN/../lib run path)
#   OUT/share/plinth/plugin-sdk/    the plugin SDK and the WIT contracts it builds
#   OUT/share/plinth/wit/           against, so `plinth plugin new` works from the bundle
#   OUT/share/plinth/examples/      the example clients and the walkthrough's model
#   OUT/LICENSES/                   the licences of everything above (scripts/licenses.py)
# Nothing else from the build tree; copy the folder anywhere with glibc 2.36 or
# newer and run bin/plinth. It needs no Rust, no Python and no network.
#
# Usage: scripts/dist.sh [OUT] [--tarball]   (default OUT: dist/plinth)
#   --tarball  also writes OUT's parent/plinth-VERSION-x86_64-linux.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist/plinth tarball=
for arg in "$@"; do
    case $arg in
        --tarball) tarball=yes ;;
        *) out=$arg ;;
    esac
done
[[ -x target/release/plinth && -e .cache/onnxruntime/libonnxruntime.so && -f .cache/libtorch/build-version ]] \
    || { echo "the server, ONNX Runtime or libtorch is not set up: run \`scripts/setup.sh models\` first" >&2; exit 1; }
# The bundle promises TorchScript: refuse a binary built without libtorch.
ldd target/release/plinth | grep -q libtorch_cpu.so \
    || { echo "target/release/plinth was built without libtorch: run \`scripts/setup.sh models\`" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

echo "== bundle $out (plinth $version)"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/share/plinth"
strip --strip-debug -o "$out/bin/plinth" target/release/plinth
cp -L .cache/onnxruntime/libonnxruntime.so "$out/lib/libonnxruntime.so"
cp -L .cache/libtorch/lib/*.so* "$out/lib/"

# The SDK as a standalone crate: the workspace's inherited fields written out,
# and the WIT folder beside it where its `generate!` path expects it.
sdk=$out/share/plinth/plugin-sdk
mkdir -p "$sdk"
cp -r plugin-sdk/src "$sdk/src"
sed -e "s/^version.workspace = true/version = \"$version\"/" \
    -e 's/^edition.workspace = true/edition = "2024"/' \
    -e 's/^license.workspace = true/license = "Apache-2.0"/' \
    -e 's/^rust-version.workspace = true/rust-version = "1.95"/' \
    plugin-sdk/Cargo.toml > "$sdk/Cargo.toml"
printf '\n# Standalone: not a member of the crate that depends on it.\n[workspace]\n' >> "$sdk/Cargo.toml"
cp -r wit "$out/share/plinth/wit"
# The clients and the walkthrough model of the docs (docs/plugins.md), and the
# guide itself, so that a reader with only the bundle can follow it.
cp -r examples "$out/share/plinth/examples"
cp -r docs "$out/share/plinth/docs"

python3 scripts/licenses.py .cache/wheels "$out/LICENSES" libtorch
echo "   bundle in $out ($(du -sh "$out" | cut -f1))"

if [[ -n $tarball ]]; then
    archive=$(dirname "$out")/plinth-$version-x86_64-linux.tar.gz
    echo "== tarball $archive"
    tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | gzip -1 > "$archive.partial"
    mv "$archive.partial" "$archive"
    echo "   $archive ($(du -h "$archive" | cut -f1)); unpack anywhere and run plinth/bin/plinth serve"
fi
