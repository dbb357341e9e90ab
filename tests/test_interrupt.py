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


# ----------------------------------------------------------------------------- Ctrl-C while references are generated
def _press_after_tokens(monkeypatch: pytest.MonkeyPatch, tokens: int) -> None:
    """Ctrl-C during generate(), once `tokens` tokens of the batch were sampled (0: in the
    first forward pass, before any)."""
    import specprobe.probe.references as references

    real = references._Reached.__call__
    state = {"steps": 0, "pressed": False}

    def step(self: Any, input_ids: Any, scores: Any, **kw: Any) -> Any:
        if not state["pressed"] and state["steps"] == tokens:
            state["pressed"] = True
            raise KeyboardInterrupt
        state["steps"] += 1
        return real(self, input_ids, scores, **kw)

    monkeypatch.setattr(references._Reached, "__call__", step)


def _one_batch_args(tiny_pair: dict[str, Path], prompts: Path, out: Path) -> list[str]:
    return [
        "diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts), "--max-new-tokens", "8", "--batch-size", "6",
        "--temperature", "1", "--cost-ratio", "0.1", "--verify-factor", "1", "--json", str(out / "r.json"),
    ]


def _cache_lines(cache: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted((cache / "references").glob("*.jsonl")) for line in f.read_text().splitlines() if line.strip()]


def test_ctrl_c_inside_a_batch_keeps_what_it_generated(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(cache))
    # 6 prompts in one batch, Ctrl-C after its 3rd token: nothing finished a batch, yet
    # every prompt has 3 tokens (or fewer, ending in EOS) to score
    _press_after_tokens(monkeypatch, 3)
    res = runner.invoke(app, _one_batch_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code == 130, res.output
    assert "cut short where Ctrl-C stopped them" in " ".join(res.output.split())
    first = json.loads((tmp_path / "r.json").read_text())
    assert first["interrupted"] and first["metrics"]["num_prompts"] == 6 and first["metrics"]["num_positions"] > 0
    assert first["verdict"] != "no positions were scored — nothing to judge"
    (partial,) = _cache_lines(cache)
    assert partial["partial"] == 0 and "batch" not in partial and len(partial["finished"]) == 6
    assert all(len(c) <= 3 for c in partial["continuations"]) and any(partial["continuations"])

    # cut sooner in the same batch: what the earlier run reached is kept
    _press_after_tokens(monkeypatch, 1)
    res = runner.invoke(app, _one_batch_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code == 130, res.output
    again = json.loads((tmp_path / "r.json").read_text())
    assert again["metrics"]["num_positions"] == first["metrics"]["num_positions"]

    # a run that is not interrupted generates the batch whole: the same seeded tokens
    monkeypatch.undo()
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(cache))
    res = runner.invoke(app, _one_batch_args(tiny_pair, prompts, tmp_path))
    assert res.exit_code in (0, 1), res.output
    full = next(line for line in _cache_lines(cache) if "batch" in line)
    for cut, whole in zip(partial["continuations"], full["continuations"], strict=True):
        assert whole[: len(cut)] == cut
    done = json.loads((tmp_path / "r.json").read_text())
    assert not done["interrupted"] and done["metrics"]["num_positions"] > first["metrics"]["num_positions"]


def test_ctrl_c_before_any_reference_token_judges_nothing(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    _press_after_tokens(monkeypatch, 0)
    res = runner.invoke(app, [*_one_batch_args(tiny_pair, prompts, tmp_path), "--csv", str(tmp_path / "csv")], env={"COLUMNS": "100"})
    assert res.exit_code == 130, res.output
    text = " ".join(res.output.split())
    assert "no reference token was generated, so nothing is scored or priced" in text and "finishing, press Ctrl-C again" not in text
    assert "NO POSITIONS WERE SCORED — NOTHING TO JUDGE" in text and "0 positions scored" in text
    assert "K=None" not in text and "τ —" not in text
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["interrupted"] and r["metrics"]["num_positions"] == 0
    assert r["verdict"] == "no positions were scored — nothing to judge"
    # only the alignment rules judged the pair; the cost ratio alone set no headline
    assert all(f["rule_id"].startswith("SP0") for f in r["findings"])
    assert all(e["status"] != "fail" for e in r["evaluations"] if not e["rule_id"].startswith("SP0"))
    # `report` re-renders it the same way
    res = runner.invoke(app, ["report", str(tmp_path / "r.json"), "--markdown", str(tmp_path / "r.md"), "--html", str(tmp_path / "r.html")])
    assert "nothing to judge" in " ".join(res.output.split()) and "from SP3" not in res.output
    from specprobe.report.fmt import headline_source
    from specprobe.result import Result

    assert headline_source(Result.model_validate(r)) is None  # no finding gave that verdict: none is named as its source
    assert "nothing to judge" in (tmp_path / "r.md").read_text() and "nothing to judge" in (tmp_path / "r.html").read_text()
