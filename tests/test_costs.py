"""The cost model: timing with warm-up, interleaved repeats and the median (driven by a
fake clock — never by wall time), round costs K·c + v_K, the overrides reproduced
exactly, speedup per (batch size, K), the SP304/SP305 findings, simulate's calibration
columns, and compare at a fixed K."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from specprobe.estimates import costs, estimate
from specprobe.judge.rules import load_table
from specprobe.probe import timing


class FakeClock:
    """A clock that moves only when a timed call says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _calls(clock: FakeClock, durations: dict[str, list[float]], log: list[str]) -> dict[str, Any]:
    """Functions that log their name and advance the clock by their next duration."""
    it = {name: iter(d) for name, d in durations.items()}

    def make(name: str) -> Any:
        def run() -> None:
            log.append(name)
            clock.now += next(it[name])

        return run

    return {name: make(name) for name in durations}


# ----------------------------------------------------------------------------- timing
def test_warm_up_then_interleaved_repeats_in_the_same_order() -> None:
    clock, log = FakeClock(), []
    calls = _calls(clock, {"a": [9.0, 1.0, 1.0, 1.0], "b": [9.0, 2.0, 2.0, 2.0]}, log)
    s = costs.interleaved(calls, clock=clock, warmup=1, min_repeats=3, max_repeats=3)
    assert log == ["a", "b"] * 4  # one warm-up round, then A B A B A B
    assert s.times == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}  # the warm-up is not timed
    assert s.repeats == 3 and s.elapsed_s == pytest.approx(18 + 9) and not s.stopped_by_budget


def test_repeating_stops_when_the_budget_is_spent_but_never_before_min_repeats() -> None:
    clock = FakeClock()
    calls = _calls(clock, {"a": [1.0] * 20, "b": [2.0] * 20}, [])
    # warm-up 3 s, each repeat 3 s: at the start of repeat 4 the 10 s budget is spent
    s = costs.interleaved(calls, clock=clock, min_repeats=3, max_repeats=15, budget_s=10.0)
    assert s.repeats == 3 and s.stopped_by_budget
    clock = FakeClock()
    calls = _calls(clock, {"a": [1.0] * 20, "b": [2.0] * 20}, [])
    s = costs.interleaved(calls, clock=clock, min_repeats=3, max_repeats=15, budget_s=0.5)  # spent before any repeat
    assert s.repeats == 3 and s.stopped_by_budget
    clock = FakeClock()
    calls = _calls(clock, {"a": [1.0] * 20, "b": [2.0] * 20}, [])
    s = costs.interleaved(calls, clock=clock, min_repeats=3, max_repeats=5, budget_s=1e9)
    assert s.repeats == 5 and not s.stopped_by_budget


def test_per_repeat_ratios_cancel_drift_and_the_median_ignores_a_spike() -> None:
    # The machine slows down over the run (every call 1.5× slower each repeat) and one
    # repeat of the drafter is hit by another job (4.38× its time).
    clock = FakeClock()
    target = [1.0 * 1.5**i for i in range(6)]
    draft = [0.3 * 1.5**i for i in range(6)]
    draft[3] *= 4.38
    calls = _calls(clock, {"target": target, "draft": draft, "verify1": [2 * t for t in target]}, [])
    s = costs.interleaved(calls, clock=clock, warmup=1, min_repeats=5, max_repeats=5)
    b = costs.batch_timings(s, k_max=1, batch_size=4)
    # call 0 was the warm-up, so the spike (call 3) is repeat 2; the slow-down cancels in every ratio
    assert b["draft_ratios"] == pytest.approx([0.3, 0.3, 0.3 * 4.38, 0.3, 0.3])
    rounds = estimate.round_costs(1, draft_ratios=b["draft_ratios"], verify_ratios=b["verify_ratios"])
    assert rounds[0].verify_factor == pytest.approx(2.0)
    assert rounds[0].cost == pytest.approx(0.3 + 2.0)  # the median: drift and spike gone
    assert rounds[0].low == pytest.approx(2.3) and rounds[0].high == pytest.approx(2.3)  # one spike of 5 stays outside the quartiles
    assert b["target_step"]["repeats"] == 5 and b["target_step"]["min_ms"] < b["target_step"]["median_ms"] < b["target_step"]["max_ms"]


