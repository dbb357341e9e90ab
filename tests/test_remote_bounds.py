"""metrics.remote: acceptance from a served target's top-n logprobs — exact where the
listed tokens decide it, and bounds that contain the truth where they do not (random
full distributions truncated to their top-n, as the engine returns them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specprobe.metrics.core import position_metrics_reference
from specprobe.metrics.remote import TopN, bounded_metrics, supported
from specprobe.metrics.sampling import Sampling

V = 64


def _served(target_logits: torch.Tensor, actual: torch.Tensor, n: int) -> TopN:
    """What the engine returns: the top-n and the actual token, {id: (logprob, rank)}."""
    logp = torch.log_softmax(target_logits.double(), -1)
    rows = []
    for i in range(logp.shape[0]):
        order = torch.argsort(logp[i], descending=True).tolist()
        rank = {t: r + 1 for r, t in enumerate(order)}
        keep = order if n < 0 else order[:n]
        row = {t: (float(logp[i, t]), rank[t]) for t in keep}
        a = int(actual[i])
        row[a] = (float(logp[i, a]), rank[a])
        rows.append(row)
    return TopN.from_rows(rows, n)


def _pair(seed: int, n_pos: int = 200, sharp: float = 3.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n_pos, V, generator=g, dtype=torch.float64) * sharp
    d = t + torch.randn(n_pos, V, generator=g, dtype=torch.float64) * 1.5  # a drafter that mostly agrees
    actual = torch.randint(0, V, (n_pos,), generator=g)
    return t, d, actual


def _truth(t: torch.Tensor, d: torch.Tensor, target: Sampling, draft: Sampling) -> dict[str, np.ndarray]:
    pm = position_metrics_reference(t.float(), d.float(), target, draft)
    return {"accept_prob": pm.accept_prob.double().numpy(), "accept_prob_greedy_draft": pm.accept_prob_greedy_draft.double().numpy(), "greedy_agree": pm.greedy_agree.double().numpy()}


@pytest.mark.parametrize("n", [1, 3, 8, 20])
@pytest.mark.parametrize("draft", [Sampling(temperature=0.0), Sampling(temperature=1.0), Sampling(temperature=0.7, top_p=0.9)])
def test_bounds_contain_the_truth(n: int, draft: Sampling) -> None:
    for seed in range(3):
        t, d, actual = _pair(seed)
        target = Sampling(temperature=1.0)
        b = bounded_metrics(_served(t, actual, n), d, target, draft)
        truth = _truth(t, d, target, draft)
        for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree"):
            assert np.all(b.low[f] <= truth[f] + 1e-5), f
            assert np.all(truth[f] <= b.high[f] + 1e-5), f
        # exact positions: both ends equal the truth
        key = "accept_prob_greedy_draft" if draft.greedy else "accept_prob"
        assert np.allclose(b.low[key][b.exact], truth[key][b.exact], atol=1e-5)
        assert np.allclose(b.high[key][b.exact], truth[key][b.exact], atol=1e-5)
        np.testing.assert_array_equal(b.low["greedy_agree"], truth["greedy_agree"])  # rank 1 is always listed


def test_greedy_draft_exact_when_its_argmax_is_listed() -> None:
    t, d, actual = _pair(7)
    top = _served(t, actual, 5)
    b = bounded_metrics(top, d, Sampling(temperature=1.0), Sampling(temperature=0.0))
    da = d.argmax(-1).numpy()
    listed = np.array([da[i] in set(top.ids[i].tolist()) for i in range(len(da))])
    np.testing.assert_array_equal(b.exact, listed)
    assert listed.any() and (~listed).any()  # both cases exercised
    truth = torch.softmax(t, -1).gather(-1, torch.as_tensor(da)[:, None]).squeeze(-1).numpy()
    np.testing.assert_allclose(b.low["accept_prob_greedy_draft"][listed], truth[listed], atol=1e-9)
    # unlisted: the upper end is the n-th probability or the missing mass, whichever is less
    assert np.all(b.high["accept_prob_greedy_draft"][~listed] <= np.exp(top.floor[~listed]) + 1e-12)


def test_the_actual_token_counts_when_it_is_the_draft() -> None:
    # n = 1: the drafter proposes the actual (reference) token, listed outside the top-1
    t = torch.tensor([[3.0, 2.0, 1.0, 0.0]], dtype=torch.float64)
    d = torch.tensor([[0.0, 5.0, 0.0, 0.0]], dtype=torch.float64)
    b = bounded_metrics(_served(t, torch.tensor([1]), 1), d, Sampling(temperature=1.0), Sampling(temperature=0.0))
    assert b.exact.all()
    assert b.low["accept_prob_greedy_draft"][0] == pytest.approx(float(torch.softmax(t, -1)[0, 1]))


def test_full_vocabulary_is_exact() -> None:
    t, d, actual = _pair(3)
    for draft in (Sampling(temperature=0.0), Sampling(temperature=1.0)):
        b = bounded_metrics(_served(t, actual, -1), d, Sampling(temperature=1.0), draft)
        truth = _truth(t, d, Sampling(temperature=1.0), draft)
        assert b.exact.all()
        np.testing.assert_allclose(b.low["accept_prob"], truth["accept_prob"], atol=1e-5)
        np.testing.assert_allclose(b.high["accept_prob"], truth["accept_prob"], atol=1e-5)


@pytest.mark.parametrize("draft", [Sampling(temperature=0.0), Sampling(temperature=0.8)])
def test_greedy_target_is_exact_from_rank_one(draft: Sampling) -> None:
    t, d, actual = _pair(11)
    target = Sampling(temperature=0.0)
    b = bounded_metrics(_served(t, actual, 1), d, target, draft)
    truth = _truth(t, d, target, draft)
    assert b.exact.all()
    for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree"):
        np.testing.assert_allclose(b.low[f], truth[f], atol=1e-5)
        np.testing.assert_array_equal(b.low[f], b.high[f])


def test_unsupported_target_sampling() -> None:
    assert supported(Sampling(temperature=0.0)) is None
    assert supported(Sampling(temperature=1.0)) is None
    assert supported(Sampling(temperature=0.7)) is None  # bounded: see the tempered tests
    assert "top-k" in (supported(Sampling(temperature=1.0, top_k=50)) or "")
    t, d, actual = _pair(1, n_pos=4)
    with pytest.raises(ValueError):
        bounded_metrics(_served(t, actual, 3), d, Sampling(temperature=1.0, top_k=50), Sampling(temperature=0.0))


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.5])
@pytest.mark.parametrize("n", [1, 5, 20])
@pytest.mark.parametrize("draft", [Sampling(temperature=0.0), Sampling(temperature=0.7)])
def test_tempered_bounds_contain_the_truth(temperature: float, n: int, draft: Sampling) -> None:
    """The target at T ∉ {0, 1} from raw top-n logprobs: every range holds the value
    from the whole distribution at T; sharp and flat targets alike."""
    target = Sampling(temperature=temperature)
    for seed, sharp in ((0, 3.0), (1, 1.0), (2, 6.0)):
        t, d, actual = _pair(seed, sharp=sharp)
        b = bounded_metrics(_served(t, actual, n), d, target, draft)
        truth = _truth(t, d, target, draft)
        for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree"):
            assert np.all(b.low[f] <= truth[f] + 1e-5), (f, seed)
            assert np.all(truth[f] <= b.high[f] + 1e-5), (f, seed)
        assert np.all(b.low["accept_prob"] <= b.high["accept_prob"])


def test_tempered_with_the_whole_vocabulary_is_exact() -> None:
    t, d, actual = _pair(4)
    target = Sampling(temperature=0.6)
    for draft in (Sampling(temperature=0.0), Sampling(temperature=0.8)):
        b = bounded_metrics(_served(t, actual, -1), d, target, draft)
        truth = _truth(t, d, target, draft)
        assert b.exact.all()
        for f in ("accept_prob", "accept_prob_greedy_draft"):
            np.testing.assert_allclose(b.low[f], truth[f], atol=1e-5)
            np.testing.assert_allclose(b.high[f], truth[f], atol=1e-5)


def test_tempered_ranges_narrow_as_n_grows() -> None:
    t, d, actual = _pair(6)
    target, draft = Sampling(temperature=0.7), Sampling(temperature=0.0)
    width = [float((b.high["accept_prob_greedy_draft"] - b.low["accept_prob_greedy_draft"]).mean())
             for b in (bounded_metrics(_served(t, actual, n), d, target, draft) for n in (2, 8, 32))]
    assert width[0] > width[1] > width[2] > 0


def test_greedy_drafting_with_a_sampled_draft_counts_the_greedy_field_exact() -> None:
    # vLLM drafts the argmax whatever the request's temperature: exactness is p(argmax q)'s
    t, d, actual = _pair(5)
    target, draft = Sampling(temperature=1.0), Sampling(temperature=1.0)
    top = _served(t, actual, 5)
    b = bounded_metrics(top, d, target, draft, greedy_drafting=True)
    g = bounded_metrics(top, d, target, Sampling(temperature=0.0))
    np.testing.assert_array_equal(b.exact, g.exact)
    np.testing.assert_array_equal(b.low["accept_prob_greedy_draft"], g.low["accept_prob_greedy_draft"])
    assert not bounded_metrics(top, d, target, draft).exact.all()  # α's missing mass keeps most sampled positions ranges
