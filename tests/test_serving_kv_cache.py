"""The KV-cache dtype a serving config runs: vLLM's `--kv-cache-dtype` (the target's) and
`speculative_config.kv_cache_dtype` (the draft model's, inheriting the target's when
unset), SGLang's `--kv-cache-dtype fp8_e4m3` and `--speculative-draft-kv-cache-dtype`,
as `--kv-cache-dtype` / `--draft-kv-cache-dtype` — filled where neither a flag nor the
probe config sets them, named where they were written, and a dtype specprobe does not
simulate refused in one line unless a flag says what to score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError
from specprobe.settings.model import for_command
from specprobe.settings.options import merge
from specprobe.settings.serving import read_serving_config

runner = CliRunner()


def _write(folder: Path, name: str, text: str) -> Path:
    p = folder / name
    p.write_text(text, encoding="utf-8")
    return p


def _params(command: str, **over: Any) -> dict[str, Any]:
    return {**{s.name: s.default_for(command) for s in for_command(command)}, "target": "t", "drafter": "d", "device": "cpu", **over}


def _kv(path: Path, command: str = "diagnose", given: set[str] | None = None, **over: Any) -> tuple[Any, Any, str | None, str | None]:
    opts = merge(command, _params(command, serving_config=[path], **over), {"serving_config", *(given or set())})
    return opts.values.get("kv_cache_dtype"), opts.values.get("draft_kv_cache_dtype"), opts.origins.get("kv_cache_dtype"), opts.origins.get("draft_kv_cache_dtype")


def test_vllm_spellings(tmp_path: Path) -> None:
    line = _write(tmp_path, "serve.sh", "vllm serve org/t --kv-cache-dtype fp8 --speculative-config.model org/d --speculative-config.num_speculative_tokens 3\n")
    assert _kv(line) == ("fp8", None, "serve.sh: --kv-cache-dtype", "default")  # the drafter inherits it
    sv = read_serving_config(line)
    assert (sv.kv_cache_dtype, sv.draft_kv_cache_dtype) == ("fp8", None)
    # the draft model's own, as a JSON speculative config and as the dotted flag
    both = _write(tmp_path, "both.sh", 'vllm serve org/t --kv-cache-dtype fp8_e4m3 --speculative-config \'{"model": "org/d", "num_speculative_tokens": 3, "kv_cache_dtype": "auto"}\'\n')
    assert _kv(both) == ("fp8", "auto", "both.sh: --kv-cache-dtype", "both.sh: --speculative-config.kv_cache_dtype")
    assert "kv_cache_dtype" not in read_serving_config(both).extra  # read, not an unknown knob
    dotted = _write(tmp_path, "dotted.sh", "vllm serve org/t --speculative-config.model org/d --speculative-config.kv_cache_dtype fp8\n")
    assert _kv(dotted) == (None, "fp8", "default", "dotted.sh: --speculative-config.kv_cache_dtype")
    yaml = _write(tmp_path, "serve.yaml", "model: org/t\nkv-cache-dtype: bfloat16\nspeculative-config:\n  model: org/d\n  num_speculative_tokens: 3\n  kv_cache_dtype: fp8\n")
    assert _kv(yaml) == ("auto", "fp8", "serve.yaml: kv-cache-dtype", "serve.yaml: speculative-config.kv_cache_dtype")
    # a bare --speculative-config JSON names only the drafter's
    spec = _write(tmp_path, "spec.json", '{"model": "org/d", "num_speculative_tokens": 3, "kv_cache_dtype": "fp8"}')
    assert _kv(spec) == (None, "fp8", "default", "spec.json: kv_cache_dtype")


def test_sglang_spellings(tmp_path: Path) -> None:
    line = _write(tmp_path, "launch.sh", "python -m sglang.launch_server --model-path org/t --speculative-algorithm STANDALONE --speculative-draft-model-path org/d --speculative-num-steps 3 --kv-cache-dtype fp8_e4m3\n")
    assert _kv(line) == ("fp8", None, "launch.sh: --kv-cache-dtype", "default")
    own = _write(tmp_path, "own.yaml", "model-path: org/t\nspeculative-algorithm: STANDALONE\nspeculative-draft-model-path: org/d\nkv-cache-dtype: bf16\nspeculative-draft-kv-cache-dtype: fp8_e4m3\n")
    assert _kv(own) == ("auto", "fp8", "own.yaml: kv-cache-dtype", "own.yaml: speculative-draft-kv-cache-dtype")


def test_flags_and_probe_config_win(tmp_path: Path) -> None:
    line = _write(tmp_path, "serve.sh", "vllm serve org/t --kv-cache-dtype fp8 --speculative-config.model org/d --speculative-config.kv_cache_dtype fp8\n")
    assert _kv(line, given={"kv_cache_dtype"}, kv_cache_dtype="auto") == ("auto", "fp8", "--kv-cache-dtype", "serve.sh: --speculative-config.kv_cache_dtype")
    probe = _write(tmp_path, "probe.yaml", "draft_kv_cache_dtype: auto\n")
    opts = merge("simulate", _params("simulate", serving_config=[line]), {"serving_config"}, probe)
    assert (opts.values["kv_cache_dtype"], opts.values["draft_kv_cache_dtype"], opts.origins["draft_kv_cache_dtype"]) == ("fp8", "auto", "probe.yaml: draft_kv_cache_dtype")
    # what the run is given: both sides' caches
    assert opts.simulate_config().diagnose.kv_fp8 == (True, False)


def test_a_kv_cache_dtype_not_simulated_is_one_line(tmp_path: Path) -> None:
    e5m2 = _write(tmp_path, "launch.sh", "python -m sglang.launch_server --model-path t --speculative-algorithm STANDALONE --speculative-draft-model-path d --kv-cache-dtype fp8_e5m2\n")
    with pytest.raises(ConfigError) as e:
        merge("diagnose", _params("diagnose", serving_config=[e5m2]), {"serving_config"})
    assert "launch.sh: --kv-cache-dtype 'fp8_e5m2' is a KV-cache dtype specprobe does not simulate" in e.value.one_line()
    # a flag that says what to score replaces it, so the file is no obstacle
    assert _kv(e5m2, given={"kv_cache_dtype"}, kv_cache_dtype="fp8")[0] == "fp8"
    res = runner.invoke(app, ["simulate", "t", "d", "--serving-config", str(e5m2)])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1, res.output
    assert " ".join(res.output.split()).startswith("error: launch.sh: --kv-cache-dtype 'fp8_e5m2'")
