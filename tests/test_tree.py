"""Draft trees (specprobe.estimates.tree): shapes, EAGLE-2's node selection, what a tree
accepts — against hand-computed trees, a brute-force selection and the chain estimate."""

from __future__ import annotations

import numpy as np
import pytest

from specprobe.estimates import tree as T
from specprobe.estimates.estimate import renewal_counts, survival


def _sorted_q(rng: np.random.Generator, n: int, s: int, t: int) -> np.ndarray:
    q = rng.dirichlet(np.ones(t + 3), size=(n, s))[:, :, :t]
    return -np.sort(-q, axis=-1)


# ----------------------------------------------------------------------------- shapes
def test_parse_dynamic_and_static() -> None:
    assert T.parse("steps=3,topk=4,tokens=8") == T.TreeShape(3, 4, 8)
    assert T.parse("steps=4") == T.TreeShape(4, 1, 5)  # the chain
    assert T.parse("steps=4").chain
    st = T.parse("[[0],[1],[0,0],[0,1],[0,0,0]]")
    assert st.static and (st.steps, st.topk, st.tokens) == (3, 2, 6)
    assert st.paths[0] == (0,) and st.paths[-1] == (0, 0, 0)


@pytest.mark.parametrize("text, words", [
    ("steps=3,topk=4,tokens=80", "does not fit"),
    ("steps=3,topk=4", "needs tokens"),
    ("topk=4,tokens=8", "needs steps"),
    ("steps=three", "not an integer"),
    ("depth=3", "is not steps"),
    ("[[0],[0,1,2]]", "no parent"),
    ("[[0],[0]]", "twice"),
    ("[[0], [-1]]", "rank outside"),
    ("[[0]", "not a JSON list"),
    ("steps=2,topk=11,tokens=8", "wider"),
])
def test_parse_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        T.parse(text)


def test_max_tokens_is_every_expanded_node() -> None:
    assert T.max_tokens(3, 4) == 1 + 4 + 2 * 16
    assert T.dynamic(3, 4, 37).tokens == 37


# ----------------------------------------------------------------------------- the chain
def test_topk_one_is_the_chain_to_1e12() -> None:
    rng = np.random.default_rng(0)
    n, k = 40, 5
    alpha = rng.uniform(0, 1, size=n)
    per_token = [np.c_[alpha] for _ in range(k)]  # autoregressive: every depth repeats α_t
    q = T.round_windows([np.c_[rng.uniform(0.2, 1, size=n)] for _ in range(k)])
    acc = T.round_windows(per_token)
    for s in range(1, k + 1):
        got = T.rounds(T.TreeShape(s, 1, s + 1), q[:, :s], acc[:, :s]).survival
        want = survival(np.tile(alpha, (s, 1)))[: s + 1]
        # the chain leaves r_j(t) = 0 where the window runs past the end; so does the tree
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_head_depths_are_read_at_their_own_token() -> None:
    rng = np.random.default_rng(1)
    n, k = 30, 3
    depth_alpha = rng.uniform(0, 1, size=(k, n))  # a head: each depth its own α^{(d)}_t
    acc = T.round_windows([np.c_[depth_alpha[d]] for d in range(k)])
    q = np.ones_like(acc)
    got = T.rounds(T.TreeShape(k, 1, k + 1), q, acc).survival
    np.testing.assert_allclose(got, survival(depth_alpha)[: k + 1], atol=1e-12)


# ----------------------------------------------------------------------------- hand trees
def test_two_level_tree_by_hand() -> None:
    # q: depth 1 [.6, .3], depth 2 [.5, .4]; scores .6 .3 | .30 .24 (beam 0) .15 .12 (beam 1)
    q = np.array([[[0.6, 0.3], [0.5, 0.4]]])
    p = np.array([[[0.5, 0.2], [0.7, 0.1]]])  # the target's probability of each candidate
    r = T.rounds(T.TreeShape(2, 2, 5), q, p)  # root + the 4 best: .6, .3, .30, .24
    np.testing.assert_allclose(r.survival[:, 0], [1.0, 0.7, 0.5 * 0.7 + 0.5 * 0.1])
    # all six nodes: the rank-1 node's children add .2·.7 + .2·.1
    r6 = T.rounds(T.TreeShape(2, 2, 7), q, p)
    np.testing.assert_allclose(r6.survival[:, 0], [1.0, 0.7, 0.40 + 0.2 * 0.8])
    # by rank: depth 1 rank 0 .5, rank 1 .2; depth 2 rank 0 .35 + .14, rank 1 .05 + .02
    np.testing.assert_allclose(r6.by_rank[:, :, 0], [[0.5, 0.2], [0.49, 0.07]])


def test_three_level_tree_keeps_only_the_best_beams() -> None:
    # topk 2: at depth 3 only the 2 best depth-2 nodes are expanded
    q = np.array([[[0.7, 0.2], [0.6, 0.3], [0.9, 0.05]]])
    p = np.array([[[0.8, 0.1], [0.5, 0.4], [0.6, 0.3]]])
    r = T.rounds(T.TreeShape(3, 2, 11), q, p)  # every expanded node: 2 + 4 + 4
    # depth-2 scores: .42 .21 | .12 .06 -> beams (0,0) and (0,1); depth 3 under them only
    d3 = 0.8 * 0.5 * (0.6 + 0.3) + 0.8 * 0.4 * (0.6 + 0.3)
    d2 = 0.8 * 0.9 + 0.1 * 0.9
    np.testing.assert_allclose(r.survival[:, 0], [1.0, 0.9, d2, d3])


