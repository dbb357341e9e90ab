"""The renewal estimate of τ(K): rounds start only where the previous round ended.

Checked against closed forms (constant α), hand-computed sequences, a Monte-Carlo run of
real rounds on synthetic α sequences, and the accumulator's merge/state round trip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specprobe.estimates import estimate
from specprobe.metrics.accumulate import FIELDS, Accumulator


def _values(alpha: np.ndarray) -> dict[str, np.ndarray]:
    vals = {f: np.zeros(len(alpha)) for f in FIELDS}
    vals["accept_prob"] = np.asarray(alpha, dtype=float)
    return vals


def _acc(seqs: list[np.ndarray], k_max: int, heads: list[dict[int, np.ndarray]] | None = None) -> Accumulator:
    acc = Accumulator(k_max=k_max)
    for i, a in enumerate(seqs):
        acc.add_sequence(f"d{i % 2}", np.arange(len(a)), _values(a), alpha_by_depth=heads[i] if heads else None)
    return acc


def _tau(alpha: np.ndarray) -> np.ndarray:
    c = estimate.renewal_counts(alpha)
    return estimate.renewal_tau(c.accepted, c.drafted)


# ----------------------------------------------------------------------------- closed forms
@pytest.mark.parametrize("n", [3, 7, 40, 500])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.75, 1.0])
def test_constant_alpha_renewal_equals_window_and_iid_at_any_length(n: int, alpha: float) -> None:
    # The renewal τ counts like vLLM: per depth i, rounds that accepted 1..i ÷ rounds that
    # drafted i. With α constant every round's r_i is α^i wherever it starts and however
    # short the end caps its draft, so there is no boundary effect at any length.
    acc = _acc([np.full(n, alpha)], k_max=6)
    ren = acc.renewal_tau()
    window = acc.cumulative_depth()
    for k in range(1, 7):
        if k >= n:  # no round can draft k tokens: the table stops at shorter drafts
            continue
        assert ren[k - 1] == pytest.approx(estimate.iid_tau(alpha, k), abs=1e-12)
        assert ren[k - 1] == pytest.approx(estimate.tau(window.tolist(), k), abs=1e-12)


def test_constant_alpha_tokens_per_verify_has_only_an_end_effect() -> None:
    # tokens ÷ rounds includes the final rounds, whose drafts are capped by what is left:
    # it sits below τ by an amount that shrinks like 1/n.
    k, alpha = 4, 0.7
    tau = estimate.iid_tau(alpha, k)
    gaps = []
    for n in (40, 400, 4000):
        c = estimate.renewal_counts(np.full((k, n), alpha))
        tpv = estimate.renewal_tokens_per_verify(c.tokens, c.rounds)[k - 1]
        assert tpv < tau
        gaps.append(tau - tpv)
    assert gaps[0] > 5 * gaps[1] > 25 * gaps[2]
    assert gaps[2] / tau < 1e-3


def test_constant_per_depth_alpha_of_a_head_drafter() -> None:
    a = [0.9, 0.7, 0.5, 0.3]  # depth-d head acceptance, the same at every position
    n = 60
    heads = {d: np.full(n, a[d - 1]) for d in range(1, 5)}
    acc = _acc([np.full(n, a[0])], k_max=4, heads=[heads])
    expected = [1 + sum(math.prod(a[:j]) for j in range(1, k + 1)) for k in range(1, 5)]
    assert acc.renewal_tau() == pytest.approx(expected, abs=1e-12)
    assert acc.renewal_tau() == pytest.approx([estimate.tau(acc.cumulative_depth().tolist(), k) for k in range(1, 5)], abs=1e-12)


def test_every_token_is_emitted_by_exactly_one_round() -> None:
    rng = np.random.default_rng(3)
    c = estimate.renewal_counts(rng.random((5, 37)))
    # each round emits its accepted drafts plus one target token
    assert c.accepted.sum(axis=1) + c.rounds == pytest.approx(np.full(5, 37.0))
    for k in range(1, 6):  # a round drafts depth i+1 only if it drafts depth i
        row = c.drafted[k - 1, :k]
        assert np.all(np.diff(row) <= 1e-12) and np.all(c.drafted[k - 1, k:] == 0)


# ----------------------------------------------------------------------------- by hand
def test_two_regime_sequence_k1_by_hand() -> None:
    # α = [.5, .5 | 1, 1, 1], K = 1: a round at t drafts min(1, 5 − t − 1) tokens.
    # π(0) = 1; t=0 → t=1 (.5) or t=2 (.5); t=1 → t=2 (.25) or t=3 (.25): π(2) = .75,
    # π(3) = .25; t=2 and t=3 accept surely (→ 4, → 5); t=4 drafts nothing (→ 5).
    # rounds = 1 + .5 + .75 + .25 + .75 = 3.25; drafted = 2.5 (t=4 drafts 0);
    # accepted = .5 + .25 + .75 + .25 = 1.75 → τ = 1 + 1.75/2.5 = 1.7, tokens/rounds = 5/3.25.
    c = estimate.renewal_counts(np.array([[0.5, 0.5, 1.0, 1.0, 1.0]]))
    assert c.rounds[0] == pytest.approx(3.25)
    assert c.drafted[0, 0] == pytest.approx(2.5) and c.accepted[0, 0] == pytest.approx(1.75)
    assert estimate.renewal_tau(c.accepted, c.drafted)[0] == pytest.approx(1.7)
    assert estimate.renewal_tokens_per_verify(c.tokens, c.rounds)[0] == pytest.approx(5 / 3.25)
    # the window estimate averages every start: 1 + mean α = 1.8
    assert estimate.tau([0.8], 1) == pytest.approx(1 + np.mean([0.5, 0.5, 1, 1, 1]))


def test_hard_stretch_then_easy_stretch_k2_by_hand() -> None:
    # 4 hard tokens (α = 0) then 8 easy ones (α = 1), K = 2. Rounds start at 0, 1, 2, 3
    # (each drafts 2, rejects the first, emits 1), then at 4 and 7 (accept 2, emit 3), then
    # at 10 where only 2 tokens are left (drafts 1, accepts it, emits 2): 7 rounds.
    # drafted: depth 1 in 7 rounds, depth 2 in 6; accepted: depth 1 in 3, depths 1..2 in 2.
    a = np.array([0.0] * 4 + [1.0] * 8)
    acc = _acc([a], k_max=2)
    assert acc.renewal_rounds[1] == pytest.approx(7)
    assert acc.renewal_tau()[1] == pytest.approx(1 + 3 / 7 + 2 / 6)
    assert acc.renewal_tokens_per_verify()[1] == pytest.approx(12 / 7)
    # the window estimate: r_1 = 8/12, r_2 = 7/11 (starts 4..10 of 11) — far too optimistic,
    # because it starts rounds in the easy stretch as often as in the hard one
    window = estimate.tau(acc.cumulative_depth().tolist(), 2)
    assert window == pytest.approx(1 + 8 / 12 + 7 / 11)
    assert acc.renewal_tau()[1] < window - 0.5


# ----------------------------------------------------------------------------- Monte Carlo
def _bursty(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """[k, n]: stretches of hard and easy tokens (a two-state Markov chain), per-depth α
    decaying with depth as a head drafter's does."""
    easy = np.empty(n, dtype=bool)
    easy[0] = True
    for t in range(1, n):
        easy[t] = easy[t - 1] if rng.random() < 0.85 else not easy[t - 1]
    base = np.where(easy, rng.uniform(0.75, 1.0, n), rng.uniform(0.0, 0.35, n))
    return np.stack([base * 0.93**d for d in range(k)])


