"""SGLang's NGRAM (drafters.sglang_ngram; spec `sglang-ngram[:…]`): trees on hand-made token
sequences worked out by hand (no match, several match windows merged, BFS by recency
against PROB by frequency, the breadth and branch-length limits, capacity's LRU
eviction, the token-0 padding), what the cache is fed (after each verify step, across
requests), a property test that every tree path continues a match the cache has seen,
the spec and serving-config reader, and the walk against the real tree loop (greedy
output token-identical to plain decoding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specprobe.core.errors import ConfigError
from specprobe.drafters.ngram import NgramDrafter
from specprobe.drafters.sglang_ngram import NgramTree, TrieCache
from specprobe.metrics.sampling import Sampling
from specprobe.probe.ngram import Steps, walk
from specprobe.settings.serving import read_serving_config
from tests.helpers import read_serving_text

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _cache(max_bfs: int = 2, match_type: str = "BFS", capacity: int = 1000, branch: int = 4, max_window: int = 3) -> TrieCache:
    return TrieCache(capacity, 1, max_window, branch, 1, max_bfs, match_type)


def _edges(tree: NgramTree) -> set[tuple[int, ...]]:
    """Every real node's token path from the root (its numbering left out)."""
    out = set()
    for i in range(1, tree.real + 1):
        path, j = [], i
        while j > 0:
            path.append(tree.tokens[j])
            j = tree.parents[j]
        out.add(tuple(reversed(path)))
    return out


def test_no_match_is_a_padded_tree() -> None:
    tree = _cache().build([7, 8], 8, 4)
    assert (tree.tokens, tree.parents, tree.real) == ([8, 0, 0, 0, 0], [-1, 0, 0, 0, 0], 0)
    assert tree.width == 4 and tree.accepted([0, 5]) == 1  # padding is token 0 under the root


def test_every_window_adds_its_continuation_and_a_longer_match_branches_less() -> None:
    c = _cache(max_bfs=2)
    c.insert([1, 2, 3, 4])  # paths [1 2 3 4], [2 3 4], [3 4] (i + min_window < len)
    c.insert([1, 2, 5, 6])
    assert sorted(c.root.child) == [1, 2, 3, 5]
    # context [9 1 2]: windows [1 2] and [2] match; breadth (3 − w)·(1/3) + 1 -> 1 for both:
    # the most recent child (5) alone, and the shorter window merges into the same nodes
    tree = c.build([9, 1, 2], 2, 4)
    assert (tree.tokens, tree.parents, tree.real) == ([2, 5, 6, 0, 0], [-1, 0, 1, 0, 0], 2)
    # max_bfs_breadth 4: scale 1, the [1 2] window's breadth 2 at its first level, 1 below
    wide = _cache(max_bfs=4)
    wide.insert([1, 2, 3, 4])
    wide.insert([1, 2, 5, 6])
    t = wide.build([9, 1, 2], 2, 4)
    assert (t.tokens, t.parents, t.real) == ([2, 5, 3, 6, 4], [-1, 0, 0, 1, 2], 4)
    assert t.accepted([3, 4, 9]) == 2 and t.accepted([5, 6]) == 2 and t.accepted([7]) == 0


def test_bfs_follows_recency_prob_follows_frequency() -> None:
    seqs = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6]]  # 3 is the more frequent, 5 the more recent
    bfs, prob = _cache(max_bfs=1), _cache(max_bfs=1, match_type="PROB")
    for s in seqs:
        bfs.insert(s)
        prob.insert(s)
    assert _edges(bfs.build([1, 2], 2, 4)) == {(5,), (5, 6)}
    assert _edges(prob.build([1, 2], 2, 4)) == {(3,), (3, 4)}
    # PROB, two children a node: 3 (2/3) then its child 4 (2/3) before 5 (1/3), then 6
    p2 = _cache(max_bfs=2, match_type="PROB")
    for s in seqs:
        p2.insert(s)
    t = p2.build([1, 2], 2, 4)
    assert (t.tokens, t.parents) == ([2, 3, 5, 4, 6], [-1, 0, 0, 1, 2])
    assert _edges(p2.build([1, 2], 2, 2)) == {(3,), (3, 4)}  # two nodes: the two most probable


