"""`simulate` with head drafters (EAGLE-1/2, EAGLE-3, Medusa, MTP) in the real draft →
verify loop, on the tiny checkpoints of tests/helpers/heads.py: greedy output
token-identical to plain target decoding for every layout; oracle heads accepted at
every depth, greedy and sampled; the live head's logits equal the teacher-forced
scorer's at the same positions round after round (its cache holds the verified tokens
only); the pipeline's calibration block and the CLI, with its one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from benchmarks.bench_kvcache import ConcatKV
from specprobe.cli.main import app
from specprobe.metrics.sampling import Sampling, probs
from specprobe.simulate import Procedure, speculate
from tests.helpers import heads as hh
from tests.helpers.heads import head_prompts, load_pair
from tests.helpers.tiny import prompts_file

runner = CliRunner()
GREEDY = Sampling(temperature=0.0)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def layouts(tiny_pair, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name -> (target, drafter spec): one random (poor) head of every layout."""
    return hh.every_layout(tmp_path_factory.mktemp("sim-heads"), tiny_pair["target"], prefixed=True)


@pytest.fixture(scope="module")
def oracles(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Heads whose depth-d distribution is the target's (see tests/helpers/heads.py)."""
    root = tmp_path_factory.mktemp("sim-oracles")
    bg = hh.bigram_target(root / "bigram")
    uni = hh.bigram_target(root / "uni", unigram=True)
    out = {
        "eagle3-speculators": (bg, str(hh.eagle3_speculators(root / "e3s", bg, oracle=True, verifier="bigram"))),
        "eagle3-norm-before-residual": (bg, str(hh.eagle3_speculators(root / "e3n", bg, oracle=True, verifier="bigram", norm_before_residual=True))),
        "eagle3-export": (bg, str(hh.eagle3_export(root / "e3x", bg, oracle=True))),
        "eagle1": (bg, str(hh.eagle1(root / "e1", bg, oracle=True))),
        "medusa": (uni, str(hh.medusa_fasterdecoding(root / "mo", uni, heads=4, version=2, oracle=True))),
    }
    for style in ("deepseek", "qwen3_next", "mimo"):
        out[f"mtp-{style}"] = (hh.target_with_mtp(root / f"t-{style}", bg, style, oracle=True), "mtp")
    return out


# ----------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("name", ["eagle3-speculators", "eagle3-export", "eagle1", "medusa-fd-v2", "medusa-fd-v1", "medusa-vllm", "mtp-deepseek", "mtp-qwen3_next", "mtp-mimo"])
def test_greedy_output_is_the_targets_for_every_head(layouts, name) -> None:
    target, spec = layouts[name]
    t, d = load_pair(target, spec)
    prompts = head_prompts()
    plain = speculate(t.model, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=20, batch_size=3)
    run = speculate(t.model, d, prompts, k=3, target_sampling=GREEDY, max_new_tokens=20, batch_size=3)
    assert run.outputs == plain.outputs
    c = run.counters
    assert c.num_drafts > 0 and c.draft_calls > 0 and c.drafted_tokens >= c.num_drafts
    # round 1 is the prefill (a head has no target state to draft from yet): it proposes nothing
    assert c.verify_steps - c.num_drafts >= len(prompts)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_oracle_heads_accept_every_draft(oracles, temperature) -> None:
    """α = 1 at every depth: each row verifies the prefill, then 4 rounds of K+1 = 5."""
    prompts = head_prompts()
    for name, (target, spec) in oracles.items():
        t, d = load_pair(target, spec)
        run = speculate(t.model, d, prompts, k=4, target_sampling=Sampling(temperature=temperature), max_new_tokens=21, batch_size=3, seed=1)
        c = run.counters
        assert c.accept_rate == 1.0 and c.tau_tokens == 5.0, name
        assert c.cumulative() == [1.0] * 4, name
        assert (c.num_drafts, c.verify_steps) == (4 * len(prompts), 5 * len(prompts)), name
        assert all(len(o) == 21 for o in run.outputs), name


def test_oracle_cut_to_a_draft_vocabulary_is_mapped_with_d2t(oracles, tmp_path) -> None:
    """An oracle cut to 150 draft ids: proposals are target ids (via d2t), never an id
    outside the draft vocabulary, and greedy output is still the target's."""
    bg = oracles["eagle1"][0]
    head = hh.eagle3_speculators(tmp_path / "cut", bg, oracle=True, vd=150, verifier="bigram")
    t, d = load_pair(bg, str(head))
    allowed = set(hh.draft_vocab(int(t.vocab_size), 150).tolist())
    proposed: list[int] = []
    real = d.logits

    def spy(features: Any, depth: int) -> Any:
        out = real(features, depth)
        proposed.extend(out.argmax(-1).tolist())
        assert torch.isneginf(out[:, sorted(set(range(out.shape[1])) - allowed)]).all()
        return out

    d.logits = spy  # type: ignore[method-assign]
    prompts = head_prompts()
    plain = speculate(t.model, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=16, batch_size=5)
    run = speculate(t.model, d, prompts, k=3, target_sampling=GREEDY, max_new_tokens=16, batch_size=5)
    assert run.outputs == plain.outputs
    assert proposed and set(proposed) <= allowed
    assert 0.0 < run.counters.accept_rate < 1.0


def _replay(t: Any, d: Any, prompt: list[int], k: int = 3) -> tuple[int, int, float]:
    """Run the loop (batch of one, greedy) recording every logits the head returns, then
    compare each with the teacher-forced scorer's at the same position -> (logits
    compared, of which at depth > 1, acceptance)."""
    from specprobe.drafters.base import TargetPass
    from specprobe.models.anatomy import capture_layers

    calls: list[tuple[int, torch.Tensor]] = []
    real = d.logits

    def spy(features: Any, depth: int) -> Any:
        out = real(features, depth)
        calls.append((depth, out[0].clone()))
        return out

    d.logits = spy
    try:
        run = speculate(t.model, d, [prompt], k=k, target_sampling=GREEDY, max_new_tokens=30, batch_size=1)
    finally:
        d.logits = real
    seq = prompt + run.outputs[0]
    ids = torch.tensor([seq])
    mask = torch.ones_like(ids)
    compared, deep, known = 0, 0, len(prompt) + 1  # round 1: the prefill emits one token
    with torch.inference_mode(), capture_layers(t.model, d.target_layers_needed()) as cap:
        feats = d.hidden(TargetPass(ids, mask, t.last_hidden(ids, mask), dict(cap)))
        i = 0
        while i < len(calls):  # one round: depth 1, then its chain
            chain = [calls[i][1]]
            i += 1
            while i < len(calls) and calls[i][0] > 1:
                chain.append(calls[i][1])
                i += 1
            n = 0
            for j, lg in enumerate(chain, start=1):
                want = d.logits(feats[j][0, known - 1 : known], j)[0]  # depth j predicting token `known + j − 1`
                assert torch.allclose(lg, want, atol=1e-4), (known, j, float((lg - want).abs().max()))
                compared, deep = compared + 1, deep + (j > 1)
                if int(lg.argmax()) != seq[known + j - 1]:
                    break  # deeper steps were fed a draft the reference does not have
                n = j
            known += n + 1
    return compared, deep, run.counters.accept_rate


@pytest.mark.parametrize("kind", ["eagle3-speculators", "eagle1", "mtp-deepseek", "mtp-mimo"])
def test_live_head_equals_teacher_forced_scoring(layouts, oracles, kind) -> None:
    """The head in the loop computes what the scorer computes teacher-forced on the final
    sequence: depth-1 logits at every round (its cache holds the verified tokens only,
    after any number of roll-backs) and depth j wherever drafts 1..j−1 were the
    reference's tokens. A random head (attention that reads the whole cache) and a
    perturbed oracle (accepts some chains, rejects others)."""
    prompt = head_prompts(1, seed=11)[0]
    t, d = load_pair(*layouts[kind])
    compared, _, _ = _replay(t, d, prompt)
    assert compared >= 10
    t, d = load_pair(*oracles[kind])
    _perturb(d, 0.05)
    compared, deep, acc = _replay(t, d, prompt)
    assert 0.0 < acc < 1.0, acc  # roll-backs after accepted and rejected drafts
    assert deep >= 3, (compared, deep)


def _perturb(d: Any, scale: float, seed: int = 3, lm_head_only: bool = False) -> None:
    """Noise on every weight of a built head (an oracle becomes a good, imperfect head).
    The EAGLE-3 oracle cancels the incoming hidden state exactly (v = ê − ĥ), so noise on
    its layer ruins it; noise on its own LM head alone degrades it gradually."""
    d.ensure_built()
    g = torch.Generator().manual_seed(seed)
    mods = [d.head] if d.kind == "eagle3" else [d.fc, *d.layers] if d.kind == "eagle" else list(d.mods) if d.kind == "mtp" else [d.blocks]
    mods = [d.head.lm_head] if lm_head_only else mods
    with torch.no_grad():
        for m in mods:
            for p in m.parameters():
                p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("procedure", [None, Procedure.of("vllm"), Procedure.of("llama.cpp")], ids=["sampled-drafts", "vllm-greedy", "llama.cpp-greedy"])
@pytest.mark.parametrize("name", ["eagle3-speculators", "mtp-qwen3_next"])
def test_sampled_output_follows_target_distribution(oracles, name, procedure, monkeypatch) -> None:
    """Many draws of one prompt in one batch: the second and third emitted tokens (the
    first a head drafts for, after the prefill) follow the target's exact marginals
    through the same verification, while the head's q differs from p; drafting greedily,
    a head proposes its argmax at every depth as a causal drafter does."""
    import specprobe.simulate.sources as sources
    from specprobe.metrics.core import align_vocab
    from tests.test_simulate import _chi2

    target, spec = oracles[name]
    t, d = load_pair(target, spec)
    _perturb(d, 3.0, lm_head_only=True) if name.startswith("eagle3") else _perturb(d, 0.05)
    real_chain, firsts = sources.chain, []

    def spy(logits, step, cap, rule, gen):
        prop, fed = real_chain(logits, step, cap, rule, gen)
        firsts.append((align_vocab(logits, rule.vocab).argmax(-1), prop.tokens[:, 0], prop.drafted))
        return prop, fed

    monkeypatch.setattr(sources, "chain", spy)
    # a greedy draft is accepted with p(argmax), near 1 for this peaked bigram target
    # unless it is spread further
    s = Sampling(temperature=1.5 if procedure is None else 10.0)
    prompt, n = [7, 30, 101], 2000
    run = speculate(t.model, d, [prompt] * n, k=2, target_sampling=s, max_new_tokens=3, batch_size=n, seed=7, procedure=procedure)
    c = run.counters
    assert 0.05 < c.accept_rate < 0.95, c.accept_rate  # both branches (accept / residual)
    assert firsts
    for want, got, drafted in firsts:
        same = bool((want == got)[drafted > 0].all())
        assert same if procedure is not None else not same  # sampled drafts are not all the argmax
    with torch.inference_mode():
        m = t.model
        p1 = probs(m(torch.tensor([prompt])).logits[0, -1], s).double()  # [V]
        v = p1.shape[0]
        ids = torch.cat([torch.tensor([prompt]).expand(v, -1), torch.arange(v)[:, None]], 1)
        p2 = (p1[:, None] * probs(m(ids).logits[:, -1], s).double()).sum(0)  # [V] marginal of token 2
    first, second = _chi2([o[0] for o in run.outputs], p1.numpy()), _chi2([o[1] for o in run.outputs], p2.numpy())
    print(f"{name} {procedure.engine if procedure else 'sampled drafts'}: chi-square token 1 p = {first:.3g}, token 2 p = {second:.3g}")
    assert first > 1e-3 and second > 1e-3


@pytest.mark.parametrize("procedure", [Procedure.of("vllm"), Procedure.of("llama.cpp")], ids=["vllm", "llama.cpp"])
def test_greedy_drafting_heads_are_exact_and_accepted_with_p_of_the_argmax(oracles, procedure) -> None:
    """An oracle head (q = p) drafting greedily: at T = 0 every draft is accepted and the
    output is plain decoding's; at T = 0.8 its argmax is accepted with p(argmax) < 1."""
    prompts = head_prompts()
    target, spec = oracles["eagle3-speculators"]
    t, d = load_pair(target, spec)
    plain = speculate(t.model, None, prompts, k=0, target_sampling=GREEDY, max_new_tokens=21, batch_size=3)
    run = speculate(t.model, d, prompts, k=4, target_sampling=GREEDY, max_new_tokens=21, batch_size=3, procedure=procedure)
    assert run.outputs == plain.outputs and run.counters.accept_rate == 1.0
    warm = speculate(t.model, d, prompts, k=4, target_sampling=Sampling(temperature=0.8), max_new_tokens=21, batch_size=3, seed=1, procedure=procedure).counters
    assert 0.0 < warm.accept_rate < 1.0


# ----------------------------------------------------------------------------- pipeline and CLI
@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return prompts_file(tmp_path_factory.mktemp("shp") / "p.jsonl", n=4, words=8)


def test_simulate_cli_calibrates_a_head(oracles, prompts, tmp_path) -> None:
    """`simulate TARGET eagle3:PATH`: the measured block carries renewal, window and
    measured τ per K, and the SP601 calibration metrics, as for a causal drafter; an
    oracle measures τ = K+1 and the estimate agrees."""
    target, spec = oracles["eagle3-speculators"]
    out = tmp_path / "sim.json"
    res = runner.invoke(app, ["simulate", str(target), "eagle3:" + spec, "--prompts", str(prompts), "--k", "2,3", "--max-new-tokens", "13", "--batch-size", "4",
                              "--temperature", "0", "--cost-ratio", "0.1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    rows = {row["k"]: row for row in r["measured"]["k_table"]}
    assert sorted(rows) == [2, 3]
    for k, row in rows.items():
        assert row["accept_rate"] == 1.0 and row["tau_tokens"] == pytest.approx(k + 1)
        assert row["tau_estimate"] == pytest.approx(k + 1, abs=1e-3) and row["tau_window"] == pytest.approx(k + 1, abs=1e-3)
    m = r["metrics"]
    assert m["calibration_k"] == 3 and m["tau_measured_tokens"] == pytest.approx(4.0)
    assert m["tau_gap_rel_abs"] == pytest.approx(0.0, abs=1e-3)
    assert "SP601" not in [f["rule_id"] for f in r["findings"]]
    assert r["drafter"]["kind"] == "eagle3" and r["measured"]["depth"]["cumulative"] == [1.0, 1.0, 1.0]


def test_medusa_k_beyond_its_heads_is_measured_at_the_heads(layouts, prompts, tmp_path) -> None:
    target, spec = layouts["medusa-fd-v2"]  # 3 heads
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["simulate", str(target), spec, "--prompts", str(prompts), "--k", "2,5", "--max-new-tokens", "8", "--cost-ratio", "0.1", "--fail-on", "never", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "3 Medusa heads" in res.output and "measured as K=2,3" in res.output
    r = json.loads(out.read_text())
    assert [row["k"] for row in r["measured"]["k_table"]] == [2, 3]


def test_unsupported_head_is_a_one_line_error(tiny_pair, prompts, tmp_path, monkeypatch) -> None:
    """Two MTP layers cannot be rolled back like one (a later layer's context is its own
    teacher-forced step): refused from the checkpoint's config and headers before the
    target loads (minutes, for a big one), exit 2, no traceback."""
    import specprobe.models.loader as loader

    two = hh.target_with_mtp(tmp_path / "t2", tiny_pair["target"], "deepseek", layers=2)
    read: list[str] = []
    real_info = loader.load_info

    def info(spec: str, *a: Any, **k: Any) -> Any:
        read.append(spec)
        return real_info(spec, *a, **k)

    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the target was loaded before the head was refused")

    import specprobe.probe.diagnose as diagnose  # loads the pair: patched where it looks them up

    for mod in (loader, diagnose):
        monkeypatch.setattr(mod, "load_info", info)
        monkeypatch.setattr(mod, "load_model", boom)
    res = runner.invoke(app, ["simulate", str(two), "mtp", "--prompts", str(prompts), "--k", "2", "--max-new-tokens", "6", "--cost-ratio", "0.1"])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "one layer" in lines[0] and "has 2" in lines[0], res.output
    assert "Traceback" not in res.output and "the target was loaded" not in res.output
    assert read == [str(two)]  # its config was read, and nothing loaded


# ----------------------------------------------------------------------------- the head's KV cache
class _ConcatKV(ConcatKV):
    """The cache KVList replaced (the benchmark's reference: a `torch.cat` per append),
    with the cache calls a live head makes."""

    def update(self, key: Any, value: Any, *args: Any, **kw: Any) -> Any:
        self.append((key, value))
        return self[0]

    def crop(self, keep: int) -> None:
        if self:
            self[0] = (self[0][0][:, :, :keep], self[0][1][:, :, :keep])

    def select(self, rows: Any) -> None:
        if self:
            self[0] = (self[0][0][rows], self[0][1][rows])


def _kv(b: int, t: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, 2, t, 4, generator=g), torch.randn(b, 2, t, 4, generator=g)  # [B, heads, T, D]


def _moves(cache: Any, n: int, g: torch.Generator) -> int:
    """n single-token appends -> how many of them left the keys in a different buffer."""
    moved, last = 0, None
    for _ in range(n):
        cache.append(_kv(3, 1, g))
        ptr = cache[0][0].untyped_storage().data_ptr()
        moved += last is not None and ptr != last
        last = ptr
    return moved


def test_kv_cache_grows_geometrically() -> None:
    """300 single-token appends reallocate O(log L) times (each copying the live part:
    O(L) slots in all), where a concatenation per append copies all of it every time."""
    from specprobe.models.heads.live import KVList

    g = torch.Generator().manual_seed(0)
    kv = KVList()
    moved = _moves(kv, 300, g)
    assert kv.allocations <= 6 and moved == kv.allocations - 1, (kv.allocations, moved)  # 16, 32, …, 512
    assert kv[0][0].shape == (3, 2, 300, 4) and kv.capacity == 512
    assert _moves(_ConcatKV(), 300, g) == 299  # the count above can see a copy per append


def test_kv_cache_equals_concatenation_through_crop_select_append() -> None:
    """Appends of any width, crops (roll-backs), row selections (finished rows) and
    appends after them: the entry, and what `update` returns, is exactly the live part."""
    from specprobe.models.heads.live import KVList

    g = torch.Generator().manual_seed(1)
    new, ref = KVList(), _ConcatKV()
    ops: list[tuple[str, Any]] = [("add", 7), ("add", 1), ("crop", 5), ("add", 3), ("add", 20), ("select", torch.tensor([0, 2, 3])), ("add", 1), ("crop", 29),
                                  ("crop", 40), ("select", torch.tensor([True, False, True])), ("add", 2), ("crop", 0), ("add", 4), ("add", 30), ("crop", 33), ("update", 1)]
    b = 4
    for op, arg in ops:
        if op in ("add", "update"):
            k, v = _kv(b, arg, g)
            got = new.update(k, v, 0) if op == "update" else new.append((k, v))
            want = ref.update(k, v) if op == "update" else ref.append((k, v))
            if op == "update":
                assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))
        elif op == "crop":
            new.crop(arg), ref.crop(arg)
        else:
            new.select(arg), ref.select(arg)
            b = int(arg.sum()) if arg.dtype == torch.bool else len(arg)
        assert len(new) == 1 and torch.equal(new[0][0], ref[0][0]) and torch.equal(new[0][1], ref[0][1]), (op, arg)
    assert new.allocations >= 4  # grew past its first buffer, and each select made one


@pytest.mark.parametrize("name", ["eagle3-speculators", "eagle1", "mtp-deepseek", "mtp-qwen3_next"])
def test_live_logits_bit_identical_to_a_concatenating_cache(layouts, monkeypatch, name) -> None:
    """The same run with the old concatenating cache: every logits the head returns is
    equal bit for bit (rows of several lengths finish apart: crops, selects, growth)."""
    import specprobe.models.heads.live as live

    made: list[Any] = []

    class Tracked(live.KVList):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    def logits_of(cache_cls: Any) -> list[torch.Tensor]:
        monkeypatch.setattr(live, "KVList", cache_cls)
        t, d = load_pair(*layouts[name])
        out: list[torch.Tensor] = []
        real = d.logits

        def spy(features: Any, depth: int) -> Any:
            out.append(real(features, depth).clone())
            return out[-1]

        d.logits = spy
        speculate(t.model, d, head_prompts(), k=3, target_sampling=GREEDY, max_new_tokens=24, batch_size=3)
        return out

    ref, new = logits_of(_ConcatKV), logits_of(Tracked)
    assert len(new) == len(ref) > 20
    assert all(torch.equal(a, b) for a, b in zip(new, ref, strict=True))
    assert made and max(kv.allocations for kv in made) >= 3  # grew while the run went on
