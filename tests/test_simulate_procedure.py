"""`simulate` runs the engine's own draft-and-verify procedure: greedy drafting (each draft
the drafter's argmax, a one-hot q for the rejection sampler: vLLM, SGLang), llama.cpp's
sample-and-compare verification and its --spec-draft-p-min / -n-min early stop, and the
textbook sampled drafts. Closed-form checks on synthetic tensors; on tiny random models,
the real loop's counts: drafts are the argmax, accepted with p(draft) (binomial test),
and the emitted tokens follow the target's distribution (chi-square) under either
verification; greedy targets stay token-identical to plain decoding; the pipeline
records the procedure it ran."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from specprobe.engines.llamacpp import DRAFT_TOP_K as LLAMA_CPP_TOP
from specprobe.metrics.sampling import Sampling, probs
from specprobe.simulate import DraftRule, speculate, verify_match, verify_sampled
from specprobe.simulate.draft_source import chain, confidence
from specprobe.simulate.procedure import MAX_Q, REJECTION, SAMPLE_MATCH, Procedure
from tests.test_simulate import _chi2, _exact_marginals, hf_greedy, noisy_copy, rand_prompts, tiny

GREEDY = Sampling(temperature=0.0)
VLLM, LLAMA = Procedure.of("vllm"), Procedure.of("llama.cpp")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- which procedure
def test_each_engine_runs_its_own_procedure() -> None:
    assert (VLLM.drafting, VLLM.verify, VLLM.confidence) == ("greedy", REJECTION, MAX_Q)
    assert (LLAMA.drafting, LLAMA.verify, LLAMA.confidence) == ("greedy", SAMPLE_MATCH, LLAMA_CPP_TOP)
    assert Procedure.of("sglang").verify == REJECTION and Procedure.of("sglang").greedy
    assert Procedure.of("transformers").drafting == "probabilistic"
    # sampled drafts are verified by rejection sampling whatever the engine
    forced = Procedure.of("llama.cpp", "probabilistic")
    assert forced.verify == REJECTION and forced.confidence == LLAMA_CPP_TOP
    assert Procedure.of("vllm", "probabilistic") == Procedure(engine="vllm")
    with pytest.raises(ValueError, match="greedy drafts only"):
        Procedure(drafting="probabilistic", verify=SAMPLE_MATCH)
    assert "as llama.cpp runs it" in LLAMA.describe() and "--spec-draft-p-min" in LLAMA.describe()
    assert "one-hot" in VLLM.describe() and "min(1, p/q)" in Procedure().describe()


# ----------------------------------------------------------------------------- closed form
def _one_position(seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(seed)
    v = 8
    p1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    q1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    return p1, q1, int(q1.argmax())


@pytest.mark.parametrize("how", ["one-hot rejection", "sample-match"])
def test_greedy_draft_verification_reproduces_target_distribution(how: str) -> None:
    """One greedy draft x = argmax q, many rows: accepted with p(x), and the first emitted
    token ~ p exactly (chi-square), by the rejection sampler with a one-hot q and by
    sampling the target and comparing."""
    rows = 40_000
    p1, q1, x = _one_position(seed=1)
    v = p1.shape[0]
    g = torch.Generator().manual_seed(2)
    p = p1.expand(rows, 2, v).clone()
    drafts = torch.full((rows, 1), x)
    ones = torch.ones(rows, dtype=torch.long)
    if how == "sample-match":
        n, nxt = verify_match(drafts, ones, p, g)
    else:
        onehot = torch.zeros(rows, 1, v).scatter_(-1, drafts[..., None], 1.0)
        n, nxt = verify_sampled(drafts, ones, onehot, p, g)
    assert bool((nxt[n == 0] != x).all())  # a rejected draft is never the next token
    first = torch.where(n == 1, drafts[:, 0], nxt)
    counts = torch.bincount(first, minlength=v).double().numpy()
    exp = p1.double().numpy()
    pv = stats.chisquare(counts, exp / exp.sum() * rows).pvalue
    acc = stats.binomtest(int(n.sum()), rows, float(p1[x])).pvalue
    print(f"{how}: chi-square p = {pv:.3g}, acceptance binomial p = {acc:.3g}")
    assert pv > 1e-3 and acc > 1e-3


# ----------------------------------------------------------------------------- drafting: argmax, p-min, n-min
def _fixed_step(per_depth: list[torch.Tensor]):
    def step(x: torch.Tensor, feed: torch.Tensor, depth: int) -> torch.Tensor:
        return per_depth[depth - 1]

    return step


def _logits(top: float, v: int = 40, lead: int = 3) -> torch.Tensor:
    lg = torch.zeros(1, v)
    lg[0, lead] = top
    return lg


def test_greedy_drafts_are_the_argmax_lowest_id_on_ties() -> None:
    lg = torch.tensor([[0.0, 3.0, 3.0, 1.0]])
    rule = DraftRule(k=2, sampling=Sampling(temperature=1.0), threshold=None, vocab=4, greedy=True)
    prop, _ = chain(lg, _fixed_step([lg, torch.tensor([[5.0, 0.0, 0.0, 5.0]])]), torch.tensor([2]), rule, torch.Generator())
    assert prop.tokens.tolist() == [[1, 0]] and prop.drafted.tolist() == [2]
    assert prop.q[0].tolist() == [[0.0, 1.0, 0.0, 0.0]]  # one-hot q for the verify step


def test_llama_cpp_p_min_stops_before_the_unconfident_draft() -> None:
    """llama.cpp's draft-simple compares p_min with the top token's probability among the
    drafter's 10 best (temperature 1) and stops before adding that token. A long tail
    beyond the top 10 makes max q smaller: the default confidence stops at depth 1."""
    d1, d2 = _logits(5.0), _logits(1.0)  # top-10 confidence .943 and .232; max q over 40 ids .792
    rule = DraftRule(k=3, sampling=Sampling(temperature=1.0), threshold=0.85, vocab=40, greedy=True, confidence=LLAMA_CPP_TOP)
    assert confidence(d1, d1, rule).item() == pytest.approx(np.exp(5) / (np.exp(5) + 9))
    prop, fed = chain(d1, _fixed_step([d1, d2, d1]), torch.tensor([3]), rule, torch.Generator())
    assert prop.drafted.tolist() == [1] and fed.tolist() == [1]  # d_2 was not proposed
    by_q = DraftRule(k=3, sampling=Sampling(temperature=1.0), threshold=0.85, vocab=40, greedy=True)
    assert confidence(d1, d1, by_q).item() == pytest.approx(np.exp(5) / (np.exp(5) + 39))
    assert chain(d1, _fixed_step([d1, d2, d1]), torch.tensor([3]), by_q, torch.Generator())[0].drafted.tolist() == [0]
    # --spec-draft-n-min: a draft shorter than it is dropped whole
    short = DraftRule(k=3, sampling=Sampling(temperature=1.0), threshold=0.85, vocab=40, greedy=True, confidence=LLAMA_CPP_TOP, n_min=2)
    assert chain(d1, _fixed_step([d1, d2, d1]), torch.tensor([3]), short, torch.Generator())[0].drafted.tolist() == [0]


# ----------------------------------------------------------------------------- the real loop
@pytest.fixture(scope="module")
def spread():
    """A spread target (entropy ≈ 1.6 nats at the test prompt) and a drafter whose argmax
    is the target's there, accepted with p ≈ .47 at depth 1 and .43 at depth 2."""
    tgt = tiny(11, vocab=48, scale=0.3)
    return tgt, noisy_copy(tgt, 2, 0.1)


