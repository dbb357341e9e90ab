"""`sweep` with n-gram drafters beside model drafters on one set of references, and its
per-group advice: the pure table (best K per group, the fastest, ties, NaN), the real
pipeline on the tiny family with a Spec-Bench-style file (n-gram rows walked on the
sweep's references, the same numbers as diagnose alone; a group's estimate for a model
drafter equal to the whole run's when the group is the whole run), and the command's
terminal (80 columns), JSON, CSV and HTML."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.probe.sweep import SweepReport, group_table
from tests.test_ngram_report import QUESTIONS

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner()
NGRAMS = ["ngram:min=1,max=2", "ngram-simple:size_n=1,size_m=3"]


def test_group_table_picks_each_groups_fastest_at_its_best_k() -> None:
    est = {
        "eagle": {("domain", "chat"): {1: (1.8, 1.6), 2: (2.4, 1.9), 3: (2.6, 1.7)}, ("domain", "summarization"): {1: (1.3, 1.1), 2: (1.5, 1.2)}},
        "ngram": {("domain", "chat"): {3: (1.1, 1.05)}, ("domain", "summarization"): {3: (2.9, 2.5)}, ("category", "rag"): {3: (math.nan, math.nan)}},
        "tie": {("domain", "chat"): {2: (2.4, 1.9)}},
    }
    pos = {("domain", "chat"): 40, ("domain", "summarization"): 60, ("category", "rag"): 10}
    rows = group_table(est, pos, ["eagle", "ngram", "tie"])
    assert [(g.scope, g.group) for g in rows] == [("domain", "chat"), ("domain", "summarization"), ("category", "rag")]
    chat, summ, rag = rows
    assert [(e.drafter, e.best_k, e.speedup) for e in chat.drafters] == [("eagle", 2, 1.9), ("ngram", 3, 1.05), ("tie", 2, 1.9)]
    assert chat.recommended == "eagle"  # a tie goes to the drafter listed first
    assert summ.recommended == "ngram" and summ.positions == 60
    assert rag.recommended is None and all(e.speedup is None for e in rag.drafters)  # nothing finite: no advice
    report = SweepReport(created="now", target="t", reference="on-policy", num_prompts=3, num_positions=100, target_passes=1, rows=[], recommended="eagle", by_group=rows)
    assert report.advice_scope() == "category"  # its categories (rag) say more than its domains
    assert report.advice("domain") == [("eagle", ["chat"]), ("ngram", ["summarization"])]


def _questions(folder: Path, questions: list[tuple[str, str]]) -> Path:
    pf = folder / "question.jsonl"
    pf.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) + "\n" for i, (c, t) in enumerate(questions)))
    return pf


def _cfg(tiny_pair, prompts: Path, drafter: str = "self:layers=1"):
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    return DiagnoseConfig(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(prompts), max_new_tokens=14, batch_size=3, k_max=3, keep_positions=False,
                          cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=1.0), seed=7)


def test_sweep_walks_ngram_drafters_on_the_shared_references(tiny_pair, tmp_path) -> None:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.probe.sweep import run_sweep

    pf = _questions(tmp_path, QUESTIONS)
    drafters = ["self:layers=1", str(tiny_pair["twin"]), *NGRAMS]
    sw = run_sweep(_cfg(tiny_pair, pf), drafters)
    rows = {r.drafter: r for r in sw.report.rows}
    assert sw.report.target_passes == 2  # 6 prompts in batches of 3, for the model drafters only
    assert [rows[d].kind for d in NGRAMS] == ["ngram", "ngram"]
    assert len(rows[NGRAMS[0]].speedup_by_k) == 3 and all(v is not None for v in rows[NGRAMS[0]].speedup_by_k)  # vLLM's ngram: every K
    assert rows[NGRAMS[1]].speedup_by_k[:2] == [None, None] and rows[NGRAMS[1]].speedup_by_k[2] == pytest.approx(rows[NGRAMS[1]].speedup_best)  # its own K = size_m, at K = 3
    assert sw.report.recommended in drafters

    # each n-gram result is what diagnose alone finds on the same references
    for spec, r in zip(drafters, sw.results, strict=True):
        if spec in NGRAMS:
            alone = run_diagnose(_cfg(tiny_pair, pf, spec))
            for name in ("ngram_proposal_frac", "ngram_accept_frac", "tau_tokens", "best_k"):
                assert r.metrics[name] == pytest.approx(alone.metrics[name]), (spec, name)

    # by group: every domain and category, every drafter, the fastest recommended
    res = {r.drafter.spec: r for r in sw.results}
    groups = {(g.scope, g.group): g for g in sw.report.by_group}
    first = sw.results[0]
    assert {k[1] for k in groups if k[0] == "domain"} == {r.group for r in first.by_domain}
    assert {k[1] for k in groups if k[0] == "category"} == {r.group for r in first.by_category}
    for scope in ("domain", "category"):
        assert sum(g.positions for (s, _), g in groups.items() if s == scope) == first.metrics["num_positions"]
    for g in groups.values():
        assert [e.drafter for e in g.drafters] == drafters
        priced = [e for e in g.drafters if e.speedup is not None]
        assert g.recommended == max(priced, key=lambda e: e.speedup).drafter
        # an n-gram drafter of one draft length: the group row of its result, exactly
        single = next(e for e in g.drafters if e.drafter == NGRAMS[1])
        row = next(r for r in (res[NGRAMS[1]].by_domain if g.scope == "domain" else res[NGRAMS[1]].by_category) if r.group == g.group)
        assert (single.best_k, single.tau_tokens, single.speedup) == (3, pytest.approx(row.tau_tokens), pytest.approx(row.speedup))
        # vLLM's ngram: the group's best K is at least as fast as the run's best K there
        multi = next(e for e in g.drafters if e.drafter == NGRAMS[0])
        row = next(r for r in (res[NGRAMS[0]].by_domain if g.scope == "domain" else res[NGRAMS[0]].by_category) if r.group == g.group)
        assert multi.speedup >= row.speedup - 1e-12


def test_a_group_that_is_the_whole_run_has_the_whole_runs_estimate(tiny_pair, tmp_path) -> None:
    """One category, one domain: a model drafter's per-group accumulator sees every
    sequence, so its best speedup and K are the run's own."""
    from specprobe.probe.sweep import run_sweep

    pf = _questions(tmp_path, [("summarization", t) for _, t in QUESTIONS[:4]])
    drafters = ["self:layers=1", str(tiny_pair["twin"])]
    sw = run_sweep(_cfg(tiny_pair, pf), drafters)
    assert len(sw.report.by_group) == 2
    for g in sw.report.by_group:
        for e, r in zip(g.drafters, sw.results, strict=True):
            assert e.best_k == r.best_k and e.speedup == pytest.approx(r.metrics["speedup_best"], rel=1e-9)
            assert e.tau_tokens == pytest.approx(next(k for k in r.k_table if k.k == r.best_k).tau_renewal_tokens, rel=1e-9)


