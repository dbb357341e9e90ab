"""The run's own tree drafted on its candidate paths (`probe.tree_paths`): every start's
round equals a fresh round of the loop's own drafting on that context, every node's
acceptance equals the product of plain target forwards along its path, the greedy
estimate equals the real tree loop exactly (float64), and heads chained on their own
outputs (EAGLE-1/3, MTP) or reading the root's state (Medusa) are drafted the same way."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from specprobe.estimates.tree import parse
from specprobe.metrics.sampling import Sampling
from specprobe.metrics.tree import TreeAccumulator
from specprobe.models.heads.live import LiveHead
from specprobe.models.kvcache import Stream
from specprobe.models.tree_draft import HeadTree, LMTree, draft
from specprobe.probe import tree_paths
from specprobe.simulate import tree as tl
from tests.test_simulate import hf_greedy, noisy_copy, rand_prompts, tiny

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TREES = ["steps=3,topk=3,tokens=8", "[[0], [1], [0, 0], [1, 0], [0, 1], [0, 0, 0]]", "steps=3"]


class _LM:
    """A causal-LM drafter as diagnose holds one."""

    kind = "independent"

    def __init__(self, model: Any) -> None:
        self.model = model

    def step_model(self) -> Any:
        return self.model


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny(0)


@pytest.fixture(scope="module")
def drafter(target: Any) -> Any:
    return noisy_copy(target, 1, 0.5)


def _path_prob(model: Any, ctx: list[int], path: list[int], s: Sampling) -> float:
    """Π over the path of the target's probability of each token after the path above it
    (plain forwards, no cache)."""
    out = 1.0
    for i, tok in enumerate(path):
        lg = model(torch.tensor([ctx + path[:i]])).logits[0, -1]
        out *= float(lg.argmax() == tok) if s.greedy else float(torch.softmax(lg / s.temperature, -1)[tok])
    return out


def _check_rounds(model: Any, ctx_of: Any, fresh: Any, got: Any, n: int, s: Sampling, cap_of: Any) -> int:
    tree, verified, prob = got
    checked = 0
    for t in range(n):
        cap = cap_of(t)
        ftree, fver = fresh(t, cap)
        assert (fver[0] == verified[t]).all(), t
        live = fver[0]
        assert (ftree.tok[0][live] == tree.tok[t][live]).all() and (ftree.parent[0][live] == tree.parent[t][live]).all(), t
        np.testing.assert_allclose(ftree.score[0][live], tree.score[t][live], rtol=1e-4)  # float32 heads: a shared prefix with holes vs a fresh cache
        for j in np.flatnonzero(live):
            path = [int(ftree.tok[0, a]) for a in reversed(ftree.ancestors(0, j))] + [int(ftree.tok[0, j])]
            assert prob[t, j] == pytest.approx(_path_prob(model, ctx_of(t), path, s), abs=1e-5), (t, j)
            checked += 1
        assert not prob[t][~live].any()
    return checked


@pytest.mark.parametrize("text", TREES[:2])
def test_every_start_is_a_fresh_round_and_every_node_a_plain_forward(target: Any, drafter: Any, text: str) -> None:
    """T = 0.9, float64, start positions batched 4 to a chunk over one shared prefill."""
    prompt = [5, 9, 33, 2, 71, 8]
    cont = hf_greedy(target, [prompt], 10)[0]
    shape, s = parse(text), Sampling(temperature=0.9)
    with torch.inference_mode():
        got = tree_paths.PathRounds(target, _LM(drafter), shape, s, rows=4).reference(prompt, cont)
        assert got is not None

        def fresh(t: int, cap: int) -> Any:
            return draft(LMTree(drafter, [prompt + cont[:t]], torch.device("cpu")), shape, np.array([cap]), 300)

        checked = _check_rounds(target, lambda t: prompt + cont[:t], fresh, got, len(cont), s, lambda t: min(shape.steps, len(cont) - 1 - t))
    assert checked > 40
    assert got[2][:, :].sum() > 0 and (got[2] <= 1 + 1e-12).all()
    # the last start drafts nothing (a round at t drafts at most n − 1 − t deep)
    assert not got[1][-1].any()


@pytest.mark.parametrize("text", TREES)
def test_greedy_estimate_is_the_tree_loop(target: Any, drafter: Any, text: str) -> None:
    """Greedy target, references the target's own greedy text: the estimate's τ and
    acceptance by depth equal the real tree loop's counts exactly (dynamic, static, chain)."""
    prompts = rand_prompts(4)
    n = 16
    conts = hf_greedy(target, prompts, n)
    shape, s = parse(text), Sampling(temperature=0.0)
    with torch.inference_mode():
        rounds, pr = tree_paths.run(target, _LM(drafter), shape, s, prompts, conts)
    acc = TreeAccumulator(3, 8, shape)
    for _, nodes, prob, _ in rounds:
        acc.add_rounds(nodes, prob)
    loop = tl.speculate_tree(target, drafter, prompts, shape=shape, target_sampling=s, max_new_tokens=n, batch_size=2)
    assert loop.outputs == conts
    c = loop.counters
    assert acc.paths is not None
    assert acc.paths.tau() == pytest.approx(c.tau_tokens, abs=1e-12)
    assert acc.paths.depth_accept() == pytest.approx(c.cumulative(), abs=1e-12)
    # which rank the accepted child was, depth by depth: the loop's counts exactly
    loop_shares = [[x / row.sum() if row.sum() else None for x in row] for row in c.by_rank]
    for mine, theirs in zip(acc.paths.rank_shares(), loop_shares, strict=True):
        assert [None if np.isnan(x) else x for x in mine] == pytest.approx(theirs, abs=1e-12)
    assert 1.0 < c.tau_tokens < shape.steps + 1
    # a greedy target on its own text: its verdicts are read off the prefill, no tree pass
    # (the four short references prefill together, as one group)
    assert pr.target_calls == 1


