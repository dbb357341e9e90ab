"""The acceptance of one draft token under the engine's procedure, in closed form.

Greedy drafting (vLLM's default, llama.cpp, SGLang, TensorRT-LLM): the draft is the
drafter's argmax (the lowest id on ties, as torch.argmax), accepted with p_t(draft), p the
target's distribution after its sampling transform. Probabilistic drafting: Σ min(p, q).
Every scorer (the eager reference, the torch blocks, the compiled rows, the fused formula,
a head's own path) gives p(argmax q) exactly against a float64 computation; at T = 0 it is
greedy agreement. llama.cpp's sampler chain truncates before the temperature."""

from __future__ import annotations

import pytest
import torch

from specprobe.metrics import core
from specprobe.metrics.sampling import Sampling, probs, truncate_


def _hand() -> tuple[torch.Tensor, torch.Tensor]:
    """Four positions over 5 ids, written out: the drafter's argmax is id 1, id 3 (a tie
    of ids 3 and 4: the lower wins), id 0 (a three-way tie) and id 2."""
    tl = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0], [0.0, 0.0, 1.0, 2.0, 2.0], [1.0, 3.0, 0.0, 0.0, 0.0], [0.0, 1.0, 2.0, 3.0, 4.0]])
    dl = torch.tensor([[0.0, 3.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0, 5.0], [1.0, 1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 9.0, 0.0, 0.0]])
    return tl, dl


DRAFT_IDS = [1, 3, 0, 2]


def _p64(tl: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The target's sampling distribution in float64: one-hot at the argmax when greedy."""
    if s.greedy:
        return torch.nn.functional.one_hot(tl.argmax(-1), tl.shape[-1]).double()
    return truncate_(torch.softmax(tl.double() / s.temperature, -1), s)


def _want(tl: torch.Tensor, ts: Sampling) -> torch.Tensor:
    """p_t(argmax q) in float64: the target's own sampling distribution at the draft."""
    return _p64(tl, ts)[torch.arange(tl.shape[0]), torch.tensor(DRAFT_IDS)]


def _scorers(tl: torch.Tensor, dl: torch.Tensor, ts: Sampling, ds: Sampling, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    out = {"reference": core.position_metrics_reference(tl, dl, ts, ds).accept_prob_greedy_draft}
    out["default"] = core.position_metrics(tl, dl, ts, ds, top=2).accept_prob_greedy_draft  # the compiled rows where they take it
    with monkeypatch.context() as m:
        m.setenv("SPECPROBE_SCORER", "torch")
        out["blocks"] = core.position_metrics(tl, dl, ts, ds).accept_prob_greedy_draft
    if not ts.truncates and not ds.truncates:
        fused = core._fused_body(tl, dl, 1.0 if ts.greedy else ts.temperature, 1.0 if ds.greedy else ds.temperature, ts.greedy, ds.greedy, 0)
        out["fused"] = fused[-1]
    return out


@pytest.mark.parametrize("ts,ds", [
    (Sampling(0.7), Sampling(0.7)),
    (Sampling(1.0), Sampling(1.6)),  # the drafter's own temperature does not move its argmax
    (Sampling(1.3), Sampling(0.0)),
    (Sampling(0.8, top_p=0.6), Sampling(0.8, top_p=0.6)),  # p after the target's truncation
    (Sampling(0.9, top_k=2, semantics="sglang"), Sampling(0.9)),
])
def test_a_greedy_draft_is_accepted_with_the_targets_probability_of_it(ts: Sampling, ds: Sampling, monkeypatch: pytest.MonkeyPatch) -> None:
    tl, dl = _hand()
    want = _want(tl, ts)
    for name, got in _scorers(tl, dl, ts, ds, monkeypatch).items():
        torch.testing.assert_close(got.double(), want, atol=2e-7, rtol=0, msg=name)
    # the hand numbers: at T = 1 the first row's draft (id 1) has e¹ / (e² + e¹ + e^0.5 + e⁰ + e⁻¹)
    if ts == Sampling(1.0):
        e = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0], dtype=torch.float64).exp()
        assert float(want[0]) == pytest.approx(float(e[1] / e.sum()), abs=1e-12)


def test_ties_among_the_drafters_top_logits_draft_the_lowest_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 1's drafter ties ids 3 and 4 (the target's top two, equal too): the draft is id
    3, accepted with p(3) — not p(3) + p(4), nor the mean of the two."""
    tl, dl = _hand()
    s = Sampling(1.0)
    p = torch.softmax(tl[1].double(), -1)
    for name, got in _scorers(tl, dl, s, s, monkeypatch).items():
        assert float(got[1]) == pytest.approx(float(p[3]), abs=2e-7), name
        assert float(got[2]) == pytest.approx(float(torch.softmax(tl[2].double(), -1)[0]), abs=2e-7), name  # three-way tie: id 0


def test_at_temperature_zero_the_acceptance_is_greedy_agreement(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    tl = torch.randn(40, 300, generator=g).round()  # many ties at the top
    dl = tl + torch.randn(40, 300, generator=g).round()
    s = Sampling(0.0)
    for name, got in _scorers(tl, dl, s, s, monkeypatch).items():
        want = (tl.argmax(-1) == dl.argmax(-1)).float()
        assert torch.equal(got, want), name
        assert torch.equal(core.position_metrics_reference(tl, dl, s, s).greedy_agree, want)
    # and with the drafter sampling at T > 0: still the argmax draft, still agreement
    got = core.position_metrics_reference(tl, dl, s, Sampling(0.9)).accept_prob_greedy_draft
    assert torch.equal(got, (tl.argmax(-1) == dl.argmax(-1)).float())


def test_sampled_and_greedy_drafts_differ_at_temperature_above_zero() -> None:
    """Σ min(p, q) against p(argmax q) on a drafter that knows the target exactly: the
    first is 1, the second the target's top probability."""
    tl, _ = _hand()
    s = Sampling(0.7)
    pm = core.position_metrics_reference(tl, tl.clone(), s, s)
    assert torch.allclose(pm.accept_prob, torch.ones(4), atol=1e-6)
    torch.testing.assert_close(pm.accept_prob_greedy_draft.double(), _p64(tl, s).amax(-1), atol=2e-7, rtol=0)
    assert bool((pm.accept_prob_greedy_draft < pm.accept_prob - 0.05).all())


