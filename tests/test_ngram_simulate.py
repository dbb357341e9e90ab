"""The n-gram drafters in the real draft → verify loop (simulate.ngram_source): greedy
output token-identical to plain decoding for every type, and at T > 0 a deterministic
draft accepted with probability p_target(draft) under vLLM's and llama.cpp's procedures."""

from __future__ import annotations

import pytest
import torch

from specprobe.drafters.ngram import NgramDrafter
from specprobe.metrics.sampling import Sampling, probs
from specprobe.simulate import Procedure, speculate
from tests.test_simulate import hf_greedy, rand_prompts, tiny

GREEDY = Sampling(temperature=0.0)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SPECS = [
    "ngram:min=1,max=3",
    "ngram:min=2,max=2,k=3",
    "ngram-simple:size_n=1,size_m=4",
    "ngram-map-k:size_n=1,size_m=4",
    "ngram-map-k4v:size_n=1,size_m=3",
    "ngram-mod:n_match=1,n_min=1,n_max=4",
    "ngram-cache",
    "ngram-cache,ngram-simple:size_n=2,size_m=6",
]


@pytest.fixture(scope="module")
def target():
    return tiny(0)


@pytest.fixture(scope="module")
def prompts():
    # prompts that repeat themselves, so there is something to look up
    return [p + p[: len(p) // 2] + p for p in rand_prompts(5, seed=9)]


@pytest.fixture(scope="module")
def reference(target, prompts):
    return hf_greedy(target, prompts, 30)


@pytest.mark.parametrize("spec", SPECS)
def test_greedy_output_is_token_identical(target, prompts, reference, spec) -> None:
    drafter = NgramDrafter(spec)
    k = drafter.max_draft(k=4)
    for proc in (Procedure.of("vllm"), Procedure.of("llama.cpp")):
        run = speculate(target, drafter, prompts, k=k, target_sampling=GREEDY, max_new_tokens=30, batch_size=3, procedure=proc)
        assert run.outputs == reference
        c = run.counters
        assert c.accepted_tokens <= c.drafted_tokens
        assert c.emitted_tokens == sum(len(r) for r in reference)


def test_drafts_happen_and_pay_where_the_text_repeats(target, prompts, reference) -> None:
    """On these self-repeating prompts every type drafts, and prompt lookup is accepted."""
    drafted = {}
    for spec in SPECS:
        drafter = NgramDrafter(spec)
        run = speculate(target, drafter, prompts, k=drafter.max_draft(k=4), target_sampling=GREEDY, max_new_tokens=30, batch_size=5)
        drafted[spec] = (run.counters.num_drafts, run.counters.accepted_tokens)
    assert all(d > 0 for d, _ in drafted.values()), drafted
    assert drafted["ngram:min=1,max=3"][1] > 0


def test_first_round_drafts_nothing(target) -> None:
    """The engines draft only after the prompt's pass: with one new token there is no
    draft at all, however repetitive the prompt."""
    p = [5, 6, 7, 5, 6, 7, 5, 6]
    run = speculate(target, NgramDrafter("ngram:min=1,max=2,k=4"), [p], k=4, target_sampling=GREEDY, max_new_tokens=1)
    assert run.counters.num_drafts == 0 and len(run.outputs[0]) == 1


@pytest.mark.parametrize("engine", ["vllm", "llama.cpp"])
def test_sampled_draft_is_accepted_with_p_target(engine) -> None:
    """At T = 1: the first token x is sampled; prompt lookup (1-gram) then drafts the token
    after x's earliest occurrence in the prompt (every token occurs, so always), and the
    loop accepts it with p(draft | prompt, x). The accepted fraction over many rows equals
    Σ_x p(x) p(d(x) | x) within sampling error. (A budget of 3 tokens: the first round
    emits one, the second may draft one, remaining − 1.)"""
    v = 12
    tgt = tiny(11, vocab=v, scale=0.2)
    perm = torch.randperm(v, generator=torch.Generator().manual_seed(1)).tolist()
    prompt = perm + perm[:1]  # every token, each followed by a known successor
    follow = {perm[i]: (perm + perm[:1])[i + 1] for i in range(v)}
    ts = Sampling(temperature=1.0)
    with torch.inference_mode():
        p0 = probs(tgt(torch.tensor([prompt])).logits[0, -1].float(), ts)
        expected = 0.0
        for x in range(v):
            px = probs(tgt(torch.tensor([prompt + [x]])).logits[0, -1].float(), ts)
            expected += float(p0[x]) * float(px[follow[x]])
    n = 3000
    run = speculate(
        tgt, NgramDrafter("ngram:min=1,max=1,k=1"), [prompt] * n, k=1, target_sampling=ts,
        max_new_tokens=3, batch_size=n, seed=7, procedure=Procedure.of(engine),
    )
    c = run.counters
    assert c.drafted_tokens == n  # one deterministic draft per row
    rate = c.accepted_tokens / c.drafted_tokens
    sd = (expected * (1 - expected) / n) ** 0.5
    assert abs(rate - expected) < 4 * sd, (rate, expected)
    # a rejected draft is never the next token (the residual leaves it out), so the
    # rows whose second token is the draft are exactly the accepted ones
    assert sum(o[1] == follow[o[0]] for o in run.outputs) == c.accepted_tokens
