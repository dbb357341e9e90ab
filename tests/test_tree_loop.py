"""The real tree draft → verify loop (`simulate --tree`): the tree attention mask against
plain forwards of each path; greedy output token-identical to plain decoding for an
independent drafter, a layer-skip self-draft and head drafters; topk = 1 is the chain
loop exactly; sampled tree verification emits the target's distribution (chi-square);
an oracle drafter accepts the whole depth."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specprobe.estimates.tree import parse
from specprobe.metrics.sampling import Sampling
from specprobe.models.kvcache import Stream
from specprobe.simulate import speculate
from specprobe.simulate import tree as tl
from specprobe.simulate.procedure import Procedure
from tests.helpers.heads import head_prompts, load_pair
from tests.test_simulate import _chi2, _exact_marginals, noisy_copy, rand_prompts, tiny

GREEDY = Sampling(temperature=0.0)
SGLANG = Procedure.of("sglang", "greedy")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def target():
    return tiny(0)


@pytest.fixture(scope="module")
def drafter(target):
    return noisy_copy(target, 1, 0.5)


@pytest.fixture(scope="module")
def prompts():
    return rand_prompts(5)


def _tree(text: str):
    return parse(text)


# ----------------------------------------------------------------------------- the mask
def test_tree_mask_equals_a_plain_forward_of_every_path(target, drafter) -> None:
    """One verify pass over a real drafted tree: every node's logits equal those of a
    plain causal forward of its root-to-node path (float64, two rows of different
    lengths and a cache that already holds their prompts)."""
    prompts = [[5, 9, 33, 2, 71], [8, 1]]
    shape = _tree("steps=3,topk=3,tokens=10")
    with torch.inference_mode():
        src = tl.LMTree(drafter, prompts, torch.device("cpu"))
        tgt = Stream(target, 2, torch.device("cpu"))
        tgt.forward(*__import__("specprobe.models.kvcache", fromlist=["right_align"]).right_align([p[:-1] for p in prompts], "cpu"))
        tree, verified = tl.draft(src, shape, np.array([3, 3]), 300)
        assert verified.sum(axis=1).tolist() == [9, 9]
        todo = [[p[-1]] for p in prompts]
        blk = tl.block(tgt, todo, tree, verified)
        w = blk.ids.shape[1] - blk.unseen
        logits = tl.ta.forward(tgt, blk.ids, blk.valid, blk.allowed, blk.pos, keep=w + 1)
        checked = 0
        for r, p in enumerate(prompts):
            for c, j in enumerate(blk.nodes[r]):
                path = [int(tree.tok[r, a]) for a in reversed(tree.ancestors(r, j))] + [int(tree.tok[r, j])]
                plain = target(torch.tensor([p + path])).logits[0, -1]
                torch.testing.assert_close(logits[r, 1 + c], plain, rtol=1e-9, atol=1e-9)
                checked += 1
            torch.testing.assert_close(logits[r, 0], target(torch.tensor([p])).logits[0, -1], rtol=1e-9, atol=1e-9)
        assert checked == 18


def test_drafter_tree_forward_equals_plain_forwards(drafter) -> None:
    """The drafter's beams, fed under the tree mask, get the children a plain forward of
    their path gives: each node's token is among the top-T of its path's plain logits."""
    prompt = [4, 60, 12]
    shape = _tree("steps=3,topk=2,tokens=7")
    with torch.inference_mode():
        src = tl.LMTree(drafter, [prompt], torch.device("cpu"))
        tree, verified = tl.draft(src, shape, np.array([3]), 300)
        for j in range(tree.tok.shape[1]):
            if not np.isfinite(tree.score[0, j]):
                continue
            anc = [int(tree.tok[0, a]) for a in reversed(tree.ancestors(0, j))]
            lg = drafter(torch.tensor([prompt + anc])).logits[0, -1]
            ids, val = tl.top(lg, 2, 300)
            assert int(tree.tok[0, j]) == int(ids[tree.rank[j]])
            want = val[tree.rank[j]] * (1.0 if not anc else tree.score[0, tree.parent[0, j]])
            assert tree.score[0, j] == pytest.approx(want, rel=1e-9)


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("text", ["steps=3,topk=4,tokens=8", "steps=2,topk=2,tokens=6", "[[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]"])
def test_greedy_tree_output_is_plain_decoding(target, drafter, prompts, text) -> None:
    plain = speculate(target, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=20, batch_size=3)
    run = tl.speculate_tree(target, drafter, prompts, shape=_tree(text), target_sampling=GREEDY, max_new_tokens=20, batch_size=3)
    assert run.outputs == plain.outputs
    c = run.counters
    assert c.num_drafts > 0 and 0 < c.accept_rate < 1 and c.accepted_tokens == c.accepted_at[0] + c.accepted_at[1:].sum()
    assert c.by_rank.sum() == c.accepted_tokens and c.by_rank[:, 1:].sum() > 0  # rank-2+ children accepted


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_topk_one_is_the_chain_loop(target, drafter, prompts, temperature) -> None:
    s = Sampling(temperature=temperature)
    chain = speculate(target, drafter, prompts, k=3, target_sampling=s, max_new_tokens=17, batch_size=2, seed=4, procedure=SGLANG)
    tree = tl.speculate_tree(target, drafter, prompts, shape=_tree("steps=3"), target_sampling=s, max_new_tokens=17, batch_size=2, seed=4)
    assert tree.outputs == chain.outputs
    a, b = chain.counters, tree.counters
    for f in ("verify_steps", "num_drafts", "drafted_tokens", "accepted_tokens", "emitted_tokens", "target_calls", "draft_calls"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.accepted_at.tolist() == b.accepted_at.tolist() and a.drafted_at.tolist() == b.drafted_at.tolist()
    assert b.tau_tokens == a.tau_tokens


def test_oracle_drafter_accepts_the_full_depth(target, prompts) -> None:
    """The target as its own drafter: every round accepts all S depths, at rank 1."""
    run = tl.speculate_tree(target, target, prompts, shape=_tree("steps=4,topk=2,tokens=8"), target_sampling=GREEDY, max_new_tokens=21, batch_size=3)
    c = run.counters
    assert c.cumulative() == [1.0] * 4 and c.tau_tokens == 5.0
    assert (c.num_drafts, c.verify_steps) == (4 * len(prompts), 4 * len(prompts) + len(prompts))
    assert c.by_rank[:, 0].tolist() == [c.num_drafts] * 4 and c.by_rank[:, 1].sum() == 0
    assert all(len(o) == 21 for o in run.outputs)


def test_sampled_tree_output_follows_target_distribution() -> None:
    """Many draws of one prompt: the first two emitted tokens follow the target's exact
    marginals through a tree whose siblings are tried in order against one coin."""
    v = 48
    tgt = tiny(11, vocab=v, scale=0.2)
    drafter = noisy_copy(tgt, 2, 0.3)
    prompt = [3, 17, 5, 40]
    n = 3000
    s = Sampling(temperature=1.0)
    run = tl.speculate_tree(tgt, drafter, [prompt] * n, shape=_tree("steps=2,topk=3,tokens=7"), target_sampling=s, max_new_tokens=3, batch_size=n, seed=123)
    c = run.counters
    assert 0.05 < c.accept_rate < 0.95 and c.by_rank[0, 1:].sum() > 0.1 * c.by_rank[0].sum()  # siblings do get accepted
    p1, p2 = _exact_marginals(tgt, prompt, s)
    assert _chi2([o[0] for o in run.outputs], p1) > 1e-3
    assert _chi2([o[1] for o in run.outputs], p2) > 1e-3


# ----------------------------------------------------------------------------- drafter kinds
@pytest.fixture(scope="module")
def layouts(tiny_pair, tmp_path_factory):
    from tests.helpers import heads as hh

    return hh.every_layout(tmp_path_factory.mktemp("tree-heads"), tiny_pair["target"], prefixed=True)


def test_layer_skip_self_draft_tree_is_plain_decoding(tiny_pair) -> None:
    t, d = load_pair(tiny_pair["target"], "self:layers=1")
    prompts = head_prompts()
    plain = speculate(t.model, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=16, batch_size=3)
    run = tl.speculate_tree(t.model, d.step_model(), prompts, shape=_tree("steps=3,topk=3,tokens=8"), target_sampling=GREEDY, max_new_tokens=16, batch_size=3)
    assert run.outputs == plain.outputs
    assert run.counters.num_drafts > 0 and run.counters.accepted_tokens > 0


@pytest.mark.parametrize("name", ["eagle3-speculators", "eagle1", "mtp-deepseek", "medusa-fd-v2"])
def test_head_tree_is_plain_decoding(layouts, name) -> None:
    target, spec = layouts[name]
    t, d = load_pair(target, spec)
    prompts = head_prompts()
    text = "[[0], [1], [0, 0], [1, 0], [0, 1]]" if name.startswith("medusa") else "steps=3,topk=2,tokens=6"
    plain = speculate(t.model, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=16, batch_size=3)
    run = tl.speculate_tree(t.model, d, prompts, shape=_tree(text), target_sampling=GREEDY, max_new_tokens=16, batch_size=3)
    assert run.outputs == plain.outputs
    c = run.counters
    assert c.num_drafts > 0 and c.draft_calls > 0
    assert c.verify_steps - c.num_drafts >= len(prompts)  # the prefill drafts nothing




@pytest.fixture(scope="module")
def oracles(tmp_path_factory):
    """Heads whose depth-d distribution is the target's (tests/helpers/heads.py)."""
    from tests.helpers import heads as hh

    root = tmp_path_factory.mktemp("tree-oracles")
    bg = hh.bigram_target(root / "bigram")
    uni = hh.bigram_target(root / "uni", unigram=True)
    return {
        "eagle3": (bg, str(hh.eagle3_speculators(root / "e3s", bg, oracle=True, verifier="bigram"))),
        "eagle1": (bg, str(hh.eagle1(root / "e1", bg, oracle=True))),
        "medusa": (uni, str(hh.medusa_fasterdecoding(root / "mo", uni, heads=4, version=2, oracle=True))),
        "mtp": (hh.target_with_mtp(root / "t-mtp", bg, "deepseek", oracle=True), "mtp"),
    }


