#!/usr/bin/env bash
# Build llama.cpp's `llama-quantize` (CPU only) from the same llama.cpp source as
# benchmarks/build_llama_server.sh (vendored in the pinned llama-cpp-python sdist), with
# the same cmake flags, into the same cache folder:
#
#   ${SPECPROBE_LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-~/.cache}/specprobe/llama.cpp}/<version>/bin/llama-quantize
#
# A second run finds the binary and does nothing (no network). The quantizer tests
# (tests/test_llamacpp_quantize.py) and benchmarks/bench_llamacpp_quant_peer.py look there
# and skip the llama-quantize checks when it is absent. Not part of .ci/run: the server
# is already CI's long build.
#
# The sdist is taken, in this order, from LLAMA_CPP_PYTHON_SDIST (a path to the .tar.gz),
# from <cache>/sdist/ (kept there by an earlier run of this script), or downloaded with
# pip (which uses its own HTTP cache) into <cache>/sdist/ and kept for the next build.
# Parallelism: JOBS (default 2); the build runs under nice.
set -euo pipefail

# shellcheck source=benchmarks/llama_build_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/llama_build_common.sh"
BIN="$DEST/bin/llama-quantize"
SDIST_DIR="$ROOT/sdist"
SDIST_NAME="llama_cpp_python-$VERSION.tar.gz"

if [ -x "$BIN" ]; then
    echo "llama-quantize $VERSION already built: $BIN"
    exit 0
fi

llama_need_tools llama-quantize

mkdir -p "$ROOT"
WORK="$(mktemp -d "$ROOT/.build-quantize-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

SDIST=""
if [ -n "${LLAMA_CPP_PYTHON_SDIST:-}" ]; then
    [ -f "$LLAMA_CPP_PYTHON_SDIST" ] || { echo "error: LLAMA_CPP_PYTHON_SDIST=$LLAMA_CPP_PYTHON_SDIST is not a file" >&2; exit 1; }
    SDIST="$LLAMA_CPP_PYTHON_SDIST"
elif [ -f "$SDIST_DIR/$SDIST_NAME" ]; then
    SDIST="$SDIST_DIR/$SDIST_NAME"
else
    echo "downloading the llama-cpp-python $VERSION sdist (vendored llama.cpp source)"
    python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
        "llama-cpp-python==$VERSION" -d "$WORK/dl"
    mkdir -p "$SDIST_DIR"
    cp "$WORK/dl/$SDIST_NAME" "$SDIST_DIR/.$SDIST_NAME.tmp"
    mv "$SDIST_DIR/.$SDIST_NAME.tmp" "$SDIST_DIR/$SDIST_NAME"
    SDIST="$SDIST_DIR/$SDIST_NAME"
fi
echo "source: $SDIST"
tar -xzf "$SDIST" -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$SRC/tools/quantize/CMakeLists.txt" ] || { echo "error: no vendored llama.cpp quantize tool in the sdist" >&2; exit 1; }

llama_build llama-quantize

# Atomic publish next to llama-server (which must not be touched): the binary is copied
# under a hidden name and renamed, so a half-copied one never looks like a cached one.
mkdir -p "$DEST/bin"
cp "$WORK/build/bin/llama-quantize" "$DEST/bin/.llama-quantize.tmp"
mv "$DEST/bin/.llama-quantize.tmp" "$BIN"
echo "built $BIN"
