"""Standard errors over prompts (specprobe.metrics.uncertainty): the estimate's depth curve
and the loop's τ, acceptance and per-position rates each match a bootstrap over prompts;
the sums survive shards and older saved states; `simulate --seeds N` pools the seeds per
prompt (Ctrl-C keeps the seeds it finished); the reports print every figure ± its SE."""

from __future__ import annotations

import io
import math
from dataclasses import replace

import numpy as np
import pytest

from specprobe.metrics.accumulate import FIELDS, Accumulator
from specprobe.metrics.uncertainty import AGREE_SE, MIN_DRAFTS, combined_z, thin
from specprobe.simulate.counters import SimCounters
from tests.test_live import (
    _acc,  # prompts of random acceptance, as the live check's tests make them
)

BOOT = 3000


def test_the_depth_curve_se_matches_a_bootstrap_over_prompts_and_survives_shards() -> None:
    rng = np.random.default_rng(3)
    parts = [_acc(seed=s, prompts=1) for s in range(40)]
    whole = Accumulator(k_max=4, drafting="greedy")
    for p in parts:
        whole.merge(Accumulator.from_state(p.to_state()))  # what shards and resumed chunks do
    s = np.array([p.depth_sum for p in parts])  # [prompts, depth] Σ_t r_j(t)
    c = np.array([p.depth_count for p in parts])
    boot = [s[ix].sum(0) / c[ix].sum(0) for ix in (rng.integers(0, 40, 40) for _ in range(BOOT))]
    assert whole.depth_se() == pytest.approx(np.std(boot, axis=0), rel=0.15)  # the linearised SE is the bootstrap's, to its own noise
    assert whole.cumulative_depth() == pytest.approx(s.sum(0) / c.sum(0))
    assert whole.depth_thin() == [False] * 4  # 40 prompts, ~1,500 windows a depth, SE ≪ rate
    assert np.isnan(parts[0].depth_se()).all() and all(parts[0].depth_thin())  # one prompt: no spread to read


def test_a_state_saved_before_the_depth_sums_gives_nan_not_a_crash() -> None:
    new = _acc(seed=0, prompts=5)
    old = {k: v for k, v in new.to_state().items() if k not in ("depth_sq", "depth_prompts")}
    loaded = Accumulator.from_state(old)
    assert np.isnan(loaded.depth_se()).all() and loaded.depth_thin() == []
    merged = Accumulator.from_state(new.to_state()).merge(loaded)  # part of the data without the sums: none
    assert np.isnan(merged.depth_se()).all() and merged.depth_thin() == []
    assert merged.cumulative_depth() == pytest.approx(new.cumulative_depth())  # the rates themselves stand


def test_the_thin_rule() -> None:
    enough = [10, 10, 10, 10, 1, 10]
    drafts = [200, 200, 200, 200, 200, MIN_DRAFTS - 1]
    got = thin([0.5, 0.1, 0.0, 0.02, 0.5, 0.5], [0.05, 0.1, 0.0, math.nan, 0.05, 0.05], enough, drafts)
    # read; SE as large as the rate; 0 ± 0 over enough drafts is read (nothing accepted);
    # no SE; one prompt; too few drafts
    assert got == [False, True, False, True, True, True]
    assert combined_z(0.3, 0.1, 0.2) == pytest.approx(0.3 / math.hypot(0.1, 0.2))
    assert math.isnan(combined_z(0.3, math.nan, 0.2)) and AGREE_SE == 2


def _loop_counts(seed: int, prompts: int = 30, k: int = 3, steps: int = 12) -> SimCounters:
    """Counters of a made-up loop: each prompt its own acceptance, drafts of K or shorter."""
    rng = np.random.default_rng(seed)
    c = SimCounters(k)
    c.open_units(prompts)
    level = rng.uniform(0.2, 0.9, prompts)
    for _ in range(steps):
        rows = list(range(prompts))
        drafted = rng.integers(1, k + 1, prompts)
        accepted = np.minimum(rng.geometric(1 - level) - 1, drafted)
        c.count_units(rows, accepted, drafted)
        depth = np.arange(k)[None, :]
        c.verify_steps += prompts
        c.num_drafts += int((drafted > 0).sum())
        c.drafted_tokens += int(drafted.sum())
        c.accepted_tokens += int(accepted.sum())
        c.accepted_at += (accepted[:, None] > depth).sum(0)
        c.drafted_at += (drafted[:, None] > depth).sum(0)
    c.prompts = prompts
    return c