def _argmax_chain(drafter, prompt: list[int], k: int) -> list[int]:
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(k):
            out.append(int(drafter(torch.tensor([prompt + out])).logits[0, -1].argmax()))
    return out


def _p_next(model, seq: list[int], s: Sampling) -> torch.Tensor:
    with torch.inference_mode():
        return probs(model(torch.tensor([seq])).logits[0, -1], s).double()


@pytest.mark.parametrize("proc", [VLLM, LLAMA], ids=["vllm-one-hot-rejection", "llama.cpp-sample-match"])
def test_loop_drafts_the_argmax_accepted_with_p_and_follows_the_target(spread, proc) -> None:
    """Many draws of one prompt, K = 2 and three tokens: round 1 drafts the drafter's
    argmax chain x1, x2 in every row. A rejected draft is never the token emitted in its
    place, so the rows whose output starts x1 x2 are exactly those that accepted both:
    their count is depth 2's accepted count, binomial with p(x1)·p(x2 | x1). The first
    and second emitted tokens follow the target's exact marginals (chi-square)."""
    tgt, drafter = spread
    s = Sampling(temperature=1.0)
    prompt, n = [3, 17, 5, 40], 3000
    run = speculate(tgt, drafter, [prompt] * n, k=2, target_sampling=s, draft_sampling=Sampling(temperature=1.3, top_k=12), max_new_tokens=3, batch_size=n, seed=123, procedure=proc)
    c = run.counters
    x1, x2 = _argmax_chain(drafter, prompt, 2)
    both = sum(o[:2] == [x1, x2] for o in run.outputs)
    assert both == int(c.accepted_at[1]) and int(c.drafted_at[1]) == n  # depth 2 is drafted in round 1 only
    law = float(_p_next(tgt, prompt, s)[x1] * _p_next(tgt, prompt + [x1], s)[x2])
    accept = stats.binomtest(both, n, law).pvalue
    p1, p2 = _exact_marginals(tgt, prompt, s)
    first, second = _chi2([o[0] for o in run.outputs], p1), _chi2([o[1] for o in run.outputs], p2)
    print(f"{proc.engine}: acceptance {both}/{n} vs {law:.4f} binomial p = {accept:.3g}; chi-square token 1 p = {first:.3g}, token 2 p = {second:.3g}")
    assert 0.05 < c.accept_rate < 0.95  # both branches exercised
    assert accept > 1e-3 and first > 1e-3 and second > 1e-3