@pytest.mark.parametrize(("name", "temperature"), [("eagle3", 0.0), ("eagle1", 0.0), ("medusa", 0.0), ("mtp", 0.0), ("eagle3", 0.8), ("eagle1", 0.8), ("mtp", 0.8)])
def test_oracle_heads_accept_the_full_depth_of_a_tree(oracles, name, temperature) -> None:
    """Every round after the prefill accepts all 4 depths. At T = 0 the rank-1 path is
    the target's; at T = 0.8 the target sometimes samples the rank-2 child, and a chained
    head fed its own state down that branch still drafts the target's next tokens."""
    target, spec = oracles[name]
    t, d = load_pair(target, spec)
    prompts = head_prompts()
    run = tl.speculate_tree(t.model, d, prompts, shape=_tree("steps=4,topk=2,tokens=9"), target_sampling=Sampling(temperature=temperature), max_new_tokens=21, batch_size=3, seed=1)
    c = run.counters
    assert c.cumulative() == [1.0] * 4 and c.tau_tokens == 5.0, name
    assert (c.num_drafts, c.verify_steps) == (4 * len(prompts), 5 * len(prompts)), name
    assert all(len(o) == 21 for o in run.outputs), name
    assert (c.by_rank[:, 1].sum() > 0) == (temperature > 0), name  # off the rank-1 branch