def _resampled(c: SimCounters, ix: np.ndarray) -> SimCounters:
    k = c.k
    u = c.units[ix]
    return replace(c, units=u, accepted_tokens=int(u[:, 0].sum()), drafted_tokens=int(u[:, 1].sum()), num_drafts=int(u[:, 2].sum()),
                   accepted_at=u[:, 3 : 3 + k].sum(0), drafted_at=u[:, 3 + k :].sum(0))


@pytest.mark.parametrize("early_stop", [False, True])
def test_the_loops_standard_errors_match_a_bootstrap_over_prompts(early_stop: bool) -> None:
    rng = np.random.default_rng(5)
    c = replace(_loop_counts(seed=1), early_stop=early_stop)
    assert c.units[:, 0].sum() == c.accepted_tokens and (c.units[:, 3:6].sum(0) == c.accepted_at).all()  # the per-prompt rows add up to the counters
    boot = [_resampled(c, rng.integers(0, 30, 30)) for _ in range(BOOT)]
    assert c.tau_se == pytest.approx(np.std([b.tau_tokens for b in boot]), rel=0.15)
    assert c.accept_rate_se == pytest.approx(np.std([b.accept_rate for b in boot]), rel=0.15)
    assert c.cumulative_se() == pytest.approx(np.std([b.cumulative() for b in boot], axis=0), rel=0.15)
    assert c.thin() == [False, False, False]


def test_seeds_pool_into_each_prompts_own_row() -> None:
    a, b = _loop_counts(seed=1), _loop_counts(seed=2)
    drafts = a.num_drafts + b.num_drafts
    pooled = a.add(b)
    assert pooled.seeds == 2 and pooled.num_drafts == drafts and pooled.unit_prompts == 30  # clustered by prompt: still 30 units
    assert pooled.units[:, 2].sum() == drafts
    with pytest.raises(ValueError, match="share K and prompts"):
        pooled.add(_loop_counts(seed=3, prompts=10))


