"""The sampling transform of each engine, and whose sampling settings the engine uses.

transformers' own warper chain is the peer for the 'transformers' order (in-process, on
random logits, ties included); the vLLM and SGLang orders are checked on hand-computed
cases where the three orders give different distributions."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from specprobe.core.errors import ConfigError
from specprobe.metrics.core import position_metrics
from specprobe.metrics.sampling import Sampling, probs, truncate_
from specprobe.probe.alignment import compare, declared_gaps, effective_sampling
from specprobe.settings.pipeline import SamplingFlags


def _hf_chain(x: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    """transformers' generate() warpers for do_sample=True, in generate()'s order."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    chain = LogitsProcessorList()
    if t != 1.0:
        chain.append(TemperatureLogitsWarper(t))
    if k:
        chain.append(TopKLogitsWarper(top_k=k, min_tokens_to_keep=1))
    if p < 1.0:
        chain.append(TopPLogitsWarper(top_p=p, min_tokens_to_keep=1))
    if mp:
        chain.append(MinPLogitsWarper(min_p=mp, min_tokens_to_keep=1))
    return torch.softmax(chain(torch.zeros(x.shape[0], 1, dtype=torch.long), x.clone()), dim=-1)


GRID = list(itertools.product([0.5, 1.0, 1.7], [0, 1, 3, 20], [1.0, 0.9, 0.5, 0.1], [0.0, 0.05, 0.3]))
GRID_WIDE = list(itertools.product([0.7], [0, 40], [1.0, 0.9, 0.5], [0.0, 0.05]))  # a bigger vocabulary


@pytest.mark.parametrize("v,grid", [(50, GRID), (1000, GRID_WIDE)])
def test_transformers_order_matches_transformers_warpers(v: int, grid: list) -> None:
    g = torch.Generator().manual_seed(v)
    checked = 0
    for t, k, p, mp in grid:
        x = torch.randn(48, v, generator=g) * 3
        x[:16] = torch.round(x[:16])  # many exact ties, at the top-k and top-p cuts too
        want = _hf_chain(x, t, k, p, mp)
        got = probs(x, Sampling(t, top_k=k, top_p=p, min_p=mp, semantics="transformers"))
        assert torch.equal(got > 0, want > 0), f"kept tokens differ at T={t} top_k={k} top_p={p} min_p={mp}"
        assert torch.allclose(got, want, atol=1e-6), f"T={t} top_k={k} top_p={p} min_p={mp}"
        checked += 1
    assert checked == len(grid) and len(GRID) == 144


def _p(*vals: float) -> torch.Tensor:
    return torch.tensor([vals], dtype=torch.float32)


def _cut(p: torch.Tensor, semantics: str, **kw: float) -> torch.Tensor:
    return truncate_(p.clone(), Sampling(1.0, semantics=semantics, **kw))  # type: ignore[arg-type]


def test_top_p_after_top_k_renormalises_in_vllm_and_transformers_not_sglang() -> None:
    # the case: top-k 2 leaves [.625, .375]; top-p .6 is reached by the first
    p = _p(0.5, 0.3, 0.2)
    for sem in ("vllm", "transformers"):
        assert torch.allclose(_cut(p, sem, top_k=2, top_p=0.6), _p(1.0, 0.0, 0.0)), sem
    # SGLang measures top-p on the untruncated p: .5 < .6, so the second token stays
    assert torch.allclose(_cut(p, "sglang", top_k=2, top_p=0.6), _p(0.625, 0.375, 0.0))