@pytest.mark.parametrize("name", ["eagle3", "eagle1", "mtp", "medusa"])
def test_head_topk_one_is_the_chain_loop(oracles, name) -> None:
    """Oracle heads at T = 0.8, greedy drafts: the target sometimes samples another token,
    so rounds end early; the topk = 1 tree runs the chain's forwards, coins and samples."""
    target, spec = oracles[name]
    t, d = load_pair(target, spec)
    prompts = head_prompts()
    s = Sampling(temperature=0.8)
    chain = speculate(t.model, d, prompts, k=3, target_sampling=s, max_new_tokens=16, batch_size=3, seed=2, procedure=SGLANG)
    tree = tl.speculate_tree(t.model, d, prompts, shape=_tree("steps=3"), target_sampling=s, max_new_tokens=16, batch_size=3, seed=2)
    assert tree.outputs == chain.outputs
    a, b = chain.counters, tree.counters
    assert (a.accepted_tokens, a.drafted_tokens, a.verify_steps, a.draft_calls) == (b.accepted_tokens, b.drafted_tokens, b.verify_steps, b.draft_calls)
    assert 0 < b.accepted_tokens < b.drafted_tokens


# ----------------------------------------------------------------------------- the pipeline
def test_run_simulate_measures_the_tree(tiny_pair, tmp_path) -> None:
    """`simulate --tree`: the tree is measured (its row at K = steps), with per-depth and
    per-rank counts, and the calibration metrics keep their names."""
    from specprobe.settings.pipeline import DiagnoseConfig, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    d = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(pf), max_new_tokens=12, batch_size=3, keep_positions=False, engine="sglang", tree="steps=3,topk=2,tokens=6")
    r = run_simulate(SimulateConfig(d, ks=[1, 3]))
    m = r.measured
    assert [row.k for row in m.k_table] == [3] and m.tree is not None
    t = m.tree
    assert (t.steps, t.topk, t.tokens) == (3, 2, 6) and len(t.accepted_by_rank) == 3 and len(t.accepted_by_rank[0]) == 2
    assert sum(map(sum, t.accepted_by_rank)) > 0 and t.num_drafts == m.k_table[0].num_drafts
    assert t.tau_tokens == m.k_table[0].tau_tokens == r.metrics["tau_measured_tokens"]
    assert r.metrics["tau_estimated_tokens"] == t.tau_estimate and t.tau_estimate is not None
    assert "draft tree" in m.note


