"""Help, flags and words a new user meets first: the command list shows whole summaries,
every command's help puts its examples before the options, usage mistakes are one
`error:` line (exit 2) like every other mistake, and the flags the commands share are
on every command that can use them."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.settings.model import HELP_GROUP_ABOVE, PANELS, SETTINGS

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
    first_group = re.search(r"^(Arguments|Options|" + "|".join(PANELS) + r"):$", out, re.M)
    assert first_group is not None, out
    assert "Examples:" in out and out.index("Examples:") < first_group.start(), command


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


# ----------------------------------------------------------------------------- grouped help
def _options(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "option" and not getattr(p, "hidden", False)]


def _groups(text: str) -> dict[str, str]:
    """--help's text by group: the rows under each unindented `Heading:` line."""
    groups: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.match(r"^(\S[^:]*):$", line)
        if m:
            current = m.group(1)
            groups[current] = []
        elif current is not None:
            groups[current].append(line)
    return {title: "\n".join(lines) for title, lines in groups.items()}


def _whole(flag: str, text: str) -> bool:
    """The flag with nothing glued to either side: not cut at a hyphen, not run into a word."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text) is not None


GROUPED = [name for name, cmd in _commands().items() if len(_options(cmd)) > HELP_GROUP_ABOVE]


def test_the_commands_with_many_options_are_the_ones_grouped() -> None:
    assert {"check", "diagnose", "simulate", "sweep", "monitor"} <= set(GROUPED), GROUPED


def test_every_setting_names_a_panel_of_the_help() -> None:
    for s in SETTINGS:
        assert s.panel in PANELS, (s.flag, s.panel)


@pytest.mark.parametrize("command", GROUPED)
def test_every_option_of_a_big_command_is_in_a_named_group_at_100_columns(command: str) -> None:
    cmd = _commands()[command]
    res = runner.invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    text = res.output
    wide = [ln for ln in text.splitlines() if len(ln.rstrip()) > 100]
    assert not wide, "\n".join(wide)
    groups = _groups(text)
    used = []
    for p in _options(cmd):
        panel = getattr(p, "rich_help_panel", None)
        assert panel in PANELS, f"{command} {p.opts}: no panel of the help ({panel!r})"
        used.append(panel)
        for flag in [*p.opts, *p.secondary_opts]:
            assert _whole(flag, groups[panel]), f"{command}: {flag} is not whole under {panel}:\n{groups[panel]}"
            # on a row of its own (a line that starts with a flag), whole: the name never cut across lines
            rows = [ln.split("  ", 2)[1] for ln in groups[panel].splitlines() if ln.startswith("  -")]
            assert any(_whole(flag, row) for row in rows), (command, flag, rows)
    # what is left in the generic group is --help alone
    assert [ln.split()[0] for ln in groups["Options"].splitlines() if ln.strip()] == ["--help"], groups["Options"]
    # the groups come in the model's order: the pair, sampling and outputs before the specialist ones
    shown = [t for t in groups if t in PANELS]
    assert shown == sorted(set(used), key=PANELS.index), shown
    for arg in (p for p in cmd.params if p.param_type_name == "argument"):
        assert getattr(arg, "rich_help_panel", None) == "Target and drafter" or command == "monitor", (command, arg.name)


def test_diagnose_shows_the_pair_sampling_and_outputs_first() -> None:
    text = runner.invoke(app, ["diagnose", "--help"], env={"COLUMNS": "100"}).output
    shown = [t for t in _groups(text) if t in PANELS]
    assert shown[:4] == ["Target and drafter", "Sampling", "Prompts and references", "Outputs"], shown
    assert {"Engine procedure", "Draft shape", "Cost", "Precision as served", "Scale", "Gate"} <= set(shown), shown
    groups = _groups(text)
    assert _whole("TARGET", groups["Target and drafter"]) and _whole("--temperature", groups["Sampling"])
    assert _whole("--json", groups["Outputs"]) and _whole("--kv-cache-dtype", groups["Precision as served"])
    assert _whole("--device-map", groups["Scale"]) and _whole("--tree", groups["Draft shape"])


def test_a_command_with_few_options_lists_them_in_one_group() -> None:
    cmd = _commands()["report"]
    assert len(_options(cmd)) <= HELP_GROUP_ABOVE
    groups = _groups(runner.invoke(app, ["report", "--help"], env={"COLUMNS": "100"}).output)
    assert not set(groups) & set(PANELS), list(groups)
    for p in _options(cmd):
        assert _whole(p.opts[0], groups["Options"]), p.opts
