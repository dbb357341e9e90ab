#!/usr/bin/env bash
# llama-server with a draft model, as it is started in production. specprobe reads it as it is:
#   specprobe check --serving-config sample_configs/llama-server-launch.sh
# gives the target (-m), the drafter (-md), K (--spec-draft-n-max), the draft knobs and the
# default sampling, from the flags and from the LLAMA_ARG_* variables exported below (a flag
# on the command line wins, as llama-server reads its environment first). The engine it
# predicts for is llama.cpp unless --engine says otherwise.
set -euo pipefail

MODELS=/srv/models
export LLAMA_ARG_TEMPERATURE=0.7       # sampling for requests that set none
export LLAMA_ARG_SPEC_DRAFT_P_MIN=0.75 # stop a draft at a drafter token below this probability

exec llama-server \
    -m "$MODELS/SmolLM2-1.7B-Instruct-Q8_0.gguf" \
    -md "$MODELS/SmolLM2-135M-Instruct-Q8_0.gguf" \
    --spec-type draft-simple \
    --spec-draft-n-max 8 \
    --spec-draft-n-min 1 \
    --top-p 0.95 --top-k 0 \
    -ngl 99 -ngld 99 -c 8192 \
    --host 0.0.0.0 --port 8080