def test_simulate_seeds_pools_them_keeps_finished_seeds_on_ctrl_c_and_reports_every_se(tiny_pair, tmp_path, monkeypatch) -> None:
    """Seeds 0 and 1 pooled are seed 0 and seed 1 run apart, added; Ctrl-C in the second
    seed keeps the first whole; the result carries each SE, the reports print them within
    100 columns, and the estimate's speedup SE is its τ's, scaled."""
    from rich.console import Console

    import specprobe.simulate.pipeline as sim
    from specprobe.report.console import measured_tables, render
    from specprobe.report.csv_out import tables
    from specprobe.report.markdown import render_markdown
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")

    def cfg(seed: int, seeds: int) -> SimulateConfig:
        d = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=16, batch_size=3, keep_positions=False, seed=seed,
                           k_max=3, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=1.0))
        return SimulateConfig(d, ks=[3], baseline=False, seeds=seeds)

    both = sim.run_simulate(cfg(0, 2))
    second = sim.run_simulate(cfg(1, 1))
    real, calls = sim.speculate, {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:  # Ctrl-C in seed 1 of 2
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(sim, "speculate", flaky)
    first = sim.run_simulate(cfg(0, 2))
    monkeypatch.setattr(sim, "speculate", real)

    row, one, two = both.measured.k_table[0], first.measured.k_table[0], second.measured.k_table[0]
    assert first.interrupted and one.seeds == 1 and two.seeds == 1 and row.seeds == 2
    assert row.num_drafts == one.num_drafts + two.num_drafts and row.emitted_tokens == one.emitted_tokens + two.emitted_tokens
    assert row.prompts == one.prompts == both.metrics["num_prompts"]  # prompts, not prompts × seeds
    assert both.config.seeds == 2
    for r in (row, one):
        assert r.tau_se > 0 and r.accept_rate_se > 0 and r.tau_estimate_se > 0
    est = next(k for k in both.k_table if k.k == 3)
    assert row.tau_estimate_se == est.tau_renewal_se
    assert est.speedup_se == pytest.approx(est.speedup * est.tau_renewal_se / est.tau_renewal_tokens)
    assert both.metrics["tau_gap_z"] == pytest.approx((row.tau_estimate - row.tau_tokens) / math.hypot(row.tau_se, row.tau_estimate_se))
    assert abs(both.metrics["tau_gap_z"]) <= AGREE_SE  # the estimate-versus-loop check: within 2 standard errors of the difference
    d, md = both.depth, both.measured.depth
    assert len(d.cumulative_se) == 3 and len(d.thin) == 3 and len(md.cumulative_se) == 3 and len(md.thin) == 3

    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False, color_system=None)
    render(both, console)
    measured_tables(both, console)
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert f"{row.tau_tokens:.2f} ± {row.tau_se:.2f}" in text and f"({row.prompts} prompts × 2 seeds)" in text and "SE: within 2" in text
    md_text = render_markdown(both)
    assert "τ measured ± SE" in md_text and f"{row.tau_tokens:.2f} ± {row.tau_se:.2f}" in md_text and "SE: within 2" in md_text
    frames = tables(both)
    assert {"measured_tau_se", "measured_seeds", "tau_renewal_se", "speedup_se"} <= set(frames["k_table"].columns)
    assert {"cumulative_se_estimate", "thin_estimate", "cumulative_se_measured", "thin_measured"} <= set(frames["depth"].columns)


def _certain_loop(alpha: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """A draft→verify loop over one reference whose every draft token is accepted or not
    for certain (α ∈ {0, 1}): rounds start where the previous one ended and a round at t
    drafts min(K, n − 1 − t) tokens. ([K] rounds accepting positions 1..i, [K] rounds
    that drafted position i), as a server counts them."""
    n, t = len(alpha), 0
    acc_at, drafted_at = np.zeros(k), np.zeros(k)
    while t < n:
        c = min(k, n - 1 - t)
        j = 0
        while j < c and alpha[t + j] == 1:
            j += 1
        drafted_at[:c] += 1
        acc_at[:j] += 1
        t += j + 1
    return acc_at, drafted_at


def test_per_position_rates_count_rounds_as_the_loop_does_not_every_start() -> None:
    """The K row's per-position rates are what a loop counts: rounds start only where the
    previous one ended. On references whose hard tokens come in runs (a rejection is often
    followed by another), they sit below the depth curve, which counts every start
    position — what an EAGLE-3 head served by vLLM showed (position 1: vLLM 0.190, the loop
    0.194, the depth curve 0.227)."""
    rng = np.random.default_rng(5)
    k = 3
    acc = Accumulator(k_max=k, drafting="greedy")
    counted = np.zeros((2, k))
    for _ in range(12):
        n = 80
        hard = rng.random(n) < 0.25
        hard[1:] |= hard[:-1] & (rng.random(n - 1) < 0.7)  # hard tokens come in runs
        alpha = np.where(hard, 0.0, 1.0)
        vals = {f: np.full(n, 0.5) for f in FIELDS}
        vals["accept_prob_greedy_draft"] = alpha
        acc.add_sequence("chat", np.arange(n), vals)
        counted += np.stack(_certain_loop(alpha, k))
    rates, ses = acc.renewal_per_position(k)
    assert rates == pytest.approx((counted[0] / counted[1]).tolist(), rel=1e-12)
    window = acc.cumulative_depth()
    assert all(r < w - 0.03 for r, w in zip(rates, window, strict=True)), (rates, window.tolist())
    assert len(ses) == k and all(s > 0 for s in ses)
    assert acc.renewal_per_position(k + 1) == ([], [])  # deeper than the run estimated: nothing
