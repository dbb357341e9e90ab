"""What the terminal shows, where it is read: at 80 columns (a pipe, a narrow terminal)
every table keeps its rule ids, flags and numbers whole; CI logs get a wider default;
`--help` has no `<bool>` metavars; and the words the first users tripped over."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.report import terminal
from specprobe.report.console import (
    demo_table,
    measured_tables,
    render,
    render_comparison,
    render_summary,
    verdict_panel,
)
from specprobe.result import Finding, Result

runner = CliRunner()
ROOT = Path(__file__).parent.parent
DATA = Path(__file__).parent / "data"


def at80(*renderables: Any, fn: Any = None, result: Any = None) -> str:
    buf = io.StringIO()
    con = terminal.console(file=buf, width=80)
    for r in renderables:
        con.print(r)
    if fn is not None:
        fn(result, con)
    return buf.getvalue()


def assert_fits(text: str, width: int = 80, cut_marks: bool = True) -> None:
    long = [line for line in text.splitlines() if len(line.rstrip()) > width]
    assert not long, "\n".join(long)
    if cut_marks:  # a cell rich cut short ends in an ellipsis
        assert not re.search(r"\w…", text), text


def whole(token: str, text: str) -> bool:
    """token appears with no word character or hyphen glued to either side."""
    return re.search(rf"(?<![\w-]){re.escape(token)}(?![\w-])", text) is not None


def cli80(*args: str, **kw: Any) -> Any:
    return runner.invoke(app, list(args), env={"COLUMNS": "80"}, **kw)


# ----------------------------------------------------------------------------- 80 columns
def test_findings_and_evidence_tables_fit_80_columns(real_results) -> None:
    for r in (real_results.skip, real_results.broken, real_results.twin):
        text = at80(fn=render, result=r)
        assert_fits(text)
        for f in r.findings:
            assert whole(f.rule_id, text), f.rule_id
            assert whole(f.name, text), f.name
        for row in r.k_table:
            assert f"{row.tau_tokens:.2f}" in text
        for d in r.by_domain:
            assert whole(d.group, text)


def test_a_long_remedy_keeps_the_flag_it_names(real_results) -> None:
    remedy = "Measure adaptive K again with --adaptive-threshold 0.4 and compare the tokens/s of every --k given; see --cost-ratio."
    f = Finding(rule_id="SP602", name="adaptive-threshold-misjudged", severity="warning", message="τ estimate 3.10 vs measured 2.20 at K=4", remedy=remedy, threshold="x")
    r = real_results.skip.model_copy(update={"findings": [f]})
    text = at80(fn=render, result=r)
    for flag in ("--adaptive-threshold", "--k", "--cost-ratio"):
        assert whole(flag, text), flag
    assert whole("SP602", text) and "3.10" in text and "2.20" in text


def test_simulate_tables_keep_whole_headers(real_results) -> None:
    text = at80(fn=measured_tables, result=real_results.sim)
    assert_fits(text)
    assert "τ meas" in text and "τ est" in text and "tok/s" in text
    for row in real_results.sim.measured.k_table:
        assert f"{row.tau_tokens:.2f}" in text and f"{row.speedup:.2f}×" in text


def test_demo_table_fits_80_columns_with_the_verdict_under_the_row(real_results) -> None:
    rows = [("itself (sanity: α = 1)", real_results.twin), ("self-draft, first 1 of 2 layers", real_results.skip), ("a random drafter", real_results.broken)]
    text = at80(demo_table(rows))
    assert_fits(text)
    for label, r in rows:
        assert label in text
        assert f"{100 * r.metrics['accept_prob_mean']:.1f}%" in text
        assert r.verdict in text
    wide = io.StringIO()
    terminal.console(file=wide, width=200).print(demo_table(rows))
    assert len(wide.getvalue().splitlines()) < len(text.splitlines())  # beside the row when there is room


def test_summary_and_comparison_fit(real_results) -> None:
    from specprobe.judge.compare import compare_results

    assert_fits(at80(fn=render_summary, result=real_results.skip))
    cmp = compare_results(real_results.twin, real_results.broken, allow_procedure_change=True)  # the twin drafts by sampling
    text = at80(fn=render_comparison, result=cmp)
    assert_fits(text)
    for f in cmp.findings:
        assert whole(f.rule_id, text)


def test_rules_list_at_80_columns_keeps_every_id_and_counts_what_it_shows() -> None:
    from specprobe.judge.rules import load_table

    table = load_table([])
    res = cli80("rules", "list")
    assert res.exit_code == 0, res.output
    assert_fits(res.output)
    for r in table.rules:
        assert whole(r.id, res.output) and whole(r.name, res.output), r.id
    fam = cli80("rules", "list", "--family", "5")
    shown = [r for r in table.rules if r.family == "regression"]
    assert f"{len(shown)} of {len(table.rules)} rules" in fam.output
    assert set(re.findall(r"\bSP\d{3}\b", fam.output)) == {r.id for r in shown}
    assert cli80("rules", "list", "--family", "9").exit_code == 2
    assert_fits(cli80("rules", "metrics").output)


def _commands(cmd: Any, path: list[str]) -> Any:
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            yield from _commands(cmd.get_command(ctx, name), [*path, name])


def test_every_help_at_80_columns_keeps_every_flag_whole() -> None:
    seen = 0
    for path, cmd in _commands(get_command(app), []):
        res = cli80(*path, "--help")
        assert res.exit_code == 0, (path, res.output)
        text = res.output
        assert_fits(text, cut_marks=False)  # a metavar may say PART… (repeatable)
        assert "<bool>" not in text and "<list[" not in text and "<str>" not in text, (path, text)
        for p in cmd.params:
            if getattr(p, "hidden", False):
                continue
            for flag in [*p.opts, *p.secondary_opts] if p.param_type_name == "option" else []:
                assert whole(flag, text), (path, flag)
        seen += 1
    assert seen >= 10


def test_flags_show_no_value_and_types_read_plainly() -> None:
    text = cli80("diagnose", "--help").output
    assert re.search(r"^\s+--brief\s{2,}Verdict", text, re.M), text
    assert "--rules FILE" in text and "--max-prompts INT" in text
    mon = cli80("monitor", "--help").output
    assert "--live / --no-live" in mon and "--num-spec-tokens INT" in mon and "[≥ 1]" in mon
    # the description column is not squeezed: the help of --num-spec-tokens starts on its line
    line = next(x for x in mon.splitlines() if x.strip().startswith("--num-spec-tokens INT"))  # the option, not an example
    assert len(line.split("--num-spec-tokens INT", 1)[1].strip()) > 30


# ----------------------------------------------------------------------------- width
def test_width_follows_columns_then_the_terminal_then_ci(monkeypatch) -> None:
    monkeypatch.setattr(terminal, "_terminal_columns", lambda: None)
    assert terminal.width({}) == 80
    assert terminal.width({"GITHUB_ACTIONS": "true"}) == terminal.CI_WIDTH
    assert terminal.width({"CI": "true"}) == terminal.CI_WIDTH
    assert terminal.width({"CI": "true", "COLUMNS": "100"}) == 100
    monkeypatch.setattr(terminal, "_terminal_columns", lambda: 132)
    assert terminal.width({"GITHUB_ACTIONS": "true"}) == 132
    monkeypatch.setenv("COLUMNS", "97")
    assert terminal.console().width == 97  # read when it prints, not when it was made


def test_a_grid_drops_minor_columns_and_says_so() -> None:
    g = terminal.Grid([terminal.Column("id"), terminal.Column("a long header here", "a", "right"), terminal.Column("minor", fallback="drop", order=1)])
    g.add("SP001", "12.5", "x" * 75)
    text = at80(g)
    assert whole("SP001", text) and "12.5" in text and "x" * 75 not in text
    assert "not shown at 80 columns: minor" in text


# ----------------------------------------------------------------------------- words
def test_headline_names_its_finding_and_why_the_worse_one_wins(real_results) -> None:
    r = real_results.skip
    src = next(f for f in r.findings if f.severity == r.worst_severity and (f.verdict or f.name) == r.verdict)
    fair = Finding(rule_id="SP204", name="acceptance-fair", severity="info", message="Acceptance is 55.0%: fair", remedy="", threshold="", verdict="fair")
    r2 = r.model_copy(update={"findings": [*r.findings, fair]})
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", at80(verdict_panel(r2))).split())  # the panel's borders out
    assert f"from {src.rule_id} {src.name} ({src.severity})" in text
    assert 'SP204 says "fair" (info)' in text and "the most severe finding sets the headline" in text
    from specprobe.report.markdown import render_markdown

    md = render_markdown(r2)
    assert f"_from {src.rule_id} {src.name} ({src.severity}); SP204 says" in md


def test_sp102_explains_its_numbers_and_every_rule_has_a_why() -> None:
    rules = yaml.safe_load((ROOT / "rules" / "default.yaml").read_text())["rules"]
    sp102 = next(r for r in rules if r["id"] == "SP102")
    assert "(~1.2 nats)" not in sp102["diagnosis"] and "about 1.2 nats" in sp102["diagnosis"]
    assert [r["id"] for r in rules if not r.get("doc")] == []
    res = cli80("rules", "explain", "SP302")
    assert res.exit_code == 0 and re.search(r"^Why\s+K draft steps", res.output, re.M), res.output


def test_a_nan_metric_reads_n_a_in_a_message() -> None:
    from specprobe.judge.rules import load_table

    table = load_table([])
    metrics = {"monitor_accept_rate_drop_rel": 0.3, "monitor_accept_rate": float("nan"), "monitor_accept_rate_baseline": float("nan"), "monitor_mean_accept_len_tokens": 1.6, "monitor_mean_accept_len_baseline_tokens": 2.2}
    (f,) = [f for f in table.findings(metrics, families=["monitoring"]) if f.rule_id == "SP403"]
    assert "nan" not in f.message and "n/a now vs n/a" in f.message and "1.60" in f.message


def test_summary_csv_names_the_pair_and_writes_flags_as_integers(real_results, tmp_path) -> None:
    import pandas as pd

    from specprobe.report.csv_out import write_csv

    r = real_results.skip
    write_csv(r, tmp_path / "csv")
    text = (tmp_path / "csv" / "summary.csv").read_text()
    df = pd.read_csv(tmp_path / "csv" / "summary.csv")
    assert list(df.columns[:2]) == ["target", "drafter"] and set(df.drafter) == {r.drafter.spec}
    bools = df[df.unit == "bool"]
    assert len(bools) and set(bools.value) <= {0, 1}
    assert not re.search(r",(0|1)\.0,bool,", text), text
    assert df.value.dtype.kind == "f"  # still numeric for notebooks


def test_demo_help_and_readme_agree_on_how_long_it_takes() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    help_text = " ".join(cli80("demo", "--help").output.split())
    said = re.search(r"(\d+) CPU-seconds measured", help_text)  # a measured figure, the same in both
    assert said and f"{said.group(1)} CPU-seconds measured" in readme, help_text


def test_vocab_shuffled_drafter_is_announced_only_when_written(tiny_pair, tmp_path) -> None:
    from specprobe.core.progress import Progress
    from specprobe.models.loader import load_model
    from specprobe.probe.demo import make_vocab_shuffled

    class Notes(Progress):
        def __init__(self) -> None:
            self.said: list[str] = []

        def note(self, message: str) -> None:
            self.said.append(message)

    target = load_model(str(tiny_pair["target"]), "cpu", "float32")
    first, again = Notes(), Notes()
    make_vocab_shuffled(target, tmp_path / "sh", progress=first)
    make_vocab_shuffled(target, tmp_path / "sh", progress=again)
    assert any("vocab-shuffled" in m for m in first.said) and again.said == []


def test_dataset_reference_count_reads_as_english(tmp_path) -> None:
    from specprobe.core.errors import InputError
    from specprobe.probe.references import load_prompt_set
    from specprobe.settings.pipeline import DiagnoseConfig

    p = tmp_path / "p.jsonl"
    p.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": "hi", "reference": "" if i == 2 else "ok"}) for i in range(3)) + "\n")
    with pytest.raises(InputError) as info:
        load_prompt_set(DiagnoseConfig(target="t", drafter="d", prompts=str(p), reference="dataset"))
    assert "1 of 3 has none" in str(info.value)


# ----------------------------------------------------------------------------- monitor
MON = DATA / "monitor"


def test_sglang_without_k_says_what_to_pass() -> None:
    res = cli80("monitor", "--log", str(MON / "sglang.log"), "--once", "--no-live")
    text = " ".join(res.output.split())
    assert "n/a (K?)" in text and "pass --num-spec-tokens K" in text
    assert "¹ Δ compares accepted tokens per draft" in text


def test_once_on_a_short_log_says_what_the_baseline_holds() -> None:
    res = cli80("monitor", "--log", str(MON / "sglang.log"), "--once", "--num-spec-tokens", "4")
    text = " ".join(res.output.split())
    assert "the log spans 5m 50s, shorter than the 5m window plus the 1h baseline" in text
    assert "--baseline-window 50s" in text
    res = cli80("monitor", "--log", str(MON / "sglang.log"), "--once", "--num-spec-tokens", "4", "--window", "10m")
    assert "no baseline to compare with" in " ".join(res.output.split())


def test_follow_on_a_finished_log_says_why_acceptance_is_n_a() -> None:
    res = cli80("monitor", "--log", "-", "--follow", "--no-live", "--num-spec-tokens", "4", "--interval", "1s", input=(MON / "sglang.log").read_text())
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "older than the 5m window" in text and "drop --follow" in text and "2025-06-02 10:06:00" in text


def test_interrupted_result_says_the_cost_was_not_measured(real_results) -> None:
    r = real_results.skip
    cost = r.cost.model_copy(update={"measured": False})
    config = r.config.model_copy(update={"cost_ratio": None})
    stopped = r.model_copy(update={"interrupted": True, "cost": cost, "config": config})
    text = " ".join(at80(fn=render, result=stopped).split())
    assert "cost ratio not measured (interrupted)" in text and "computed before Ctrl-C" in text
    assert isinstance(Result.model_validate(stopped.model_dump()), Result)
