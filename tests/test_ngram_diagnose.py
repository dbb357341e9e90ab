"""diagnose and simulate with an n-gram drafter (probe.ngram): the walk along a reference
on hand-made sequences, the walk equal to the real loop's counters under greedy decoding,
the result's n-gram metrics, groups and rules, and simulate's measurement against it."""

from __future__ import annotations

import pytest

from specprobe.drafters.ngram import NgramDrafter
from specprobe.metrics.sampling import Sampling
from specprobe.probe.ngram import Steps, verify_cost, walk
from specprobe.simulate import speculate
from tests.test_simulate import hf_greedy, rand_prompts, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_walk_on_a_copy() -> None:
    """The continuation copies the prompt: after the first token every step proposes and
    the copy is accepted until the continuation goes its own way."""
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    cont = [1, 2, 3, 4, 5, 9, 9]
    s = walk(NgramDrafter("ngram:min=1,max=2,k=3").slot(), prompt, cont, max_new_tokens=64)
    # first token 1 (prefill); step 1: [1] -> drafts [2,3,4], all accepted, next 5;
    # step 2: [..5] -> drafts [6,7,8], rejected at 6 (the reference says 9);
    # step 3: [..9] -> 9 earlier? no (only at the end) -> nothing
    assert (s.steps, s.drafts, s.drafted, s.accepted) == (3, 2, 6, 3)
    assert s.by_length == {3: 2, 0: 1}
    assert s.tau_tokens == pytest.approx(6 / 3)
    assert s.proposal_frac == pytest.approx(2 / 3) and s.accept_frac == pytest.approx(0.5)


def test_walk_respects_the_budget() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    s = walk(NgramDrafter("ngram:min=1,max=1,k=8").slot(), prompt, [1, 2, 3], max_new_tokens=3)
    # after the first token 2 more may be emitted: the draft is at most 1 (remaining − 1)
    assert s.drafted <= 2 and s.steps + s.accepted == 2


def test_llama_cpp_accepts_no_drafted_eog_but_a_drafts_last() -> None:
    """llama.cpp's verify stops at a drafted end-of-generation token unless it is the
    draft's last: that EOG is emitted as the next token, not counted as accepted."""
    prompt = [1, 2, 3, 9, 0, 1, 2]
    cont = [3, 9, 0]  # 0: EOS; after [.., 2, 3] prompt lookup drafts [9, 0, 1]
    plain = walk(NgramDrafter("ngram:min=2,max=2,k=3").slot(), prompt, cont, 64)
    llama = walk(NgramDrafter("ngram:min=2,max=2,k=3").slot(), prompt, cont, 64, eog={0})
    assert (plain.drafted, plain.accepted) == (3, 2)
    assert (llama.drafted, llama.accepted) == (3, 1)
    assert plain.steps == llama.steps == 1


def test_speedup_prices_each_step_by_its_length() -> None:
    s = Steps(requests=1, steps=4, drafts=2, drafted=6, accepted=4, match_s=0.0, by_length={0: 2, 3: 2})
    # 8 tokens over 2 plain steps (1 each) + 2 steps verifying 4 tokens (v_3 = 1.5)
    assert s.speedup([1.1, 1.2, 1.5], 0.01) == pytest.approx(8 / (2 + 2 * 1.5))
    assert verify_cost(5, [1.1, 1.2, 1.5]) == pytest.approx(2.1)  # linear past the last timed
    s.match_s = 0.04  # 4 steps × 10 ms of matching = 4 target steps
    assert s.speedup([1.1, 1.2, 1.5], 0.01) == pytest.approx(8 / 9)


