"""Serving configs as users have them: every shape each engine accepts (vLLM, SGLang,
llama.cpp, TensorRT-LLM), what each says (engine, drafting, K, knobs, sampling), each
number refused where it was written, the merge (flags > probe config > serving config >
defaults) on every command that loads a target, and models named by Hugging Face repo id
found in the local cache."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError, ModelLoadError
from specprobe.settings.model import for_command
from specprobe.settings.options import merge
from specprobe.settings.serving import describe_serving, read_serving_config

runner = CliRunner()
SAMPLES = Path(__file__).resolve().parent.parent / "sample_configs"


def _write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(ConfigError) as e:
        read_serving_config(path)
    line = e.value.one_line()
    for n in needles:
        assert n in line, line
    return line


# ============================================================================= vLLM
def test_vllm_speculative_config_json_with_draft_sample_method(tmp_path: Path) -> None:
    p = _write(tmp_path, "spec.json", json.dumps({"method": "eagle3", "model": "org/eagle3", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic", "draft_tensor_parallel_size": 1}))
    sv = read_serving_config(p)
    assert (sv.engine, sv.method, sv.drafter_kind, sv.num_speculative_tokens, sv.drafting) == ("vllm", "eagle3", "eagle3", 3, "probabilistic")
    assert sv.drafter_spec == "eagle3:org/eagle3" and sv.extra == {"draft_tensor_parallel_size": 1}
    assert sv.where("drafting") == "spec.json: draft_sample_method" and sv.where("k") == "spec.json: num_speculative_tokens"
    # greedy is vLLM's default: a config that says nothing leaves the drafting to the engine
    assert read_serving_config(_write(tmp_path, "plain.json", '{"model": "d", "num_speculative_tokens": 2}')).drafting is None
    _refused(_write(tmp_path, "bad.json", '{"model": "d", "draft_sample_method": "sampled"}'), "bad.json: draft_sample_method 'sampled' is not one of greedy, probabilistic")
    _refused(_write(tmp_path, "k0.json", '{"model": "d", "num_speculative_tokens": 0}'), "k0.json: num_speculative_tokens 0 is outside [1, 32]")
    _refused(_write(tmp_path, "k.json", '{"model": "d", "num_speculative_tokens": 2.5}'), "k.json: num_speculative_tokens 2.5 is not a whole number")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        pytest.param("model: org/t\nspeculative-config:\n  method: eagle3\n  model: org/h\n  num_speculative_tokens: 0\n", "serve.yaml: speculative-config.num_speculative_tokens", id="nested-mapping"),
        pytest.param("model: org/t\nspeculative-config: '{\"method\": \"eagle3\", \"model\": \"org/h\", \"num_speculative_tokens\": 0}'\n", "serve.yaml: speculative-config.num_speculative_tokens", id="json-string"),
        pytest.param("model: org/t\nspeculative_config: {method: eagle3, model: org/h, num_speculative_tokens: 0}\n", "serve.yaml: speculative_config.num_speculative_tokens", id="underscores"),
        pytest.param("model: org/t\nspeculative-model: org/h\nnum-speculative-tokens: 0\n", "serve.yaml: num-speculative-tokens", id="older-keys"),
        pytest.param("model: org/t\nspec-method: eagle3\nspec-model: org/h\nspec-tokens: 0\n", "serve.yaml: spec-tokens", id="shorthands"),
    ],
)
def test_vllm_serve_yaml_shapes(tmp_path: Path, text: str, where: str) -> None:
    """`vllm serve --config` YAML: the speculative config as a mapping or as the JSON
    string vLLM's flag takes, and the shorthand / older keys; K named where it is written."""
    sv = read_serving_config(_write(tmp_path, "serve.yaml", text.replace(": 0", ": 4").replace('": 0', '": 4')))
    assert (sv.engine, sv.target, sv.drafter, sv.num_speculative_tokens) == ("vllm", "org/t", "org/h", 4)
    assert sv.where("k") == where and sv.where("target") == "serve.yaml: model"
    _refused(_write(tmp_path, "serve.yaml", text), f"{where} 0 is outside [1, 32]")


