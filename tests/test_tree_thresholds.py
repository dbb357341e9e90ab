"""SGLang's relaxed acceptance thresholds on draft trees (`--tree` with
--accept-threshold-single/-acc below 1): tree_speculative_sampling_target_only draws one
coin per accepted node, tries its children in index order and accepts child j when
coin ≤ P_j ÷ θ_acc (P_j the summed target probability of the children tried) or
p_j ≥ θ_single. The closed form against a hand two-level tree; the loop's per-node
acceptance frequencies against the closed form (binomial standard errors); the estimate
drafted on the candidate paths against the loop's measured τ; thresholds (1, 1) as
before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from specprobe.estimates import tree as T
from specprobe.metrics.sampling import Sampling, probs
from specprobe.metrics.tree import TreeAccumulator
from specprobe.models.tree_draft import Tree
from specprobe.probe import tree_paths
from specprobe.simulate import speculate
from specprobe.simulate import tree as tl
from specprobe.simulate.procedure import Procedure
from tests.test_simulate import noisy_copy, rand_prompts, tiny
from tests.test_tree_paths import _LM

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _two_level(thresholds: tuple[float, float]) -> T.TreeRounds:
    """Root → ranks 0, 1; rank 0 → ranks 0, 1; rank 1 → rank 0. Depth 1's candidates have
    target probabilities (.3, .5), depth 2's (.4, .35) (teacher-forced: every depth-2 node
    the same)."""
    shape = T.static([[0], [1], [0, 0], [0, 1], [1, 0]])
    q = np.array([[[0.6, 0.3], [0.5, 0.4]]])
    p = np.array([[[0.3, 0.5], [0.4, 0.35]]])
    return T.rounds(shape, q, p, thresholds)


def test_closed_form_on_a_hand_two_level_tree() -> None:
    # θ_single .45, θ_acc .6. Depth 1: rank 0 (p .3 < .45) min(.3/.6, 1) = 1/2; rank 1
    # (p .5 ≥ .45) 1 − min(.3/.6, 1) = 1/2. Below rank 0: min(.4/.6, 1) = 2/3, then
    # min(.75/.6, 1) − 2/3 = 1/3; below rank 1 (one child): 2/3.
    r = _two_level((0.45, 0.6))
    np.testing.assert_allclose(r.by_rank[:, :, 0], [[0.5, 0.5], [0.5 * 2 / 3 + 0.5 * 2 / 3, 0.5 / 3]], atol=1e-12)
    np.testing.assert_allclose(r.survival[:, 0], [1.0, 1.0, 2 / 3 + 1 / 6], atol=1e-12)
    # θ_single .25: depth 1's rank 0 (p .3) is taken outright, rank 1 is never tried;
    # depth 2's rank 0 (.4) likewise
    r = _two_level((0.25, 0.6))
    np.testing.assert_allclose(r.by_rank[:, :, 0], [[1.0, 0.0], [1.0, 0.0]], atol=1e-12)
    # exact thresholds: each child with its own p, the product along the path
    r = _two_level((1.0, 1.0))
    np.testing.assert_allclose(r.by_rank[:, :, 0], [[0.3, 0.5], [0.3 * 0.4 + 0.5 * 0.4, 0.3 * 0.35]], atol=1e-15)


def test_exact_thresholds_are_todays_numbers_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    q = np.sort(rng.dirichlet(np.ones(12), size=(40, 3))[:, :, :4], axis=-1)[:, :, ::-1]
    p = rng.dirichlet(np.ones(6), size=(40, 3))[:, :, :4]  # siblings' target probabilities sum below 1
    for shape in (T.TreeShape(3, 4, 12), T.TreeShape(3, 1, 4), T.static([[0], [1], [0, 0], [0, 1], [0, 0, 0]])):
        a, b = T.rounds(shape, q, p), T.rounds(shape, q, p, (1.0, 1.0))
        assert np.array_equal(a.survival, b.survival) and np.array_equal(a.by_rank, b.by_rank)
        # the closed form itself at (1, 1) is p up to round-off
        depth, rank, parent, _ = T.dynamic_nodes(q, 3, 4)
        own = p[:, depth - 1, rank]
        np.testing.assert_allclose(T.sibling_accept(own, parent, (1.0, 1.0)), own, atol=1e-15)


@pytest.mark.parametrize("th", [(0.5, 0.7), (0.3, 0.2), (1.0, 0.5)])
def test_topk_one_is_the_chains_relaxed_acceptance(th: tuple[float, float]) -> None:
    """One child a node: accepted outright where p ≥ θ_single, else min(1, p ÷ θ_acc) —
    the chain's `relaxed`, multiplied along the chain."""
    from specprobe.metrics.accumulate import Accumulator

    rng = np.random.default_rng(5)
    p = rng.uniform(0, 1, size=(30, 3, 1))
    q = np.ones_like(p)
    got = T.rounds(T.TreeShape(3, 1, 4), q, p, th).survival
    rel = Accumulator(k_max=3, threshold_single=th[0], threshold_acc=th[1]).relaxed(p[:, :, 0])
    np.testing.assert_allclose(got[1:], np.cumprod(rel, axis=1).T, atol=1e-12)