@pytest.mark.parametrize("v,rows", [(512, 23), (49_152, 3)])  # 16 segments; SmolLM2's width
def test_every_scorer_equals_a_float64_reference_on_random_logits(v: int, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(v)
    tl = torch.randn(rows, v, generator=g) * 3
    dl = tl + torch.randn(rows, v, generator=g)
    for ts, ds in ((Sampling(0.7), Sampling(0.7)), (Sampling(1.2), Sampling(0.5)), (Sampling(0.8, top_k=50, min_p=0.02), Sampling(0.8))):
        want = _p64(tl, ts).gather(-1, dl.argmax(-1, keepdim=True)).squeeze(-1)
        for name, got in _scorers(tl, dl, ts, ds, monkeypatch).items():
            torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5, msg=f"{name} {ts.describe()}")


# ----------------------------------------------------------------------------- llama.cpp's chain
def _tempered(u: list[float], t: float) -> torch.Tensor:
    x = torch.tensor([u], dtype=torch.float64).log() / t
    return torch.softmax(x, -1)


def test_llama_cpp_truncates_the_untempered_distribution() -> None:
    """Untempered [.64, .2, .16] at T = 2: top-p .5 keeps one token in llama.cpp (.64 ≥ .5)
    and two in vLLM (tempered first: [.49, .27, .24]); min-p .3 (cut .192) drops .16 in
    llama.cpp and nothing in vLLM (cut .146 on the tempered)."""
    p = _tempered([0.64, 0.2, 0.16], 2.0)
    cut = lambda sem, **kw: truncate_(p.clone(), Sampling(2.0, semantics=sem, **kw))  # noqa: E731
    assert torch.equal(cut("llama.cpp", top_p=0.5), torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    assert int((cut("vllm", top_p=0.5) > 0).sum()) == 2
    kept = cut("llama.cpp", min_p=0.3)
    torch.testing.assert_close(kept, torch.cat([p[:, :2] / p[:, :2].sum(), torch.zeros(1, 1, dtype=torch.float64)], -1))
    assert int((cut("vllm", min_p=0.3) > 0).sum()) == 3


def test_llama_cpp_top_p_keeps_the_token_that_crosses_and_renormalises_after_top_k() -> None:
    # at T = 1: top-k 3 leaves [.4, .3, .2] → [.444, .333, .222]; top-p .7 is reached at the
    # second (.778 ≥ .7): two tokens. Without top-k the first two make exactly .7: two.
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    out = truncate_(p.clone(), Sampling(1.0, top_k=3, top_p=0.7, semantics="llama.cpp"))
    torch.testing.assert_close(out, torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0]], dtype=torch.float64))
    out = truncate_(p.clone(), Sampling(1.0, top_p=0.65, semantics="llama.cpp"))
    assert int((out > 0).sum()) == 2


def test_llama_cpp_top_k_keeps_exactly_k_and_greedy_only_at_zero() -> None:
    p = torch.tensor([[0.4, 0.2, 0.2, 0.2]])
    out = truncate_(p.clone(), Sampling(1.0, top_k=2, semantics="llama.cpp"))
    assert out[0].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0])  # a tie with the 2nd is cut, the lower id kept
    assert Sampling(0.0, semantics="llama.cpp").greedy and not Sampling(1e-7, semantics="llama.cpp").greedy


def test_the_llama_cpp_engine_applies_its_own_transform() -> None:
    from specprobe.settings.engines import BY_ENGINE
    from specprobe.settings.model import SEMANTICS

    assert BY_ENGINE["llama.cpp"].semantics == "llama.cpp" and "llama.cpp" in SEMANTICS
    assert BY_ENGINE["llama.cpp"].adaptive_knob == "--spec-draft-p-min" and BY_ENGINE["vllm"].adaptive_knob is None
    g = torch.Generator().manual_seed(2)
    tl = torch.randn(16, 80, generator=g) * 2
    ts = Sampling(1.5, top_k=20, top_p=0.8, min_p=0.05, semantics="llama.cpp")
    pm = core.position_metrics(tl, tl + 0.3 * torch.randn(16, 80, generator=g), ts, ts)
    untempered = truncate_(torch.softmax(tl.double(), -1), Sampling(1.0, top_k=20, top_p=0.8, min_p=0.05, semantics="llama.cpp")) > 0
    assert torch.equal(probs(tl, ts) > 0, untempered)  # the same survivors as at T = 1: only their weights temper
    assert bool((pm.accept_prob_greedy_draft <= probs(tl, ts).amax(-1) + 1e-6).all())