def test_no_repeat_starts_that_would_end_past_the_cap() -> None:
    clock = FakeClock()
    calls = _calls(clock, {"a": [1.0] * 20, "b": [2.0] * 20}, [])
    # warm-up 3 s + repeat 3 s = 6 s; a second repeat would end at 9 s > the 8 s cap
    s = costs.interleaved(calls, clock=clock, min_repeats=3, max_repeats=15, budget_s=2.0, cap_s=8.0)
    assert s.repeats == 1 and s.stopped_by_budget and s.elapsed_s == pytest.approx(6.0)
    clock = FakeClock()
    calls = _calls(clock, {"a": [1.0] * 20, "b": [2.0] * 20}, [])
    s = costs.interleaved(calls, clock=clock, min_repeats=3, max_repeats=15, cap_s=0.1)  # the first repeat always runs
    assert s.repeats == 1


def test_budget_and_cap_are_fractions_of_the_scoring_time() -> None:
    assert costs.budget_for(100.0) == pytest.approx((costs.BUDGET_FRACTION * 100.0, costs.CAP_FRACTION * 100.0))
    assert costs.budget_for(0.1) == (costs.MIN_BUDGET_S, costs.MIN_BUDGET_S)
    assert all(math.isinf(x) for x in costs.budget_for(None))


def test_context_is_the_median_prompt_plus_half_its_continuation() -> None:
    assert timing.context_length([10, 20, 30], [40, 40, 40]) == 40
    assert timing.context_length([], []) == 64


# ----------------------------------------------------------------------------- overrides
@pytest.mark.parametrize("c,v", [(0.1, 1.0), (0.37, 1.5), (1.0, 0.8)])
def test_the_cost_model_reproduces_the_overrides_exactly(c: float, v: float) -> None:
    cum = [0.9, 0.75, 0.6, 0.4]
    renewal = [1.85, 2.5, 3.0, 3.3]
    plain = estimate.k_table(cum, 0.8, c, v, renewal)
    rounds = estimate.round_costs(4, cost_ratio=c, verify_factor=v)
    assert [r.cost for r in rounds] == [(1 + k * c) * v for k in range(1, 5)]
    modelled = estimate.k_table(cum, 0.8, c, v, renewal, rounds=rounds)
    for a, b in zip(plain, modelled, strict=True):
        assert a.speedup == b.speedup == estimate.speedup(renewal[a.k - 1], a.k, c, v)
        assert a.speedup_window == b.speedup_window == estimate.speedup(a.tau_tokens, a.k, c, v)
    # through the whole pricing, with nothing timed: the models are never touched
    untouchable = SimpleNamespace()
    raw = timing.cost_block(untouchable, untouchable, c, verify_factor=v, k_max=4, batch_sizes=[1, 8])
    assert not raw["measured"] and [b["batch_size"] for b in raw["batches"]] == [1, 8]
    p = costs.price(raw, cumulative=cum, alpha_mean=0.8, renewal=renewal, k_max=4, batch_size=8, cost_ratio=c, verify_factor=v, origins={"cost_ratio": "--cost-ratio", "verify_factor": "probe.yaml"})
    assert [r.speedup for r in p.k_table] == [estimate.speedup(renewal[k - 1], k, c, v) for k in range(1, 5)]
    assert p.section["sources"] == {"cost_ratio": "--cost-ratio", "verify_factor": "probe.yaml"}
    assert p.section["verify_factor"] == v and p.metrics["cost_ratio"] == c
    assert p.metrics["cost_spread_rel"] is None and p.metrics["speedup_best_low"] is None  # nothing timed, no spread
    bare = costs.price(raw, cumulative=cum, alpha_mean=0.8, renewal=renewal, k_max=4, batch_size=8, cost_ratio=c, verify_factor=v)
    assert bare.section["sources"] == {"cost_ratio": "given", "verify_factor": "given"}