def test_oracle_drafter_accepts_the_whole_depth() -> None:
    rng = np.random.default_rng(2)
    n, s, t = 12, 4, 3
    q = _sorted_q(rng, n, s, t)
    acc = np.zeros((n, s, t))
    acc[:, :, 0] = 1.0  # the drafter's first candidate is always the target's token
    r = T.rounds(T.TreeShape(s, t, 1 + t + (s - 1) * t * t), q, acc)
    np.testing.assert_allclose(r.survival, np.ones((s + 1, n)))


def test_static_tree_by_hand() -> None:
    shape = T.parse("[[0],[1],[0,0],[1,0],[0,0,0]]")
    q = np.ones((1, 3, 2))
    p = np.array([[[0.5, 0.3], [0.6, 0.2], [0.9, 0.0]]])
    r = T.rounds(shape, q, p)
    np.testing.assert_allclose(r.survival[:, 0], [1, 0.8, 0.5 * 0.6 + 0.3 * 0.6, 0.5 * 0.6 * 0.9])


# ----------------------------------------------------------------------------- against brute force
def _brute(q: np.ndarray, p: np.ndarray, steps: int, topk: int, tokens: int) -> np.ndarray:
    """One round, node by node as SGLang's draft loop writes it: a list of (score, path)."""
    cands: list[tuple[float, tuple[int, ...]]] = [(q[0, r], (r,)) for r in range(topk)]
    beams = list(cands)
    for i in range(1, steps):
        level = [(sc * q[i, r], path + (r,)) for sc, path in beams for r in range(topk)]
        cands += level
        order = sorted(range(len(level)), key=lambda j: (-level[j][0], j))
        beams = [level[j] for j in order[:topk]]
    order = sorted(range(len(cands)), key=lambda j: (-cands[j][0], j))
    chosen = [cands[j][1] for j in order[: tokens - 1]]
    surv = np.zeros(steps + 1)
    surv[0] = 1
    for path in chosen:
        surv[len(path)] += np.prod([p[d, r] for d, r in enumerate(path)])
    return surv


@pytest.mark.parametrize("steps, topk, tokens", [(2, 2, 4), (3, 2, 6), (3, 4, 8), (4, 3, 16), (3, 4, 37), (5, 1, 6)])
def test_selection_matches_brute_force(steps: int, topk: int, tokens: int) -> None:
    rng = np.random.default_rng(steps * 100 + topk * 10 + tokens)
    n = 25
    q = _sorted_q(rng, n, steps, topk)
    p = rng.uniform(0, 1, size=(n, steps, topk)) / topk
    got = T.rounds(T.TreeShape(steps, topk, tokens), q, p).survival
    for i in range(n):
        np.testing.assert_allclose(got[:, i], _brute(q[i], p[i], steps, topk, tokens), atol=1e-12)


def test_more_tokens_never_accept_less() -> None:
    rng = np.random.default_rng(5)
    q = _sorted_q(rng, 50, 3, 4)
    p = rng.uniform(0, 0.25, size=(50, 3, 4))
    prev = None
    for tokens in range(2, T.max_tokens(3, 4) + 1):
        tau = T.rounds(T.TreeShape(3, 4, tokens), q, p).survival.sum(axis=0)
        if prev is not None:
            assert np.all(tau >= prev - 1e-12)
        prev = tau


def test_sampled_tree_verification_reproduces_the_target() -> None:
    """SGLang's target-only tree sampling at thresholds 1: children tried in order against
    one coin and the accumulated target probability; on no match the residual (the target
    without the tried children). The emitted token follows p; the accepted child is c with
    probability p(c) — what the estimate multiplies along a path."""
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(6))
    children = [4, 1, 2]
    counts = np.zeros(6)
    accepted = np.zeros(6)
    n = 60_000
    for _ in range(n):
        coin, acc = rng.uniform(), 0.0
        emitted = -1
        for c in children:
            acc += p[c]
            if coin <= acc:
                emitted = c
                accepted[c] += 1
                break
        if emitted < 0:
            res = p.copy()
            res[children] = 0
            emitted = rng.choice(6, p=res / res.sum())
        counts[emitted] += 1
    sd = np.sqrt(p * (1 - p) / n)
    assert np.all(np.abs(counts / n - p) < 5 * sd)
    assert np.all(np.abs(accepted[children] / n - p[children]) < 5 * sd[children])


def test_renewal_over_a_tree_survival() -> None:
    rng = np.random.default_rng(9)
    n, s = 30, 3
    alpha = rng.uniform(0, 1, size=(s, n))
    r = survival(alpha)
    want = renewal_counts(alpha)
    from specprobe.estimates.estimate import renewal_from_survival

    got = renewal_from_survival(r)
    np.testing.assert_allclose(got.rounds, want.rounds, atol=1e-12)
    np.testing.assert_allclose(got.accepted, want.accepted, atol=1e-12)


def test_grid_holds_the_chain_and_sglang_defaults() -> None:
    g = T.grid(4, 8)
    assert T.TreeShape(3, 4, 8) in g and T.TreeShape(4, 1, 5) in g
    assert all(s.tokens <= T.max_tokens(s.steps, s.topk) for s in g)
    assert len({(s.steps, s.topk, s.tokens) for s in g}) == len(g)