def test_sweep_command_prints_and_writes_the_advice(tiny_pair, tmp_path) -> None:
    pf = _questions(tmp_path, QUESTIONS)
    res = runner.invoke(app, [
        "sweep", str(tiny_pair["target"]), NGRAMS[0], "--layers", "1", "--prompts", str(pf), "--max-new-tokens", "10", "--k-max", "3",
        "--cost-ratio", "0.1", "--verify-factor", "1", "--temperature", "1", "--json", str(tmp_path / "sweep.json"),
        "--html", str(tmp_path / "sweep.html"), "--csv", str(tmp_path / "tables"), "--fail-on", "never",
    ], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "fastest drafter by the prompt file's category" in out and "by category:" in out
    doc = SweepReport.model_validate_json((tmp_path / "sweep.json").read_text())
    cats = [g for g in doc.by_group if g.scope == "category"]
    assert {g.group for g in cats} == {c for c, _ in QUESTIONS}
    for g in cats:  # each category's row, whole
        assert next(x for x in out.splitlines() if x.split()[:1] == [g.group]).split()[2] == g.recommended
    table = pd.read_csv(tmp_path / "tables" / "sweep_groups.csv")
    assert len(table) == len(doc.by_group) * 2 and set(table.drafter) == {NGRAMS[0], "self:layers=1"}
    assert (table.groupby(["scope", "group"]).recommended.sum() == 1).all()
    html = (tmp_path / "sweep.html").read_text()
    assert 'id="by-group"' in html and "Fastest drafter by category" in html


def test_drafters_of_their_own_length_stay_out_of_the_k_table() -> None:
    import io

    from specprobe.cli.sweep_cmd import render_sweep
    from specprobe.probe.sweep import SweepRow
    from specprobe.report.terminal import console

    rows = [
        SweepRow(drafter="self:layers=16", kind="layer_skip", best_k=1, tau_tokens=1.1, speedup_best=0.57, speedup_by_k=[0.57, 0.26, 0.21], accept_prob_mean=0.095),
        SweepRow(drafter="suffix:max_spec_factor=2,min_token_prob=0.05,k=16", kind="ngram", best_k=16, tau_tokens=1.47, speedup_best=1.13, speedup_by_k=[None] * 15 + [1.13]),
    ]
    report = SweepReport(created="now", target="t", reference="on-policy", num_prompts=1, num_positions=10, target_passes=1, rows=rows, recommended=rows[1].drafter)
    buf = io.StringIO()
    render_sweep(report, console(file=buf, width=80))
    lines = buf.getvalue().splitlines()
    assert max(len(x) for x in lines) <= 80
    table = lines[lines.index("estimated speedup by draft length K") :]
    assert any(x.split()[:1] == ["self:layers=16"] for x in table)
    assert not any(x.split()[:1] == [rows[1].drafter] for x in table) and "K=16" not in buf.getvalue()
    top = next(x for x in lines if rows[1].drafter in x)
    assert "16" in top.split() and "1.13×" in top  # its own K and speedup, in the first table