def test_one_override_keeps_the_other_side_measured() -> None:
    dr = [0.2, 0.25, 0.3]
    vr = [[1.2, 1.3, 1.4], [1.5, 1.6, 1.7]]
    # --cost-ratio: c fixed, v_K measured per repeat -> K·c + v_K
    rc = estimate.round_costs(2, draft_ratios=dr, verify_ratios=vr, cost_ratio=0.1)
    assert [r.cost for r in rc] == pytest.approx([0.1 + 1.3, 0.2 + 1.6])
    assert [r.verify_factor for r in rc] == pytest.approx([1.3, 1.6])
    # --verify-factor: v fixed, c measured per repeat -> (1 + K·c)·v, the given formula
    rc = estimate.round_costs(2, draft_ratios=dr, verify_ratios=vr, verify_factor=1.5)
    assert [r.cost for r in rc] == pytest.approx([(1 + 0.25) * 1.5, (1 + 2 * 0.25) * 1.5])
    # both measured: per repeat K·c_i + v_K,i, then the median
    rc = estimate.round_costs(2, draft_ratios=dr, verify_ratios=vr)
    assert [r.cost for r in rc] == pytest.approx([0.25 + 1.3, 0.5 + 1.6])
    assert rc[1].low == pytest.approx(np.quantile([1.9, 2.1, 2.3], 0.25)) and rc[1].high == pytest.approx(np.quantile([1.9, 2.1, 2.3], 0.75))


# ----------------------------------------------------------------------------- batch sizes
def _raw(batches: dict[int, tuple[list[float], list[list[float]]]]) -> dict[str, Any]:
    return {
        "measured": True, "context_tokens": 100, "budget_s": 10.0, "elapsed_s": 3.0, "stopped_by_budget": False, "notes": [],
        "batches": [{"batch_size": b, "repeats": len(dr), "draft_ratios": dr, "verify_ratios": vr} for b, (dr, vr) in batches.items()],
    }


def test_speedup_by_batch_size_and_the_rule_when_it_stops_paying() -> None:
    cum = [0.8, 0.6, 0.45, 0.3]
    renewal = [1.8, 2.35, 2.7, 2.95]
    raw = _raw({
        1: ([0.1] * 3, [[1.0] * 3, [1.02] * 3, [1.05] * 3, [1.08] * 3]),  # memory-bound: verifying is nearly free
        32: ([0.3] * 3, [[1.9] * 3, [2.8] * 3, [3.7] * 3, [4.6] * 3]),  # compute-bound: every token costs
    })
    p = costs.price(raw, cumulative=cum, alpha_mean=0.7, renewal=renewal, k_max=4, batch_size=1)
    by = {b["batch_size"]: b for b in p.section["batches"]}
    assert by[1]["speedup_best"] > 1.5 and by[32]["speedup_best"] < 1.0
    assert by[32]["best_k"] == 1 and by[1]["best_k"] > 1
    row = by[32]["rows"][1]  # K = 2 at batch 32
    assert row["round_cost"] == pytest.approx(2 * 0.3 + 2.8) and row["speedup"] == pytest.approx(2.35 / (2 * 0.3 + 2.8))
    assert p.metrics["batch_size_no_speedup"] == 32 and p.metrics["cost_batch_size"] == 1
    assert p.metrics["speedup_best"] == by[1]["speedup_best"]  # the headline: the run's batch size
    fired = {f.rule_id for f in load_table().findings(p.metrics)}
    assert "SP305" in fired and "SP301" not in fired
    # at the batch size that does not pay, the headline itself is the SP301 finding
    p32 = costs.price(raw, cumulative=cum, alpha_mean=0.7, renewal=renewal, k_max=4, batch_size=32)
    fired = {f.rule_id for f in load_table().findings(p32.metrics)}
    assert "SP301" in fired and "SP305" not in fired


def test_a_spread_that_straddles_one_is_a_finding() -> None:
    cum, renewal = [0.5], [1.5]
    steady = _raw({8: ([0.3, 0.31, 0.3, 0.29, 0.3], [[1.15, 1.16, 1.14, 1.15, 1.15]])})
    noisy = _raw({8: ([0.3, 0.9, 0.3, 0.1, 0.5], [[1.1, 1.4, 1.0, 1.2, 1.6]])})
    for raw, fires in ((steady, False), (noisy, True)):
        p = costs.price(raw, cumulative=cum, alpha_mean=0.5, renewal=renewal, k_max=1, batch_size=8)
        assert p.metrics["speedup_best_low"] <= p.metrics["speedup_best"] <= p.metrics["speedup_best_high"]
        assert ("SP304" in {f.rule_id for f in load_table().findings(p.metrics)}) is fires