def _run_rounds(alpha: np.ndarray, k: int, reps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Real rounds, reps times: per round draft min(K, n − t − 1), accept depth i with
    probability α^{(i)}_{t+i−1} until the first rejection. -> per run rounds [R], accepted
    [R, K], drafted [R, K]."""
    n = alpha.shape[1]
    t = np.zeros(reps, dtype=np.int64)
    rounds = np.zeros(reps)
    acc, dr = np.zeros((reps, k)), np.zeros((reps, k))
    depth = np.arange(1, k + 1)
    while True:
        live = np.flatnonzero(t < n)
        if live.size == 0:
            break
        tt = t[live]
        cap = np.minimum(k, n - 1 - tt)
        drafts = depth[None, :] <= cap[:, None]  # [m, K]
        pos = np.minimum(tt[:, None] + depth[None, :] - 1, n - 1)
        ok = (rng.random((live.size, k)) < alpha[depth[None, :] - 1, pos]) & drafts
        j = np.cumprod(ok, axis=1).sum(axis=1)
        dr[live] += drafts
        acc[live] += depth[None, :] <= j[:, None]
        rounds[live] += 1
        t[live] = tt + j + 1
    return rounds, acc, dr


@pytest.mark.parametrize("k", [1, 2, 4])
def test_monte_carlo_rounds_agree_with_the_recursion(k: int) -> None:
    rng = np.random.default_rng(1234 + k)
    alpha = _bursty(50, k, rng)
    c = estimate.renewal_counts(alpha)
    rounds, acc, dr = _run_rounds(alpha, k, 20_000, rng)

    def within(samples: np.ndarray, expected: float) -> None:
        se = samples.std(ddof=1) / math.sqrt(len(samples))
        assert abs(samples.mean() - expected) <= 4 * se + 1e-9, (samples.mean(), expected, se)

    within(rounds, c.rounds[k - 1])
    for i in range(k):
        within(acc[:, i], c.accepted[k - 1, i])
        within(dr[:, i], c.drafted[k - 1, i])
    # the same τ as simulate would compute from these counters, within its noise
    tau_mc = 1 + np.sum(acc.sum(0) / dr.sum(0))
    assert tau_mc == pytest.approx(estimate.renewal_tau(c.accepted, c.drafted)[k - 1], rel=0.01)


def test_bursty_acceptance_puts_the_window_estimate_above_the_renewal_one() -> None:
    rng = np.random.default_rng(7)
    seqs = [_bursty(64, 1, rng)[0] for _ in range(20)]
    acc = _acc(seqs, k_max=4)
    window = [estimate.tau(acc.cumulative_depth().tolist(), k) for k in range(1, 5)]
    assert np.all(acc.renewal_tau() < np.asarray(window))


# ----------------------------------------------------------------------------- the real loop
def _tiny_pair():
    """A tiny float64 Llama target and a noisy copy that agrees with it about half the time."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0 / target.lm_head.weight.std())  # peaked, not near uniform
    target = target.to(torch.float64)
    drafter = LlamaForCausalLM(cfg).eval().to(torch.float64)
    drafter.load_state_dict(target.state_dict())
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for w in drafter.parameters():
            w.add_(0.3 * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype))
    return target, drafter