def test_branch_length_bounds_the_paths_and_the_tree_its_nodes() -> None:
    c = _cache(branch=4)
    c.insert([1, 2, 3, 4, 5, 6, 7])  # paths of at most 4 tokens
    # [1 2] reaches 3 4 (its path ends there); the window [2] goes one deeper: 3 4 5
    assert _edges(c.build([1, 2], 2, 8)) == {(3,), (3, 4), (3, 4, 5)}
    assert _edges(c.build([1, 2], 2, 2)) == {(3,), (3, 4)}  # num_draft_tokens − 1 nodes at most


def test_capacity_evicts_the_least_recently_used_leaves() -> None:
    c = _cache(capacity=6, branch=4)  # 5 nodes and the root
    c.insert([1, 2, 3, 4])
    # [1 2 3 4] fills 4; [2 3 4] needs 3: 4 then 3 go (the back of the LRU); [3 4] needs
    # 2: then 2 and 1 (now leaves) go
    assert c.nodes == 5 and sorted(c.root.child) == [2, 3]
    assert list(c.root.child[2].child) == [3] and list(c.root.child[3].child) == [4]


def test_the_cache_is_fed_after_each_verify_step_and_across_requests() -> None:
    d = NgramDrafter("sglang-ngram:num_draft_tokens=4,branch_length=4,max_match_window_size=3")
    s = d.slot()
    s.begin([5, 6, 7, 8])
    first = s.propose([5, 6, 7, 8, 9], 10)  # the prompt's pass inserted nothing
    assert first.tree is not None and first.tree.real == 0 and first.by is None
    assert d._trie is not None and d._trie.nodes == 0
    s.propose([5, 6, 7, 8, 9, 5], 10)  # the step before it is inserted: [7 8 9 5] (branch_length 4)
    assert sorted(d._trie.root.child) == [7, 8, 9]
    s.finish([5, 6, 7, 8, 9, 5, 6])  # the last step's tokens too
    other = d.slot()  # the next request, the same server: its first step matches the last one's
    other.begin([1, 9])
    tree = other.propose([1, 9, 5], 10).tree
    assert tree is not None and (5, 6) not in _edges(tree) and (6,) in _edges(tree)
    d.reset()  # a fresh server
    assert d._trie is not None and d._trie.nodes == 0


@settings(max_examples=60, deadline=None)
@given(
    seq=st.lists(st.integers(1, 4), min_size=4, max_size=40),
    steps=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    match_type=st.sampled_from(["BFS", "PROB"]),
    breadth=st.integers(1, 4),
)
def test_every_tree_path_continues_a_match_the_cache_has_seen(seq, steps, match_type, breadth) -> None:
    d = NgramDrafter(f"sglang-ngram:num_draft_tokens=7,branch_length=6,max_match_window_size=3,max_bfs_breadth={breadth},match_type={match_type}")
    assert d._trie is not None
    seen: list[list[int]] = []
    real_insert = d._trie.insert
    d._trie.insert = lambda toks: (seen.append(list(toks)), real_insert(toks))[1]  # type: ignore[method-assign]
    s = d.slot()
    s.begin(seq[:2])
    t = 3
    for step in steps:
        if t > len(seq):
            break
        history = seq[:t]
        tree = s.propose(history, 99).tree
        assert tree is not None and len(tree.tokens) == 7
        ctx = history[-3:]
        for path in _edges(tree):
            ok = False
            for w in range(1, len(ctx) + 1):
                want = [*ctx[len(ctx) - w :], *path]
                if any(want == seg[i : i + len(want)] for seg in seen for i in range(len(seg))):
                    ok = True
                    break
            assert ok, (history, path, seen)
        t += step