def test_squeezing_the_holes_out_changes_no_logit(target) -> None:
    """A cache with holes between real slots (rejected tree nodes), packed to its real
    slots: the next forward's logits are those of the unpacked cache."""
    from specprobe.models.kvcache import right_align

    with torch.inference_mode():
        runs = []
        for pack in (False, True):
            st = Stream(target, 2, torch.device("cpu"))
            st.forward(*right_align([[5, 9, 33, 2, 71, 8, 8, 40], [8, 1, 6, 7]], "cpu"))
            st.valid[0, 2:6] = False  # holes in the middle of row 0, and at the end of row 1
            st.valid[1, 6:] = False
            if pack:
                assert tl.ta.squeeze(st) and st.length == 4 and st.cache.layers[0].keys.shape[2] == 4
            runs.append(st.forward(*right_align([[11, 12], [13]], "cpu")))
        torch.testing.assert_close(runs[0][0], runs[1][0], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(runs[0][1, -1], runs[1][1, -1], rtol=1e-9, atol=1e-9)


def test_tree_deeper_than_medusa_heads_is_a_one_line_error(layouts, tmp_path) -> None:
    from specprobe.core.errors import ConfigError
    from specprobe.settings.pipeline import DiagnoseConfig, SimulateConfig
    from specprobe.simulate import run_simulate
    from tests.helpers.tiny import prompts_file

    target, spec = layouts["medusa-fd-v2"]
    d = DiagnoseConfig(target=str(target), drafter=spec, prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=8, k_max=8, engine="sglang", tree="steps=8,topk=2,tokens=6", keep_positions=False)
    with pytest.raises(ConfigError, match="Medusa heads"):
        run_simulate(SimulateConfig(d, ks=[1]))