def test_greedy_verdicts_off_the_target_s_text_take_the_tree_pass(target: Any, drafter: Any) -> None:
    """References that are not the target's greedy text (a dataset's responses): reading
    the verdicts off the reference where it can, and the tree pass where an accepted node
    leaves it, give what the tree pass everywhere gives."""
    prompts = rand_prompts(3, seed=9)
    own = hf_greedy(target, prompts, 14)
    g = torch.Generator().manual_seed(3)
    conts = [[c if torch.rand((), generator=g) < 0.7 else int(torch.randint(0, 300, (), generator=g)) for c in cont] for cont in own]
    assert conts != own
    shape, s = parse("steps=3,topk=3,tokens=8"), Sampling(temperature=0.0)
    with torch.inference_mode():
        quick = tree_paths.PathRounds(target, _LM(drafter), shape, s, rows=4)
        full = tree_paths.PathRounds(target, _LM(drafter), shape, s, rows=4, read_greedy=False)
        for p, c in zip(prompts, conts, strict=True):
            a, b = quick.reference(p, c), full.reference(p, c)
            assert a is not None and b is not None
            np.testing.assert_array_equal(a[1], b[1])
            np.testing.assert_array_equal(a[2], b[2])
    assert len(prompts) < quick.target_calls < full.target_calls  # some chunks needed the pass, not all


# ----------------------------------------------------------------------------- heads
def _load(target: Any, spec: str, dtype: str = "float32") -> Any:
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_model

    t = load_model(str(target), device="cpu", dtype=dtype)
    return t, build_drafter(spec, t, dtype=dtype, info=drafter_info(spec, t.info))


