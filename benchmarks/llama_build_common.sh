# Sourced by benchmarks/build_llama_server.sh and benchmarks/build_llama_quantize.sh: the
# pinned llama.cpp version, the cache folder both build into, and the one cmake
# configuration both use. Not meant to run on its own.

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${SPECPROBE_LLAMA_SERVER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specprobe/llama.cpp}"
DEST="$ROOT/$VERSION"
JOBS="${JOBS:-2}"

# llama_need_tools TARGET: the tools a build needs, or an error naming what is missing.
llama_need_tools() {
    for tool in cmake c++ python3; do
        command -v "$tool" >/dev/null || { echo "error: $tool not found (needed to build $1)" >&2; exit 1; }
    done
}

# llama_build TARGET: configure $SRC into $WORK/build and build TARGET with $JOBS jobs.
# Portable x86-64 (AVX2/FMA/F16C) code: GGML_NATIVE would pick up AVX-512 and AMX from
# the build machine, and AMX raises SIGILL on the machines these tests run on. No
# network at build time (OpenSSL, prebuilt web UI), no tests/examples, static
# libraries so the one binary can be cached on its own.
llama_build() {
    local gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    nice -n 10 cmake -S "$SRC" -B "$WORK/build" "${gen[@]}" -Wno-dev \
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

    echo "building $1 with $JOBS jobs"
    nice -n 10 cmake --build "$WORK/build" --target "$1" -j "$JOBS" \
        >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log" >&2; exit 1; }
}