def test_vllm_override_generation_config_is_its_sampling(tmp_path: Path) -> None:
    p = _write(tmp_path, "serve.yaml", "model: org/t\nspeculative-config: {method: deepseek_mtp, num_speculative_tokens: 1}\noverride-generation-config: '{\"temperature\": 0.6, \"top_k\": -1}'\n")
    sv = read_serving_config(p)
    assert sv.drafter_kind == "mtp" and sv.drafter_spec == "mtp" and sv.sampling == {"temperature": 0.6, "top_k": 0.0}  # top_k -1: vLLM's "off"
    assert sv.where("temperature") == "serve.yaml: override-generation-config.temperature"
    _refused(_write(tmp_path, "bad.yaml", "model: t\nspeculative-config: {model: d}\noverride-generation-config: {top_p: 1.5}\n"), "bad.yaml: override-generation-config.top_p 1.5 is outside (0, 1]")


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("vllm serve org/t --port 8000 --speculative-config '{\"method\": \"eagle3\", \"model\": \"org/h\", \"num_speculative_tokens\": 3, \"draft_sample_method\": \"probabilistic\"}'", id="json"),
        pytest.param("vllm serve org/t -sc '{\"method\": \"eagle3\", \"model\": \"org/h\", \"num_speculative_tokens\": 3, \"draft_sample_method\": \"probabilistic\"}'", id="short"),
        pytest.param('vllm serve org/t --speculative-config=\'{"method":"eagle3","model":"org/h","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}\'', id="equals"),
        pytest.param("vllm serve org/t --speculative-config.method eagle3 --speculative-config.model org/h --speculative-config.num_speculative_tokens 3 --speculative-config.draft_sample_method probabilistic", id="dotted"),
        pytest.param("python -m vllm.entrypoints.openai.api_server --model org/t --spec-method eagle3 --spec-model org/h --spec-tokens 3 --speculative-config.draft_sample_method probabilistic", id="api-server-shorthands"),
        pytest.param("CUDA_VISIBLE_DEVICES=0,1 exec vllm serve org/t \\\n  --tensor-parallel-size 2 \\\n  --trust-remote-code \\\n  --speculative_config '{\"method\": \"eagle3\", \"model\": \"org/h\",\n    \"num_speculative_tokens\": 3, \"draft_sample_method\": \"probabilistic\"}' \\\n  > vllm.log 2>&1 &", id="script"),
    ],
)
def test_vllm_command_lines(tmp_path: Path, line: str) -> None:
    sv = read_serving_config(_write(tmp_path, "launch.sh", f"#!/bin/sh\n# vLLM with an EAGLE-3 head\n{line}\n"))
    assert (sv.engine, sv.target, sv.drafter_spec, sv.num_speculative_tokens, sv.drafting) == ("vllm", "org/t", "eagle3:org/h", 3, "probabilistic")
    assert sv.where("k").startswith("launch.sh: ") and sv.where("drafting").startswith("launch.sh: ")


def test_vllm_command_line_values_are_refused_as_written(tmp_path: Path) -> None:
    _refused(_write(tmp_path, "a.sh", "vllm serve m --speculative-config.num_speculative_tokens 40\n"), "a.sh: --speculative-config.num_speculative_tokens 40 is outside [1, 32]")
    _refused(_write(tmp_path, "b.sh", "vllm serve m --spec-tokens 3 --override-generation-config '{\"temperature\": -1}'\n"), "b.sh: --override-generation-config.temperature -1.0 is negative")
    _refused(_write(tmp_path, "c.sh", "vllm serve m --speculative-config '{bad'\n"), "c.sh: --speculative-config is not valid JSON")


def test_vllm_config_file_named_by_the_command_line(tmp_path: Path) -> None:
    """`vllm serve --config cfg.yaml` reads the YAML (relative to the script) and lays its
    own flags over it, as vLLM does."""
    _write(tmp_path, "cfg.yaml", "model: org/t\nspeculative-config: {method: draft_model, model: org/d, num_speculative_tokens: 5}\n")
    sv = read_serving_config(_write(tmp_path, "run.sh", "vllm serve --config cfg.yaml --spec-tokens 2\n"))
    assert (sv.target, sv.drafter, sv.num_speculative_tokens) == ("org/t", "org/d", 2) and sv.where("k") == "run.sh: --spec-tokens"
    assert sv.where("target") == "cfg.yaml: model"
    _refused(_write(tmp_path, "gone.sh", "vllm serve m --config nope.yaml\n"), "gone.sh names nope.yaml, which does not exist")


# ============================================================================= SGLang
def test_sglang_launch_yaml_and_command_line(tmp_path: Path) -> None:
    sv = read_serving_config(SAMPLES / "sglang-launch.yaml")
    assert (sv.engine, sv.num_speculative_tokens, sv.drafting) == ("sglang", 4, None)
    assert sv.extra == {"speculative_eagle_topk": 1, "speculative_num_draft_tokens": 5}
    assert sv.where("temperature") == "sglang-launch.yaml: preferred-sampling-params.temperature"
    script = _write(
        tmp_path,
        "sglang.sh",
        "python3 -m sglang.launch_server --model-path org/t --speculative-algorithm EAGLE3 --speculative-draft-model-path org/h \\\n"
        "  --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16 \\\n"
        "  --speculative-accept-threshold-single 0.9 --speculative-accept-threshold-acc=0.5 --speculative-use-rejection-sampling \\\n"
        "  --preferred-sampling-params '{\"temperature\": 0.8}' --port 30000\n",
    )
    sv = read_serving_config(script)
    assert (sv.engine, sv.target, sv.drafter_spec, sv.num_speculative_tokens, sv.drafting) == ("sglang", "org/t", "eagle3:org/h", 3, "probabilistic")
    assert sv.extra == {
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 16,
        "speculative_accept_threshold_single": 0.9,
        "speculative_accept_threshold_acc": 0.5,
        "speculative_use_rejection_sampling": True,
    }
    assert sv.sampling == {"temperature": 0.8} and sv.where("drafting") == "sglang.sh: --speculative-use-rejection-sampling"
    # topk 4: a tree, said as one (not "K = 3"), with each knob where the script set it
    line = describe_serving(sv)
    assert "a tree: depth 3 (--speculative-num-steps), 4 candidates per step (--speculative-eagle-topk), 16 tokens verified (--speculative-num-draft-tokens)" in line
    assert "K = 3" not in line
    # an EAGLE (1/2) head and the args-file form (no program named)
    args = read_serving_config(_write(tmp_path, "sglang.args", "--model-path org/t\n--speculative-algorithm EAGLE\n--speculative-draft-model org/e\n--speculative-num-steps 5\n"))
    assert (args.engine, args.drafter_spec, args.num_speculative_tokens) == ("sglang", "eagle:org/e", 5)


