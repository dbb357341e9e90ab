"""Tables by the prompt file's own categories, and long-context decay read within each
domain (so a suite whose long prompts are all one domain does not fake a decay)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specprobe.metrics.accumulate import FIELDS, Accumulator

DATA = Path(__file__).parent / "data" / "prompts"


def _seq(alpha: float, n: int) -> dict[str, np.ndarray]:
    vals = {f: np.zeros(n) for f in FIELDS}
    vals["accept_prob"] = np.full(n, alpha)
    return vals


def test_domain_mix_is_not_a_long_context_decay() -> None:
    """Chat prompts are short and easy (α .9), summarisation prompts long and hard (α .3),
    neither decays with position: the old all-prompts ratio read .33, the within-domain
    ratio reads 1."""
    acc = Accumulator(k_max=2)
    for _ in range(4):
        acc.add_sequence("chat", np.arange(10, 74), _seq(0.9, 64))
        acc.add_sequence("summarization", np.arange(600, 664), _seq(0.3, 64))
    pos = acc.by_position()
    assert pos[-1]["accept_prob_mean"] / pos[0]["accept_prob_mean"] == pytest.approx(1 / 3)
    assert acc.long_context_ratio() == pytest.approx(1.0)


def test_decay_within_a_domain_is_measured() -> None:
    """α falls from .8 to .4 along long chat contexts: the ratio is .5."""
    acc = Accumulator(k_max=2)
    for _ in range(2):
        positions = np.arange(0, 1100)
        alpha = np.where(positions < 512, 0.8, 0.4)
        vals = _seq(0.0, len(positions))
        vals["accept_prob"] = alpha
        acc.add_sequence("chat", positions, vals)
    assert acc.long_context_ratio() == pytest.approx(0.5)


def test_categories_are_kept_beside_domains_and_merge() -> None:
    a, b = Accumulator(k_max=2), Accumulator(k_max=2)
    a.add_sequence("chat", np.arange(5), _seq(0.5, 5), category="mt_bench_writing")
    b.add_sequence("chat", np.arange(5), _seq(1.0, 5), category="mt_bench_roleplay")
    b.add_sequence("code", np.arange(5), _seq(1.0, 5))  # no category: its domain stands in
    a.merge(b)
    cats = {r["group"]: r["accept_prob_mean"] for r in a.by_category()}
    assert cats == {"mt_bench_writing": 0.5, "mt_bench_roleplay": 1.0, "code": 1.0}
    assert [r["group"] for r in a.by_domain()] == ["chat", "code"]
    back = Accumulator.from_state(a.to_state())
    assert {r["group"] for r in back.by_category()} == set(cats)
    assert back.long_context_ratio() != back.long_context_ratio()  # nan: no domain spans two buckets


def test_old_state_without_categories_still_loads() -> None:
    acc = Accumulator(k_max=2)
    acc.add_sequence("chat", np.arange(5), _seq(0.5, 5))
    state = acc.to_state()
    state.pop("categories")
    state.pop("domain_position")
    back = Accumulator.from_state(state)
    assert back.by_category() == [] and back.by_domain()[0]["positions"] == 5


def test_spec_bench_results_are_tabulated_by_its_own_categories(tiny_pair, tmp_path) -> None:
    """A diagnose run on a Spec-Bench-shaped question file reports its categories (the
    first 80 are MT-Bench's, with two turns each) beside the folded domains."""
    import json

    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags

    cats = [json.loads(ln).get("category") for ln in (DATA / "spec_bench_question.jsonl").read_text().splitlines() if ln.strip()]
    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self", prompts=str(DATA / "spec_bench_question.jsonl"), max_new_tokens=3, batch_size=8, sampling=SamplingFlags(temperature=1.0), keep_positions=False, cost_ratio=0.1)
    r = run_diagnose(cfg)
    got = {row.group for row in r.by_category}
    assert got == {c for c in cats if c}
    assert r.categories  # more than the domains say
    assert len(r.by_domain) < len(r.by_category)
    from specprobe.report.markdown import render_markdown

    md = render_markdown(r)
    assert "α by the prompt file's category" in md and "math_reasoning" in md
