"""A paths pass that drafts only every N-th start (`--tree-paths-stride`): the drafted
starts keep their own rounds, every other start its rounds along the reference plus the
mean difference the drafted starts measured (the difference estimator: the sum over
starts is the reference's plus n times that mean), and where the two ways agree (a chain
at T = 0 on the target's own text) any stride gives the full pass's numbers exactly."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from specprobe.estimates.tree import TreeRounds, mean_shift, reach, shifted


def _rounds(rng: np.random.Generator, s: int, t: int, n: int, scale: float = 1.0) -> TreeRounds:
    """Rounds whose survival falls with depth, zero past each start's reach."""
    by_rank = rng.uniform(0, scale / t, size=(s, t, n))
    by_rank = np.cumprod(np.ones((s, 1, 1)) * 0.7, axis=0) * by_rank
    by_rank *= reach(s, n)[:, None, :]
    surv = np.ones((s + 1, n))
    surv[1:] = by_rank.sum(axis=1)
    return TreeRounds(np.minimum.accumulate(surv, axis=0), by_rank)


def test_the_shift_is_the_mean_difference_and_the_sum_is_the_difference_estimator() -> None:
    rng = np.random.default_rng(0)
    s, t = 3, 4
    refs = [_rounds(rng, s, t, n, 0.5) for n in (17, 9, 30)]
    ats = [np.arange(i % 3, r.survival.shape[1], 3) for i, r in enumerate(refs)]
    # drafted on the paths: the reference's rounds at those starts, moved a little
    drafted = []
    for r, at in zip(refs, ats, strict=True):
        d = TreeRounds(r.survival[:, at].copy(), r.by_rank[:, :, at] * 1.1)
        d.survival[1:] = d.by_rank.sum(axis=1)
        d.survival[:] = np.minimum.accumulate(d.survival, axis=0)
        drafted.append(d)
    sh = mean_shift(list(zip(refs, ats, drafted, strict=True)))
    for d in range(s):  # by hand: over every drafted start that drafts depth d + 1
        diffs = np.concatenate([(g.survival[d + 1] - r.survival[d + 1, at])[reach(s, r.survival.shape[1], at)[d]] for r, at, g in zip(refs, ats, drafted, strict=True)])
        assert sh.survival[d] == pytest.approx(diffs.mean(), abs=1e-12)
        assert sh.count[d] == len(diffs)
        assert sh.se[d] == pytest.approx(diffs.std(ddof=1) / np.sqrt(len(diffs)), abs=1e-12)
    for r, at, g in zip(refs, ats, drafted, strict=True):
        out = shifted(r, at, g, sh)
        n = r.survival.shape[1]
        np.testing.assert_array_equal(out.survival[:, at], g.survival)  # the drafted starts keep their own
        np.testing.assert_array_equal(out.by_rank[:, :, at], g.by_rank)
        live = reach(s, n)
        assert not out.survival[1:][~live].any() and not out.by_rank[~np.broadcast_to(live[:, None, :], out.by_rank.shape)].any()
        others = np.setdiff1d(np.arange(n), at)
        # no clipping here (survival well inside [0, 1]): the others are the reference's plus the shift
        np.testing.assert_allclose(out.survival[1:, others], np.where(live[:, others], r.survival[1:, others] + sh.survival[:, None], 0.0), atol=1e-12)
        assert np.all(np.diff(out.survival, axis=0) <= 1e-15)  # still a survival


def test_every_start_drafted_is_the_drafted_rounds() -> None:
    rng = np.random.default_rng(1)
    ref, got = _rounds(rng, 2, 3, 11), _rounds(rng, 2, 3, 11)
    at = np.arange(11)
    out = shifted(ref, at, got, mean_shift([(ref, at, got)]))
    np.testing.assert_array_equal(out.survival, got.survival)
    np.testing.assert_array_equal(out.by_rank, got.by_rank)


def _cfg(tiny_pair: Any, tmp_path: Any, tree: str, temperature: float) -> Any:
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    return DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(tmp_path / "p.jsonl", n=6, words=8)), max_new_tokens=16,
                          batch_size=4, k_max=3, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree=tree,
                          sampling=SamplingFlags(temperature=temperature), use_cache=False, tree_paths_stride=1)


