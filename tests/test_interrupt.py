"""Ctrl-C and SIGTERM during diagnose/simulate: the first press writes what was computed
before anything else runs, the run then finishes; a second press skips what is left
(the cost measurement) and still writes. Presses are injected where the real ones land
(a scoring batch, the cost measurement, a K of the simulate loop); one test sends real
signals to a real process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.interrupts import shielded, terminate_as_interrupt

runner = CliRunner()


def _diagnose_args(tiny_pair: dict[str, Path], prompts: Path, out: Path, *extra: str) -> list[str]:
    return [
        "diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "8",
        "--batch-size", "2", "--temperature", "1", "--json", str(out / "r.json"), "--csv", str(out / "csv"), *extra,
    ]


@pytest.fixture
def prompts(tmp_path: Path) -> Path:
    from tests.helpers.tiny import prompts_file

    return prompts_file(tmp_path / "p.jsonl")


def _on_timing(monkeypatch: pytest.MonkeyPatch, hook: Any) -> None:
    """Run `hook` in place of the cost measurement (the call that times something: it
    gets the timing settings); the untimed cost block of a stopped run stays real."""
    import inspect

    import specprobe.probe.diagnose as diagnose

    real = diagnose.cost_block
    # where cost_block takes timing settings, a call without them times nothing
    untimed_calls = "batch_sizes" in inspect.signature(real).parameters

    def cost(*a: Any, **kw: Any) -> Any:
        return real(*a, **kw) if untimed_calls and not kw else hook(real, *a, **kw)

    monkeypatch.setattr(diagnose, "cost_block", cost)


def _press_in_second_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    import specprobe.probe.scoring as scoring

    real = scoring.score_batch
    calls = {"n": 0}

    def batch(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt  # the first Ctrl-C, while scoring
        return real(*a, **kw)

    monkeypatch.setattr(scoring, "score_batch", batch)


def test_second_ctrl_c_during_the_cost_measurement_still_writes(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    _press_in_second_batch(monkeypatch)
    seen: dict[str, Any] = {}

    def cost(real: Any, *a: Any, **kw: Any) -> Any:
        # what was computed is on disk before the cost measurement starts
        seen["json_before_cost"] = json.loads((tmp_path / "r.json").read_text())
        raise KeyboardInterrupt  # the second Ctrl-C

    _on_timing(monkeypatch, cost)
    res = runner.invoke(app, _diagnose_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code == 130, res.output
    text = " ".join(res.output.split())
    assert "finishing, press Ctrl-C again to stop without the cost measurement" in text
    assert "stopped without the cost measurement" in text
    early = seen["json_before_cost"]
    assert early["interrupted"] and early["scored"] and early["metrics"]["num_prompts"] == 2
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["interrupted"] and final["metrics"]["num_prompts"] == 2 and not final["cost"]["measured"]
    assert (tmp_path / "csv" / "summary.csv").is_file()
    assert "cost ratio not measured" in text


def test_one_ctrl_c_finishes_with_the_cost_measurement(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    _press_in_second_batch(monkeypatch)
    calls: list[bool] = []

    def cost(real: Any, *a: Any, **kw: Any) -> Any:
        calls.append((tmp_path / "r.json").is_file())
        return real(*a, **kw)

    _on_timing(monkeypatch, cost)
    res = runner.invoke(app, _diagnose_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code == 130, res.output
    assert calls == [True]  # measured once, after the partial result was written
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["interrupted"] and final["cost"]["measured"] and final["metrics"]["num_prompts"] == 2


def test_first_ctrl_c_in_the_cost_measurement_keeps_every_score(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    def cost(real: Any, *a: Any, **kw: Any) -> Any:
        raise KeyboardInterrupt

    _on_timing(monkeypatch, cost)
    res = runner.invoke(app, _diagnose_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code == 130, res.output
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["interrupted"] and final["metrics"]["num_prompts"] == 6 and not final["cost"]["measured"]


def test_ctrl_c_in_the_simulate_loop_writes_what_was_measured(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    import specprobe.simulate.pipeline as pipeline

    real = pipeline.speculate
    calls = {"n": 0}

    def flaky(*a: Any, **kw: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 3:  # baseline and K=1 done; Ctrl-C during K=2
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "speculate", flaky)
    res = runner.invoke(app, [
        "simulate", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "6", "--k", "1,2",
        "--temperature", "0", "--cost-ratio", "0.2", "--json", str(tmp_path / "s.json"),
    ])
    assert res.exit_code == 130, res.output
    r = json.loads((tmp_path / "s.json").read_text())
    assert r["command"] == "simulate" and r["interrupted"] and [row["k"] for row in r["measured"]["k_table"]] == [1]


def test_ctrl_c_in_the_simulate_estimate_writes_a_simulate_result_first(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    _press_in_second_batch(monkeypatch)
    seen: list[str] = []

    def cost(real: Any, *a: Any, **kw: Any) -> Any:
        seen.append(json.loads((tmp_path / "s.json").read_text())["command"])
        raise KeyboardInterrupt

    _on_timing(monkeypatch, cost)
    res = runner.invoke(app, [
        "simulate", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "6", "--k", "1",
        "--batch-size", "2", "--temperature", "0", "--json", str(tmp_path / "s.json"),
    ])
    assert res.exit_code == 130, res.output
    assert seen == ["simulate"]
    r = json.loads((tmp_path / "s.json").read_text())
    assert r["interrupted"] and r["measured"] is None and r["metrics"]["num_prompts"] == 2


# ----------------------------------------------------------------------------- the signal plumbing
def test_shielded_holds_a_press_until_the_body_is_done() -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), shielded():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        done.append("body ran to its end")
    assert done == ["body ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_sigterm_raises_keyboard_interrupt_inside_the_guard() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) == before


# A real process, real signals: SIGTERM while scoring (the first "press"), SIGINT during
# the cost measurement (the second). The hooks only decide *when* the signals are sent.
_SCRIPT = """
import os, signal, sys, time
import specprobe.probe.diagnose as diagnose, specprobe.probe.scoring as scoring
real = scoring.score_batch
n = [0]
def batch(*a, **kw):
    n[0] += 1
    if n[0] == 2:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return real(*a, **kw)
import inspect
real_cost = diagnose.cost_block
def cost(*a, **kw):
    if not kw and "batch_sizes" in inspect.signature(real_cost).parameters:  # the untimed block of a stopped run
        return real_cost(*a, **kw)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    raise SystemExit("the second signal did not stop the cost measurement")
scoring.score_batch = batch
diagnose.cost_block = cost
from specprobe.cli.main import run
sys.argv = ["specprobe", *sys.argv[1:]]
run()
"""


def test_real_sigterm_then_sigint(tiny_pair, prompts, tmp_path) -> None:
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *_diagnose_args(tiny_pair, prompts, tmp_path)[0:]], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 130, proc.stderr
    stderr = " ".join(proc.stderr.split())
    assert "finishing, press Ctrl-C again to stop without the cost measurement" in stderr
    final = json.loads((tmp_path / "r.json").read_text())
    assert final["interrupted"] and final["metrics"]["num_prompts"] == 2
