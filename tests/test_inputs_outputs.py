"""An output that names an input is refused before any work: exit 2, one line naming
both, and the input left byte for byte as it was (same path, a symlink, a hard link,
a CSV folder that holds it)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app

runner = CliRunner()
RESULTS = Path(__file__).parent / "data" / "results" / "v1"


@pytest.fixture(autouse=True)
def _refused_before_any_model(no_models: None) -> None:
    """The refusal comes before any model loads: the TARGET and DRAFTER below do not exist."""


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Small real inputs in the current folder, so the commands name them as a user would."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "P.jsonl").write_text('{"prompt": "Write a haiku about rain.", "domain": "chat"}\n{"prompt": "What is 2 + 2?", "domain": "math"}\n')
    (tmp_path / "R.yaml").write_text("rules:\n  - id: SP001\n    enabled: false\n")
    shutil.copy(RESULTS / "diagnose.json", tmp_path / "R.json")
    shutil.copy(RESULTS / "diagnose.json", tmp_path / "B.json")
    shutil.copy(RESULTS / "diagnose_stopped.json", tmp_path / "C.json")
    shutil.copy(RESULTS / "diagnose.json", tmp_path / "p0.json")
    shutil.copy(RESULTS / "diagnose_stopped.json", tmp_path / "p1.json")
    (tmp_path / "S.yaml").write_text("model-path: T\nspeculative-algorithm: STANDALONE\nspeculative-draft-model-path: D\nspeculative-num-steps: 4\n")
    (tmp_path / "probe.yaml").write_text("target: T\ndrafter: D\n")
    return tmp_path


def refused(args: list[str], keep: Path, output_flag: str, input_name: str) -> str:
    before = keep.read_bytes()
    res = runner.invoke(app, args)
    line = res.output.strip()
    assert res.exit_code == 2, res.output
    assert "\n" not in line and line.startswith("error:"), res.output
    assert output_flag in line and input_name in line, line
    assert keep.read_bytes() == before
    return line


@pytest.mark.parametrize(
    ("args", "keep", "output_flag", "input_name"),
    [
        (["diagnose", "T", "D", "--prompts", "P.jsonl", "--json", "P.jsonl"], "P.jsonl", "--json P.jsonl", "(--prompts)"),
        (["diagnose", "T", "D", "--rules", "R.yaml", "--json", "R.yaml"], "R.yaml", "--json R.yaml", "(--rules)"),
        (["simulate", "T", "D", "--prompts", "P.jsonl", "--markdown", "P.jsonl"], "P.jsonl", "--markdown P.jsonl", "(--prompts)"),
        (["report", "R.json", "--html", "R.json"], "R.json", "--html R.json", "(RESULT.json)"),
        (["report", "R.json", "--markdown", "R.json"], "R.json", "--markdown R.json", "(RESULT.json)"),
        (["report", "R.json", "--junit", "R.json"], "R.json", "--junit R.json", "(RESULT.json)"),
        (["report", "R.json", "--csv", "R.json"], "R.json", "--csv R.json", "(RESULT.json)"),
        (["compare", "B.json", "C.json", "--json", "B.json"], "B.json", "--json B.json", "(BASELINE.json)"),
        (["compare", "B.json", "C.json", "--html", "C.json"], "C.json", "--html C.json", "(CANDIDATE.json)"),
        (["compare", "B.json", "C.json", "--rules", "R.yaml", "--junit", "R.yaml"], "R.yaml", "--junit R.yaml", "(--rules)"),
        (["merge", "p0.json", "p1.json", "--json", "p1.json"], "p1.json", "--json p1.json", "(PART)"),
        (["diagnose", "--config", "probe.yaml", "--json", "probe.yaml"], "probe.yaml", "--json probe.yaml", "(--config)"),
        (["check", "T", "D", "--serving-config", "S.yaml", "--json", "S.yaml"], "S.yaml", "--json S.yaml", "(--serving-config)"),
    ],
    ids=lambda v: "-".join(v) if isinstance(v, list) else None,
)
def test_an_output_that_is_an_input_is_refused(files: Path, args: list[str], keep: str, output_flag: str, input_name: str) -> None:
    line = refused(args, files / keep, output_flag, input_name)
    assert "write the result elsewhere" in line


def test_a_configs_own_output_may_not_be_the_config(files: Path) -> None:
    cfg = files / "probe.yaml"
    cfg.write_text("target: T\ndrafter: D\noutputs:\n  json: probe.yaml\n")
    refused(["diagnose", "--config", "probe.yaml"], cfg, "probe.yaml: outputs.json", "(--config probe.yaml)")


def test_compare_keeps_the_candidate_its_config_names(files: Path) -> None:
    (files / "probe.yaml").write_text("target: T\ndrafter: D\noutputs:\n  json: C.json\n")
    refused(["compare", "B.json", "--config", "probe.yaml", "--json", "C.json"], files / "C.json", "--json C.json", "probe.yaml: outputs.json")


def test_a_symlink_to_an_input_is_refused(files: Path) -> None:
    (files / "link.jsonl").symlink_to("P.jsonl")
    refused(["diagnose", "T", "D", "--prompts", "P.jsonl", "--json", "link.jsonl"], files / "P.jsonl", "--json link.jsonl", "--prompts P.jsonl")
    # and the other way round: the input named through the link
    refused(["diagnose", "T", "D", "--prompts", "link.jsonl", "--html", "P.jsonl"], files / "P.jsonl", "--html P.jsonl", "--prompts link.jsonl")
    assert (files / "link.jsonl").is_symlink()


def test_a_hard_link_to_an_input_is_refused(files: Path) -> None:
    os.link(files / "B.json", files / "hard.json")
    refused(["compare", "B.json", "C.json", "--json", "hard.json"], files / "B.json", "--json hard.json", "BASELINE.json B.json")
    refused(["report", "hard.json", "--markdown", "B.json"], files / "B.json", "--markdown B.json", "RESULT.json hard.json")
    refused(["merge", "p0.json", "hard.json", "--json", "B.json"], files / "B.json", "--json B.json", "PART hard.json")


def test_a_csv_folder_that_holds_an_input_is_refused(files: Path) -> None:
    out = files / "out"
    out.mkdir()
    shutil.copy(files / "P.jsonl", out / "prompts.jsonl")
    line = refused(["diagnose", "T", "D", "--prompts", "out/prompts.jsonl", "--csv", "out"], out / "prompts.jsonl", "--csv out", "--prompts out/prompts.jsonl")
    assert "another folder" in line
    shutil.move(files / "R.json", out / "R.json")
    refused(["report", "out/R.json", "--csv", "out/"], out / "R.json", "--csv out", "RESULT.json out/R.json")
    assert sorted(p.name for p in out.iterdir()) == ["R.json", "prompts.jsonl"]  # no table was written


def test_outputs_apart_from_the_inputs_are_written(files: Path) -> None:
    res = runner.invoke(app, ["report", "R.json", "--html", "r.html", "--csv", "tables"])
    assert res.exit_code == 0, res.output
    assert (files / "r.html").is_file() and any((files / "tables").iterdir())
    res = runner.invoke(app, ["compare", "B.json", "C.json", "--json", "cmp.json", "--fail-on", "never"])
    assert res.exit_code == 0, res.output
