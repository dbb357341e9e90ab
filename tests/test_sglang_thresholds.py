"""SGLang's relaxed acceptance (--speculative-accept-threshold-single / -acc): in the
estimate's per-position acceptance, in the real loop's verify step, from a launch config,
and the lossy finding (SP215). tree_speculative_sampling_target_only accepts draft x when
a uniform coin ≤ p(x) ÷ threshold_acc or p(x) ≥ threshold_single."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specprobe.core.errors import ConfigError
from specprobe.metrics.accumulate import Accumulator
from specprobe.simulate.procedure import REJECTION, THRESHOLD, Procedure
from specprobe.simulate.rejection import verify_thresholds


def test_relaxed_acceptance_in_closed_form() -> None:
    acc = Accumulator(k_max=2, drafting="greedy", threshold_single=0.6, threshold_acc=0.5)
    p = np.array([0.0, 0.1, 0.25, 0.5, 0.55, 0.6, 0.9])
    assert acc.relaxed(p).tolist() == pytest.approx([0.0, 0.2, 0.5, 1.0, 1.0, 1.0, 1.0])
    assert Accumulator(k_max=2, drafting="greedy").relaxed(p).tolist() == pytest.approx(p.tolist())  # (1, 1): p itself


@pytest.mark.parametrize(("single", "acc"), [(1.0, 1.0), (0.3, 0.5), (1.0, 0.4), (0.2, 1.0)])
def test_verify_step_accepts_as_the_kernel_does(single: float, acc: float) -> None:
    """Monte Carlo over one draft position: the acceptance frequency of each draft token is
    1 where p ≥ single, else min(1, p ÷ acc), within 4 standard errors; after a rejection
    the next token is never the draft."""
    gen = torch.Generator().manual_seed(0)
    p_row = torch.tensor([0.05, 0.15, 0.25, 0.55])
    n = 20_000
    for x in range(4):
        drafts = torch.full((n, 1), x)
        p = p_row.expand(n, 2, 4).contiguous()
        got, nxt = verify_thresholds(drafts, torch.ones(n, dtype=torch.long), p, single, acc, gen)
        rate = float(got.float().mean())
        px = float(p_row[x])
        want = 1.0 if px >= single else min(1.0, px / acc)
        se = max((want * (1 - want) / n) ** 0.5, 1e-3)
        assert abs(rate - want) < 4 * se, (x, rate, want)
        assert not bool((nxt[got == 0] == x).any())


def test_exact_thresholds_reproduce_the_target_distribution() -> None:
    """At (1, 1) the emitted first token follows p whatever the greedy draft."""
    gen = torch.Generator().manual_seed(1)
    p_row = torch.tensor([0.1, 0.2, 0.3, 0.4])
    n = 40_000
    drafts = torch.full((n, 1), 3)
    got, nxt = verify_thresholds(drafts, torch.ones(n, dtype=torch.long), p_row.expand(n, 2, 4).contiguous(), 1.0, 1.0, gen)
    first = torch.where(got > 0, drafts[:, 0], nxt)
    freq = torch.bincount(first, minlength=4).float() / n
    assert torch.allclose(freq, p_row, atol=0.01)


def test_the_procedure_is_sglangs_only_and_lossy_below_one() -> None:
    from specprobe.settings.pipeline import DiagnoseConfig

    assert Procedure.of("sglang", thresholds=(0.8, 0.5)).verify == THRESHOLD
    assert Procedure.of("sglang").verify == REJECTION and Procedure.of("vllm", thresholds=(0.8, 0.5)).verify == REJECTION
    assert "lossy" in Procedure.of("sglang", thresholds=(0.8, 0.5)).describe()
    with pytest.raises(ConfigError, match=r"--accept-threshold-acc is SGLang's .* vLLM verifies every draft exactly"):
        DiagnoseConfig(target="t", drafter="d", accept_threshold_acc=0.5)
    with pytest.raises(ConfigError, match="outside"):
        DiagnoseConfig(target="t", drafter="d", engine="sglang", accept_threshold_single=0.0)
    cfg = DiagnoseConfig(target="t", drafter="d", engine="sglang", accept_threshold_single=0.9)
    assert cfg.lossy and not DiagnoseConfig(target="t", drafter="d", engine="sglang").lossy


def test_an_sglang_launch_sets_the_thresholds(tmp_path) -> None:
    from specprobe.settings.options import merge
    from tests.test_serving import _params, _write

    launch = _write(tmp_path, "sglang.yaml", "model-path: org/t\nspeculative-algorithm: EAGLE3\nspeculative-draft-model-path: org/h\nspeculative-num-steps: 3\nspeculative-accept-threshold-single: 0.9\nspeculative-accept-threshold-acc: 0.6\n")
    opts = merge("diagnose", _params("diagnose", serving_config=[launch]), {"serving_config"})
    cfg = opts.diagnose_config()
    assert (cfg.engine, cfg.accept_threshold_single, cfg.accept_threshold_acc, cfg.lossy) == ("sglang", 0.9, 0.6, True)
    assert opts.origins["accept_threshold_single"] == "sglang.yaml: speculative-accept-threshold-single"


def test_estimate_and_loop_follow_the_thresholds_and_sp215_says_it_is_lossy(tiny_pair, tmp_path) -> None:
    """The same tiny pair under SGLang at T = 4 (the tiny target is nearly one-hot at T = 1,
    where a threshold has nothing to relax): relaxed thresholds raise the estimated
    acceptance, the loop measures what the estimate says within its noise, and the result
    carries the lossy finding."""
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    got = {}
    for th in (1.0, 0.3):
        d = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=16, batch_size=3, keep_positions=False,
                           engine="sglang", accept_threshold_single=th, accept_threshold_acc=th, k_max=3, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=4.0))
        got[th] = run_simulate(SimulateConfig(d, ks=[3], baseline=False))
    exact, relaxed = got[1.0], got[0.3]
    assert relaxed.metrics["accept_prob_engine_mean"] > exact.metrics["accept_prob_engine_mean"] + 0.02
    for r in (exact, relaxed):  # the seeded loop against its own estimate: within 2 standard errors of the difference (each side's over prompts)
        row = r.measured.k_table[0]
        assert row.tau_se > 0 and row.tau_estimate_se > 0
        assert abs(row.tau_tokens - row.tau_estimate) <= 2 * math.hypot(row.tau_se, row.tau_estimate_se), row
        assert r.metrics["tau_gap_z_abs"] <= 2
    assert relaxed.measured.k_table[0].tau_tokens > exact.measured.k_table[0].tau_tokens
    assert relaxed.metrics["acceptance_lossy"] == 1 and exact.metrics["acceptance_lossy"] == 0
    assert "SP215" in {f.rule_id for f in relaxed.findings} and "SP215" not in {f.rule_id for f in exact.findings}
    assert "lossy" in (relaxed.measured.note or "")
