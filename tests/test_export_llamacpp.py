"""`specprobe export --engine llama.cpp --synthetic` run for real: llama-server started
with the exported flags accepts drafts at the exported rates, and its own count of
tokens per verify step (the `mean len` of its per-request log line: 1 + accepted ÷
verify steps) comes out within 5 % of 1 + Σ rates, the result's τ at that K.

The synthetic verdicts are seeded by the request's seed (tools/server/server-context.cpp
seeds the slot's generator from it), so the count is the same run after run. Skipped
without the built server or the SmolLM2 package."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import stop, wait_healthy
from tests.helpers.llamacpp import free_port, http_json, worker_threads, write_self_draft_gguf
from tests.test_export import _result
from tests.test_llamacpp import BINARY, needs_server

pytestmark = needs_server

RATES = [0.6, 0.4, 0.25, 0.1]  # the depth curve of the result under test: τ(4) = 2.35
N_PREDICT = 1500
MEAN_LEN = re.compile(r"draft acceptance = [0-9.]+ \(\s*(\d+) accepted /\s*(\d+) generated\), mean len =\s*([0-9.]+)")


def _args(text: str) -> list[str]:
    words: list[str] = []
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            flag, _, value = line.partition(" ")
            words += [flag] + ([value] if value else [])
    return words


def test_llama_server_runs_the_exported_synthetic_rates(tmp_path: Path) -> None:
    import json as _json

    from specprobe.export.serving import export_config
    from specprobe.models.loader import builtin_gguf_path
    from specprobe.result import Result

    assert BINARY is not None
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / "smollm2-first1.gguf", 1)  # any drafter: the rates decide
    r, src = _result(tmp_path, kind="independent", spec=str(draft), engine="llama.cpp")
    d: dict[str, Any] = _json.loads(r.to_json())
    d["depth"] = {**d["depth"], "cumulative": RATES, "conditional": [RATES[0]] + [RATES[i] / RATES[i - 1] for i in range(1, 4)]}
    d["config"]["target"] = str(target)
    d["target"] = {**d["target"], "spec": str(target)}
    r = Result.model_validate(d)
    src.write_text(r.to_json(), encoding="utf-8")

    ex = export_config(r, src, "llama.cpp", k=4, synthetic=True)
    expected = ex.plan.tau_synthetic
    assert expected == pytest.approx(2.35)
    args = _args(ex.text)
    assert args[args.index("--spec-synth-rates") + 1] == "0.6,0.4,0.25,0.1"

    port = free_port()
    log = tmp_path / "server.log"
    cmd = ["nice", str(BINARY), *args, "--host", "127.0.0.1", "--port", str(port), "-np", "1", "-c", "4096", *_threads(), "--no-warmup", "--log-colors", "off"]
    proc = _start(cmd, log, port)
    try:
        body = {"prompt": "Write a long story about a lighthouse keeper.", "n_predict": N_PREDICT, "ignore_eos": True, "temperature": 0.0, "top_k": 1, "seed": 7, "cache_prompt": False}
        out = http_json(f"http://127.0.0.1:{port}/completion", body, timeout=900)
    finally:
        stop(proc, 30)
    text = log.read_text(errors="replace")
    assert "synthetic acceptance: n_max = 4" in text, text[-2000:]  # the server took the rates
    found = MEAN_LEN.findall(text)
    assert found, text[-2000:]
    accepted, drafted, mean_len = int(found[-1][0]), int(found[-1][1]), float(found[-1][2])
    assert out["timings"]["draft_n_accepted"] == accepted and drafted > 0
    print(f"llama-server synthetic: mean len {mean_len:.2f} tokens per verify step against 1 + Σ rates = {expected:.2f} ({accepted} accepted of {drafted} drafted, {out['timings']['predicted_n']} tokens)")
    assert mean_len == pytest.approx(expected, rel=0.05)


def _threads() -> list[str]:
    """How many threads and how they wait, for this machine (not part of the export): a
    pytest-xdist worker's share of the cores, waiting without spinning."""
    n = str(worker_threads())
    return ["-t", n, "-tb", n, "--poll", "0"]


def _start(cmd: list[str], log: Path, port: int) -> subprocess.Popen:  # type: ignore[type-arg]
    """llama-server from `cmd` (its log in `log`), healthy on `port` within 300 s."""
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, start_new_session=True)  # noqa: S603
    try:
        wait_healthy(proc, log, "llama-server", lambda: http_json(f"http://127.0.0.1:{port}/health", timeout=5).get("status") == "ok", 300, 0.5)
    except BaseException:
        stop(proc, 30)
        raise
    return proc


def test_llama_server_serves_the_exported_args_of_a_builtin_target_with_speculation(tmp_path: Path) -> None:
    """`export --engine llama.cpp` of a result whose target is the built-in `smollm2` and
    whose drafter is a GGUF: the args file names the built-in's GGUF (-m) and the drafter's
    (-md), nothing to run first, and llama-server started with those args as written
    (plus where to listen) drafts K at a time."""
    import json as _json

    from typer.testing import CliRunner

    from specprobe.cli.main import app
    from specprobe.models.loader import builtin_gguf_path
    from specprobe.result import Result

    assert BINARY is not None
    target = builtin_gguf_path("smollm2")
    draft = write_self_draft_gguf(target, tmp_path / "smollm2-first24.gguf", 24)  # confident enough to draft past the default --spec-draft-p-min
    r, src = _result(tmp_path, kind="independent", spec=str(draft), engine="llama.cpp")
    d: dict[str, Any] = _json.loads(r.to_json())
    d["config"]["target"] = "smollm2"
    d["target"] = {**d["target"], "spec": "smollm2"}
    src.write_text(Result.model_validate(d).to_json(), encoding="utf-8")

    out = tmp_path / "server.args"
    res = CliRunner().invoke(app, ["export", str(src), "--engine", "llama.cpp", "--k", "3", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "run first" not in res.output
    args = _args(out.read_text(encoding="utf-8"))
    assert args[args.index("-m") + 1] == str(target) and args[args.index("-md") + 1] == str(draft)
    assert args[args.index("--spec-draft-n-max") + 1] == "3"

    port = free_port()
    log = tmp_path / "server.log"
    cmd = ["nice", str(BINARY), *args, "--host", "127.0.0.1", "--port", str(port), "--metrics", "-np", "1", "-c", "2048", *_threads(), "--no-warmup", "--log-colors", "off"]
    proc = _start(cmd, log, port)
    try:
        body = {"prompt": "Write a short story about a lighthouse keeper.", "n_predict": 64, "ignore_eos": True, "temperature": 0.0, "top_k": 1, "seed": 7, "cache_prompt": False}
        timings = http_json(f"http://127.0.0.1:{port}/completion", body, timeout=600)["timings"]
    finally:
        stop(proc, 30)
    print(f"llama-server from the exported args: {timings.get('draft_n')} drafted, {timings.get('draft_n_accepted')} accepted over {timings.get('predicted_n')} tokens")
    assert timings.get("draft_n", 0) > 0, log.read_text(errors="replace")[-3000:]  # it served with speculative decoding
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