def test_a_drafter_that_could_not_be_timed_counts_as_free_and_says_so() -> None:
    raw = _raw({1: ([], [[1.1, 1.1, 1.1]])})
    p = costs.price(raw, cumulative=[0.5], alpha_mean=0.5, renewal=[1.5], k_max=1, batch_size=1)
    assert p.cost_ratio == 0.0 and p.k_table[0].speedup == pytest.approx(1.5 / 1.1)
    assert p.section["sources"]["cost_ratio"].startswith("not measured")


def test_batch_sizes_flag_and_config_key() -> None:
    from specprobe.core.errors import ConfigError
    from specprobe.settings.config import probe_config_from_mapping
    from specprobe.settings.options import merge
    from specprobe.settings.values import parse_batch_sizes

    assert parse_batch_sizes("32, 1,8") == [1, 8, 32]
    with pytest.raises(ConfigError):
        parse_batch_sizes("1,0")
    assert probe_config_from_mapping({"batch-sizes": 16}).batch_sizes == [16]
    opts = merge("diagnose", {"target": "t", "drafter": "d", "batch_sizes": "1,32", "batch_size": 8, "cost_ratio": 0.2, "verify_factor": None}, {"target", "drafter", "batch_sizes", "cost_ratio"})
    cfg = opts.diagnose_config()
    assert cfg.cost_batch_sizes() == [1, 8, 32] and cfg.verify_factor is None
    assert cfg.cost_origins == {"cost_ratio": "--cost-ratio"} and "cost_origins" not in cfg.to_dict()


# ----------------------------------------------------------------------------- timing a real model (fake clock)
def _tiny_model(layers: int = 2) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_the_timed_passes_run_over_the_same_context_every_time() -> None:
    import torch

    model = _tiny_model()
    with torch.inference_mode():
        dec = timing._Decoder(model, batch=3, context=11, device="cpu", gen=torch.Generator().manual_seed(0))
        run = dec.call(5)
        for _ in range(3):
            run()
            assert dec.stream.length == 11 and dec.stream.cache.get_seq_length() == 11
    assert dec.stream.calls == 4  # prefill + three timed passes over 5 new tokens per row


def test_cost_block_times_every_k_at_every_batch_size() -> None:
    target_model, draft_model = _tiny_model(2), _tiny_model(1)
    target = SimpleNamespace(model=target_model, device="cpu", config=target_model.config, vocab_size=128)
    drafter = SimpleNamespace(step_model=lambda: draft_model)
    clock = FakeClock()

    def tick() -> float:  # every reading moves the fake clock on: no wall time anywhere
        clock.now += 0.001
        return clock.now

    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[2, 1, 2], context_tokens=9, budget_s=0.0, clock=tick)
    assert raw["measured"] and [b["batch_size"] for b in raw["batches"]] == [1, 2]
    for b in raw["batches"]:
        assert b["repeats"] == costs.MIN_REPEATS  # the budget is spent at once: the minimum
        assert len(b["draft_ratios"]) == costs.MIN_REPEATS and len(b["verify_ratios"]) == 3
        assert all(len(v) == costs.MIN_REPEATS for v in b["verify_ratios"])
    # only the verify passes are timed when the cost ratio is given
    raw = timing.cost_block(target, drafter, 0.2, k_max=2, batch_sizes=[1], context_tokens=9, budget_s=0.0, clock=tick)
    assert raw["batches"][0]["draft_ratios"] == [] and len(raw["batches"][0]["verify_ratios"]) == 2


# ----------------------------------------------------------------------------- simulate: calibration
def test_simulate_puts_window_renewal_and_measured_side_by_side() -> None:
    from specprobe.probe.assemble import measured_metrics
    from specprobe.result import Measured
    from specprobe.simulate.counters import SimCounters
    from specprobe.simulate.pipeline import estimate_by_k, measured_section

    rows = estimate.k_table([0.8, 0.6], 0.7, 0.1, 1.0, renewal=[1.7, 2.1])
    est = estimate_by_k(rows)
    assert est[2] == (2.1, pytest.approx(2.4), rows[1].speedup)
    c = SimCounters(2, num_drafts=100, drafted_tokens=200, accepted_tokens=110, emitted_tokens=210, verify_steps=100, wall_s=2.0)
    c.accepted_at, c.drafted_at = np.array([65.0, 45.0]), np.array([100.0, 100.0])
    base = SimCounters(0, emitted_tokens=210, wall_s=3.0)
    m = Measured.model_validate(measured_section([c], base, None, est))
    row = m.k_table[0]
    assert row.tau_tokens == pytest.approx(2.1) and row.tau_estimate == 2.1 and row.tau_window == pytest.approx(2.4)
    assert row.speedup == pytest.approx(1.5) and row.speedup_gap == pytest.approx((rows[1].speedup - 1.5) / 1.5)
    metrics = measured_metrics(m)
    assert metrics["tau_estimated_tokens"] == 2.1 and metrics["tau_gap_rel_abs"] == pytest.approx(0.0)  # SP601 reads the renewal τ
    assert metrics["speedup_gap_rel_abs"] == pytest.approx(abs(rows[1].speedup - 1.5) / 1.5)
    fired = {f.rule_id for f in load_table().findings({**metrics, "num_drafts_measured": 100})}
    assert ("SP603" in fired) is (metrics["speedup_gap_rel_abs"] > 0.15) and "SP601" not in fired


