"""The n-gram section of every report (terminal, Markdown, HTML, CSV) from a real
diagnose of an n-gram drafter on the tiny target with a Spec-Bench-style file (its
categories fold into fewer domains, so both tables show): the walk's numbers appear as
the result holds them, the model-only columns (α, KL, greedy agreement) do not, and the
terminal holds 80 columns."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.report.console import render, render_summary
from specprobe.report.csv_out import write_csv
from specprobe.report.fmt import fixed, pct
from specprobe.report.html import render_html
from specprobe.report.markdown import render_markdown
from specprobe.report.terminal import console
from specprobe.result import Result

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()

# Spec-Bench's format: categories that fold into the domains summarization, qa, …
QUESTIONS = [
    ("summarization", "the quick brown fox jumps over the lazy dog and the quick brown fox sleeps"),
    ("rag", "a b c d e f g a b c d e f g a b c"),
    ("writing", "write a short poem about the sea and the wind"),
    ("qa", "what is the capital of the land of the quick brown fox"),
    ("summarization", "one two three four five one two three four five one two three"),
    ("coding", "def f(x): return x + 1 def g(x): return f(x) + 1 def h"),
]


@pytest.fixture(scope="module")
def ngram_result(tiny_pair, tmp_path_factory) -> Result:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig

    pf = tmp_path_factory.mktemp("ngram_report") / "question.jsonl"
    pf.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in enumerate(QUESTIONS)))
    r = run_diagnose(DiagnoseConfig(target=str(tiny_pair["target"]), drafter="ngram:min=1,max=2", prompts=str(pf), max_new_tokens=16, batch_size=3, k_max=3, keep_positions=False))
    assert r.scored and r.drafter.kind == "ngram" and r.categories and r.by_domain
    return r


def _terminal(result: Result, width: int, summary: bool = False) -> list[str]:
    import io

    buf = io.StringIO()
    c = console(file=buf, width=width)
    (render_summary if summary else render)(result, c)
    return buf.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_shows_the_walk_by_group_and_k(ngram_result: Result, width: int) -> None:
    lines = _terminal(ngram_result, width)
    text = "\n".join(lines)
    assert max(len(x) for x in lines) <= width
    assert "n-gram proposals by domain" in text and "n-gram proposals by the prompt file's category" in text
    assert "by domain" not in lines and "α alignment" not in text and "KL nats" not in text  # model-only tables left out
    assert "by longest draft K" in text and "matching" in text
    # each group's row carries its own numbers, whole
    cut = lines.index("n-gram proposals by the prompt file's category")
    for r, section in [*((r, lines[:cut]) for r in ngram_result.by_domain), *((r, lines[cut:]) for r in ngram_result.categories)]:
        row = next(x for x in section if x.split() and x.split()[0] == r.group)
        assert pct(r.ngram_proposal_frac) in row and fixed(r.tau_tokens, ".2f") in row and f"{fixed(r.speedup, '.2f')}×" in row, row
    m = ngram_result.metrics
    flat = re.sub(r"[│\s]+", " ", text)
    assert f"proposes at {pct(m['ngram_proposal_frac'])} of verify steps" in flat
    assert f"{pct(m['ngram_accept_frac'])} of drafted tokens accepted" in flat
    best = next(x for x in lines if "◀ best" in x)
    assert best.split()[0] == str(ngram_result.best_k)


def test_summary_lists_the_ngram_metrics(ngram_result: Result, tmp_path: Path) -> None:
    f = tmp_path / "r.json"
    f.write_text(ngram_result.to_json())
    res = runner.invoke(app, ["report", str(f)], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    for name in ("ngram_proposal_frac", "ngram_draft_tokens_mean", "ngram_accept_frac", "speedup_best"):
        assert name in res.output
    assert "proposes at" in res.output and "alignment α" not in res.output
    assert max(len(x) for x in res.output.splitlines()) <= 80


def test_markdown_has_the_ngram_tables(ngram_result: Result) -> None:
    md = render_markdown(ngram_result)
    assert "#### n-gram proposals by domain" in md and "#### n-gram proposals by the prompt file's category" in md
    assert "α by domain" not in md and "| ngram_accept_frac |" in md
    for r in ngram_result.categories:
        row = next(x for x in md.split("by the prompt file's category")[1].splitlines() if x.startswith(f"| {r.group} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == [r.group, str(r.positions), pct(r.ngram_proposal_frac), fixed(r.ngram_draft_tokens_mean, ".2f"), pct(r.accept_prob_engine_mean), fixed(r.tau_tokens, ".2f"), fixed(r.speedup, ".2f") + "×"]
    assert f"**{ngram_result.best_k}** (best" in md and "matching" in md  # "(best)", or with the Ks timing cannot tell apart


def test_html_charts_proposals_not_alpha(ngram_result: Result) -> None:
    h = render_html(ngram_result)
    assert 'id="chart-ngram-domain"' in h and 'id="chart-ngram-category"' in h
    assert "α by domain" not in h and 'id="chart-domain"' not in h
    assert "ngram_proposal_frac" in h and "matching" in h and "(K·c + v_K)" not in h


def test_csv_ngram_table_is_the_result(ngram_result: Result, tmp_path: Path) -> None:
    paths = write_csv(ngram_result, tmp_path / "csv")
    assert tmp_path / "csv" / "ngram.csv" in paths
    df = pd.read_csv(tmp_path / "csv" / "ngram.csv")
    m = ngram_result.metrics
    top = df.iloc[0]
    assert (top.scope, top.group) == ("all", "all")
    assert top.proposal_frac == pytest.approx(m["ngram_proposal_frac"], rel=1e-5) and top.tau_tokens == pytest.approx(m["tau_tokens"], rel=1e-5)
    assert top.verify_steps == sum(r.positions for r in ngram_result.by_domain)
    for scope, rows in (("domain", ngram_result.by_domain), ("category", ngram_result.categories)):
        part = df[df.scope == scope]
        assert list(part.group) == [r.group for r in rows]
        assert list(part.verify_steps) == [r.positions for r in rows]
        assert list(part.speedup) == pytest.approx([r.speedup for r in rows], rel=1e-5)
