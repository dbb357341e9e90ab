"""One options object, one merge: every probe-config key is exactly one flag, flags
override the file, and every error names the flag typed or the key and its file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError
from specprobe.settings.config import K_LIMIT, OutputsConfig, ProbeConfig
from specprobe.settings.model import SETTINGS
from specprobe.settings.options import merge

runner = CliRunner()
DATA = Path(__file__).parent / "data"
COMMANDS = ("check", "diagnose", "simulate", "compare")
# parameters of those commands that are not probe-config keys, and why
NOT_KEYS = {
    "config": "the file itself",
    "candidate": "compare's CANDIDATE.json: a file's outputs.json",
    "allow_target_change": "compare-only escape hatch",
    "allow_prompt_change": "compare-only escape hatch",
    "allow_procedure_change": "compare-only escape hatch",
}


def _params(command: str) -> dict[str, Any]:
    group: Any = typer.main.get_command(app)  # typer's own click-like command objects
    return {p.name: p for p in group.commands[command].params if p.name and p.name != "help"}


def _spelling(p: Any) -> set[str]:
    return {p.metavar} if p.param_type_name == "argument" else set(p.opts)


def test_every_key_is_exactly_one_flag_of_every_command_that_has_it() -> None:
    file_keys = {n for n in ProbeConfig.model_fields if n not in ("source", "outputs")}
    file_keys |= {f"outputs.{'json' if n == 'json_path' else n}" for n in OutputsConfig.model_fields}
    keyed = [s for s in SETTINGS if s.file_key is not None]
    assert {s.file_key for s in keyed} == file_keys, "a probe-config key without a flag, or a flag without a key"
    assert len({s.name for s in SETTINGS}) == len(SETTINGS) and len({s.flag for s in SETTINGS}) == len(SETTINGS)
    for command in COMMANDS:
        params = _params(command)
        mine = {s.name: s for s in keyed if command in s.commands}
        for name, p in params.items():
            if name in NOT_KEYS:
                continue
            assert name in mine, f"{command} {sorted(p.opts)} has no probe-config key"
            assert mine[name].flag in _spelling(p), f"{command}: key {mine[name].file_key} is spelled {_spelling(p)}, table says {mine[name].flag}"
        for name, key in mine.items():
            assert name in params, f"table says {command} has {key.flag}, it does not"
    for command in ("check", "diagnose", "simulate"):
        assert "config" in _params(command), f"{command} runs models and must take --config"


def _config(tmp_path: Path, text: str, name: str = "probe.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_flags_override_the_file_and_every_value_says_where_it_came_from(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "target: t\ndrafter: d\ntemperature: 0.5\nmin_p: 0.05\ndraft_top_k: 7\ndraft_top_p: 0.8\nfail_on: never\nk: [1, 3]\nmax_new_tokens: 9\n")
    params = {"target": None, "drafter": None, "temperature": 0.9, "min_p": None, "draft_top_k": None, "draft_top_p": None, "fail_on": "error", "max_new_tokens": 64, "k_max": 8, "k": "1,2,4"}
    o = merge("diagnose", params, {"temperature"}, cfg)
    assert o.temperature == 0.9 and o.where("temperature") == "--temperature"  # the flag beat the file
    assert (o.min_p, o.draft_top_k, o.draft_top_p, o.fail_on, o.max_new_tokens) == (0.05, 7, 0.8, "never", 9)
    assert o.where("min_p") == "probe.yaml: min_p" and o.where("fail_on") == "probe.yaml: fail_on"
    assert o.k_max == 3 and o.where("k_max") == "probe.yaml: k"  # diagnose tabulates up to the largest K listed
    assert o.where("max_new_tokens") == "probe.yaml: max_new_tokens"
    s = merge("simulate", params, set(), cfg)
    assert s.k == [1, 3] and s.k_max == 8  # simulate measures the listed K; its table runs to the largest
    assert s.simulate_config().ks == [1, 3]
    assert s.diagnose_config().sampling.draft_top_k == 7  # the keys check's old merge dropped now arrive


def test_k_limit_is_one_number_for_files_and_flags(tmp_path: Path) -> None:
    ok = _config(tmp_path, f"target: t\ndrafter: d\nk_max: {K_LIMIT}\n")
    assert merge("diagnose", {"target": None, "drafter": None, "k_max": 8}, set(), ok).k_max == K_LIMIT
    bad = _config(tmp_path, f"target: t\ndrafter: d\nk_max: {K_LIMIT + 1}\n", "big.yaml")
    with pytest.raises(ConfigError, match=r"big\.yaml: k_max"):
        merge("diagnose", {"target": None, "drafter": None, "k_max": 8}, set(), bad)
    with pytest.raises(ConfigError, match=r"^--k-max 33 is out of range"):
        merge("diagnose", {"target": "t", "drafter": "d", "k_max": 33}, {"k_max"}, None)


def test_errors_name_the_key_and_file_or_the_flag_typed(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "target: t\ndrafter: d\nmin_p: 1.0\n")  # passes the file schema, not the range check
    with pytest.raises(ConfigError) as e:
        merge("diagnose", {"target": None, "drafter": None, "min_p": None}, set(), cfg)
    assert e.value.message.startswith("probe.yaml: min_p 1.0 is outside [0, 1)")
    res = runner.invoke(app, ["diagnose", "t", "d", "--min-p", "1.0"])
    assert res.exit_code == 2 and "--min-p 1.0 is outside" in res.output
    res = runner.invoke(app, ["simulate", "t", "d", "--k", "1,40"])
    assert res.exit_code == 2 and "--k '1,40' must list draft lengths between 1 and 32" in " ".join(res.output.split())
    res = runner.invoke(app, ["simulate", "--config", str(_config(tmp_path, "target: t\ndrafter: d\nk: [40]\n", "sim.yaml"))])
    assert res.exit_code == 2 and "sim.yaml: k" in res.output and "--k" not in res.output


def test_compare_reads_baseline_and_candidate_from_the_config(tmp_path: Path) -> None:
    shutil.copy(DATA / "results" / "v1" / "diagnose.json", tmp_path / "baseline.json")
    shutil.copy(DATA / "results" / "v1" / "diagnose.json", tmp_path / "candidate.json")
    cfg = _config(tmp_path, "baseline: baseline.json\noutputs:\n  json: candidate.json\n  html: report.html\nfail_on: never\n")
    res = runner.invoke(app, ["compare", "--config", str(cfg)])
    assert res.exit_code == 0, res.output
    assert "against baseline" in res.output
    assert not (tmp_path / "report.html").exists()  # the file's outputs are diagnose's, not compare's
    nothing = _config(tmp_path, "fail_on: never\n", "empty.yaml")
    res = runner.invoke(app, ["compare", "--config", str(nothing)])
    assert res.exit_code == 2 and "needs a BASELINE.json and a CANDIDATE.json" in res.output


def test_check_config_keys_reach_check(tiny_pair, tmp_path: Path) -> None:
    """fail_on, min_p, draft_top_k and draft_top_p in a probe config were ignored by check."""
    cfg = _config(
        tmp_path,
        f"target: {tiny_pair['target']}\ndrafter: {tiny_pair['twin']}\ntemperature: 0.7\ndraft_temperature: 1.2\n"
        "min_p: 0.05\ndraft_top_k: 7\ndraft_top_p: 0.8\nfail_on: never\ndraft_sampling: probabilistic\n",
    )
    res = runner.invoke(app, ["check", "--config", str(cfg), "--json", str(tmp_path / "c.json")])
    assert res.exit_code == 0, res.output  # SP012 fires, but the file says fail_on: never
    data = json.loads((tmp_path / "c.json").read_text())
    assert data["sampling"]["target"]["min_p"] == 0.05 and data["sampling"]["draft"]["top_k"] == 7 and data["sampling"]["draft"]["top_p"] == 0.8
    assert data["sampling"]["sources"]["draft.temperature"] == "probe.yaml"  # a file is not "flag"
    assert any(f["rule_id"] == "SP012" for f in data["findings"])