# ----------------------------------------------------------------------------- compare at a fixed K
def _repriced(r: Any, cost_ratio: float) -> Any:
    """The same result as if only its measured cost ratio had come out differently."""
    cum = list(r.depth.cumulative)
    renewal = [row.tau_renewal_tokens for row in r.k_table]
    rows = estimate.k_table(cum, r.metrics["accept_prob_mean"], cost_ratio, 1.0, renewal)
    best = estimate.best_k(rows)
    from dataclasses import asdict

    metrics = {**r.metrics, "cost_ratio": cost_ratio, "best_k": best.k, "speedup_best": best.speedup, "tau_tokens": estimate.headline_tau(best), "tau_window_tokens": best.tau_tokens}
    return r.model_copy(update={
        "drafter": r.drafter.model_copy(update={"spec": "same-drafter-other-timing"}),
        "k_table": [type(r.k_table[0]).model_validate(asdict(x)) for x in rows],
        "metrics": metrics,
        "cost": r.cost.model_copy(update={"cost_ratio": cost_ratio}),
    })


def test_compare_at_a_fixed_k_does_not_flip_when_only_the_cost_changes(real_results: Any) -> None:
    from specprobe.judge.compare import compare_results, judge

    table = load_table()
    base = _repriced(real_results.twin, 0.05)  # a cheap drafter: its best K is deep
    cand = _repriced(real_results.twin, 3.0)  # the same drafter, timed on a busy machine
    assert cand.best_k != base.best_k and cand.metrics["tau_tokens"] < 0.5 * base.metrics["tau_tokens"]  # each at its best K: a "regression"
    plain = judge(compare_results(base, base.model_copy(update={"drafter": cand.drafter}), table=table), table)
    comp = judge(compare_results(base, cand, table=table), table)
    assert comp.metrics["compare_k"] == base.best_k and comp.metrics["tau_rel_drop_frac"] == 0.0
    assert comp.verdict == plain.verdict and {f.rule_id for f in comp.findings} == {f.rule_id for f in plain.findings}
    # the speedup at that K moved with the cost, and is reported, not gated
    assert comp.metrics["speedup_rel_change"] < -0.5
    # at the config's K as well
    comp = judge(compare_results(base, cand, table=table, ks=[2]), table)
    assert comp.metrics["compare_k"] == 2 and comp.config.k == [2] and "SP505" not in {f.rule_id for f in comp.findings}


def test_compare_at_a_fixed_k_still_catches_a_tau_regression(real_results: Any) -> None:
    from specprobe.judge.compare import compare_results, judge

    table = load_table()
    base = real_results.twin
    k = base.best_k
    worse = [row.model_copy(update={"tau_renewal_tokens": 1 + 0.7 * (row.tau_renewal_tokens - 1)}) for row in base.k_table]
    cand = base.model_copy(update={"drafter": base.drafter.model_copy(update={"spec": "worse"}), "k_table": worse})
    comp = judge(compare_results(base, cand, table=table), table)
    assert comp.metrics["compare_k"] == k and comp.metrics["tau_rel_drop_frac"] > 0.15
    assert "SP505" in {f.rule_id for f in comp.findings}


