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

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${SPECPROBE_LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specprobe/llama.cpp}"
DEST="$ROOT/$VERSION"
BIN="$DEST/bin/llama-server"
JOBS="${JOBS:-2}"

if [ -x "$BIN" ]; then
    echo "llama-server $VERSION already built: $BIN"
    exit 0
fi

for tool in cmake c++ python3; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (needed to build llama-server)" >&2; exit 1; }
done

mkdir -p "$ROOT"
WORK="$(mktemp -d "$ROOT/.build-$VERSION.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "downloading the llama-cpp-python $VERSION sdist (vendored llama.cpp source)"
python3 -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
    "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-*.tar.gz -C "$WORK"
SRC="$(echo "$WORK"/llama_cpp_python-*/vendor/llama.cpp)"
[ -f "$SRC/CMakeLists.txt" ] || { echo "error: no vendored llama.cpp in the sdist" >&2; exit 1; }

# Portable x86-64 (AVX2/FMA/F16C) code: GGML_NATIVE would pick up AVX-512 and AMX from
# the build machine, and AMX raises SIGILL on the machines these tests run on. No
# network at build time (OpenSSL, prebuilt web UI), no tests/examples, static
# libraries so the one binary can be cached on its own.
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
nice -n 10 cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=OFF \
    -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
    -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
    -DGGML_CCACHE=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    >"$WORK/cmake.log" 2>&1 || { tail -30 "$WORK/cmake.log" >&2; exit 1; }

echo "building llama-server with $JOBS jobs"
nice -n 10 cmake --build "$WORK/build" --target llama-server -j "$JOBS" \
    >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }

# Atomic publish: a half-built or interrupted build never looks like a cached one.
STAGE="$WORK/out"
mkdir -p "$STAGE/bin"
cp "$WORK/build/bin/llama-server" "$STAGE/bin/"
"$STAGE/bin/llama-server" --version >"$STAGE/version.txt" 2>&1 || true
echo "llama-cpp-python $VERSION" >>"$STAGE/version.txt"
rm -rf "$DEST"
mv "$STAGE" "$DEST"
echo "built $BIN"