def test_spec_knobs_defaults_and_the_engines_checks() -> None:
    d = NgramDrafter("sglang-ngram")
    assert d.is_tree and d.engine == "sglang" and d.max_draft() == 11  # 12 tokens verified, the root one of them
    kn = dict(d.types[0].knobs)
    assert kn == {"min_match_window_size": 1, "max_match_window_size": 12, "min_bfs_breadth": 1, "max_bfs_breadth": 10, "match_type": "BFS", "branch_length": 18, "capacity": 10_000_000, "num_draft_tokens": 12}
    assert dict(NgramDrafter("sglang-ngram:match_type=prob").types[0].knobs)["match_type"] == "PROB"
    for bad, why in [
        ("sglang-ngram:match_type=dfs", "neither BFS nor PROB"),
        ("sglang-ngram:max_match_window_size=18", "must be less than branch_length"),
        ("sglang-ngram:min_bfs_breadth=5,max_bfs_breadth=2", "above max_bfs_breadth"),
        ("sglang-ngram:num_draft_tokens=1", "out of range"),
        ("sglang-ngram:k=4", "has no knob"),
        ("sglang-ngram,ngram-simple", "mixes SGLang's 'sglang-ngram'"),
    ]:
        with pytest.raises(ConfigError, match=why):
            NgramDrafter(bad)


def test_a_bad_ngram_knob_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="g.yaml: speculative-ngram-match-type 'DFS' is neither BFS nor PROB"):
        read_serving_text(tmp_path, "g.yaml", "model-path: t\nspeculative-algorithm: NGRAM\nspeculative-ngram-match-type: DFS\n")
    with pytest.raises(ConfigError, match="g.sh: --speculative-ngram-capacity 0 is below 1"):
        read_serving_text(tmp_path, "g.sh", "python -m sglang.launch_server --model-path t --speculative-algorithm NGRAM --speculative-ngram-capacity 0\n")


@pytest.fixture(scope="module")
def greedy_case():
    from tests.test_simulate import hf_greedy, rand_prompts, tiny

    target = tiny(0)
    prompts = [p + p for p in rand_prompts(4, seed=3)]
    return target, prompts, hf_greedy(target, prompts, 24)


@pytest.mark.parametrize("spec", ["sglang-ngram:num_draft_tokens=6", "sglang-ngram:num_draft_tokens=8,match_type=PROB,max_bfs_breadth=3"])
def test_the_tree_loop_is_plain_greedy_and_the_walk_counts_it(greedy_case, spec) -> None:
    """Greedy: the tree loop's output is plain decoding's token for token; one request at a
    time (batch 1, the loop's order: shortest prompt first) it counts what the walk along
    the same greedy text counts, the trie shared across the requests on both sides."""
    from specprobe.simulate.ngram_tree import speculate_ngram_tree

    target, prompts, refs = greedy_case
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    d = NgramDrafter(spec)
    total = Steps()
    for i in order:
        total.add(walk(d.slot(), prompts[i], refs[i], 24))
    run = speculate_ngram_tree(target, NgramDrafter(spec), prompts, target_sampling=Sampling(temperature=0.0), max_new_tokens=24, batch_size=1)
    c = run.counters
    assert run.outputs == refs
    assert (c.verify_steps - len(prompts), c.num_drafts, c.drafted_tokens, c.accepted_tokens) == (total.steps, total.drafts, total.drafted, total.accepted)
    assert total.drafts > 0 and total.accepted > 0
    assert set(total.by_length) == {NgramDrafter(spec).max_draft()}  # every step verifies the whole tree
    batched = speculate_ngram_tree(target, NgramDrafter(spec), prompts, target_sampling=Sampling(temperature=0.0), max_new_tokens=24, batch_size=4)
    assert batched.outputs == refs


def test_sampled_tree_loop_emits_the_budget(greedy_case) -> None:
    from specprobe.simulate.ngram_tree import speculate_ngram_tree

    target, prompts, _ = greedy_case
    run = speculate_ngram_tree(target, NgramDrafter("sglang-ngram:num_draft_tokens=6"), prompts, target_sampling=Sampling(temperature=1.0), max_new_tokens=16, batch_size=2, seed=3)
    assert [len(o) for o in run.outputs] == [16] * len(prompts)
    assert run.counters.verify_steps >= len(prompts) and run.counters.accepted_tokens >= 0