@pytest.fixture(scope="module")
def layouts(tiny_pair: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.helpers import heads as hh

    return hh.every_layout(tmp_path_factory.mktemp("paths-heads"), tiny_pair["target"], prefixed=True)


def _fresh_head(t_model: Any, d: Any, ctx: list[int], shape: Any, cap: int, vocab: int) -> Any:
    """One round of the loop's head drafting on one context, caught up from scratch."""
    dev = torch.device("cpu")
    head = LiveHead(d, 1, dev)
    ids = torch.tensor([ctx[:-1]])
    ones = torch.ones_like(ids, dtype=torch.bool)
    tgt = Stream(t_model, 1, dev)
    head.watch(ids, lambda: tgt.forward(ids, ones, keep=1))
    assert head._seen is not None
    feats = head._seen[1]
    head._seen = None
    if ids.shape[1] > 1:
        head.pending = (feats[:, :-1], ids[:, 1:], ones[:, 1:])
        head.catch_up()
    head.pending = (feats[:, -1:], torch.tensor([[ctx[-1]]]), ones[:, :1])
    src = HeadTree(d, 1, dev)
    src.head = head
    return draft(src, shape, np.array([cap]), vocab)


@pytest.mark.parametrize("name", ["eagle3-speculators", "eagle1", "mtp-deepseek", "medusa-fd-v2"])
def test_head_rounds_are_fresh_head_rounds(layouts: Any, name: str) -> None:
    target, spec = layouts[name]
    t, d = _load(target, spec)
    prompt = [14, 60, 12, 9, 77]
    s = Sampling(temperature=0.8)
    shape = parse("[[0], [1], [0, 0], [1, 0], [0, 1]]" if name.startswith("medusa") else "steps=3,topk=2,tokens=6")
    vocab = int(t.model.get_output_embeddings().weight.shape[0])
    with torch.inference_mode():
        cont = hf_greedy(t.model, [prompt], 8)[0]
        got = tree_paths.PathRounds(t.model, d, shape, s, rows=3).reference(prompt, cont)
        assert got is not None
        checked = _check_rounds(t.model, lambda i: prompt + cont[:i], lambda i, cap: _fresh_head(t.model, d, prompt + cont[:i], shape, cap, vocab),
                                got, len(cont), s, lambda i: min(shape.steps, len(cont) - 1 - i))
    assert checked > 10


# ----------------------------------------------------------------------------- the pipeline
def test_diagnose_drafts_its_own_tree_on_the_paths(tiny_pair: Any, tmp_path: Any) -> None:
    """diagnose --tree: the run's tree is marked `paths`, its evidence comes from the
    drafted rounds, the grid's way is kept beside it, and the grid row of the same tree
    agrees with the tree section."""
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=12,
                         batch_size=4, k_max=4, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=4,tokens=8",
                         sampling=SamplingFlags(temperature=1.0), use_cache=False)
    r = run_diagnose(cfg)
    t = r.trees
    assert t is not None and t.tree is not None
    assert t.tree.estimate == "paths" and t.tree.tau_reference_tokens is not None
    assert t.tree.tau_tokens != t.tree.tau_reference_tokens  # off the reference the two ways differ
    same = next(row for row in t.grid if (row.steps, row.topk, row.tokens) == (3, 4, 8))
    assert same.estimate == "paths" and same.tau_tokens == t.tree.tau_tokens
    assert all(row.estimate is None for row in t.grid if (row.steps, row.topk, row.tokens) != (3, 4, 8))
    for shares in t.tree.rank_shares:
        assert sum(x for x in shares if x is not None) == pytest.approx(1.0, abs=1e-5)  # shares rounded to 6 places
    assert t.tree.nodes and all(0 <= n.accepted <= n.verified <= 1 for n in t.tree.nodes)
    assert r.metrics["tree_tau_tokens"] == pytest.approx(t.tree.tau_tokens)
    # --tree-estimate reference: the run's tree the grid's way, with no extra forwards
    from dataclasses import replace

    ref = run_diagnose(replace(cfg, tree_estimate="reference")).trees
    assert ref is not None and ref.tree is not None and ref.tree.estimate == "reference" and ref.tree.tau_reference_tokens is None
    assert ref.tree.tau_tokens == pytest.approx(t.tree.tau_reference_tokens, abs=1e-6)