def test_min_p_before_top_p_in_vllm_after_it_in_transformers() -> None:
    p = _p(0.4, 0.3, 0.2, 0.1)
    # vLLM: min-p .3 (cut .12) drops .1 -> [.444, .333, .222]; top-p .75 then drops .222
    assert torch.allclose(_cut(p, "vllm", min_p=0.3, top_p=0.75), _p(4 / 7, 3 / 7, 0.0, 0.0))
    # transformers: top-p .75 on the original drops only .1; min-p keeps .2 (>= .12)
    assert torch.allclose(_cut(p, "transformers", min_p=0.3, top_p=0.75), _p(0.4, 0.3, 0.2, 0.0) / 0.9)
    # SGLang: both masks on the original: the same three tokens
    assert torch.allclose(_cut(p, "sglang", min_p=0.3, top_p=0.75), _p(0.4, 0.3, 0.2, 0.0) / 0.9)


def test_top_p_boundary_sglang_keeps_mass_equal_to_top_p() -> None:
    p = _p(0.5, 0.25, 0.25)  # exact in binary: no rounding at the boundary
    # vLLM/transformers drop tokens whose ascending cumulative mass is <= 1 - top_p = .5
    assert torch.equal(_cut(p, "vllm", top_p=0.5), _p(1.0, 0.0, 0.0))
    assert torch.equal(_cut(p, "transformers", top_p=0.5), _p(1.0, 0.0, 0.0))
    # SGLang drops only tokens with MORE than top_p ahead of them: .5 ahead of the second
    kept = _cut(p, "sglang", top_p=0.5)
    assert int((kept > 0).sum()) == 2 and torch.allclose(kept.sum(), torch.tensor(1.0))


def test_top_k_ties_kept_by_vllm_and_transformers_cut_by_sglang() -> None:
    p = _p(0.4, 0.2, 0.2, 0.2)
    for sem in ("vllm", "transformers"):
        assert torch.allclose(_cut(p, sem, top_k=2), p), sem  # the tie with the 2nd stays
    assert int((_cut(p, "sglang", top_k=2) > 0).sum()) == 2


def test_greedy_threshold_is_each_engines() -> None:
    x = torch.tensor([[2.0, 1.0, 0.0]])
    assert Sampling(5e-6, semantics="vllm").greedy and torch.equal(probs(x, Sampling(5e-6)), _p(1.0, 0.0, 0.0))
    assert not Sampling(5e-6, semantics="sglang").greedy and Sampling(5e-7, semantics="sglang").greedy
    assert not Sampling(5e-6, semantics="transformers").greedy and Sampling(0.0, semantics="transformers").greedy


@pytest.mark.parametrize("sem", ["vllm", "sglang", "transformers"])
def test_position_metrics_acceptance_uses_the_engines_transform(sem: str) -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(24, 80, generator=g) * 3, torch.randn(24, 80, generator=g) * 3
    st = Sampling(0.8, top_k=20, top_p=0.7, min_p=0.05, semantics=sem)  # type: ignore[arg-type]
    sd = Sampling(1.1, top_k=10, top_p=0.9, semantics=sem)  # type: ignore[arg-type]
    a0, b0 = a.clone(), b.clone()
    pm = position_metrics(a, b, st, sd)
    want = torch.minimum(probs(a, st), probs(b, sd)).sum(-1)
    assert torch.allclose(pm.accept_prob, want, atol=1e-6)
    assert torch.allclose(pm.draft_confidence, probs(b, sd).amax(-1), atol=1e-6)
    # KL stays on the untruncated tempered softmax
    lp, lq = torch.log_softmax(a / 0.8, -1), torch.log_softmax(b / 1.1, -1)
    assert torch.allclose(pm.kl_target_draft_nats, (lp.exp() * (lp - lq)).sum(-1), atol=1e-4)
    assert torch.equal(a, a0) and torch.equal(b, b0)  # inputs untouched


def test_sampling_reports_its_semantics() -> None:
    d = Sampling(0.7, top_p=0.9, semantics="sglang").to_dict()
    assert d["semantics"] == "sglang" and d["repetition_penalty"] == 1.0
    assert "sglang" in Sampling(0.7, top_p=0.9, semantics="sglang").describe()
    assert SamplingFlags().to_dict()["sampling_semantics"] == "vllm"


# ----------------------------------------------------------------------------- whose settings


