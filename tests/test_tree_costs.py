"""A tree round's cost: the target's pass over N tree tokens under a tree attention mask
and the drafter's pass over its T beams, timed in the chain's interleaved repeats under
the same budget and cap (fake clock, never wall time); `tree_round_cost` gives the
chain's cost exactly at topk 1."""

from __future__ import annotations

import math

import pytest

from specprobe.estimates import costs
from specprobe.probe import timing
from tests.test_timing_budget import FakeClock, Watch, _model, _pair


def test_topk_1_is_the_chain_to_1e_12() -> None:
    verify = [1.07, 1.19, 1.33, 1.52, 1.61, 1.90]  # v_K, K = 1..6
    for c in (0.0, 0.137, 0.5, 1.3):
        for s in range(1, 7):
            chain = s * c + verify[s - 1]
            assert abs(costs.tree_round_cost(s, 1, s + 1, c, verify, None) - chain) < 1e-12
            # a measured width table does not matter at topk 1
            assert abs(costs.tree_round_cost(s, 1, s + 1, c, verify, {2: 1.4, 4: 2.0}) - chain) < 1e-12
    # no verify factors at all: v = 1, as the chain assumes untimed
    assert costs.tree_round_cost(3, 1, 4, 0.2, None, None) == pytest.approx(3 * 0.2 + 1.0, abs=1e-12)


def test_a_tree_round_prices_the_beams_and_interpolates_what_was_not_measured() -> None:
    # measured: v at 2, 8 and 16 tokens; w at widths 2 and 8
    v = {2: 1.1, 8: 1.5, 16: 2.3}
    w = {2: 1.2, 8: 2.4}
    assert costs.tree_verify_factor(1, v) == 1.0 and costs.tree_verify_factor(8, v) == 1.5
    assert costs.tree_verify_factor(4, v) == pytest.approx(1.1 + 0.4 * 2 / 6)  # linear between 2 and 8
    assert costs.tree_verify_factor(32, v) == pytest.approx(2.3 + 0.8 * 16 / 8)  # beyond: along the last two
    assert costs.draft_width_factor(4, w) == pytest.approx(1.2 + 1.2 * 2 / 6) and costs.draft_width_factor(1, w) == 1.0
    assert costs.draft_width_factor(4, None) == 1.0 and costs.draft_width_factor(4, 1.7) == 1.7
    # SGLang's steps 3, topk 4, 8 tokens: c·(1 + 2·w_4) + v_8
    c = 0.25
    assert costs.tree_round_cost(3, 4, 8, c, v, w) == pytest.approx(c * (1 + 2 * costs.draft_width_factor(4, w)) + 1.5, abs=1e-12)
    # unmeasured tree: the chain's verify factors by token count (verify[K − 1] over K + 1 tokens)
    chain = [1.1, 1.2, 1.3]
    assert costs.tree_round_cost(3, 4, 3, c, chain) == pytest.approx(c * 3 + 1.2, abs=1e-12)
    assert costs.tree_round_cost(3, 4, 6, c, chain) == pytest.approx(c * 3 + 1.5, abs=1e-12)  # past K = 3 along the last two
    with pytest.raises(ValueError):
        costs.tree_round_cost(0, 1, 1, c)


def test_the_tree_mask_gives_each_node_the_logits_of_its_own_path() -> None:
    import torch

    from specprobe.models.kvcache import Stream, crop

    torch.manual_seed(0)
    model = _model(2, positions=256)
    gen = torch.Generator().manual_seed(1)
    context = torch.randint(0, 128, (1, 12), generator=gen)
    dec = timing._Decoder(model, 1, 12, "cpu", gen)
    dec.stream.cache = None
    dec.stream.valid = torch.zeros((1, 0), dtype=torch.bool)
    dec.stream.forward(context, torch.ones_like(context, dtype=torch.bool), keep=1)
    parents = timing.tree_parents(7, 2)  # root, 2 children, 4 grandchildren
    assert parents == [-1, 0, 0, 1, 1, 2, 2]
    nodes = torch.randint(0, 128, (1, 7), generator=gen)
    with torch.inference_mode():
        tree = dec.tree_logits(nodes, parents)[0]  # [7, V]
        crop(dec.stream.cache, 7)
        for i in range(7):
            path, j = [], i
            while j >= 0:
                path.insert(0, int(nodes[0, j]))
                j = parents[j]
            ids = torch.cat([context, torch.tensor([path])], dim=1)
            s = Stream(model, 1, "cpu")
            plain = s.forward(ids, torch.ones_like(ids, dtype=torch.bool), keep=1)[0, -1]
            assert torch.allclose(tree[i], plain, atol=1e-4), i