def test_greedy_renewal_counts_are_exactly_the_real_loops_counters() -> None:
    # Greedy target and drafter on the target's own greedy reference: every accepted draft
    # is the reference token, α ∈ {0, 1}, and the renewal schedule is the loop's schedule,
    # end of budget included — so the expected counters are the measured ones, exactly.
    import torch

    from specprobe.metrics.sampling import Sampling
    from specprobe.simulate import speculate

    greedy = Sampling(temperature=0.0)
    n = 30
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models gain nothing from threads on a shared machine
    try:
        target, drafter = _tiny_pair()
        g = torch.Generator().manual_seed(5)
        prompts = [torch.randint(0, 300, (int(L),), generator=g).tolist() for L in torch.randint(3, 14, (4,), generator=g)]
        refs = speculate(target, None, prompts, k=0, target_sampling=greedy, max_new_tokens=n, batch_size=1).outputs
        alphas = []
        with torch.inference_mode():
            for p, y in zip(prompts, refs, strict=True):
                ids = torch.tensor([p + y[:-1]])
                tl = target(input_ids=ids).logits[0, len(p) - 1 :]  # [n, V]: predicts y_0 … y_{n−1}
                dl = drafter(input_ids=ids).logits[0, len(p) - 1 :]
                assert tl.argmax(-1).tolist() == y  # teacher forcing reproduces the reference
                alphas.append((dl.argmax(-1) == tl.argmax(-1)).double().numpy())
        assert 0.2 < np.mean(np.concatenate(alphas)) < 0.9  # a drafter that is neither useless nor perfect
        for k in (1, 3):
            c = speculate(target, drafter, prompts, k=k, target_sampling=greedy, draft_sampling=greedy, max_new_tokens=n, batch_size=1).counters
            counts = [estimate.renewal_counts(np.tile(a, (k, 1))) for a in alphas]
            assert c.verify_steps == pytest.approx(sum(x.rounds[k - 1] for x in counts), abs=1e-9)
            assert c.accepted_at == pytest.approx(sum(x.accepted[k - 1] for x in counts), abs=1e-9)
            assert c.drafted_at == pytest.approx(sum(x.drafted[k - 1] for x in counts), abs=1e-9)
            acc = sum(x.accepted for x in counts)
            assert c.tau_tokens == pytest.approx(estimate.renewal_tau(acc, sum(x.drafted for x in counts))[k - 1])
    finally:
        torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- accumulator