def test_diagnose_prices_every_step_at_the_tree(tiny_pair, tmp_path) -> None:
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig
    from tests.helpers.tiny import prompts_file

    pf = prompts_file(tmp_path / "p.jsonl")
    r = run_diagnose(DiagnoseConfig(target=str(tiny_pair["target"]), drafter="sglang-ngram:num_draft_tokens=5", prompts=str(pf), max_new_tokens=20, batch_size=3, keep_positions=False, engine="sglang"))
    assert r.scored and r.drafter.kind == "ngram"
    assert [row.k for row in r.k_table] == [4] and r.metrics["best_k"] == 4
    assert 0 <= r.metrics["ngram_proposal_frac"] <= 1 and r.metrics["tau_tokens"] >= 1
    assert {row.group for row in r.by_domain} == {"code", "math", "chat"}
    # exported as the SGLang launch it measured; another engine's n-gram is not SGLang's NGRAM
    import yaml

    from specprobe.core.errors import InputError
    from specprobe.export.serving import export_config

    src = tmp_path / "r.json"
    src.write_text(r.model_dump_json())
    d = yaml.safe_load(export_config(r, src, "sglang").text)
    assert d["speculative-algorithm"] == "NGRAM" and d["speculative-num-draft-tokens"] == 5 and d["speculative-ngram-match-type"] == "BFS"
    assert "speculative-num-steps" not in d and "speculative-eagle-topk" not in d
    again = read_serving_config(_write(tmp_path / "launch.yaml", export_config(r, src, "sglang").text))
    assert again.drafter_spec is not None and NgramDrafter(again.drafter_spec).name == NgramDrafter("sglang-ngram:num_draft_tokens=5").name
    with pytest.raises(InputError, match="it is SGLang's NGRAM"):
        export_config(r, src, "vllm")


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


_HEAP_CPP = r"""
#include <cstdio>
#include <queue>
#include <tuple>
#include <vector>
struct Cmp { bool operator()(const std::tuple<int,double>& a, const std::tuple<int,double>& b) const { return std::get<1>(a) < std::get<1>(b); } };
int main() {
  std::priority_queue<std::tuple<int,double>, std::vector<std::tuple<int,double>>, Cmp> q;
  char op; int id; double p;
  while (scanf(" %c", &op) == 1) {
    if (op == 'u') { if (scanf("%d %lf", &id, &p) != 2) return 1; q.emplace(id, p); }
    else { printf("%d\n", std::get<0>(q.top())); q.pop(); }
  }
}
"""


def test_prob_ties_leave_the_heap_as_libstdcxx_leaves_them(tmp_path: Path) -> None:
    """PROB's candidates with equal probabilities come off the heap in std::priority_queue's
    order (compiled here with the system's g++; skipped without one)."""
    import random
    import shutil
    import subprocess

    from specprobe.drafters.sglang_ngram import _Heap

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ to build the std::priority_queue reference")
    exe = tmp_path / "heap"
    (tmp_path / "heap.cpp").write_text(_HEAP_CPP)
    subprocess.run([gxx, "-O1", "-o", str(exe), str(tmp_path / "heap.cpp")], check=True, capture_output=True)
    for trial in range(40):
        rnd = random.Random(trial)
        ops, heap, mine, size = [], _Heap(), [], 0
        for nid in range(rnd.randint(5, 60)):
            if size and rnd.random() < 0.4:
                ops.append("o")
                mine.append(heap.pop()[0])
                size -= 1
            else:
                p = rnd.choice([0.125, 0.25, 0.5, 1.0])  # many ties
                ops.append(f"u {nid} {p}")
                heap.push((nid, None, p))  # type: ignore[arg-type]
                size += 1
        out = subprocess.run([str(exe)], input="\n".join(ops), capture_output=True, text=True, check=True).stdout.split()
        assert [int(x) for x in out] == mine


def test_relaxed_thresholds_with_the_ngram_tree_are_refused() -> None:
    """SGLang verifies its NGRAM tree with the same kernel as EAGLE's, thresholds included;
    the padded NGRAM tree is modelled at exact verification only, so thresholds below 1
    are refused in one line rather than scored as if exact (a model drafter takes them)."""
    from specprobe.settings.pipeline import DiagnoseConfig

    with pytest.raises(ConfigError, match="sglang-ngram is not modelled"):
        DiagnoseConfig(target="smollm2", drafter="sglang-ngram:num_draft_tokens=8", engine="sglang", accept_threshold_acc=0.7)
    DiagnoseConfig(target="smollm2", drafter="self:layers=24", engine="sglang", accept_threshold_acc=0.7)
    DiagnoseConfig(target="smollm2", drafter="sglang-ngram", engine="sglang")