def test_the_verified_siblings_are_a_rank_prefix_of_a_dynamic_tree() -> None:
    """The grid shares one expansion's path probabilities over every token budget: taken
    over all expanded siblings, they equal those over the verified siblings only."""
    rng = np.random.default_rng(11)
    q = np.sort(rng.dirichlet(np.ones(12), size=(60, 3))[:, :, :4], axis=-1)[:, :, ::-1]
    p = rng.dirichlet(np.ones(6), size=(60, 3))[:, :, :4]
    depth, rank, parent, score = T.dynamic_nodes(q, 3, 4)
    own = p[:, depth - 1, rank]
    every = T.sibling_accept(own, parent, (0.4, 0.5))
    for tokens in (4, 8, 16, T.max_tokens(3, 4)):
        ver = T.select(score, depth, 3, tokens)
        only = T.sibling_accept(own, parent, (0.4, 0.5), ver)
        np.testing.assert_allclose(np.where(ver, every, 0.0), only, atol=1e-15)


# ----------------------------------------------------------------------------- the loop's walk
@dataclass
class _Blk:
    nodes: list[list[int]]


def test_the_loops_acceptance_frequencies_are_the_closed_form() -> None:
    """`simulate.tree.walk` on one hand tree repeated over many rows (one sampled verify
    each): every node's frequency on the accepted path within 4 binomial standard errors
    of the closed form, and a row that accepts nothing at the root emits from the target
    without the root's children."""
    v, b = 12, 40_000
    # root → nodes 0, 1, 2 (tokens 3, 7, 1); node 0 → 3, 4 (tokens 5, 2); node 1 → 5 (token 3)
    tok = np.array([3, 7, 1, 5, 2, 3])
    parent = np.array([-1, -1, -1, 0, 0, 1])
    depth = np.array([1, 1, 1, 2, 2, 2])
    rank = np.array([0, 1, 2, 0, 1, 0])
    tree = Tree(depth, rank, np.broadcast_to(tok, (b, 6)).copy(), np.broadcast_to(parent, (b, 6)).copy(), np.zeros((b, 6)))
    rng = np.random.default_rng(2)
    dist = rng.dirichlet(np.ones(v) * 0.6, size=7)  # columns: the root, then nodes 0..5
    rest = np.setdiff1d(np.arange(v), [3, 7, 1])
    dist[0, rest] *= 0.3 / dist[0, rest].sum()
    dist[0, [3, 7, 1]] = [0.22, 0.18, 0.3]  # depth 1: the coin rule and the outright rule both matter
    logits = torch.tensor(np.log(dist), dtype=torch.float64)[None].expand(b, -1, -1).contiguous()
    s = Sampling(temperature=1.0)
    pr = probs(logits[:1], s)[0].double().numpy()  # [7, V] what the walk reads
    for th in ((0.3, 0.5), (0.25, 0.35), (0.5, 0.9), (1.0, 1.0)):
        gen = torch.Generator().manual_seed(17)
        paths, nxt = tl.walk(tree, _Blk([list(range(6))] * b), logits, s, 2, gen, th)  # type: ignore[arg-type]
        own = np.array([[pr[0 if parent[j] < 0 else parent[j] + 1, tok[j]] for j in range(6)]])
        acc = T.sibling_accept(own, parent[None], th) if T.relaxed(th) else own
        want = acc[0].copy()
        for j in range(6):
            if parent[j] >= 0:
                want[j] *= want[parent[j]]
        freq = np.zeros(6)
        for pth in paths:
            for j in pth:
                freq[j] += 1
        freq /= b
        se = np.sqrt(want * (1 - want) / b)
        assert np.all(np.abs(freq - want) <= 4 * se + 1e-12), (th, freq, want)
        # nothing accepted at the root: the next token is the target's with its children out
        none = [n for pth, n in zip(paths, nxt, strict=True) if not pth]
        if want[:3].sum() > 1 - 1e-9:  # depth 1's children take every coin
            assert not none
            continue
        assert none and not set(none) & {3, 7, 1}
        res = pr[0].copy()
        res[[3, 7, 1]] = 0.0
        res /= res.sum()
        counts = np.bincount(none, minlength=v) / len(none)
        assert np.all(np.abs(counts - res) <= 4 * np.sqrt(res * (1 - res) / len(none)) + 1e-12)


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny(0, scale=4.0)