@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--speculative-accept-threshold-single", "1.5", "is outside [0, 1]"),
        ("--speculative-accept-threshold-acc", "0", "is outside (0, 1]"),
        ("--speculative-eagle-topk", "0", "must be at least 1"),
        ("--speculative-num-draft-tokens", "-2", "must be at least 1"),
        ("--speculative-num-steps", "nan", "is not a finite number"),
    ],
)
def test_sglang_knobs_are_bounded(tmp_path: Path, flag: str, value: str, words: str) -> None:
    p = _write(tmp_path, "sg.sh", f"python -m sglang.launch_server --model-path t --speculative-algorithm EAGLE3 --speculative-draft-model-path d {flag} {value}\n")
    _refused(p, f"sg.sh: {flag} ", words)
    y = _write(tmp_path, "sg.yaml", f"model-path: t\nspeculative-algorithm: EAGLE3\n{flag[2:]}: {value.replace('nan', '.nan')}\n")
    _refused(y, f"sg.yaml: {flag[2:]} ", words)


# ============================================================================= llama.cpp
LLAMA_SCRIPT = """#!/usr/bin/env bash
set -euo pipefail
MODELS=/srv/models
export LLAMA_ARG_TEMPERATURE=0.6
export LLAMA_ARG_SPEC_DRAFT_P_MIN=0.5   # the flag below wins
DRAFT="${MODELS}/draft.gguf"
# the server, in the background
CUDA_VISIBLE_DEVICES=0 LLAMA_ARG_TOP_P=0.9 nohup ./build/bin/llama-server \\
    -m "$MODELS/target.gguf" \\
    --model-draft=$DRAFT \\
    --spec-type draft-simple \\
    --spec-draft-n-max 8 --spec-draft-n-min=2 \\
    --spec-draft-p-min 0.75 \\
    --top_k 40 --min-p 0.05 \\
    -ngl 99 --host 0.0.0.0 --port 8080 > server.log 2>&1 &
echo "started"
"""


def test_llama_server_launch_script(tmp_path: Path) -> None:
    """Both spellings of a value, the environment of `export` and of the env prefix, and a
    flag over its LLAMA_ARG_* variable (llama-server reads the environment first)."""
    sv = read_serving_config(_write(tmp_path, "launch.sh", LLAMA_SCRIPT))
    assert (sv.engine, sv.target, sv.drafter, sv.method, sv.drafter_kind, sv.num_speculative_tokens) == ("llama.cpp", "/srv/models/target.gguf", "/srv/models/draft.gguf", "draft-simple", "independent", 8)
    assert sv.drafter_spec == "/srv/models/draft.gguf" and sv.drafting is None  # greedy: llama.cpp's own
    assert sv.extra == {"spec_type": "draft-simple", "p_min": 0.75, "n_min": 2, "n_max": 8}
    assert sv.sampling == {"temperature": 0.6, "top_k": 40.0, "top_p": 0.9, "min_p": 0.05}
    assert sv.places["temperature"] == "launch.sh: LLAMA_ARG_TEMPERATURE" and sv.places["top_p"] == "launch.sh: LLAMA_ARG_TOP_P"
    assert sv.places["top_k"] == "launch.sh: --top_k" and sv.places["drafter"] == "launch.sh: --model-draft" and sv.places["k"] == "launch.sh: --spec-draft-n-max"
    line = describe_serving(sv)
    assert "llama.cpp" in line and "K = 8 (--spec-draft-n-max)" in line and "temperature 0.6" in line


@pytest.mark.parametrize(
    ("name", "text"),
    [
        pytest.param("old.sh", "llama-server -m t.gguf -md d.gguf --draft-max 6 --draft-min 1 --draft-p-min 0.4 --temp 0.3\n", id="older-spellings"),
        pytest.param("equals.sh", "llama-server --model=t.gguf --spec-draft-model=d.gguf --draft=6 --draft-n-min=1 --draft-p-min=0.4 --temperature=0.3\n", id="flag=value"),
        pytest.param("env.sh", "export LLAMA_ARG_MODEL=t.gguf LLAMA_ARG_MODEL_DRAFT=d.gguf\nexport LLAMA_ARG_DRAFT_MAX=6\nLLAMA_ARG_DRAFT_MIN=1 LLAMA_ARG_DRAFT_P_MIN=0.4 LLAMA_ARG_TEMPERATURE=0.3 exec llama-server --port 8080\n", id="older-env"),
        pytest.param("wrapped.sh", "env LLAMA_ARG_SPEC_DRAFT_N_MAX=6 numactl --interleave=all /opt/llama.cpp/llama-server -m t.gguf -md d.gguf --spec-draft-n-min 1 --spec-draft-p-min 0.4 --temp 0.3\n", id="env-wrapper"),
        pytest.param("llama.args", "-m t.gguf\n-md d.gguf\n--spec-draft-n-max 6\n--spec-draft-n-min 1\n--spec-draft-p-min 0.4\n--temp 0.3\n", id="args-file"),
        pytest.param(
            "llama.env",
            "LLAMA_ARG_MODEL=t.gguf\nLLAMA_ARG_SPEC_DRAFT_MODEL=d.gguf\nLLAMA_ARG_SPEC_DRAFT_N_MAX=6\nLLAMA_ARG_SPEC_DRAFT_N_MIN=1\nLLAMA_ARG_SPEC_DRAFT_P_MIN=0.4\nLLAMA_ARG_TEMPERATURE=0.3\n",
            id="env-file",
        ),
    ],
)
def test_llama_server_spellings(tmp_path: Path, name: str, text: str) -> None:
    sv = read_serving_config(_write(tmp_path, name, text))
    assert (sv.engine, sv.target, sv.drafter, sv.num_speculative_tokens, sv.drafter_kind) == ("llama.cpp", "t.gguf", "d.gguf", 6, "independent")
    # what the line leaves unset is the server's own sampler (top-k 40, top-p 0.95, min-p 0.05)
    assert (sv.extra["n_min"], sv.extra["p_min"], sv.sampling) == (1, 0.4, {"temperature": 0.3, "top_k": 40.0, "top_p": 0.95, "min_p": 0.05})