def test_two_shards_merged_give_the_one_shot_trees(tiny_pair: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """--shard parts carry the tree sums (the grid's and the run's own on its paths):
    merged, the trees section is the one-shot run's."""
    from tests.helpers.same import REL_OTHER_BATCHING, differences, whole_and_merged
    from tests.helpers.tiny import prompts_file

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    args = ["diagnose", str(tiny_pair["target"]), "self:layers=1", "--prompts", str(prompts_file(tmp_path / "p.jsonl", n=6, words=8)),
            "--engine", "sglang", "--tree", "steps=2,topk=2,tokens=4", "--k-max", "2", "--temperature", "1",
            "--max-new-tokens", "8", "--batch-size", "2", "--cost-ratio", "0.1", "--verify-factor", "1", "--fail-on", "never"]
    one, merged = whole_and_merged(args, tmp_path)
    assert one["trees"]["tree"]["estimate"] == "paths"
    assert differences(one["trees"], merged["trees"], rel=REL_OTHER_BATCHING) == []


def test_a_long_reference_gets_fewer_rows_and_the_same_rounds(target: Any, drafter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies of a reference's caches stay within COPY_BYTES: with a budget of one
    row, every start is its own batch, and the rounds are the same."""
    prompt = [5, 9, 33, 2, 71, 8]
    cont = hf_greedy(target, [prompt], 9)[0]
    shape, s = parse("steps=2,topk=2,tokens=5"), Sampling(temperature=0.9)
    with torch.inference_mode():
        wide = tree_paths.PathRounds(target, _LM(drafter), shape, s)
        a = wide.reference(prompt, cont)
        monkeypatch.setattr(tree_paths, "COPY_BYTES", 1)
        narrow = tree_paths.PathRounds(target, _LM(drafter), shape, s)
        b = narrow.reference(prompt, cont)
    assert a is not None and b is not None
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_allclose(a[2], b[2], rtol=1e-12, atol=1e-15)
    assert (wide.target_calls, narrow.target_calls) == (2, 1 + len(cont))


def test_top_candidates_break_ties_to_the_lower_id() -> None:
    """The drafter's top-k, ties included (inside the k and across the k-th place), are
    those of a full stable sort of the vocabulary."""
    from specprobe.models.tree_draft import top

    g = torch.Generator().manual_seed(0)
    lg = torch.randint(0, 4, (64, 50), generator=g).double()  # many exact ties
    lg[0, :] = 0.0  # one row all tied
    for k in (1, 3, 8):
        ids, val = top(lg, k, 50)
        p = torch.softmax(lg.float(), dim=-1)
        fv, fi = torch.sort(p, dim=-1, descending=True, stable=True)
        np.testing.assert_array_equal(ids, fi[:, :k].numpy())
        np.testing.assert_array_equal(val, fv[:, :k].double().numpy())


def test_a_layer_skip_self_draft_starts_from_the_targets_first_layers(target: Any) -> None:
    """A layer-skip self-draft's prefill is a copy of the target's first N layers' cache;
    its rounds are those of a fresh self-draft (T = 0.9, float64)."""
    from specprobe.models.anatomy import layer_view

    class _Self(_LM):
        kind = "layer_skip"
        n_layers = 1

    step = layer_view(target, 1)
    prompt = [5, 9, 33, 2, 71, 8]
    cont = hf_greedy(target, [prompt], 10)[0]
    shape, s = parse("steps=3,topk=3,tokens=8"), Sampling(temperature=0.9)
    with torch.inference_mode():
        pr = tree_paths.PathRounds(target, _Self(step), shape, s, rows=4)
        probe = Stream(target, 1, torch.device("cpu"))
        probe.forward(torch.tensor([prompt]), torch.ones((1, len(prompt)), dtype=torch.bool))
        shared = pr._shared_prefill(probe)
        assert shared is not None and len(shared.cache.layers) == 1 and len(probe.cache.layers) == 2
        got = pr.reference(prompt, cont)
        assert got is not None

        def fresh(t: int, cap: int) -> Any:
            return draft(LMTree(step, [prompt + cont[:t]], torch.device("cpu")), shape, np.array([cap]), 300)

        checked = _check_rounds(target, lambda t: prompt + cont[:t], fresh, got, len(cont), s, lambda t: min(shape.steps, len(cont) - 1 - t))
    assert checked > 40


def _group_equals_alone(model: Any, drafter: Any, shape: Any, s: Sampling, items: list[Any]) -> None:
    """References drafted together (one group: a shared prefill with holes on the left,
    rounds of several references in one forward) give each one's rounds alone."""
    with torch.inference_mode():
        together = tree_paths.PathRounds(model, drafter, shape, s, rows=5)
        assert len(together.groups([tree_paths.PathRef([0] * (len(p) + len(c)), len(p), len(c), np.arange(len(c))) for p, c, _ in items])) == 1
        got = together.references(items)
        singles = [tree_paths.PathRounds(model, drafter, shape, s, rows=5) for _ in items]
        alone = [one.reference(*item) for one, item in zip(singles, items, strict=True)]
    for mine, theirs in zip(got, alone, strict=True):
        assert mine is not None and theirs is not None
        np.testing.assert_array_equal(mine[0].tok, theirs[0].tok)
        np.testing.assert_array_equal(mine[0].parent, theirs[0].parent)
        np.testing.assert_allclose(mine[0].score, theirs[0].score, rtol=1e-9)
        np.testing.assert_array_equal(mine[1], theirs[1])
        np.testing.assert_allclose(mine[2], theirs[2], rtol=1e-9, atol=1e-12)
    # one prefill and a verify pass per chunk of 5 rows, against a prefill and chunks per reference
    assert together.target_calls < sum(one.target_calls for one in singles)


def _mixed(model: Any) -> list[Any]:
    """Three references of different lengths, every start of one, strided starts of two."""
    prompts = [[14, 60, 12], [5, 9, 33, 2, 71, 8, 40], [7, 3, 90, 11, 2]]
    conts = hf_greedy(model, prompts, 9)
    conts[2] = conts[2][:6]
    return [(prompts[0], conts[0], None), (prompts[1], conts[1], np.arange(1, 9, 3)), (prompts[2], conts[2], np.array([0, 2, 5]))]


@pytest.mark.parametrize("temperature", [0.9, 0.0])
def test_references_drafted_together_give_each_ones_rounds(target: Any, drafter: Any, temperature: float) -> None:
    from specprobe.models.anatomy import layer_view

    class _Self(_LM):
        kind = "layer_skip"
        n_layers = 1

    s = Sampling(temperature=temperature)
    t64, d64 = copy.deepcopy(target).double(), copy.deepcopy(drafter).double()  # float64: batching moves float32 round-off
    for d in (_LM(d64), _Self(layer_view(t64, 1))):
        _group_equals_alone(t64, d, parse("steps=3,topk=2,tokens=6"), s, _mixed(t64))


@pytest.mark.parametrize("name", ["eagle3-speculators", "mtp-deepseek", "medusa-fd-v2"])
def test_head_references_drafted_together_give_each_ones_rounds(layouts: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.models import loader

    plain = loader.resolve_dtype
    monkeypatch.setattr(loader, "resolve_dtype", lambda dtype, device: torch.float64 if dtype == "float64" else plain(dtype, device))
    target, spec = layouts[name]
    t, d = _load(target, spec, "float64")
    assert t.dtype == torch.float64
    shape = parse("[[0], [1], [0, 0], [1, 0], [0, 1]]" if name.startswith("medusa") else "steps=3,topk=2,tokens=6")
    _group_equals_alone(t.model, d, shape, Sampling(temperature=0.8), _mixed(t.model))


def _scored_rounds_equal_a_pass_of_their_own(cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """diagnose drafts the tree during the scoring, from each batch's target pass (its KV
    cache, its states, its argmax): the rounds are those of a paths pass with a target
    prefill of its own, on the same references and starts."""
    from specprobe.probe import tree as tree_mod
    from specprobe.probe.diagnose import run_diagnose

    seen: dict[str, Any] = {}
    finish = tree_mod.PathsCollector.finish

    def spy(self: Any, acc: Any) -> None:
        seen["c"] = self
        finish(self, acc)

    monkeypatch.setattr(tree_mod.PathsCollector, "finish", spy)
    run_diagnose(cfg)
    c = seen["c"]
    pr = c.paths
    with torch.inference_mode():
        own, _ = tree_paths.run(pr.target_model, pr.drafter, c.shape, pr.sampling, c.encoded, c.conts, starts=c.starts, thresholds=pr.thresholds)
    mine = {i: rest for i, *rest in c.rounds}
    assert sorted(mine) == [i for i, *_ in own] and len(own) >= 3
    for i, nodes, prob, at in own:
        m_nodes, m_prob, m_at = mine[i]
        np.testing.assert_array_equal(m_at, at)
        np.testing.assert_array_equal(m_nodes.parent, nodes.parent)
        np.testing.assert_array_equal(m_nodes.verified, nodes.verified)
        np.testing.assert_allclose(m_nodes.score, nodes.score, rtol=1e-4)
        np.testing.assert_allclose(m_prob, prob, rtol=1e-4, atol=1e-6)  # float32: the scoring's forward and a plain one differ by round-off


@pytest.mark.parametrize(("temperature", "stride"), [(1.0, 1), (0.0, 1), (1.0, 2)])
def test_diagnose_drafts_from_the_scoring_pass(tiny_pair: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, temperature: float, stride: int) -> None:
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=10,
                         batch_size=2, k_max=3, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=3,tokens=6",
                         sampling=SamplingFlags(temperature=temperature), use_cache=False, tree_paths_stride=stride)
    _scored_rounds_equal_a_pass_of_their_own(cfg, monkeypatch)


def test_diagnose_drafts_a_head_from_the_scoring_pass(layouts: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    target, spec = layouts["eagle3-speculators"]
    cfg = DiagnoseConfig(target=str(target), drafter=spec, prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=10,
                         batch_size=2, k_max=3, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=2,tokens=6",
                         sampling=SamplingFlags(temperature=0.8), use_cache=False)
    _scored_rounds_equal_a_pass_of_their_own(cfg, monkeypatch)


def test_out_of_memory_in_the_drafting_halves_its_rows(tiny_pair: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of memory while drafting a batch's tree: fewer rounds per forward, the same
    numbers; at one round a forward, one error that says what to do (never an
    out-of-memory error the scoring would retry after committing its batch)."""
    from specprobe.core.errors import ConfigError
    from specprobe.probe.diagnose import run_diagnose
    from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
    from tests.helpers.tiny import prompts_file

    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter="self:layers=1", prompts=str(prompts_file(tmp_path / "p.jsonl")), max_new_tokens=10,
                         batch_size=4, k_max=3, cost_ratio=0.1, verify_factor=1.0, engine="sglang", tree="steps=3,topk=3,tokens=6",
                         sampling=SamplingFlags(temperature=1.0), use_cache=False)
    plain = run_diagnose(cfg).trees
    real = tree_paths.PathRounds.from_pass
    rows: list[int] = []

    def flaky(self: Any, *a: Any, **k: Any) -> Any:
        rows.append(self.rows)
        if len(rows) == 1:
            raise RuntimeError("CUDA out of memory (a test)")
        return real(self, *a, **k)

    monkeypatch.setattr(tree_paths.PathRounds, "from_pass", flaky)
    again = run_diagnose(cfg).trees
    assert rows[:2] == [tree_paths.ROWS, tree_paths.ROWS // 2]
    assert plain is not None and again is not None and plain.tree is not None and again.tree is not None
    assert again.tree.tau_tokens == pytest.approx(plain.tree.tau_tokens, abs=1e-6)

    def full(self: Any, *a: Any, **k: Any) -> Any:
        raise RuntimeError("CUDA out of memory (a test)")

    monkeypatch.setattr(tree_paths.PathRounds, "from_pass", full)
    with pytest.raises(ConfigError, match="one round per forward"):
        run_diagnose(cfg)