@pytest.fixture(scope="module")
def drafter(target: Any) -> Any:
    return noisy_copy(target, 1, 0.3)


def test_topk_one_with_thresholds_is_the_chain_loop(target: Any, drafter: Any) -> None:
    prompts = rand_prompts(5)
    s, th = Sampling(temperature=0.9), (0.5, 0.7)
    chain = speculate(target, drafter, prompts, k=3, target_sampling=s, max_new_tokens=17, batch_size=2, seed=4, procedure=Procedure.of("sglang", "greedy", thresholds=th))
    tree = tl.speculate_tree(target, drafter, prompts, shape=T.parse("steps=3"), target_sampling=s, max_new_tokens=17, batch_size=2, seed=4, thresholds=th)
    assert tree.outputs == chain.outputs
    assert tree.counters.accepted_at.tolist() == chain.counters.accepted_at.tolist()


def test_exact_thresholds_leave_the_loop_as_it_was(target: Any, drafter: Any) -> None:
    prompts = rand_prompts(4)
    s, shape = Sampling(temperature=0.9), T.parse("steps=3,topk=3,tokens=8")
    a = tl.speculate_tree(target, drafter, prompts, shape=shape, target_sampling=s, max_new_tokens=15, batch_size=2, seed=2)
    b = tl.speculate_tree(target, drafter, prompts, shape=shape, target_sampling=s, max_new_tokens=15, batch_size=2, seed=2, thresholds=(1.0, 1.0))
    assert a.outputs == b.outputs and a.counters.by_rank.tolist() == b.counters.by_rank.tolist()
    c = tl.speculate_tree(target, drafter, prompts, shape=shape, target_sampling=s, max_new_tokens=15, batch_size=2, seed=2, thresholds=(0.3, 0.4))
    assert c.outputs != a.outputs  # the thresholds do take effect