class _Gen:
    """A generation config as loaded: only what the file sets shows in to_diff_dict."""

    def __init__(self, **kw: object) -> None:
        self.kw = kw

    def to_diff_dict(self) -> dict[str, object]:
        return dict(self.kw)


def test_drafter_takes_the_targets_settings_not_its_own_generation_config() -> None:
    pair = effective_sampling(SamplingFlags(), _Gen(do_sample=True, temperature=0.6, top_p=0.95), _Gen(temperature=1.5, top_p=0.8))
    assert pair.draft.temperature == pair.target.temperature == 0.6
    assert pair.draft.top_p == 0.95 and pair.sources["draft.temperature"] == "target's"
    assert pair.draft_own == {"temperature": 1.5, "top_p": 0.8}
    # a drafter with no generation config: transformers' default temperature, reported
    assert effective_sampling(SamplingFlags(), _Gen(temperature=0.6), _Gen()).draft_own == {"temperature": 1.0}
    # the drafter is the target itself: nothing to report
    assert effective_sampling(SamplingFlags(), _Gen(temperature=0.6), None).draft_own is None


def test_draft_flags_set_the_drafter_apart() -> None:
    pair = effective_sampling(SamplingFlags(draft_temperature=1.0, draft_top_k=5), _Gen(temperature=0.6), _Gen())
    assert (pair.draft.temperature, pair.draft.top_k) == (1.0, 5)
    assert pair.sources["draft.temperature"] == "flag" and pair.target.temperature == 0.6


def test_do_sample_matters_to_transformers_only() -> None:
    gen = _Gen(do_sample=False, temperature=0.6)
    assert effective_sampling(SamplingFlags(), gen, None).target.temperature == 0.6  # vLLM ignores do_sample
    assert effective_sampling(SamplingFlags(sampling_semantics="sglang"), gen, None).target.temperature == 0.6
    hf = effective_sampling(SamplingFlags(sampling_semantics="transformers"), gen, None)
    assert hf.target.greedy and "do_sample" in hf.sources["target.temperature"]
    # transformers fills in top_k 50 and, without do_sample, decodes greedily
    hf2 = effective_sampling(SamplingFlags(sampling_semantics="transformers"), _Gen(temperature=0.6), None)
    assert hf2.target.greedy and hf2.target.top_k == 50 and hf2.sources["target.top_k"] == "transformers default"
    hf3 = effective_sampling(SamplingFlags(temperature=0.7, sampling_semantics="transformers"), _Gen(), None)
    assert hf3.target.temperature == 0.7 and hf3.target.semantics == hf3.draft.semantics == "transformers"
    with pytest.raises(ConfigError, match="semantics"):
        effective_sampling(SamplingFlags(sampling_semantics="tgi"), _Gen(), None)


def test_penalties_are_read_and_reported() -> None:
    pair = effective_sampling(SamplingFlags(presence_penalty=0.5), _Gen(repetition_penalty=1.1), None)
    assert pair.target.repetition_penalty == 1.1 and pair.target.presence_penalty == 0.5 and pair.target.penalised
    assert pair.draft.repetition_penalty == 1.1
    assert pair.sources["target.repetition_penalty"] == "generation_config"
    assert not effective_sampling(SamplingFlags(), _Gen(), None).target.penalised


def test_declared_gaps_are_numbers() -> None:
    gaps = declared_gaps({"probe.yaml": {"temperature": 0.7, "top_p": 0.95}, "sglang.yaml": {"temperature": 1.0, "top_p": 0.95}, "vllm.json": {}})
    assert gaps["temperature"] == pytest.approx(0.3) and gaps["top_p"] == 0.0 and gaps["top_k"] == 0.0
    assert declared_gaps({"a": {"temperature": 0.7}}) == {"temperature": 0.0, "top_k": 0.0, "top_p": 0.0, "min_p": 0.0}