def test_llama_server_defaults_where_the_line_sets_nothing(tmp_path: Path) -> None:
    """llama-server's own defaults (common/common.h of the vendored llama.cpp 0.3.36):
    sampler temperature 0.8, top-k 40, top-p 0.95, min-p 0.05; a draft model drafts 3
    tokens; each default is named as such, and says a request's value replaces it."""
    sv = read_serving_config(_write(tmp_path, "bare.sh", "llama-server -m t.gguf -md d.gguf --port 8080\n"))
    assert sv.sampling == {"temperature": 0.8, "top_k": 40.0, "top_p": 0.95, "min_p": 0.05}
    assert sv.num_speculative_tokens == 3 and sv.extra["n_max"] == 3
    assert sv.places["temperature"] == "llama-server's default temperature 0.8 (a request's own value replaces it)"
    assert sv.places["k"] == "llama-server's default --spec-draft-n-max 3"
    mtp = read_serving_config(_write(tmp_path, "mtp.sh", "llama-server -m t.gguf --spec-type draft-mtp\n"))
    assert mtp.num_speculative_tokens == 3  # the draft types share the draft n_max
    ngram = read_serving_config(_write(tmp_path, "ngram.sh", "llama-server -m t.gguf --spec-type ngram-mod\n"))
    assert ngram.num_speculative_tokens is None  # the n-gram types draft by their own rules


def test_llama_server_kinds_and_repos(tmp_path: Path) -> None:
    mtp = read_serving_config(_write(tmp_path, "mtp.sh", "llama-server -hf org/Target-GGUF:Q4_K_M --spec-type draft-mtp --spec-draft-n-max 2\n"))
    assert (mtp.target, mtp.drafter_kind, mtp.drafter_spec, mtp.num_speculative_tokens) == ("org/Target-GGUF", "mtp", "mtp", 2)
    eagle = read_serving_config(_write(tmp_path, "e.sh", "llama-server -m t.gguf -hfd org/Eagle3-GGUF --spec-type draft-eagle3,ngram-mod\n"))
    assert (eagle.drafter_spec, eagle.method, eagle.extra["spec_type"]) == ("eagle3:org/Eagle3-GGUF", "draft-eagle3", "draft-eagle3,ngram-mod")
    ngram = read_serving_config(_write(tmp_path, "n.sh", "llama-server -m t.gguf --spec-default\n"))
    assert (ngram.method, ngram.drafter_spec, ngram.num_speculative_tokens) == ("ngram-mod", "ngram-mod", None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("llama-server -m t -md d --spec-draft-p-min 1.5\n", "launch.sh: --spec-draft-p-min 1.5 is outside [0, 1]"),
        ("llama-server -m t -md d --draft-p-min=-0.1\n", "launch.sh: --draft-p-min -0.1 is outside [0, 1]"),
        ("llama-server -m t -md d --spec-draft-n-max 0\n", "launch.sh: --spec-draft-n-max 0 is outside [1, 32]"),
        ("llama-server -m t -md d --spec-draft-n-min -1\n", "launch.sh: --spec-draft-n-min -1 is negative"),
        ("llama-server -m t -md d --spec-draft-n-max 3 --spec-draft-n-min 5\n", "launch.sh: --spec-draft-n-min 5 is more than launch.sh: --spec-draft-n-max 3"),
        ("export LLAMA_ARG_TEMPERATURE=-2\nllama-server -m t -md d\n", "launch.sh: LLAMA_ARG_TEMPERATURE -2.0 is negative"),
        ("llama-server -m t -md d --top-p 0\n", "launch.sh: --top-p 0.0 is outside (0, 1]"),
        ("llama-server -m t -md d --top-k $TOPK\n", "launch.sh: --top-k '$TOPK' is not a number (a shell variable this file does not set)"),
        ("llama-server -m t -md d --temp warm\n", "launch.sh: --temp 'warm' is not a number"),
        ("llama-server -m t -md d --spec-draft-n-max 4.5\n", "launch.sh: --spec-draft-n-max '4.5' is not a whole number"),
    ],
)
def test_llama_server_values_are_refused_where_written(tmp_path: Path, text: str, needle: str) -> None:
    _refused(_write(tmp_path, "launch.sh", text), needle)