def test_both_verifications_have_one_acceptance_law(spread) -> None:
    """The same greedy drafts verified by the one-hot rejection sampler and by
    sample-and-compare: round 1's outcomes (x1 rejected, x1 accepted and x2 rejected, both
    accepted) follow one law (chi-square on the 2 × 3 table)."""
    tgt, drafter = spread
    s, prompt, n = Sampling(temperature=1.0), [3, 17, 5, 40], 10_000
    x1, x2 = _argmax_chain(drafter, prompt, 2)
    table = []
    for proc in (VLLM, LLAMA):
        out = speculate(tgt, drafter, [prompt] * n, k=2, target_sampling=s, max_new_tokens=3, batch_size=n, procedure=proc).outputs
        first = sum(o[0] == x1 for o in out)
        both = sum(o[:2] == [x1, x2] for o in out)
        table.append([n - first, first - both, both])
    pv = stats.chi2_contingency(np.array(table)).pvalue
    print(f"one-hot rejection vs sample-match, round-1 outcomes {table}: chi-square p = {pv:.3g}")
    assert pv > 1e-3


@pytest.mark.parametrize("proc", [VLLM, LLAMA, Procedure.of("llama.cpp", n_min=2)], ids=["vllm", "llama.cpp", "llama.cpp-n-min-2"])
def test_greedy_target_is_token_identical_under_every_procedure(proc) -> None:
    """T = 0: both verifications are argmax agreement, so the output is plain greedy
    decoding's, whatever the drafts and however many the p-min and n-min rules drop."""
    target, prompts = tiny(0), rand_prompts(6)
    reference = hf_greedy(target, prompts, 24)
    run = speculate(target, noisy_copy(target, 1, 0.3), prompts, k=3, target_sampling=GREEDY, draft_sampling=Sampling(temperature=0.7), max_new_tokens=24, batch_size=4, threshold=0.6, procedure=proc)
    assert run.outputs == reference
    c = run.counters
    assert c.num_drafts > 0 and c.accepted_tokens > 0
    if proc.n_min > 1:
        assert int(c.drafted_at[proc.n_min - 1]) == c.num_drafts  # no draft shorter than n_min


def test_llama_cpp_p_min_drafts_less_in_the_loop(spread) -> None:
    tgt, drafter = spread
    s, prompts = Sampling(temperature=1.0), rand_prompts(6, vocab=48)
    full = speculate(tgt, drafter, prompts, k=4, target_sampling=s, max_new_tokens=20, batch_size=3, procedure=LLAMA).counters
    gated = speculate(tgt, drafter, prompts, k=4, target_sampling=s, max_new_tokens=20, batch_size=3, threshold=0.3, procedure=LLAMA).counters
    assert gated.mean_k < full.mean_k


# ----------------------------------------------------------------------------- the pipeline's record
@pytest.mark.parametrize(("engine", "words"), [("vllm", "as vLLM runs it: greedy drafts"), ("llama.cpp", "as llama.cpp runs it: greedy drafts (the drafter's argmax), verified by sampling the target")])
def test_pipeline_runs_and_records_the_engines_procedure(tiny_pair, tmp_path, engine, words) -> None:
    """An identical drafter at T = 0.7: greedy drafts are accepted with p(argmax) < 1, not
    always as sampled ones are; the config and the measured block's note say how."""
    from specprobe.settings.pipeline import SamplingFlags
    from specprobe.simulate import run_simulate
    from tests.test_simulate import _sim_cfg

    r = run_simulate(_sim_cfg(tiny_pair, tmp_path, "self", sampling=SamplingFlags(temperature=0.7), engine=engine))
    assert r.config.model_dump()["engine"] == engine and r.config.model_dump()["draft_sampling"] == "greedy"
    assert words in r.measured.note and r.measured.note.startswith("measured by real speculative decoding")
    for row in r.measured.k_table:
        assert 0.0 < row.accept_rate < 1.0
    assert r.measured.adaptive is not None and r.measured.adaptive.threshold == 0.5