def test_merge_of_two_accumulators_equals_one_over_both() -> None:
    rng = np.random.default_rng(0)
    seqs = [rng.random(10 + 3 * i) for i in range(6)]
    heads = [{2: rng.random(len(s)), 3: rng.random(len(s))} for s in seqs]
    whole = _acc(seqs, 4, heads)
    a, b = _acc(seqs[:2], 4, heads[:2]), _acc(seqs[2:], 4, heads[2:])
    merged = Accumulator.from_state(a.to_state()).merge(Accumulator.from_state(b.to_state()))
    assert merged.renewal_tau() == pytest.approx(whole.renewal_tau(), abs=1e-12)
    assert merged.renewal_tokens_per_verify() == pytest.approx(whole.renewal_tokens_per_verify(), abs=1e-12)
    assert merged.renewal_tokens == whole.renewal_tokens == sum(len(s) for s in seqs)
    assert not np.isnan(whole.renewal_tau()).any()
    # aggregated by rounds, not by prompt: not the mean of per-prompt τ
    per_prompt = np.mean([_acc([s], 4, [h]).renewal_tau() for s, h in zip(seqs, heads, strict=True)], axis=0)
    assert not np.allclose(per_prompt, whole.renewal_tau())


def test_state_saved_before_the_renewal_estimate_still_loads() -> None:
    acc = _acc([np.full(20, 0.5)], k_max=3)
    old = {k: v for k, v in acc.to_state().items() if not k.startswith("renewal_")}
    loaded = Accumulator.from_state(old)
    assert loaded.cumulative_depth() == pytest.approx(acc.cumulative_depth())
    assert np.isnan(loaded.renewal_tau()).all() and np.isnan(loaded.renewal_tokens_per_verify()).all()
    # a merge with a new shard does not pass off part of the data as the whole
    assert np.isnan(loaded.merge(_acc([np.full(20, 0.9)], k_max=3)).renewal_tau()).all()
    assert np.isnan(Accumulator(k_max=3).renewal_tau()).all()


# ----------------------------------------------------------------------------- K table
def test_k_table_speedup_uses_the_renewal_tau_and_keeps_the_window_columns() -> None:
    a = np.array([0.0] * 4 + [1.0] * 8)
    acc = _acc([a], k_max=2)
    cum = acc.cumulative_depth().tolist()
    ren = acc.renewal_tau()
    rows = estimate.k_table(cum, float(a.mean()), cost_ratio=0.1, verify_factor=1.2, renewal=ren.tolist())
    for row in rows:
        assert row.tau_tokens == pytest.approx(estimate.tau(cum, row.k))
        assert row.tau_renewal_tokens == pytest.approx(ren[row.k - 1])
        assert row.speedup == pytest.approx(ren[row.k - 1] / (1 + 0.1 * row.k) / 1.2)
        assert row.speedup_window == pytest.approx(row.tau_tokens / (1 + 0.1 * row.k) / 1.2)
        assert row.accept_rate_renewal == pytest.approx((ren[row.k - 1] - 1) / row.k)
    plain = estimate.k_table(cum, float(a.mean()), cost_ratio=0.1)
    assert all(math.isnan(r.tau_renewal_tokens) and r.speedup == r.speedup_window for r in plain)


# ----------------------------------------------------------------------------- measured verify cost
def test_adaptive_k_prices_the_verify_pass_at_its_mean_draft_length() -> None:
    # one threshold: 10 windows, 12 expected accepted, 25 drafter passes, 15 drafted (1.5 per round)
    table = np.array([[12.0, 25.0, 15.0, 10.0]])
    c, verify = 0.2, [1.2, 1.6, 2.0]
    measured = estimate.adaptive_threshold([0.5], table, c, None, verify)
    assert estimate.verify_at(1.5, verify) == pytest.approx(1.4)  # between v_1 = 1.2 and v_2 = 1.6
    assert estimate.verify_at(0.0, verify) == 1.0 and estimate.verify_at(9.0, verify) == 2.0
    assert measured is not None and measured.speedup == pytest.approx(2.2 / (0.2 * 2.5 + 1.4))
    given = estimate.adaptive_threshold([0.5], table, c, 1.3)
    assert given is not None and given.speedup == pytest.approx(2.2 / ((1 + 0.2 * 2.5) * 1.3))