@pytest.mark.parametrize("spec", ["ngram:min=1,max=3,k=4", "ngram-simple:size_n=1,size_m=5", "ngram-map-k:size_n=1,size_m=4", "ngram-mod:n_match=1,n_min=1,n_max=4", "ngram-cache"])
def test_walk_is_the_greedy_loop(spec) -> None:
    """Teacher-forced along the target's greedy references, the walk counts exactly what
    the real loop counts (its first round, the prompt's pass, left out)."""
    target = tiny(0)
    prompts = [p + p for p in rand_prompts(4, seed=3)]
    refs = hf_greedy(target, prompts, 24)
    drafter = NgramDrafter(spec)
    total = Steps()
    for p, c in zip(prompts, refs, strict=True):
        total.add(walk(drafter.slot(), p, c, 24))
    run = speculate(target, NgramDrafter(spec), prompts, k=drafter.max_draft(), target_sampling=Sampling(temperature=0.0), max_new_tokens=24, batch_size=4)
    c = run.counters
    assert run.outputs == refs
    assert (c.verify_steps - len(prompts), c.num_drafts, c.drafted_tokens, c.accepted_tokens) == (total.steps, total.drafts, total.drafted, total.accepted)
    assert total.drafts > 0


def _cfg(tiny_pair, tmp_path, drafter: str, **kw):
    from specprobe.settings.pipeline import DiagnoseConfig
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    return DiagnoseConfig(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=20, batch_size=3, keep_positions=False, **kw)


def test_diagnose_reports_proposals_by_group(tiny_pair, tmp_path) -> None:
    from specprobe.probe.diagnose import run_diagnose

    r = run_diagnose(_cfg(tiny_pair, tmp_path, "ngram-simple:size_n=1,size_m=4"))
    assert r.scored and r.drafter.kind == "ngram" and r.command == "diagnose"
    m = r.metrics
    assert 0 <= m["ngram_proposal_frac"] <= 1 and m["tau_tokens"] >= 1 and m["best_k"] == 4
    assert [row.k for row in r.k_table] == [4]
    groups = {row.group for row in r.by_domain}
    assert groups == {"code", "math", "chat"}
    assert sum(row.positions for row in r.by_domain) > 0
    assert all(row.ngram_proposal_frac is None or 0 <= row.ngram_proposal_frac <= 1 for row in r.by_domain)
    # vLLM's ngram without k=: a row per K up to k_max, the best by speedup
    r2 = run_diagnose(_cfg(tiny_pair, tmp_path, "ngram:min=1,max=2", k_max=3))
    assert [row.k for row in r2.k_table] == [1, 2, 3] and r2.metrics["best_k"] in (1, 2, 3)


def test_rare_proposals_are_a_finding(tiny_pair, tmp_path) -> None:
    from specprobe.probe.diagnose import run_diagnose

    # llama.cpp's defaults (a 12-token key, 48-token drafts) on short answers: hardly ever
    r = run_diagnose(_cfg(tiny_pair, tmp_path, "ngram-simple"))
    assert r.metrics["ngram_proposal_frac"] < 0.1
    assert "SP310" in [f.rule_id for f in r.findings]


def test_simulate_measures_what_the_walk_counted(tiny_pair, tmp_path) -> None:
    """Greedy: the measured τ is the walked one (both run the engine's steps over the same
    greedy text)."""
    from specprobe.settings.pipeline import SamplingFlags, SimulateConfig
    from specprobe.simulate import run_simulate

    cfg = SimulateConfig(_cfg(tiny_pair, tmp_path, "ngram-simple:size_n=1,size_m=4", sampling=SamplingFlags(temperature=0.0)), ks=[1, 3], adaptive_threshold=0.5)
    r = run_simulate(cfg)
    rows = r.measured.k_table
    assert [row.k for row in rows] == [4]  # its own draft length, once
    # the same accepted ÷ proposed tokens and the same tokens per verify step (the first
    # round, the prompt's pass, left out on both)
    assert rows[0].accept_rate == pytest.approx(r.k_table[0].accept_rate)
    assert rows[0].tau_estimate == pytest.approx(rows[0].tau_tokens) and abs(rows[0].tau_gap) < 1e-9
    assert r.measured.adaptive is None