# ============================================================================= TensorRT-LLM
def test_trtllm_decoding_configs(tmp_path: Path) -> None:
    sv = read_serving_config(SAMPLES / "trtllm-extra-llm-api-options.yaml")
    assert (sv.engine, sv.method, sv.drafter_kind, sv.num_speculative_tokens, sv.drafter_spec) == ("trtllm", "Eagle3", "eagle3", 3, "eagle3:yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
    assert sv.where("k") == "trtllm-extra-llm-api-options.yaml: speculative_config.max_draft_len"
    mtp = read_serving_config(_write(tmp_path, "mtp.yaml", "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 2\n"))
    assert (mtp.drafter_spec, mtp.num_speculative_tokens) == ("mtp", 2)
    medusa = read_serving_config(_write(tmp_path, "medusa.yaml", "speculative_config: {decoding_type: Medusa, max_draft_len: 63, num_medusa_heads: 4, speculative_model_dir: /m/medusa}\n"))
    assert (medusa.drafter_spec, medusa.num_speculative_tokens, medusa.extra["max_draft_len"]) == ("medusa:/m/medusa", 4, 63)  # a tree of 63, a chain of 4 heads
    dt = read_serving_config(_write(tmp_path, "dt.yaml", "speculative_config: {decoding_type: DraftTarget, max_draft_len: 4, speculative_model: /m/draft}\n"))
    assert (dt.drafter_spec, dt.num_speculative_tokens) == ("/m/draft", 4)
    ngram = read_serving_config(_write(tmp_path, "ng.yaml", "decoding_type: NGram\nmax_draft_len: 4\nmax_matching_ngram_size: 2\n"))
    assert (ngram.engine, ngram.drafter_spec, ngram.num_speculative_tokens) == ("trtllm", None, 4)
    _refused(_write(tmp_path, "bad.yaml", "speculative_config: {decoding_type: Eagle3, max_draft_len: 0, speculative_model: h}\n"), "bad.yaml: speculative_config.max_draft_len 0 is outside [1, 32]")


def test_trtllm_serve_command_line_reads_the_yaml_it_names(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    _write(tmp_path / "cfg", "extra.yaml", "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 2\n  speculative_model: org/h\n")
    sv = read_serving_config(_write(tmp_path, "serve.sh", "trtllm-serve org/t --backend pytorch --extra_llm_api_options cfg/extra.yaml --port 8000\n"))
    assert (sv.engine, sv.target, sv.drafter_spec, sv.num_speculative_tokens, sv.source.name) == ("trtllm", "org/t", "eagle3:org/h", 2, "serve.sh")
    assert sv.where("k") == "extra.yaml: speculative_config.max_draft_len"
    _refused(_write(tmp_path, "bare.sh", "trtllm-serve org/t\n"), "bare.sh runs trtllm-serve without --extra_llm_api_options")


# ============================================================================= files that are none of these
def test_files_that_start_no_or_two_engines(tmp_path: Path) -> None:
    _refused(_write(tmp_path, "two.sh", "llama-server -m a -md b\nsleep 1\nvllm serve m --spec-tokens 2\n"), "two.sh starts 2 serving engines (lines 1, 3)")
    _refused(_write(tmp_path, "none.sh", "#!/bin/sh\necho hello\n"), "none.sh starts no serving engine")
    _refused(_write(tmp_path, "mixed.args", "-m t.gguf --speculative-algorithm EAGLE\n"), "mixed.args has flags of llama.cpp and SGLang")
    _refused(_write(tmp_path, "x.json", '{"hello": 1}'), "is none of: a vLLM speculative config or serve YAML, an SGLang launch config, a TensorRT-LLM decoding config")


def test_shell_words_as_bash_splits_them(tmp_path: Path) -> None:
    """Quotes, escapes, comments after a word, ${VAR:-default}, an unquoted # inside a
    word, and a comment line that ends a continued command (bash runs the rest apart)."""
    text = (
        "T=${TARGET:-/m/t.gguf}\n"
        "llama-server -m \"$T\" -md /m/d\\ 1.gguf --spec-draft-n-max '4' --alias a#b # a comment --spec-draft-n-max 9\n"
    )
    sv = read_serving_config(_write(tmp_path, "q.sh", text))
    assert (sv.target, sv.drafter, sv.num_speculative_tokens) == ("/m/t.gguf", "/m/d 1.gguf", 4)
    cut = read_serving_config(_write(tmp_path, "cut.sh", "llama-server -m t -md d \\\n  --spec-draft-n-max 4 \\\n# --spec-draft-n-max 9 \\\n  --temp 0.1\n"))
    assert cut.num_speculative_tokens == 4 and cut.sampling["temperature"] == 0.8  # --temp 0.1 is another command to bash: the server default stands


# ============================================================================= the merge
def _params(command: str, **over: Any) -> dict[str, Any]:
    return {**{s.name: s.default_for(command) for s in for_command(command)}, "target": "t", "drafter": "self", "device": "cpu", **over}


def test_serving_config_fills_what_neither_flag_nor_probe_config_sets(tmp_path: Path) -> None:
    launch = _write(tmp_path, "launch.sh", "export LLAMA_ARG_TEMPERATURE=0.6\nllama-server -m t.gguf -md d.gguf --spec-draft-n-max 4 --top-k 20 --top-p 0.8\n")
    for command in ("check", "diagnose", "simulate"):  # sweep merges as diagnose
        opts = merge(command, _params(command, serving_config=[launch]), {"serving_config"})
        assert (opts.engine, opts.origins["engine"]) == ("llama.cpp", "launch.sh: llama-server"), command
        assert (opts.temperature, opts.origins["temperature"], opts.top_k, opts.origins["top_k"]) == (0.6, "launch.sh: LLAMA_ARG_TEMPERATURE", 20, "launch.sh: --top-k")
        assert isinstance(opts.top_k, int) and opts.sampling_origins()["target.top_p"] == "launch.sh"
        if command != "check":
            cfg = opts.diagnose_config()
            assert (cfg.engine, cfg.sampling.temperature, cfg.sampling_origins["target.temperature"]) == ("llama.cpp", 0.6, "launch.sh")
    # a probe config beats the serving config, a flag beats both; each named where it was set
    probe = _write(tmp_path, "probe.yaml", "temperature: 0.9\nengine: vllm\n")
    opts = merge("diagnose", _params("diagnose", serving_config=[launch], top_p=0.5), {"serving_config", "top_p"}, probe)
    assert (opts.engine, opts.origins["engine"]) == ("vllm", "probe.yaml: engine")
    assert (opts.temperature, opts.origins["temperature"]) == (0.9, "probe.yaml: temperature")
    assert (opts.top_p, opts.origins["top_p"], opts.top_k) == (0.5, "--top-p", 20)
    # min-p 0.05 is the server's default, which a request replaces: filled, never a conflict
    assert opts.declared == {"command line": {"top_p": 0.5}, "probe.yaml": {"temperature": 0.9}, "launch.sh": {"temperature": 0.6, "top_k": 20.0, "top_p": 0.8}}
    opts = merge("diagnose", _params("diagnose", serving_config=[launch], engine="sglang"), {"serving_config", "engine"})
    assert (opts.engine, opts.origins["engine"]) == ("sglang", "--engine")


def test_target_drafter_and_drafting_from_the_serving_config(tmp_path: Path) -> None:
    spec = _write(tmp_path, "serve.yaml", "model: org/t\nspeculative-config: {method: eagle3, model: org/h, num_speculative_tokens: 3, draft_sample_method: probabilistic}\n")
    opts = merge("diagnose", _params("diagnose", target=None, drafter=None, serving_config=[spec]), {"serving_config"})
    assert (opts.target, opts.drafter, opts.origins["drafter"]) == ("org/t", "eagle3:org/h", "serve.yaml: speculative-config.model")
    assert (opts.draft_sampling, opts.origins["draft_sampling"]) == ("probabilistic", "serve.yaml: speculative-config.draft_sample_method")
    assert opts.diagnose_config().drafting == "probabilistic"
    # vLLM's drafting says nothing of another engine's
    other = merge("diagnose", _params("diagnose", serving_config=[spec], engine="llama.cpp"), {"serving_config", "engine"})
    assert other.draft_sampling is None and other.diagnose_config().drafting == "greedy"
    typed = merge("check", _params("check", serving_config=[spec], draft_sampling="greedy"), {"serving_config", "draft_sampling"})
    assert (typed.draft_sampling, typed.origins["draft_sampling"]) == ("greedy", "--draft-sampling")


def test_serving_configs_that_disagree(tmp_path: Path) -> None:
    sg, vl = SAMPLES / "sglang-launch.yaml", SAMPLES / "vllm-speculative-config.json"
    with pytest.raises(ConfigError, match=r"the serving configs disagree on the engine \(sglang-launch\.yaml runs SGLang, vllm-speculative-config\.json runs vLLM\)"):
        merge("check", _params("check", serving_config=[sg, vl]), {"serving_config"})
    opts = merge("check", _params("check", serving_config=[sg, vl], engine="vllm"), {"serving_config", "engine"})
    # the first config that sets a sampling value gives it; each place's values are kept for SP019
    assert (opts.temperature, opts.origins["temperature"]) == (1.0, "sglang-launch.yaml: preferred-sampling-params.temperature")
    assert opts.declared == {"sglang-launch.yaml": {"temperature": 1.0, "top_p": 0.95}}
    a = _write(tmp_path, "a.json", '{"model": "d", "draft_sample_method": "greedy"}')
    b = _write(tmp_path, "b.json", '{"model": "d", "draft_sample_method": "probabilistic"}')
    with pytest.raises(ConfigError, match="the serving configs disagree on the drafting"):
        merge("check", _params("check", serving_config=[a, b]), {"serving_config"})


def test_a_bad_serving_config_value_is_one_line_on_every_command(tmp_path: Path) -> None:
    """Refused by the merge, before any model loads, in the words of the flag it is."""
    bad = _write(tmp_path, "launch.sh", "llama-server -m t.gguf -md d.gguf --spec-draft-p-min 2\n")
    for args in (["check", "t", "d"], ["diagnose", "t", "d"], ["simulate", "t", "d"], ["sweep", "t", "self:layers=1"]):
        res = runner.invoke(app, [*args, "--serving-config", str(bad)])
        assert res.exit_code == 2, res.output
        text = " ".join(res.output.split())
        assert "error: launch.sh: --spec-draft-p-min 2.0 is outside [0, 1]" in text and len(res.output.strip().splitlines()) == 1, res.output
    temp = _write(tmp_path, "temp.sh", "llama-server -m t.gguf --temp -1\n")
    res = runner.invoke(app, ["diagnose", "t", "d", "--serving-config", str(temp)])
    assert res.exit_code == 2 and "error: temp.sh: --temp -1.0 is negative" in " ".join(res.output.split())


def test_every_model_command_takes_serving_config() -> None:
    for command in ("check", "diagnose", "simulate", "sweep"):
        res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and "--serving-config" in res.output, command


def test_check_with_a_llama_server_script(tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    """The engine, the models and the sampling a launch script starts llama-server with,
    checked without a flag; the result records the engine and names the script."""
    script = _write(
        tmp_path,
        "launch.sh",
        f"export LLAMA_ARG_TEMPERATURE=0.7\nexec llama-server -m {tiny_pair['target']} -md {tiny_pair['twin']} --spec-draft-n-max 4 --spec-draft-p-min 0.6 --top-p 0.9\n",
    )
    out = tmp_path / "c.json"
    res = runner.invoke(app, ["check", "--serving-config", str(script), "--json", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["config"]["engine"] == "llama.cpp" and data["config"]["draft_sampling"] == "greedy"
    assert data["config"]["target"] == str(tiny_pair["target"]) and data["config"]["drafter"] == str(tiny_pair["twin"])
    assert data["sampling"]["target"]["temperature"] == 0.7 and data["sampling"]["sources"]["target.temperature"] == "launch.sh"
    text = " ".join(res.output.split())
    assert "serving config launch.sh (llama.cpp)" in text and "K = 4 (--spec-draft-n-max)" in text


# ============================================================================= Hugging Face repo ids, offline
def _fake_hub(root: Path, repo: str, files: dict[str, bytes | Path], rev: str = "0123abcd" * 5) -> Path:
    """A hub cache as huggingface_hub writes it: blobs by hash, the snapshot's files
    symlinked into them, refs/main naming the revision."""
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    for i, (name, content) in enumerate(files.items()):
        data = content.read_bytes() if isinstance(content, Path) else content
        blob = base / "blobs" / f"{i:040x}"
        blob.write_bytes(data)
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, (snap / name).parent), snap / name)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    return snap


def test_repo_id_resolves_from_the_cache_each_way_it_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.models import loader

    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    files = {"config.json": b"{}", "tokenizer.json": b"{}"}
    # ~/.cache/huggingface/hub
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    snap = _fake_hub(tmp_path / "home" / ".cache" / "huggingface" / "hub", "org/tiny", files)
    r = loader.resolve("org/tiny")
    assert (r.kind, r.path, r.name) == ("checkpoint", snap, "tiny") and (r.path / "config.json").resolve().parent.name == "blobs"
    # HF_HOME/hub, then HF_HUB_CACHE over it
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    with pytest.raises(ModelLoadError, match="does not exist, and the Hugging Face cache .*hfhome/hub holds no models--org--tiny"):
        loader.resolve("org/tiny")
    snap = _fake_hub(tmp_path / "hfhome" / "hub", "org/tiny", files, rev="f" * 40)
    assert loader.resolve("org/tiny").path == snap
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    snap = _fake_hub(tmp_path / "hubcache", "org/tiny", files, rev="e" * 40)
    assert loader.resolve("org/tiny").path == snap
    loader.check_paths("org/tiny", "org/tiny")
    assert loader.local_spec("org/tiny") == str(snap) and loader.local_spec("self:layers=2") == "self:layers=2"
    assert loader.local_spec("eagle3:org/tiny") == f"eagle3:{snap}" and loader.local_spec("org/absent") == "org/absent"
    # a head is read from its folder: diagnose says which one
    with pytest.raises(ModelLoadError) as head:
        loader.check_paths("org/tiny", "eagle3:org/tiny")
    assert head.value.one_line() == f"drafter eagle3:org/tiny is a Hugging Face repo id; a head is read from its folder — pass eagle3:{snap} (its cached snapshot)"
    with pytest.raises(ModelLoadError, match="org/absent does not exist, and the Hugging Face cache"):
        loader.check_paths("org/absent", None)


def test_refs_main_names_the_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.models import loader

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    old = _fake_hub(tmp_path, "org/m", {"config.json": b"{}"}, rev="a" * 40)
    new = _fake_hub(tmp_path, "org/m", {"config.json": b"{}"}, rev="b" * 40)  # refs/main now names b…
    assert loader.hub_snapshot("org/m") == new != old
    (tmp_path / "models--org--m" / "refs" / "main").write_text("c" * 40)  # a revision not downloaded
    assert loader.hub_snapshot("org/m") is None
    (tmp_path / "models--org--m" / "refs" / "main").unlink()  # two snapshots and no ref: which is unknown
    assert loader.hub_snapshot("org/m") is None
    gguf = _fake_hub(tmp_path, "org/g", {"model-Q4_K_M.gguf": b"GGUF" + bytes(20)})
    r = loader.resolve("org/g")
    assert (r.kind, r.path, r.name) == ("gguf", gguf / "model-Q4_K_M.gguf", "model-Q4_K_M")


def test_check_a_pair_named_by_repo_ids(tiny_pair: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TARGET and DRAFTER as repo ids, and a serving config's "model": read from the
    cache's symlinked snapshot, offline."""
    hub = tmp_path / "hub"
    for repo, key in (("org/tiny-target", "target"), ("org/tiny-draft", "twin")):
        _fake_hub(hub, repo, {p.name: p for p in tiny_pair[key].iterdir() if p.is_file()})
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    res = runner.invoke(app, ["check", "org/tiny-target", "org/tiny-draft", "--json", str(tmp_path / "a.json")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "a.json").read_text())
    assert (data["target"]["spec"], data["target"]["name"], data["drafter"]["spec"]) == ("org/tiny-target", "tiny-target", "org/tiny-draft")
    spec = _write(tmp_path, "spec.json", json.dumps({"model": "org/tiny-draft", "num_speculative_tokens": 3}))
    res = runner.invoke(app, ["check", "org/tiny-target", "--serving-config", str(spec), "--json", str(tmp_path / "b.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "b.json").read_text())["drafter"]["spec"] == "org/tiny-draft"


# ============================================================================= the context the engine serves
@pytest.mark.parametrize(
    ("name", "text", "length", "where"),
    [
        ("serve.yaml", "model: t\nmax-model-len: 32k\nspeculative-config: {model: d, num_speculative_tokens: 2, max_model_len: 99}\n", 32000, "serve.yaml: max-model-len"),
        ("vllm.sh", "vllm serve t --max-model-len 16K --spec-model d --spec-tokens 2\n", 16384, "vllm.sh: --max-model-len"),
        ("sg.sh", "python -m sglang.launch_server --model-path t --speculative-algorithm STANDALONE --speculative-draft-model-path d --context-length 4096\n", 4096, "sg.sh: --context-length"),
        ("llama.sh", "LLAMA_ARG_CTX_SIZE=8192 llama-server -m t -md d\n", 8192, "llama.sh: LLAMA_ARG_CTX_SIZE"),
        ("trt.yaml", "max_seq_len: 2048\nspeculative_config: {decoding_type: DraftTarget, max_draft_len: 2, speculative_model: d}\n", 2048, "trt.yaml: max_seq_len"),
    ],
)
def test_the_context_each_engine_serves(tmp_path: Path, name: str, text: str, length: int, where: str) -> None:
    sv = read_serving_config(_write(tmp_path, name, text))
    assert (sv.context_length, sv.where("context_length")) == (length, where)
    assert read_serving_config(_write(tmp_path, "auto.sh", "llama-server -m t -md d -c 0\n")).context_length is None  # 0: the model's own
    _refused(_write(tmp_path, "neg.sh", "llama-server -m t -md d -c -5\n"), "neg.sh: -c -5 must be at least 1")


def test_check_holds_the_drafter_to_the_served_context(tiny_pair: dict[str, Path], tmp_path: Path) -> None:
    spec = _write(tmp_path, "serve.yaml", f"model: {tiny_pair['target']}\nmax-model-len: 2048\nspeculative-config: {{model: {tiny_pair['twin']}, num_speculative_tokens: 2}}\n")
    res = runner.invoke(app, ["check", "--serving-config", str(spec), "--json", str(tmp_path / "a.json")])
    data = json.loads((tmp_path / "a.json").read_text())
    assert data["metrics"]["context_length_serving_tokens"] == 2048, res.output
    assert any(f["rule_id"] == "SP011" for f in data["findings"]), res.output


def test_trtllm_relaxed_acceptance_is_flagged_in_check(tmp_path: Path) -> None:
    """TensorRT-LLM's relaxed acceptance for thinking models (MTPDecodingConfig's
    use_relaxed_acceptance_for_thinking, relaxed_topk, relaxed_delta): check raises SP037;
    the strict config does not."""
    from types import SimpleNamespace

    from specprobe.cli.check_cmd import relaxed_acceptance
    from specprobe.judge.rules import load_table

    relaxed = read_serving_config(_write(tmp_path, "trt.yaml", "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 3\n  use_relaxed_acceptance_for_thinking: true\n  relaxed_topk: 10\n  relaxed_delta: 0.6\n"))
    strict = read_serving_config(_write(tmp_path, "strict.yaml", "speculative_config:\n  decoding_type: MTP\n  num_nextn_predict_layers: 3\n"))
    table = load_table()
    reports = {}
    for sv, fires in ((relaxed, True), (strict, False)):
        report = reports[fires] = SimpleNamespace(metrics={}, evidence={})
        relaxed_acceptance(report, [sv])
        findings, _ = table.evaluate(report.metrics, kind="mtp", families=("alignment",), evidence=report.evidence)
        assert ("SP037" in {f.rule_id for f in findings}) is fires
    assert reports[True].evidence["relaxed_acceptance_served"] == ["trt.yaml: use_relaxed_acceptance_for_thinking true, relaxed_topk 10, relaxed_delta 0.6"]
    assert "relaxed_acceptance_served" not in reports[False].evidence
