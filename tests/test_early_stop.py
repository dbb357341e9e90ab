"""llama.cpp's early stop in the estimate and the loop: --draft-p-min (its
--spec-draft-p-min: a draft stops before the first token whose probability among the
drafter's 10 best, at temperature 1, is below P) and --draft-n-min (a draft shorter than N
is dropped, the round decodes one token) — as llama.cpp's common/speculative.cpp runs them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specprobe.core.errors import ConfigError
from specprobe.engines.llamacpp import DRAFT_TOP_K
from specprobe.estimates.estimate import renewal_counts, renewal_tau
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.sampling import sampler_top_confidence


def brute_rounds(accept: list[bool], conf: list[float], k: int, p_min: float, n_min: int) -> tuple[int, int, int]:
    """The rounds a greedy loop runs along one fixed text (a self-draft: depth i of a
    round at t predicts token t+i−1 with the same per-token acceptance and confidence):
    draft while confident, at most K and at most the tokens left − 1; drop a draft shorter
    than n_min. -> (rounds, drafts made, accepted)."""
    n, t = len(accept), 0
    rounds = drafts = accepted = 0
    while t < n:
        cap = min(k, n - t - 1)
        m = 0
        while m < cap and conf[t + m] >= p_min:
            m += 1
        if m < n_min:
            m = 0
        a = 0
        while a < m and accept[t + a]:
            a += 1
        rounds += 1
        drafts += m > 0
        accepted += a
        t += a + 1
    return rounds, drafts, accepted


def test_llama_cpp_confidence_is_the_top_of_ten_at_temperature_one() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0] + [-30.0] * 20, [1.0] * 23])
    want0 = 1.0 / (1.0 + np.exp(-1.0) + np.exp(-2.0) + 7 * np.exp(-35.0))
    got = sampler_top_confidence(logits, DRAFT_TOP_K)
    assert float(got[0]) == pytest.approx(want0, rel=1e-6) and float(got[1]) == pytest.approx(0.1)  # ten equal bests: 1/10


@pytest.mark.parametrize(("p_min", "n_min"), [(0.0, 0), (0.5, 0), (0.5, 2), (0.0, 3), (0.9, 0)])
def test_renewal_counts_follow_the_early_stop_exactly(p_min: float, n_min: int) -> None:
    """Acceptances 0/1 (a greedy target): the expected counts are the counts, and they
    equal the rounds a brute-force loop runs along the same text, for every K."""
    rng = np.random.default_rng(3)
    n, kmax = 40, 5
    accept = (rng.random(n) < 0.7).tolist()
    conf = rng.random(n).round(2).tolist()
    acc = Accumulator(k_max=kmax, drafting="greedy", p_min=p_min, n_min=n_min)
    lengths = acc._draft_lengths([np.asarray(conf)] * kmax, n)
    alpha = np.asarray(accept, dtype=float)
    ren = renewal_counts(np.stack([alpha] * kmax), lengths, n_min)
    tau = renewal_tau(ren.accepted, ren.drafted, per_draft=True)
    for k in range(1, kmax + 1):
        rounds, drafts, accepted = brute_rounds(accept, conf, k, p_min, n_min)
        assert ren.rounds[k - 1] == pytest.approx(rounds)
        assert ren.drafted[k - 1, 0] == pytest.approx(drafts)
        assert ren.accepted[k - 1].sum() == pytest.approx(accepted)
        if drafts:
            assert tau[k - 1] == pytest.approx(1 + accepted / drafts)  # llama-server's 1 + accepted ÷ drafts


def test_draft_lengths_stop_before_the_first_unconfident_depth() -> None:
    acc = Accumulator(k_max=2, drafting="greedy", p_min=0.5)
    conf = np.array([0.9, 0.2, 0.9, 0.9])
    assert acc._draft_lengths([conf, conf], 4).tolist() == [1, 0, 2, 1]
    dropped = Accumulator(k_max=2, drafting="greedy", p_min=0.5, n_min=2)
    assert dropped._draft_lengths([conf, conf], 4).tolist() == [0, 0, 2, 0]
    assert Accumulator(k_max=2)._draft_lengths([conf, conf], 4) is None  # neither knob: K every round


def test_the_depth_curve_counts_a_depth_only_where_it_was_drafted() -> None:
    from specprobe.metrics.accumulate import FIELDS

    n = 6
    conf = np.array([0.9, 0.2, 0.9, 0.9, 0.9, 0.9])
    values = {f: np.ones(n) for f in FIELDS}  # α = 1 everywhere
    values["draft_confidence"] = conf
    plain, gated = Accumulator(k_max=2, drafting="greedy"), Accumulator(k_max=2, drafting="greedy", p_min=0.5)
    for acc in (plain, gated):
        acc.add_sequence("chat", np.arange(n), values)
    assert plain.cumulative_depth().tolist() == [1.0, 1.0]
    # depth 1 drafted at 5 of 6 starts, depth 2 where depths 1 and 2 are both confident
    assert gated.cumulative_depth().tolist() == pytest.approx([5 / 6, 3 / 5])


def test_p_min_and_n_min_are_llama_cpps_only() -> None:
    from specprobe.settings.pipeline import DiagnoseConfig

    with pytest.raises(ConfigError, match=r"--draft-p-min is llama.cpp's .* vLLM drafts K tokens every round"):
        DiagnoseConfig(target="t", drafter="d", draft_p_min=0.5)
    with pytest.raises(ConfigError, match="outside"):
        DiagnoseConfig(target="t", drafter="d", engine="llama.cpp", draft_p_min=1.5)
    with pytest.raises(ConfigError, match="--draft-n-min 5 is more than --k-max 4: every draft would be dropped"):
        DiagnoseConfig(target="t", drafter="d", engine="llama.cpp", draft_n_min=5, k_max=4)
    cfg = DiagnoseConfig(target="t", drafter="d", engine="llama.cpp", draft_p_min=0.5, draft_n_min=2)
    assert cfg.to_dict()["draft_p_min"] == 0.5 and cfg.to_dict()["draft_n_min"] == 2 and cfg.confidence == DRAFT_TOP_K


def test_a_llama_server_line_sets_the_early_stop(tmp_path) -> None:
    from specprobe.settings.options import merge
    from tests.test_serving import _params, _write

    launch = _write(tmp_path, "launch.sh", "llama-server -m t.gguf -md d.gguf --spec-draft-n-max 6 --spec-draft-p-min 0.6 --spec-draft-n-min 2\n")
    opts = merge("diagnose", _params("diagnose", serving_config=[launch]), {"serving_config"})
    cfg = opts.diagnose_config()
    assert (cfg.engine, cfg.draft_p_min, cfg.draft_n_min) == ("llama.cpp", 0.6, 2)
    assert opts.origins["draft_p_min"] == "launch.sh: --spec-draft-p-min" and opts.origins["draft_n_min"] == "launch.sh: --spec-draft-n-min"
    typed = merge("diagnose", _params("diagnose", serving_config=[launch], draft_p_min=0.2), {"serving_config", "draft_p_min"})
    assert typed.diagnose_config().draft_p_min == 0.2  # the flag over the serving config


def test_simulate_and_the_estimate_draft_less_under_p_min(tiny_pair, tmp_path) -> None:
    """The real loop at T = 0 with llama.cpp's procedure: a higher p-min makes fewer and
    shorter drafts, and the estimate's τ (per draft made, as llama-server counts it)
    follows the measured one within 3 %, as it does without the early stop."""
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    rows = {}
    for p_min in (0.0, 0.99):
        d = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=16, batch_size=3, keep_positions=False,
                           engine="llama.cpp", draft_p_min=p_min, k_max=4, cost_ratio=0.1, verify_factor=1.0, sampling=SamplingFlags(temperature=0.0))
        r = run_simulate(SimulateConfig(d, ks=[4], baseline=False))
        rows[p_min] = (r.measured.k_table[0], r.measured.depth)
        assert r.config.model_dump()["draft_p_min"] == p_min
        est = next(row for row in r.k_table if row.k == 4)
        # accepted ÷ drafted, as llama-server counts it (not (τ − 1) ÷ K under the early
        # stop). Past a draft the target rejects, the loop drafts on from its own tokens,
        # where the teacher-forced estimate reads the reference's: the drafted count, not
        # the accepted one, is approximate there (measured 9 % at p-min 0.99 here)
        assert est.accept_rate_renewal == pytest.approx(r.measured.k_table[0].accept_rate, rel=0.03 if p_min == 0 else 0.12)
    (full, full_depth), (gated, gated_depth) = rows[0.0], rows[0.99]
    assert sum(gated_depth.drafted_per_position) < sum(full_depth.drafted_per_position)
    assert gated_depth.drafted_per_position[-1] < gated_depth.drafted_per_position[0]  # drafts of every length
    for row in (full, gated):
        assert row.tau_estimate == pytest.approx(row.tau_tokens, rel=0.03)
    assert gated.tau_tokens == pytest.approx(1 + sum(gated_depth.accepted_per_position) / gated_depth.num_drafts)
