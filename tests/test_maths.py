"""Closed-form maths on synthetic tensors (docs/maths.md)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from specprobe.estimates import estimate
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.core import align_vocab, position_metrics
from specprobe.metrics.sampling import Sampling, probs

T1 = Sampling(temperature=1.0)
GREEDY = Sampling(temperature=0.0)


def _logits(n: int = 16, v: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, v, generator=torch.Generator().manual_seed(seed)) * 3


def test_kl_of_identical_distributions_is_zero_and_alpha_one() -> None:
    x = _logits()
    pm = position_metrics(x, x.clone(), T1, T1)
    assert torch.allclose(pm.kl_target_draft_nats, torch.zeros(16), atol=1e-5)
    assert torch.allclose(pm.accept_prob, torch.ones(16), atol=1e-5)
    assert pm.greedy_agree.sum() == 16


@pytest.mark.parametrize("tp,tq", [(1.0, 1.0), (0.7, 0.7), (0.7, 1.3)])
def test_alpha_is_sum_of_min_and_kl_matches_definition(tp: float, tq: float) -> None:
    a, b = _logits(seed=1), _logits(seed=2)
    sp, sq = Sampling(temperature=tp), Sampling(temperature=tq)
    pm = position_metrics(a, b, sp, sq)
    p, q = torch.softmax(a / tp, -1).double(), torch.softmax(b / tq, -1).double()
    alpha = torch.minimum(p, q).sum(-1)
    assert torch.allclose(pm.accept_prob.double(), alpha, atol=1e-5)
    assert torch.allclose(pm.accept_prob.double(), 1 - 0.5 * (p - q).abs().sum(-1), atol=1e-5)  # 1 − TV
    kl = (p * (p.log() - q.log())).sum(-1)
    assert torch.allclose(pm.kl_target_draft_nats.double(), kl, atol=1e-4)
    ent = -(p * p.log()).sum(-1)
    assert torch.allclose(pm.target_entropy_nats.double(), ent, atol=1e-4)
    assert torch.allclose(pm.draft_confidence.double(), q.max(-1).values, atol=1e-6)


def test_greedy_agreement_equals_alpha_at_temperature_zero() -> None:
    a, b = _logits(seed=3), _logits(seed=4)
    b[:8] = a[:8]  # half agree
    pm = position_metrics(a, b, GREEDY, GREEDY)
    assert torch.equal(pm.accept_prob, pm.greedy_agree)
    assert pm.greedy_agree[:8].sum() == 8


def test_greedy_target_sampling_drafter_accepts_with_q_of_target_argmax() -> None:
    a, b = _logits(seed=5), _logits(seed=6)
    pm = position_metrics(a, b, GREEDY, T1)
    q = torch.softmax(b, -1)
    assert torch.allclose(pm.accept_prob, q.gather(-1, a.argmax(-1, keepdim=True)).squeeze(-1), atol=1e-6)


def test_truncation_top_k_top_p_min_p() -> None:
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.allclose(probs(x, Sampling(1.0, top_k=2)), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(probs(x, Sampling(1.0, top_p=0.7)), torch.tensor([[0.625, 0.375, 0, 0]]))
    assert torch.allclose(probs(x, Sampling(1.0, min_p=0.2)), torch.tensor([[0.5, 0.3, 0.15, 0]]) / 0.95)
    assert torch.equal(probs(x, GREEDY), torch.tensor([[1.0, 0, 0, 0]]))


def test_kl_stays_finite_when_drafter_lacks_ids() -> None:
    a = _logits(v=60)
    b = a[:, :50].clone()  # drafter vocab shorter: missing ids have probability 0
    pm = position_metrics(a, b, T1, T1)
    assert torch.isfinite(pm.kl_target_draft_nats).all()
    assert align_vocab(b, 60).shape[-1] == 60
    assert align_vocab(_logits(v=70), 60).shape[-1] == 60


def test_identical_distributions_give_tau_k_plus_one() -> None:
    acc = Accumulator(k_max=8)
    n = 40
    vals = {f: np.ones(n) for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "draft_confidence")}
    vals.update(kl_target_draft_nats=np.zeros(n), target_entropy_nats=np.ones(n))
    acc.add_sequence("chat", np.arange(n), vals)
    cum = acc.cumulative_depth()
    for k in range(1, 9):
        assert estimate.tau(cum, k) == pytest.approx(k + 1)
        assert estimate.accept_rate(estimate.tau(cum, k), k) == pytest.approx(1.0)


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_constant_alpha_matches_iid_closed_form(alpha: float) -> None:
    acc = Accumulator(k_max=8)
    n = 200
    vals = {"accept_prob": np.full(n, alpha), "accept_prob_greedy_draft": np.full(n, alpha), "greedy_agree": np.ones(n), "draft_confidence": np.full(n, 0.5), "kl_target_draft_nats": np.zeros(n), "target_entropy_nats": np.ones(n)}
    acc.add_sequence("chat", np.arange(n), vals)
    cum = acc.cumulative_depth()
    for k in range(1, 9):
        assert estimate.tau(cum, k) == pytest.approx(estimate.iid_tau(alpha, k), rel=1e-9)
        assert estimate.iid_tau(alpha, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))
    cond = estimate.conditional(cum)
    assert cond == pytest.approx([alpha] * 8)


def test_speedup_and_best_k() -> None:
    cum = [0.8 ** j for j in range(1, 9)]
    rows = estimate.k_table(cum, 0.8, cost_ratio=0.05)
    for r in rows:
        assert r.speedup == pytest.approx(r.tau_tokens / (1 + r.k * 0.05))
    best = estimate.best_k(rows)
    assert best.speedup == max(r.speedup for r in rows)
    # a drafter as expensive as the target never pays off
    assert estimate.best_k(estimate.k_table(cum, 0.8, cost_ratio=1.0)).speedup < 1.0


def test_depth_curve_chains_alpha_along_the_sequence() -> None:
    acc = Accumulator(k_max=2)
    a = np.array([1.0, 0.5, 0.2, 1.0])
    vals = {"accept_prob": a, "accept_prob_greedy_draft": a, "greedy_agree": a, "draft_confidence": a, "kl_target_draft_nats": a, "target_entropy_nats": a}
    acc.add_sequence("x", np.arange(4), vals)
    r = acc.cumulative_depth()
    assert r[0] == pytest.approx(a.mean())
    assert r[1] == pytest.approx(np.mean([1.0 * 0.5, 0.5 * 0.2, 0.2 * 1.0]))


def test_accumulators_merge_equals_one_pass() -> None:
    rng = np.random.default_rng(0)
    seqs = []
    for i in range(6):
        n = 20 + i
        seqs.append(({f: rng.random(n) for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "draft_confidence", "kl_target_draft_nats", "target_entropy_nats")}, n))
    whole, a, b = Accumulator(), Accumulator(), Accumulator()
    for i, (v, n) in enumerate(seqs):
        whole.add_sequence(f"d{i % 2}", np.arange(n), v)
        (a if i < 3 else b).add_sequence(f"d{i % 2}", np.arange(n), v)
    merged = Accumulator.from_state(a.to_state()).merge(b)
    assert merged.summary() == pytest.approx(whole.summary())
    assert np.allclose(merged.cumulative_depth(), whole.cumulative_depth())
    assert np.allclose(merged.adaptive, whole.adaptive)
    for x, y in zip(merged.by_domain(), whole.by_domain(), strict=True):
        assert x["group"] == y["group"] and x["positions"] == y["positions"]
        assert x["accept_prob_mean"] == pytest.approx(y["accept_prob_mean"])


def test_adaptive_threshold_zero_drafts_everything() -> None:
    acc = Accumulator(k_max=4)
    n = 30
    vals = {"accept_prob": np.full(n, 0.9), "accept_prob_greedy_draft": np.full(n, 0.9), "greedy_agree": np.ones(n), "draft_confidence": np.full(n, 0.6), "kl_target_draft_nats": np.zeros(n), "target_entropy_nats": np.ones(n)}
    acc.add_sequence("x", np.arange(n), vals)
    from specprobe.metrics.accumulate import THRESHOLDS

    theta0 = acc.adaptive[0]
    assert theta0[2] / theta0[3] == 4  # threshold 0: always K drafts
    hi = acc.adaptive[THRESHOLDS.index(0.65)]
    assert hi[2] == 0  # confidence 0.6 < 0.65: never drafts
    ad = estimate.adaptive_threshold(THRESHOLDS, acc.adaptive, cost_ratio=0.01)
    assert ad is not None and ad.tau_tokens == pytest.approx(1 + sum(0.9 ** j for j in range(1, 5)))
    assert not math.isnan(ad.speedup)