# ----------------------------------------------------------------------------- reports
def test_reports_show_the_speedup_by_batch_size(real_results: Any) -> None:
    from io import StringIO

    from specprobe.report import terminal
    from specprobe.report.console import render
    from specprobe.report.html import render_html
    from specprobe.report.markdown import render_markdown
    from specprobe.result import Cost

    r = real_results.twin
    raw = _raw({1: ([0.1] * 3, [[1.0] * 3] * 4), 32: ([0.3] * 3, [[1.9] * 3, [2.8] * 3, [3.7] * 3, [4.6] * 3])})
    renewal = [row.tau_renewal_tokens for row in r.k_table]
    p = costs.price(raw, cumulative=list(r.depth.cumulative), alpha_mean=r.metrics["accept_prob_mean"], renewal=renewal, k_max=4, batch_size=1)
    r = r.model_copy(update={"cost": Cost.model_validate(p.section)})
    buf = StringIO()
    render(r, terminal.console(file=buf, width=80))
    text = buf.getvalue()
    assert "estimated speedup by batch size and K" in text and "◀ run" in text
    assert max(len(line) for line in text.splitlines()) <= 80
    by32 = next(b for b in r.cost.batches if b.batch_size == 32)
    assert f"{by32.speedup_best:.2f}×" in text
    md = render_markdown(r)
    assert "Estimated speedup by batch size and K" in md and "| 32 |" in md
    page = render_html(r)
    assert 'id="chart-batch"' in page and "batch 32" in page


@pytest.mark.parametrize("layout", ["eagle3", "eagle1", "medusa", "mtp"])
def test_a_head_drafters_step_is_timed(layout: str, tiny_pair: Any, tmp_path: Any) -> None:
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model
    from tests.helpers import heads as hh

    t = tiny_pair["target"]
    target_path, spec = {
        "eagle3": lambda: (t, str(hh.eagle3_speculators(tmp_path / "e3", t, vd=150))),
        "eagle1": lambda: (t, str(hh.eagle1(tmp_path / "e1", t))),
        "medusa": lambda: (t, str(hh.medusa_fasterdecoding(tmp_path / "m", t))),
        "mtp": lambda: (hh.target_with_mtp(tmp_path / "t", t, "deepseek"), "mtp"),
    }[layout]()
    target = load_model(str(target_path), "cpu", "float32")
    drafter = build_drafter(spec, target)
    assert drafter.step_model() is None  # a head: its features and logits are what is timed
    clock = FakeClock()

    def tick() -> float:
        clock.now += 0.001
        return clock.now

    raw = timing.cost_block(target, drafter, None, k_max=2, batch_sizes=[2], context_tokens=6, budget_s=0.0, clock=tick)
    assert len(raw["batches"][0]["draft_ratios"]) == costs.MIN_REPEATS, raw["notes"]


def test_simulate_compares_the_measurement_with_the_speedup_at_its_own_token_budget() -> None:
    from specprobe.simulate.pipeline import estimate_by_k

    # one sequence of 10 tokens, α = 0.6 throughout, K ≤ 2: the renewal sums of a real run
    cnt = estimate.renewal_counts(np.full((2, 10), 0.6))
    raw = {"measured": True, "batches": [{"batch_size": 1, "repeats": 3, "draft_ratios": [0.3, 0.3, 0.3], "verify_ratios": [[1.1] * 3, [1.2] * 3]}]}
    renewal = estimate.renewal_tau(cnt.accepted, cnt.drafted).tolist()
    priced = costs.price(raw, cumulative=[0.6, 0.36], alpha_mean=0.6, renewal=renewal, k_max=2, batch_size=1, budget=(cnt.tokens, cnt.rounds, cnt.drafted))
    for row in priced.k_table:
        k = row.k
        expected = 10 / estimate.budget_cost(float(cnt.rounds[k - 1]), cnt.drafted[k - 1, :k], 0.3, [1.1, 1.2])
        assert row.speedup_budget == pytest.approx(expected)
        assert row.speedup == pytest.approx(renewal[k - 1] / (k * 0.3 + [1.1, 1.2][k - 1]))  # the headline stays the steady state
    assert estimate_by_k(priced.k_table)[2][2] == pytest.approx(priced.k_table[1].speedup_budget)
    # without the renewal sums (an old result) simulate falls back to the steady state
    plain = costs.price(raw, cumulative=[0.6, 0.36], alpha_mean=0.6, renewal=renewal, k_max=2, batch_size=1)
    assert math.isnan(plain.k_table[1].speedup_budget) and estimate_by_k(plain.k_table)[2][2] == plain.k_table[1].speedup