def test_k_table_with_measured_round_costs_and_their_quartiles() -> None:
    rounds = estimate.round_costs(2, draft_ratios=[0.1, 0.2, 0.3], verify_ratios=[[1.1, 1.2, 1.3], [1.4, 1.5, 1.9]])
    rows = estimate.k_table([0.8, 0.5], 0.7, 0.2, 1.0, renewal=[1.75, 2.2], rounds=rounds)
    for row, rc in zip(rows, rounds, strict=True):
        assert row.speedup == pytest.approx([1.75, 2.2][row.k - 1] / rc.cost)
        assert row.speedup_low <= row.speedup <= row.speedup_high
        assert row.verify_factor == rc.verify_factor
    assert rounds[1].cost == pytest.approx(2 * 0.2 + 1.5)  # per repeat 2·c_i + v_2,i: [1.6, 1.9, 2.5] -> median 1.9


# ----------------------------------------------------------------------------- cost over a budget
def test_budget_cost_prices_full_rounds_as_the_round_cost() -> None:
    # every round drafts K (a long sequence of sure acceptances is the limit): the budget cost
    # is rounds × (K·c + v_K), and with --verify-factor exactly rounds × (1 + K·c)·v
    drafted = [10.0, 10.0, 10.0]
    assert estimate.budget_cost(10.0, drafted, 0.4, [1.2, 1.3, 1.5]) == pytest.approx(10 * (3 * 0.4 + 1.5))
    assert estimate.budget_cost(10.0, drafted, 0.4, [], verify_factor=1.1) == pytest.approx(10 * estimate.round_cost(3, 0.4, 1.1))


def test_budget_cost_by_hand_with_short_final_rounds() -> None:
    # n = 3, K = 2, α = 1: round 1 at t = 0 drafts 2 (accepts both, emits 3 tokens). n = 4:
    # round 1 emits 3, round 2 at t = 3 has one token left and drafts 0 (a plain step, v_0 = 1)
    c, v = 0.5, [1.2, 1.4]
    for n, expected in [(3, 2 * c + v[1]), (4, 2 * c + v[1] + 1.0)]:
        cnt = estimate.renewal_counts(np.ones((2, n)))
        cost = estimate.budget_cost(float(cnt.rounds[1]), cnt.drafted[1].tolist(), c, v)
        assert cost == pytest.approx(expected)


def test_budget_speedup_tends_to_the_steady_state_one_on_long_sequences() -> None:
    k, alpha, c, v = 4, 0.7, 0.3, [1.1, 1.2, 1.3, 1.4]
    steady = estimate.iid_tau(alpha, k) / (k * c + v[k - 1])
    gaps = []
    for n in (32, 320, 3200):
        cnt = estimate.renewal_counts(np.full((k, n), alpha))
        budget = cnt.tokens / estimate.budget_cost(float(cnt.rounds[k - 1]), cnt.drafted[k - 1].tolist(), c, v)
        gaps.append(abs(budget - steady) / steady)
    assert gaps[0] > 5 * gaps[1] > 25 * gaps[2]
    assert gaps[0] > 0.005  # on 32 tokens the final short rounds show


@pytest.mark.parametrize("k", [2, 4])
def test_monte_carlo_cost_of_real_rounds_agrees_with_the_budget_cost(k: int) -> None:
    # the real rounds as in simulate's loop at batch 1: a round at t drafts m = min(K, n − t − 1)
    # and costs m·c + v_m (v_0 = 1)
    rng = np.random.default_rng(99 + k)
    alpha = _bursty(40, k, rng)
    c, v = 0.35, [1.0, *np.linspace(1.1, 1.6, k)]
    n, reps = alpha.shape[1], 20_000
    t = np.zeros(reps, dtype=np.int64)
    cost = np.zeros(reps)
    depth = np.arange(1, k + 1)
    while (live := np.flatnonzero(t < n)).size:
        tt = t[live]
        cap = np.minimum(k, n - 1 - tt)
        pos = np.minimum(tt[:, None] + depth[None, :] - 1, n - 1)
        ok = (rng.random((live.size, k)) < alpha[depth[None, :] - 1, pos]) & (depth[None, :] <= cap[:, None])
        j = np.cumprod(ok, axis=1).sum(axis=1)
        cost[live] += cap * c + np.asarray(v)[cap]
        t[live] = tt + j + 1
    cnt = estimate.renewal_counts(alpha)
    expected = estimate.budget_cost(float(cnt.rounds[k - 1]), cnt.drafted[k - 1].tolist(), c, list(v[1:]))
    se = cost.std(ddof=1) / math.sqrt(reps)
    assert abs(cost.mean() - expected) <= 4 * se, (cost.mean(), expected, se)