@pytest.mark.parametrize("th", [(0.5, 0.7), (0.1, 0.1)])
def test_estimate_on_the_paths_is_the_loops_tau(target: Any, drafter: Any, th: tuple[float, float]) -> None:
    """A sampled target with relaxed thresholds: the estimate drafted on the candidate
    paths along the loop's own outputs (the contexts the lossy loop visits) against the
    loop's measured τ, within three standard errors of their difference (the loop's from
    its rounds, the estimate's from its references); above the exact thresholds'
    estimate on the same references."""
    prompts = rand_prompts(16, seed=8)
    n = 24
    s, shape = Sampling(temperature=0.9), T.parse("steps=3,topk=3,tokens=8")
    loop = tl.speculate_tree(target, drafter, prompts, shape=shape, target_sampling=s, max_new_tokens=n, batch_size=8, seed=1, thresholds=th)
    c = loop.counters
    conts = [list(o) for o in loop.outputs]
    with torch.inference_mode():
        rounds, _ = tree_paths.run(target, _LM(drafter), shape, s, prompts, conts, thresholds=th)
    per_ref = []
    acc = TreeAccumulator(3, 8, shape, thresholds=th)
    for _, nodes, prob, _ in rounds:
        acc.add_rounds(nodes, prob)
        one = TreeAccumulator(3, 8, shape, thresholds=th)
        one.add_rounds(nodes, prob)
        assert one.paths is not None
        per_ref.append((one.paths.tokens, one.paths.rounds))
    assert acc.paths is not None
    est = acc.paths.tau()
    # the estimate's SE: a ratio estimator over references; the loop's: accepted per round
    tok, rnd = np.array(per_ref).T
    resid = tok - est * rnd
    se_est = float(np.sqrt(np.sum(resid**2)) / rnd.sum())
    lengths = np.asarray(c.accepted_at, dtype=float)
    p_at = lengths / c.verify_steps  # P(a round reaches depth d)
    var_round = float(np.sum((2 * np.arange(1, 4) - 1) * p_at) - np.sum(p_at) ** 2)
    se_loop = float(np.sqrt(max(var_round, 1e-12) / c.verify_steps))
    se = float(np.hypot(se_est, se_loop))
    assert 1.2 < c.tau_tokens < 4.0
    exact = TreeAccumulator(3, 8, shape)
    with torch.inference_mode():
        for _, nodes, prob, _ in tree_paths.run(target, _LM(drafter), shape, s, prompts, conts)[0]:
            exact.add_rounds(nodes, prob)
    assert exact.paths is not None
    assert est > exact.paths.tau()
    assert abs(est - c.tau_tokens) < 3 * se, (est, c.tau_tokens, se_est, se_loop)


# ----------------------------------------------------------------------------- the pipeline
def test_diagnose_estimates_the_tree_and_the_grid_at_relaxed_thresholds(tiny_pair: Any, tmp_path: Any) -> None:
    """--tree with SGLang's thresholds below 1 is no longer refused: the run's tree is
    drafted on its paths under the relaxed rule, the grid is estimated too (also without
    --tree), and relaxing accepts more than the exact thresholds on the same references."""
    from dataclasses import replace

    from specprobe.probe.diagnose import run_diagnose
    from specprobe.probe.tree import wants_trees
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=12,
                         batch_size=4, k_max=3, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=4,tokens=8",
                         sampling=SamplingFlags(temperature=1.0), use_cache=False, accept_threshold_single=0.5, accept_threshold_acc=0.3)
    assert wants_trees(replace(cfg, tree=None))
    res = run_diagnose(cfg)
    relaxed = res.trees
    # the grid's chains (topk 1) are the K table under the same relaxed acceptance
    assert relaxed is not None
    chains = {row.steps: row for row in relaxed.grid if row.topk == 1}
    for k in res.k_table:
        assert chains[k.k].tau_tokens == pytest.approx(k.tau_renewal_tokens, abs=1e-6)
    exact = run_diagnose(replace(cfg, accept_threshold_single=1.0, accept_threshold_acc=1.0)).trees
    assert relaxed is not None and relaxed.tree is not None and exact is not None and exact.tree is not None
    assert relaxed.tree.estimate == "paths" and relaxed.grid
    assert relaxed.tree.tau_tokens > exact.tree.tau_tokens
    assert relaxed.tree.tau_reference_tokens > exact.tree.tau_reference_tokens
    by = {(r.steps, r.topk, r.tokens): r.tau_tokens for r in exact.grid}
    assert all(r.tau_tokens >= by[(r.steps, r.topk, r.tokens)] - 1e-9 for r in relaxed.grid if r.estimate is None)