def test_tree_passes_are_timed_in_the_chains_repeats_and_recorded_in_the_cost_section() -> None:
    t, d, target, drafter = _pair()
    tw, dw = Watch(t), Watch(d)
    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[1], context_tokens=40, budget_s=0.0,
                            tree_tokens=(2, 4, 8, 16), tree_widths=(1, 2, 4))
    b = raw["batches"][0]
    assert [x["tokens"] for x in b["tree_verify"]] == [2, 4, 8, 16] and all(len(x["ratios"]) == b["repeats"] for x in b["tree_verify"])
    assert [x["width"] for x in b["draft_width"]] == [2, 4] and all(x["ratios"] for x in b["draft_width"])  # w_1 = 1 by definition
    assert {c[1] for c in tw.calls if c[2] == 40} == {1, 2, 3, 4, 8, 16} and {c[1] for c in dw.calls if c[2] == 40} == {1, 2, 4}
    assert raw["tree"]["mask"].startswith("tree-shaped 4D attention mask")
    priced = costs.price(raw, cumulative=[0.8, 0.6, 0.5], alpha_mean=0.8, renewal=None, k_max=3, batch_size=1)
    sec = priced.section
    assert [x["tokens"] for x in sec["tree_verify"]] == [2, 4, 8, 16] and all(x["measured"] for x in sec["tree_verify"])
    assert [x["width"] for x in sec["draft_width"]] == [1, 2, 4] and sec["draft_width"][0]["width_factor"] == 1.0
    assert sec["tree_mask"] == raw["tree"]["mask"] and any("tree verify timed at N = 2, 4, 8, 16" in n for n in sec["notes"])
    from specprobe.result.run import Cost

    Cost(**sec)
    v, w = costs.tree_factors(sec["batches"][0])
    assert set(v) == {2, 4, 8, 16} and set(w) == {2, 4}
    assert not math.isnan(costs.tree_round_cost(3, 4, 8, sec["cost_ratio"], v, w))


def test_a_chain_run_times_nothing_more() -> None:
    t, d, target, drafter = _pair()
    tw = Watch(t)
    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[1], context_tokens=40, budget_s=0.0)
    assert "tree" not in raw and "tree_verify" not in raw["batches"][0] and max(c[1] for c in tw.calls if c[2] == 40) == 4
    sec = costs.price(raw, cumulative=[0.8, 0.6, 0.5], alpha_mean=0.8, renewal=None, k_max=3, batch_size=1).section
    assert sec["tree_verify"] == [] and sec["draft_width"] == [] and sec["tree_mask"] is None


def test_the_cap_cuts_the_largest_tree_passes_first_and_says_so() -> None:
    clock = FakeClock()
    t, d, target, drafter = _pair()
    Watch(t, clock, per_row=1.0), Watch(d, clock, per_row=0.3)
    # warm-up: target 1 + draft 0.3 + draftw2 0.3 + verify 1, 2, 3 (3 s) + tree 2, 4, 8, … : the 8 s cap comes inside the tree passes
    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[1], context_tokens=40, budget_s=4.0, cap_s=8.0, clock=clock,
                            tree_tokens=(2, 4, 8, 16), tree_widths=(2,))
    b = raw["batches"][0]
    got = [x["tokens"] for x in b["tree_verify"] if x["ratios"]]
    assert got and got == sorted(got) and 16 not in got
    assert any("not timed" in n and "N = 16" in n for n in raw["notes"])
    sec = costs.price(raw, cumulative=[0.8, 0.6, 0.5], alpha_mean=0.8, renewal=None, k_max=3, batch_size=1).section
    row16 = next(x for x in sec["tree_verify"] if x["tokens"] == 16)
    assert not row16["measured"] and row16["verify_factor"] is not None and not math.isnan(row16["verify_factor"])
