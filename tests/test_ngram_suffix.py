"""vLLM's suffix decoding (drafters.suffix; spec `suffix[:…]`): proposals on hand-made
sequences whose drafts are worked out by hand (the match length that wins, the draft
cap max_spec_factor × match length, min_token_prob pruning, the children's order on
ties), the tree's counts against brute force (and after a sequence is removed), the
global cache of earlier requests in order (off, evicting the oldest), the spec and the
serving-config reader, and the walk equal to the real greedy loop (token-identical)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import NgramDrafter
from specprobe.drafters.suffix import SuffixCache, SuffixTree
from specprobe.probe.ngram import Steps, walk

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _own(prompt: list[int], max_spec_tokens: int = 5, factor: float = 1.0, min_prob: float = 0.1, depth: int = 8):
    c = SuffixCache(depth, 0)  # no global tree: the request's own
    c.start("r", prompt)
    return c.speculate("r", prompt, max_spec_tokens, factor, min_prob)


def test_the_best_scoring_match_drafts_capped_by_its_length() -> None:
    seq = [1, 2, 3, 9, 1, 2, 3]
    # "3", "2 3", "1 2 3" occur twice (once at the end, nothing after it): each step 1/2;
    # match m drafts at most m tokens; m = 3 scores 1.5 with [9, 1, 2]; longer matches
    # occur only at the end and draft nothing
    d = _own(seq)
    assert (d.tokens, d.probs, d.score, d.match_len) == ([9, 1, 2], [0.5] * 3, 1.5, 3)
    # factor 2: m = 2 drafts [9, 1, 2, 3] (score 2.0); m = 3 the same, and a tie goes to the longer match
    d = _own(seq, factor=2.0)
    assert (d.tokens, d.score, d.match_len) == ([9, 1, 2, 3], 2.0, 3)
    assert _own(seq, max_spec_tokens=2).tokens == [9, 1]  # num_speculative_tokens caps it
    assert _own([4, 5, 6, 7]).tokens == []  # nothing repeats


def test_min_token_prob_prunes() -> None:
    seq = [5, 1, 5, 2, 5, 3, 5, 4, 5]  # "5" five times, four continuations: 1/5 each
    assert _own(seq, min_prob=0.25).tokens == []
    d = _own(seq, factor=3.0, min_prob=0.1)
    assert d.tokens == [1, 5, 2] and d.probs == pytest.approx([0.2] * 3)  # the oldest count-1 child first


def test_ties_follow_the_engines_sibling_lists() -> None:
    t = SuffixTree(8)
    t.extend(0, [7, 1, 7, 2, 7, 2])
    # "7 2" reached count 2 while "7 1" had 1: 2 moves in front
    assert [(n.token, n.count) for n in t.root.children[7].order] == [(2, 2), (1, 1)]
    t.extend(0, [7, 1])
    # "7 1" rises to 2 as the head of its group: it becomes the head of the count-2 group
    assert [(n.token, n.count) for n in t.root.children[7].order] == [(1, 2), (2, 2)]
    t2 = SuffixTree(8)
    t2.extend(0, [8, 1, 8, 2, 8, 3, 8, 3, 8, 2])
    # 3 reached 2 first (head of the count-1 group then: to the front); 2 rose from behind 1
    # (not its group's head): it joins the count-2 group at its end
    assert [(n.token, n.count) for n in t2.root.children[8].order] == [(3, 2), (2, 2), (1, 1)]


def _brute(seqs: list[list[int]], depth: int) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(len(s), i + depth) + 1):
                out[tuple(s[i:j])] = out.get(tuple(s[i:j]), 0) + 1
    return out


def _counts(tree: SuffixTree) -> dict[tuple[int, ...], int]:
    out: dict[tuple[int, ...], int] = {}
    stack = [((), tree.root)]
    while stack:
        path, node = stack.pop()
        counts = [c.count for c in node.order]
        assert counts == sorted(counts, reverse=True) and len(node.order) == len(node.children)
        for c in node.order:
            out[(*path, c.token)] = c.count
            stack.append(((*path, c.token), c))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_counts_are_occurrences_and_survive_removal(seed: int) -> None:
    rng = random.Random(seed)
    seqs = {i: [rng.randrange(4) for _ in range(rng.randrange(5, 40))] for i in range(4)}
    t = SuffixTree(6)
    for sid, s in seqs.items():
        for x in s[: len(s) // 2]:
            t.append(sid, x)
    for sid, s in seqs.items():  # interleaved, as concurrent responses grow
        t.extend(sid, s[len(s) // 2 :])
    assert _counts(t) == _brute(list(seqs.values()), 6)
    t.remove(1)
    t.remove(3)
    assert _counts(t) == _brute([seqs[0], seqs[2]], 6)


def test_the_global_cache_holds_earlier_responses_in_order() -> None:
    c = SuffixCache(8, 10)
    c.start("a", [1, 2])
    c.add("a", [3, 4, 5, 6])  # a's response
    c.stop("a")
    c.start("b", [9, 3, 4])  # b's prompt ends with what a wrote
    d = c.speculate("b", [9, 3, 4], 5, 1.0, 0.1)
    assert d.tokens == [5, 6]  # from a's response (b's own tree has nothing after "3 4")
    off = SuffixCache(8, 0)  # max_cached_requests 0: no global tree
    off.start("a", [1, 2])
    off.add("a", [3, 4, 5, 6])
    off.start("b", [9, 3, 4])
    assert off.speculate("b", [9, 3, 4], 5, 1.0, 0.1).tokens == []
    one = SuffixCache(8, 1)  # room for one: a's response goes when b starts
    one.start("a", [1, 2])
    one.add("a", [3, 4, 5, 6])
    one.start("b", [9, 3, 4])
    assert list(one.seq_of) == ["b"] and one.speculate("b", [9, 3, 4], 5, 1.0, 0.1).tokens == []


def test_the_requests_own_tree_wins_a_tie() -> None:
    c = SuffixCache(8, 10)
    c.start("a", [1])
    c.add("a", [7, 8])
    c.start("b", [7, 9, 7])  # own: "7" → 9 at 1/2; global: "7" → 8 at 1/1
    assert c.speculate("b", [7, 9, 7], 1, 1.0, 0.1).tokens == [8]  # the higher score
    t = SuffixCache(8, 10)
    t.start("a", [1])
    t.add("a", [7, 9, 7])
    t.start("c", [7, 8, 7])  # own: "7" → 8 at 1/2; global: "7" → 9 at 1/2
    assert t.speculate("c", [7, 8, 7], 1, 1.0, 0.1).tokens == [8]  # a tie: the request's own


def test_the_walk_with_a_cross_request_copy() -> None:
    """The second request's answer repeats the first's: its drafts come from the global
    cache (the first request's whole response, its last tokens included)."""
    d = NgramDrafter("suffix:max_tree_depth=8,k=4")
    first = walk(d.slot(), [1, 2, 3], [10, 11, 12, 13, 14, 15], 64)
    second = walk(d.slot(), [4, 5, 10], [11, 12, 13, 14, 15, 16], 64)
    assert first.drafts == 0
    # after "10 11" the global tree drafts 12 (m = 2) … then 12, 13 / 14, 15 as matches grow
    assert second.drafts > 0 and second.accepted >= 3
    alone = NgramDrafter("suffix:max_tree_depth=8,k=4")
    assert walk(alone.slot(), [4, 5, 10], [11, 12, 13, 14, 15, 16], 64).accepted == 0
    off = NgramDrafter("suffix:max_tree_depth=8,max_cached_requests=0,k=4")
    walk(off.slot(), [1, 2, 3], [10, 11, 12, 13, 14, 15], 64)
    assert walk(off.slot(), [4, 5, 10], [11, 12, 13, 14, 15, 16], 64).accepted == 0
    d.reset()  # a fresh server forgets
    assert walk(d.slot(), [4, 5, 10], [11, 12, 13, 14, 15, 16], 64).accepted == 0


def test_max_model_len_caps_the_draft() -> None:
    d = NgramDrafter("suffix:k=8", max_model_len=10)
    s = d.slot()
    s.begin([1, 2, 3, 1, 2, 3, 1])
    assert s.propose([1, 2, 3, 1, 2, 3, 1, 2], 8).tokens == [3]  # 10 − 8 − 1 = 1 left


def test_spec_knobs_and_refusals() -> None:
    d = NgramDrafter("suffix:max_spec_factor=2.5,min_token_prob=0.2,k=8")
    t = d.types[0]
    assert (t.getf("max_spec_factor"), t.getf("min_token_prob"), t.get("max_tree_depth"), d.max_draft(), d.engine) == (2.5, 0.2, 24, 8, "vllm")
    assert NgramDrafter("suffix").max_draft() == 24  # vLLM: num_speculative_tokens defaults to the depth
    for bad, what in (("suffix:min_token_prob=1.5", "out of range"), ("suffix:max_tree_depth=0", "out of range"), ("suffix:max_spec_factor=x", "not a number"),
                      ("suffix,ngram-simple", "mixes vLLM's 'suffix'"), ("suffix:depth=3", "no knob")):
        with pytest.raises(ConfigError, match=what):
            NgramDrafter(bad)


def test_walk_is_the_greedy_loop_and_the_output_the_targets() -> None:
    """One request at a time in the set's order (batch 1, prompts already shortest first,
    as the loop orders them): the walk counts what the loop counts, global cache and all,
    and the output is plain greedy decoding's."""
    from specprobe.metrics.sampling import Sampling
    from specprobe.simulate import speculate
    from tests.test_simulate import hf_greedy, rand_prompts, tiny

    target = tiny(0)
    base = rand_prompts(4, seed=5)
    prompts = sorted((p + p[: 3 + i] for i, p in enumerate(base)), key=len)
    refs = hf_greedy(target, prompts, 24)
    spec = "suffix:max_tree_depth=12,min_token_prob=0.05,k=6"
    drafter = NgramDrafter(spec)
    total = Steps()
    for p, c in zip(prompts, refs, strict=True):
        total.add(walk(drafter.slot(), p, c, 24))
    drafter.reset()
    run = speculate(target, drafter, prompts, k=6, target_sampling=Sampling(temperature=0.0), max_new_tokens=24, batch_size=1)
    c = run.counters
    assert run.outputs == refs
    assert (c.verify_steps - len(prompts), c.num_drafts, c.drafted_tokens, c.accepted_tokens) == (total.steps, total.drafts, total.drafted, total.accepted)
    assert total.drafts > 0


def test_export_writes_method_suffix_that_reads_back(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from specprobe.cli.main import app
    from specprobe.drafters.ngram import parse_spec
    from specprobe.export.serving import export_config
    from specprobe.settings.serving import read_serving_config
    from tests.test_export import _result

    spec = "suffix:max_spec_factor=2.0,min_token_prob=0.2"
    r, src = _result(tmp_path, kind="ngram", spec=spec, engine="vllm")
    text = export_config(r, src, "vllm").text
    (tmp_path / "spec.json").write_text(text)
    sv = read_serving_config(tmp_path / "spec.json")
    assert sv.method == "suffix" and sv.num_speculative_tokens == r.best_k
    assert [t.label() for t in parse_spec(sv.drafter_spec)] == [parse_spec(spec)[0].label() + f",k={r.best_k}"]
    res = CliRunner().invoke(app, ["export", str(src), "--engine", "llama.cpp"])
    assert res.exit_code == 2 and "vLLM's suffix decoding" in res.stderr
