#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only) from the llama.cpp vendored in the
# llama-cpp-python sdist on PyPI, into a cache folder keyed by that version:
#
#   ${SPECPROBE_LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-~/.cache}/specprobe/llama.cpp}/<version>/bin/llama-server
#
# A second run finds the binary and does nothing (no network). The engine tests
# (tests/test_llamacpp.py) and benchmarks/bench_llamacpp_peer.py look in the same place.
#
# The version is pinned because the server's metric names and log lines change between
# releases and the tests check the ones this version writes; override with
# LLAMA_CPP_PYTHON_VERSION. Parallelism: JOBS (default 2); the build runs under nice.
# Only the llama-server target is built (~190 compile steps). Measured: 59 min with -j2 at
# nice 10 on two cores shared with a load average of ~10; idle cores take a fraction.
set -euo pipefail

# shellcheck source=benchmarks/llama_build_common.sh
. "$(dirname "${BASH_SOURCE[0]}")/llama_build_common.sh"
BIN="$DEST/bin/llama-server"

if [ -x "$BIN" ]; then
    echo "llama-server $VERSION already built: $BIN"
    exit 0
fi

llama_need_tools llama-server

mkdir -p "$ROOT"
WORK="$(mktemp -d "$ROOT/.build-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "downloading the llama-cpp-python $VERSION sdist (vendored llama.cpp source)"
python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$SRC/CMakeLists.txt" ] || { echo "error: no vendored llama.cpp in the sdist" >&2; exit 1; }

llama_build llama-server

# Atomic publish: a half-built or interrupted build never looks like a cached one.
STAGE="$WORK/out"
mkdir -p "$STAGE/bin"
cp "$WORK/build/bin/llama-server" "$STAGE/bin/"
"$STAGE/bin/llama-server" --version >"$STAGE/version.txt" 2>&1 || true
echo "llama-cpp-python $VERSION" >>"$STAGE/version.txt"
rm -rf "$DEST"
mv "$STAGE" "$DEST"
echo "built $BIN"
