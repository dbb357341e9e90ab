"""Help, flags and words a new user meets first: the command list shows whole summaries,
every command's help puts its examples before the options, usage mistakes are one
`error:` line (exit 2) like every other mistake, and the flags the commands share are
on every command that can use them."""

from __future__ import annotations

from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from specprobe.cli.main import app

runner = CliRunner()


def _commands() -> dict[str, Any]:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined,no-any-return]


def test_the_command_list_shows_each_summary_whole() -> None:
    res = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    line = next(ln for ln in res.output.splitlines() if ln.strip().startswith("sweep "))
    assert line.rstrip().endswith("and the best recommended."), line


@pytest.mark.parametrize("command", ["check", "diagnose", "simulate", "sweep", "compare", "merge", "report", "monitor", "explain"])
def test_examples_come_before_the_options(command: str) -> None:
    out = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"}).output
    assert "Examples:" in out and out.index("Examples:") < out.index("Options:"), command


@pytest.mark.parametrize("command", ["check", "diagnose", "simulate"])
def test_the_drafter_help_names_the_head_forms(command: str) -> None:
    out = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"}).output.split())
    for form in ("eagle3:", "eagle:", "medusa:", "mtp"):
        assert form in out, (command, form)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["diagnose", "t", "d", "--fail-on", "bogus"], "--fail-on 'bogus' is not one of error, warning, info, never"),
        (["explain", "r.json", "--worst", "0"], "--worst"),
        (["merge"], "Missing argument 'PART…'"),
        (["no-such-command"], "No such command"),
        (["diagnose", "--no-such-flag"], "No such option: --no-such-flag"),
        (["report", "r.json", "--fail-on", "sometimes"], "--fail-on 'sometimes' is not one of"),
        (["monitor", "--log", "x.log", "--fail-on", "sometimes"], "--fail-on 'sometimes' is not one of"),
    ],
)
def test_usage_mistakes_are_one_line(args: list[str], needle: str) -> None:
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], res.output
    assert "Usage:" not in res.output


@pytest.mark.parametrize(
    ("command", "flags"),
    [
        ("sweep", ["--draft-top-k", "--draft-top-p", "--batch-sizes", "--fail-on", "--html", "--csv"]),
        ("simulate", ["--brief"]),
        ("merge", ["--config"]),
    ],
)
def test_the_shared_flags_are_on_every_command_that_can_use_them(command: str, flags: list[str]) -> None:
    opts = {o for p in _commands()[command].params for o in getattr(p, "opts", [])}
    for flag in flags:
        assert flag in opts, (command, flag)