# ----------------------------------------------------------------------------- on tiny checkpoints


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.helpers.tiny import _model, _tokenizer, base_vocab, save

    root = tmp_path_factory.mktemp("sampling")
    tok = _tokenizer(base_vocab())
    m = _model(0, len(base_vocab()))
    return {
        "target": save(m, tok, root / "target", gen={"do_sample": True, "temperature": 0.6, "top_p": 0.95}),
        "bare": save(m, tok, root / "bare"),  # no generation_config.json
        "hot": save(m, tok, root / "hot", gen={"do_sample": True, "temperature": 1.5}),
        "penalised": save(m, tok, root / "penalised", gen={"do_sample": True, "temperature": 0.6, "repetition_penalty": 1.15}),
    }


def _check(target: Path, drafter: Path, flags: SamplingFlags, declared: dict | None = None, drafting: str | None = None) -> tuple[dict, dict]:
    from specprobe.judge.rules import load_table
    from specprobe.models.loader import load_info

    t, d = load_info(str(target)), load_info(str(drafter))
    pair = effective_sampling(flags, t.generation_config, d.generation_config, declared, drafting=drafting)
    rep = compare(t, d, pair)
    found = {f.rule_id: f for f in load_table().findings(rep.metrics, evidence=rep.evidence, families=("alignment",))}
    return rep.metrics | {"facts": rep.facts}, found


def test_target_at_0_6_with_a_drafter_without_generation_config_is_not_a_mismatch(ckpts) -> None:
    m, found = _check(ckpts["target"], ckpts["bare"], SamplingFlags())
    assert "SP012" not in found and m["temperature_target"] == m["temperature_draft"] == 0.6
    f = found["SP018"]  # reported, at info level
    assert f.severity == "info" and m["draft_own_temperature_diff"] == pytest.approx(0.4)
    assert any("transformers default" in e for e in f.evidence)
    assert m["facts"]["sampling_semantics"] == "vllm" and m["facts"]["drafter_own_sampling"] == {"temperature": 1.0}


def test_drafter_shipping_another_temperature_is_served_at_the_targets(ckpts) -> None:
    m, found = _check(ckpts["target"], ckpts["hot"], SamplingFlags())
    assert "SP012" not in found and "SP018" in found and m["temperature_abs_diff"] == 0.0


def test_a_drafter_flag_that_differs_is_a_mismatch(ckpts) -> None:
    # a drafter temperature changes sampled drafts only
    m, found = _check(ckpts["target"], ckpts["bare"], SamplingFlags(draft_temperature=1.0), drafting="probabilistic")
    assert found["SP012"].severity == "error" and m["temperature_abs_diff"] == pytest.approx(0.4)
    assert "SP018" not in found  # the drafter's own 1.0 is what it is given
    # greedy drafting (the engines' default) proposes argmax q whatever the temperature: no mismatch, an info line
    _, greedy = _check(ckpts["target"], ckpts["bare"], SamplingFlags(draft_temperature=1.0), drafting="greedy")
    assert "SP012" not in greedy and greedy["SP030"].severity == "info"


def test_config_files_that_disagree_give_a_number_and_a_finding(ckpts) -> None:
    m, found = _check(ckpts["target"], ckpts["bare"], SamplingFlags(temperature=0.7), {"probe.yaml": {"temperature": 0.7}, "serve.yaml": {"temperature": 1.0}})
    assert m["temperature_config_gap"] == pytest.approx(0.3) and "SP019" in found
    assert any("serve.yaml 1" in e for e in found["SP019"].evidence)
    m2, found2 = _check(ckpts["target"], ckpts["bare"], SamplingFlags())
    assert m2["temperature_config_gap"] == 0.0 and "SP019" not in found2


def test_penalties_in_generation_config_are_a_finding(ckpts) -> None:
    m, found = _check(ckpts["penalised"], ckpts["bare"], SamplingFlags())
    assert m["sampling_penalties_set"] == 1 and found["SP017"].severity == "warning"
    assert any("repetition_penalty 1.15" in e for e in found["SP017"].evidence)