def test_a_chain_at_t0_on_its_own_text_is_the_same_at_any_stride(tiny_pair: Any, tmp_path: Any) -> None:
    """Greedy target, its own text, a chain: along the reference is what the loop does,
    so the drafted starts measure no difference and every stride is the full pass."""
    from specprobe.probe.diagnose import run_diagnose

    cfg = _cfg(tiny_pair, tmp_path, "steps=3", 0.0)
    full = run_diagnose(cfg).trees
    part = run_diagnose(replace(cfg, tree_paths_stride=3)).trees
    assert full is not None and part is not None and full.tree is not None and part.tree is not None
    assert full.tree.paths_stride == 1 and full.tree.paths_starts is None
    assert part.tree.paths_stride == 3 and part.tree.paths_starts is not None and part.tree.paths_starts < part.tree.paths_positions
    assert part.tree.paths_shift == pytest.approx([0.0] * 3, abs=1e-12)
    assert part.tree.tau_tokens == pytest.approx(full.tree.tau_tokens, abs=1e-9)
    assert part.tree.depth_accept == pytest.approx(full.tree.depth_accept, abs=1e-9)


def test_a_sampled_tree_at_a_stride_is_near_the_full_pass(tiny_pair: Any, tmp_path: Any) -> None:
    """T = 1, a dynamic tree, every 2nd start drafted: τ near the full pass's, the shift
    and its standard error reported, τ's one-standard-error range around the estimate."""
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.report.fmt import tree_lines

    cfg = _cfg(tiny_pair, tmp_path, "steps=3,topk=4,tokens=8", 1.0)
    full = run_diagnose(cfg).trees
    result = run_diagnose(replace(cfg, tree_paths_stride=2))
    part = result.trees
    assert full is not None and part is not None and full.tree is not None and part.tree is not None
    t = part.tree
    assert t.estimate == "paths" and t.paths_stride == 2 and len(t.paths_shift) == 3 and len(t.paths_shift_se) == 3
    assert t.paths_starts == pytest.approx(t.paths_positions / 2, abs=6)
    assert t.paths_tau_low_tokens <= t.tau_tokens <= t.paths_tau_high_tokens
    # the tiny random pair's per-start differences are wide and heavy-tailed (its drafter's
    # top candidates after a node off the reference are nearly arbitrary): a loose band
    assert t.tau_tokens == pytest.approx(full.tree.tau_tokens, rel=0.1)
    assert t.tau_tokens != full.tree.tau_tokens  # the others are estimated, not drafted
    for shares in t.rank_shares:
        assert sum(x for x in shares if x is not None) == pytest.approx(1.0, abs=1e-5)  # shares rounded to 6 places
    said = " ".join(tree_lines(result))
    assert f"at every 2nd start ({t.paths_starts} of {t.paths_positions})" in said and "within one standard error of that shift" in said


def test_the_default_stride_drafts_about_128_starts() -> None:
    from specprobe.probe.tree import paths_stride

    assert paths_stride(None, [[0] * 48] * 2) == 1
    assert paths_stride(None, [[0] * 64] * 16) == 8
    assert paths_stride(5, [[0] * 64] * 16) == 5


def test_the_stride_pass_puts_each_drafted_start_where_it_belongs() -> None:
    """With every reference's rounds along the reference set to the full pass's own (so
    the shift is zero), a stride-3 pass must give the full pass's sums: each drafted
    start lands at its own position, every other start keeps its own rounds."""
    import torch

    from specprobe.estimates.tree import parse, tally
    from specprobe.metrics.sampling import Sampling
    from specprobe.metrics.tree import TreeAccumulator
    from specprobe.probe import tree_paths
    from specprobe.probe.tree import add_paths, paths_starts
    from tests.test_simulate import hf_greedy, noisy_copy, rand_prompts, tiny
    from tests.test_tree_paths import _LM

    target = tiny(0)
    drafter = noisy_copy(target, 1, 0.5)
    prompts = rand_prompts(4)
    conts = hf_greedy(target, prompts, 14)
    shape, smp = parse("steps=3,topk=3,tokens=6"), Sampling(temperature=0.8)

    with torch.inference_mode():
        rounds, _ = tree_paths.run(target, _LM(drafter), shape, smp, prompts, conts)
        full = TreeAccumulator(3, 8, shape)
        for _, nodes, prob, _ in rounds:
            full.add_rounds(nodes, prob)
        part = TreeAccumulator(3, 8, shape)
        part.along = {i: tally(shape, nodes, prob) for i, nodes, prob, _ in rounds}
        strided, _ = tree_paths.run(target, _LM(drafter), shape, smp, prompts, conts, starts=paths_starts(3, conts))
        add_paths(part, shape, strided, conts, 3)
    assert full.paths is not None and part.paths is not None and part.paths_sampling is not None
    assert part.paths_sampling["starts"] == sum(len(range(i % 3, len(c), 3)) for i, c in enumerate(conts))
    assert part.paths_sampling["shift"] == pytest.approx([0.0] * 3, abs=1e-6)
    assert part.paths.tau() == pytest.approx(full.paths.tau(), abs=1e-6)
    assert part.paths.depth_accept() == pytest.approx(full.paths.depth_accept(), abs=1e-6)
    np.testing.assert_allclose(part.paths.by_rank, full.paths.by_rank, atol=1e-6)
