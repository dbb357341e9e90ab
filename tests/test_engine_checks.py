"""The pre-flight checks that follow the engine: greedy drafting makes the drafter's
temperature moot, the context the engine serves against the drafter's window, a head's
rope against the target's, the weights' scale, and the vocabularies as vLLM and
llama.cpp pair them — each through its rule on tiny real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from specprobe.core.errors import ConfigError
from specprobe.core.progress import Progress
from specprobe.engines.base import shared_vocab_frac
from specprobe.engines.llamacpp import (
    VOCAB_MAX_SIZE_DIFFERENCE as LLAMACPP_VOCAB_MAX_SIZE_DIFFERENCE,
)
from specprobe.engines.llamacpp import vocab_problems as llamacpp_vocab_problems
from specprobe.judge.rules import load_table
from specprobe.models.drafters import drafter_info
from specprobe.models.heads.checks import rope_settings
from specprobe.models.loader import load_info
from specprobe.probe.alignment import compare, effective_sampling
from specprobe.probe.diagnose import load_pair
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.conftest import requires_smollm2
from tests.helpers import heads as hh
from tests.helpers.tiny import SPECIALS, WORDS, _model, _tokenizer, base_vocab, save

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _findings(metrics: dict[str, Any], evidence: dict[str, list[str]], kind: str | None = None) -> dict[str, Any]:
    table = load_table()
    return {f.rule_id: f for f in table.findings(metrics, kind=kind, evidence=evidence, families=("alignment",))}


def _check(target: Path | str, drafter: Path | str, flags: SamplingFlags | None = None, **kw: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """check's path: infos only, no weights."""
    serving_context = kw.pop("serving_context", None)
    tinfo = load_info(str(target))
    dinfo = drafter_info(str(drafter), tinfo)
    pair = effective_sampling(flags or SamplingFlags(temperature=1.0), tinfo.generation_config, None if dinfo is tinfo else dinfo.generation_config, **kw)
    rep = compare(tinfo, dinfo, pair, serving_context=serving_context)
    kind = "eagle3" if "head" in dinfo.extra and dinfo.extra["head"].kind == "eagle3" else None
    return rep.metrics, _findings(rep.metrics, rep.evidence, kind), rep


# ----------------------------------------------------------------------------- the engine's drafting
def test_greedy_drafting_reports_no_temperature_mismatch(tiny_pair) -> None:
    t, d = tiny_pair["target"], tiny_pair["twin"]
    for draft_t in (1.5, 0.0):
        m, found, rep = _check(t, d, SamplingFlags(temperature=1.0, draft_temperature=draft_t), engine="llama.cpp", drafting="greedy")
        assert "SP012" not in found and "SP013" not in found
        assert m["temperature_abs_diff"] == pytest.approx(abs(1.0 - draft_t))  # the settings are still told as they are
        f = found["SP030"]
        assert f.severity == "info"
        assert "llama.cpp drafts the drafter's top token (--spec-type draft-simple): the drafter's temperature does not change its drafts" in f.evidence
        assert rep.facts["procedure"] == "as llama.cpp verifies it: greedy drafts, acceptance = p_target(draft token)"
    # vLLM's default is greedy too; its knob is named
    _, found, _ = _check(t, d, SamplingFlags(temperature=1.0, draft_temperature=1.5), engine="vllm", drafting="greedy")
    assert any("speculative_config.draft_sample_method: greedy" in e for e in found["SP030"].evidence)
    # no drafter temperature given: nothing to say
    m, found, _ = _check(t, d, SamplingFlags(temperature=1.0), engine="vllm", drafting="greedy")
    assert m["draft_temperature_ignored"] == 0 and "SP030" not in found


def test_probabilistic_drafting_keeps_sp012_and_sp013(tiny_pair) -> None:
    t, d = tiny_pair["target"], tiny_pair["twin"]
    m, found, _ = _check(t, d, SamplingFlags(temperature=1.0, draft_temperature=1.5), engine="transformers", drafting="probabilistic")
    assert found["SP012"].severity == "error" and "SP030" not in found
    assert "as transformers verifies it: sampled drafts, acceptance = Σ min(p, q)" in found["SP012"].evidence
    _, found, _ = _check(t, d, SamplingFlags(temperature=0.8, draft_temperature=0.0), engine="vllm", drafting="probabilistic")
    assert "SP013" in found
    # a greedy override of an engine that samples its drafts names the override
    _, found, _ = _check(t, d, SamplingFlags(temperature=1.0, draft_temperature=1.5), engine="transformers", drafting="greedy")
    assert any("transformers drafts the drafter's top token (--draft-sampling greedy)" in e for e in found["SP030"].evidence)


def test_drafting_not_given_is_the_engines_own(tiny_pair) -> None:
    flags = SamplingFlags(temperature=1.0, draft_temperature=1.5)
    m, found, rep = _check(tiny_pair["target"], tiny_pair["twin"], flags)  # vLLM, its default greedy drafting
    assert "SP012" not in found and "SP030" in found and m["draft_temperature_applies"] == 0
    assert (rep.facts["engine"], rep.facts["drafting"]) == ("vllm", "greedy")
    m, found, rep = _check(tiny_pair["target"], tiny_pair["twin"], flags, engine="transformers")
    assert "SP012" in found and rep.facts["drafting"] == "probabilistic"


def test_vllm_samples_a_probabilistic_draft_at_the_temperature_only(tiny_pair) -> None:
    """vLLM draws a probabilistic draft from the drafter's softmax at the request's
    temperature, without its top-k, top-p or min-p (`compute_probs_and_sample_next_token`):
    q stays untruncated while the target's p is truncated. Greedy drafting, and engines
    that sample the drafter with every setting, keep the target's settings on q."""
    info = load_info(str(tiny_pair["target"]))
    flags = SamplingFlags(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    pair = effective_sampling(flags, info.generation_config, None, engine="vllm", drafting="probabilistic")
    assert (pair.target.top_k, pair.target.top_p, pair.target.min_p) == (20, 0.9, 0.05)
    assert (pair.draft.temperature, pair.draft.top_k, pair.draft.top_p, pair.draft.min_p) == (0.7, 0, 1.0, 0.0)
    assert pair.sources["draft.top_p"].startswith("off (vLLM samples drafts")
    for engine, drafting in (("vllm", "greedy"), ("transformers", "probabilistic")):
        other = effective_sampling(flags, info.generation_config, None, engine=engine, drafting=drafting)
        assert (other.draft.top_k, other.draft.top_p, other.draft.min_p) == (20, 0.9, 0.05), engine
    told = effective_sampling(SamplingFlags(temperature=0.7, top_p=0.9, draft_top_p=0.8), info.generation_config, None, engine="vllm", drafting="probabilistic")
    assert told.draft.top_p == 0.8 and told.sources["draft.top_p"] == "flag"  # a flag still wins


def test_unknown_engine_or_drafting_is_a_config_error(tiny_pair) -> None:
    info = load_info(str(tiny_pair["target"]))
    with pytest.raises(ConfigError, match="engine 'tgi'"):
        effective_sampling(SamplingFlags(), info.generation_config, None, engine="tgi")
    with pytest.raises(ConfigError, match="draft sampling 'top-k'"):
        effective_sampling(SamplingFlags(), info.generation_config, None, drafting="top-k")


def test_diagnose_passes_the_engine_and_its_drafting(tiny_pair, tmp_path) -> None:
    """load_pair: the config's engine and resolved drafting reach the alignment check."""
    base = dict(target=str(tiny_pair["target"]), drafter=str(tiny_pair["twin"]), sampling=SamplingFlags(temperature=1.0, draft_temperature=1.5))
    pair = load_pair(DiagnoseConfig(**base, engine="llama.cpp"), Progress())
    assert (pair.sampling.engine, pair.sampling.drafting) == ("llama.cpp", "greedy")
    found = _findings(pair.alignment.metrics, pair.alignment.evidence)
    assert "SP030" in found and "SP012" not in found
    pair = load_pair(DiagnoseConfig(**base, draft_sampling="probabilistic"), Progress())
    assert "SP012" in _findings(pair.alignment.metrics, pair.alignment.evidence)


# ----------------------------------------------------------------------------- the drafter's window
def test_serving_context_past_the_drafters_window(tiny_pair) -> None:
    t, d = tiny_pair["target"], tiny_pair["twin"]  # both 512 positions
    m, found, rep = _check(t, d)
    assert m["context_length_deficit_tokens"] == 0 and m["context_length_serving_tokens"] is None and "SP011" not in found
    m, found, rep = _check(t, d, serving_context=2048)
    assert m["context_length_deficit_tokens"] == 1536 and found["SP011"].severity == "warning"
    assert "the engine serves up to 2048 tokens (the serving config's max_model_len); the drafter's max_position_embeddings is 512" in found["SP011"].evidence
    assert "1536 tokens shorter" in found["SP011"].message
    # a serving context within the drafter's window: nothing to say
    m, found, _ = _check(t, d, serving_context=256)
    assert m["context_length_deficit_tokens"] == 0 and "SP011" not in found


def _layer_config(head: Path, **keys: Any) -> Path:
    cfg = json.loads((head / "config.json").read_text())
    cfg["transformer_layer_config"].update(keys)
    for k, v in list(cfg["transformer_layer_config"].items()):
        if v is None:
            del cfg["transformer_layer_config"][k]
    (head / "config.json").write_text(json.dumps(cfg))
    return head


def test_head_window_below_the_targets(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]
    head = _layer_config(hh.eagle3_speculators(tmp_path / "short", t), max_position_embeddings=128)
    m, found, _ = _check(t, head)
    assert m["context_length_deficit_tokens"] == 384
    assert found["SP031"].severity == "warning" and "SP011" not in found  # the head's own rule, not the drafter's
    assert "max_position_embeddings (128 tokens) is 384 tokens below" in found["SP031"].message
    m, found, _ = _check(t, hh.eagle3_speculators(tmp_path / "full", t))
    assert m["context_length_deficit_tokens"] == 0 and "SP031" not in found


# ----------------------------------------------------------------------------- rope
def test_rope_settings_read_both_spellings() -> None:
    assert rope_settings({"rope_theta": 500000.0, "rope_scaling": None}) == (500000.0, None)
    assert rope_settings({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}) == (500000.0, None)
    assert rope_settings({}) == (10000.0, None)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old = rope_settings({"rope_theta": 500000.0, "rope_scaling": {**llama3, "type": "llama3"} | {"rope_type": "llama3"}})
    new = rope_settings({"rope_parameters": {"rope_theta": 500000.0, **llama3}})
    assert old == new and new[1] is not None and new[1]["factor"] == 8.0


def test_head_rope_against_the_targets(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]  # rope_theta 10000, no scaling
    m, found, _ = _check(t, hh.eagle3_speculators(tmp_path / "same", t))
    assert m["head_rope_theta_rel_diff"] == 0.0 and m["head_rope_scaling_mismatch"] == 0 and "SP032" not in found
    head = _layer_config(hh.eagle3_speculators(tmp_path / "theta", t), rope_theta=500000.0)
    m, found, _ = _check(t, head)
    f = found["SP032"]
    assert f.severity == "warning" and m["head_rope_theta_rel_diff"] == pytest.approx(49.0)
    assert "theta 500000 vs 10000" in f.message and "rope_theta: head 500000, target 10000" in f.evidence
    scaled = _layer_config(hh.eagle3_speculators(tmp_path / "scaled", t), rope_scaling={"rope_type": "linear", "factor": 4.0})
    m, found, _ = _check(t, scaled)
    assert m["head_rope_scaling_mismatch"] == 1 and "SP032" in found
    assert any(e.startswith("rope scaling: head {'rope_type': 'linear', 'factor': 4.0}, target none") for e in found["SP032"].evidence)


def test_mtp_layers_run_with_the_targets_rope(tiny_pair, tmp_path) -> None:
    target = hh.target_with_mtp(tmp_path / "t-mtp", tiny_pair["target"], "deepseek")
    tinfo = load_info(str(target))
    dinfo = drafter_info("mtp", tinfo)
    rep = compare(tinfo, dinfo, effective_sampling(SamplingFlags(), tinfo.generation_config, None))
    assert rep.metrics["head_rope_theta_rel_diff"] == 0.0 and rep.metrics["head_rope_scaling_mismatch"] == 0
    assert "SP032" not in _findings(rep.metrics, rep.evidence, "mtp")


# ----------------------------------------------------------------------------- the weights' scale (diagnose only)
def _rescaled(tiny_pair: dict[str, Path], dest: Path, *, head: float = 1.0, embed: float = 1.0) -> Path:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(tiny_pair["target"]))
    with torch.no_grad():
        m.lm_head.weight.mul_(head)
        m.model.embed_tokens.weight.mul_(embed)
    return save(m, _tokenizer(base_vocab()), dest)


def _pair_findings(tiny_pair: dict[str, Path], drafter: str, **kw: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = DiagnoseConfig(target=str(tiny_pair["target"]), drafter=drafter, sampling=SamplingFlags(temperature=1.0), **kw)
    pair = load_pair(cfg, Progress())
    return pair.alignment.metrics, _findings(pair.alignment.metrics, pair.alignment.evidence, pair.drafter.kind)


def test_scale_ratios_are_one_for_shared_weights(tiny_pair) -> None:
    for drafter in (str(tiny_pair["twin"]), "self:layers=1", "self"):
        m, found = _pair_findings(tiny_pair, drafter, draft_sampling="probabilistic")
        assert m["embedding_scale_ratio"] == pytest.approx(1.0, abs=1e-6) and m["logit_scale_ratio"] == pytest.approx(1.0, abs=1e-6)
        assert "SP033" not in found and "SP034" not in found


def test_a_rescaled_twin_is_caught_and_a_mild_one_is_not(tiny_pair, tmp_path) -> None:
    head4 = _rescaled(tiny_pair, tmp_path / "head4", head=4.0)
    m, found = _pair_findings(tiny_pair, str(head4), draft_sampling="probabilistic")
    assert m["logit_scale_ratio"] == pytest.approx(4.0, rel=1e-3) and m["embedding_scale_ratio"] == pytest.approx(1.0)
    assert found["SP033"].severity == "warning" and "4" in found["SP033"].message
    # greedy drafting proposes argmax q, which no logit scale moves: not a finding there
    m, found = _pair_findings(tiny_pair, str(head4), draft_sampling="greedy")
    assert m["logit_scale_ratio"] == pytest.approx(4.0, rel=1e-3) and "SP033" not in found
    emb = _rescaled(tiny_pair, tmp_path / "emb025", embed=0.25)
    m, found = _pair_findings(tiny_pair, str(emb))
    assert m["embedding_scale_ratio"] == pytest.approx(0.25, rel=1e-3) and found["SP034"].severity == "warning"
    mild = _rescaled(tiny_pair, tmp_path / "mild", head=1.5, embed=1.5)
    m, found = _pair_findings(tiny_pair, str(mild), draft_sampling="probabilistic")
    assert m["logit_scale_ratio"] == pytest.approx(1.5, rel=1e-3) and "SP033" not in found and "SP034" not in found


def test_check_measures_no_scale(tiny_pair) -> None:
    m, found, _ = _check(tiny_pair["target"], tiny_pair["twin"])
    assert "embedding_scale_ratio" not in m and "logit_scale_ratio" not in m


def test_an_eagle1_head_is_measured_on_the_embedding_it_reads(tiny_pair, tmp_path) -> None:
    head = hh.eagle1(tmp_path / "e1", tiny_pair["target"])  # no embed_tokens: the target's
    m, found = _pair_findings(tiny_pair, str(head))
    assert m["embedding_scale_ratio"] == pytest.approx(1.0) and m["logit_scale_ratio"] is None


# ----------------------------------------------------------------------------- vocabularies as the engines pair them
def _drafter_with(dest: Path, vocab: dict[str, int], *, rows: int | None = None, bos: bool = False, kind: str = "word") -> Path:
    """A tiny drafter with its own tokenizer (optionally adding BOS, or WordPiece) and LM
    head rows."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = _tokenizer(vocab)
    if kind == "wordpiece":
        tk = Tokenizer(models.WordPiece(vocab=vocab, unk_token="<unk>"))
        tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if bos:
        tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return save(_model(0, rows or len(vocab)), tok, dest)


def test_vllm_refuses_another_vocab_size_and_llamacpp_tolerates_128(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]
    padded = _drafter_with(tmp_path / "pad64", base_vocab(), rows=len(base_vocab()) + 64)
    m, found, rep = _check(t, padded, engine="vllm")
    assert m["engine_vocab_incompatible"] == 1 and found["SP035"].severity == "error"
    assert "SP002" in found  # the scores are fine: padding only
    assert any("'Target and draft model should have the same vocabulary size'" in e for e in found["SP035"].evidence)
    assert "vocab sizes 284 and 348, 64 tokens apart" not in found["SP035"].message  # counts, not tokens
    assert "vocab sizes 284 and 348, 64 apart" in found["SP035"].message
    m, found, _ = _check(t, padded, engine="llama.cpp")
    assert m["engine_vocab_incompatible"] == 0 and "SP035" not in found
    wide = _drafter_with(tmp_path / "pad200", base_vocab(), rows=len(base_vocab()) + LLAMACPP_VOCAB_MAX_SIZE_DIFFERENCE + 1)
    m, found, _ = _check(t, wide, engine="llama.cpp")
    assert m["engine_vocab_incompatible"] == 1
    assert any("differ by 129 > 128 (SPEC_VOCAB_MAX_SIZE_DIFFERENCE)" in e for e in found["SP035"].evidence)
    # an engine whose vocabulary check is not modelled says nothing
    m, found, _ = _check(t, padded, engine="sglang")
    assert m["engine_vocab_incompatible"] is None and "SP035" not in found


def test_llamacpp_compatibility_checks_one_by_one(tiny_pair, tmp_path) -> None:
    tinfo = load_info(str(tiny_pair["target"]))
    tt, n = tinfo.tokenizer, len(base_vocab())

    def problems(folder: Path) -> list[str]:
        d = load_info(str(folder))
        vd = int(d.config.vocab_size)
        from specprobe.probe.alignment import _tokenizer_json

        return llamacpp_vocab_problems(tt, d.tokenizer, n, vd, _tokenizer_json(tt), _tokenizer_json(d.tokenizer))

    assert problems(tiny_pair["twin"]) == []
    shuffled = problems(tiny_pair["shuffled"])  # the specials keep their ids; the words do not
    assert len(shuffled) == 1 and shuffled[0].startswith("token ") and "the text of every id from 5 must agree" in shuffled[0]
    # ids 0..4 are not compared: a drafter that renames token 4 only is compatible
    renamed = {("zz" if i == 4 else t): i for t, i in base_vocab().items()}
    assert problems(_drafter_with(tmp_path / "r4", renamed)) == []
    bos = problems(_drafter_with(tmp_path / "bos", base_vocab(), bos=True))
    assert bos == ["BOS: target adds False (id 1), drafter adds True (id 1)"]
    wp = problems(_drafter_with(tmp_path / "wp", base_vocab(), kind="wordpiece"))
    assert wp and wp[0] == "vocab type: target WordLevel, drafter WPM"


def test_heterogeneous_vocab_shares_the_common_tokens(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]
    half = len(WORDS) // 2
    other = {tok: i for i, tok in enumerate(SPECIALS + WORDS[:half] + [f"x{i}" for i in range(len(WORDS) - half)])}
    d = _drafter_with(tmp_path / "half", other)
    m, found, _ = _check(t, d, engine="vllm")
    expect = (len(SPECIALS) + half) / len(base_vocab())
    assert m["vocab_shared_frac"] == pytest.approx(expect)
    f = found["SP036"]
    assert f.severity == "info" and f"{100 * expect:.1f}%" in f.message and "SP003" in found
    # the same tokens under other ids are all shared (SP003 stops scoring; vLLM maps them)
    m, found, _ = _check(t, tiny_pair["shuffled"], engine="vllm")
    assert m["vocab_shared_frac"] == pytest.approx(1.0) and "SP036" not in found
    # a self-draft and an identical twin share everything
    m, _, _ = _check(t, "self:layers=1", engine="vllm")
    assert (m["engine_vocab_incompatible"], m["vocab_shared_frac"]) == (0, 1.0)


def test_shared_fraction_makes_space_marks_alike() -> None:
    """Ġ (byte-level BPE) and ▁ (SentencePiece) both mark a word-initial space."""

    class Tok:
        def __init__(self, mark: str, words: list[str]) -> None:
            self.vocab = {("<s>" if i == 0 else mark + w): i for i, w in enumerate(["", *words])}
            self.mark = mark

        def get_vocab(self) -> dict[str, int]:
            return self.vocab

        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return [1]

        def convert_ids_to_tokens(self, i: int) -> str:
            return self.mark + "a"

    a, b = Tok("\u0120", ["a", "cat", "dog", "sun"]), Tok("\u2581", ["a", "cat", "moon", "sun"])
    assert shared_vocab_frac(a, b, 5) == pytest.approx(4 / 5)  # <s>, a, cat, sun


# ----------------------------------------------------------------------------- SmolLM2's real weights
@pytest.mark.slow
@requires_smollm2
def test_scale_on_smollm2_real_weights() -> None:
    """Self-drafts share the target's tensors: exactly 1. A copy whose tied embedding and
    LM head are stored at twice the scale is caught; the statistic reads 2 on real weights."""
    import copy

    from specprobe.models.drafters import IndependentDrafter
    from specprobe.models.loader import LoadedModel, load_model
    from specprobe.probe.alignment import scale_checks

    target = load_model("smollm2", "cpu", "float32")
    from specprobe.models.drafters import build_drafter

    m, _ = scale_checks(target, build_drafter("self:layers=24", target, "cpu", "float32"))
    assert m == {"embedding_scale_ratio": 1.0, "logit_scale_ratio": 1.0}
    twin = copy.deepcopy(target.model)
    with torch.no_grad():
        twin.get_input_embeddings().weight.mul_(2.0)  # tied: the LM head doubles with it
    drafter = IndependentDrafter("twin", target, LoadedModel(target.info, twin, target.device, target.dtype))
    m, ev = scale_checks(target, drafter)
    assert m["embedding_scale_ratio"] == pytest.approx(2.0, rel=1e-4) and m["logit_scale_ratio"] == pytest.approx(2.0, rel=1e-4)
    same = IndependentDrafter("copy", target, LoadedModel(target.info, copy.deepcopy(target.model), target.device, target.dtype))
    m, _ = scale_checks(target, same)
    assert m["embedding_scale_ratio"] == pytest.approx(1.0, abs=1e-6) and m["logit_scale_ratio"] == pytest.approx(1.0, abs=1e-6)


def test_vllm_refuses_a_draft_model_that_declares_mrope() -> None:
    """Where a config declares M-RoPE as vLLM's uses_mrope reads it (SP038's metric); the
    real server's refusal is tests/test_vllm_check.py's."""
    from types import SimpleNamespace

    from specprobe.engines.vllm import ENGINE, mrope_sections

    plain = SimpleNamespace(rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    assert mrope_sections(plain) == []
    vl = SimpleNamespace(text_config=SimpleNamespace(rope_scaling={"rope_type": "default", "mrope_section": [16, 24, 24]}))
    assert mrope_sections(vl) == ["text_config.rope_scaling.mrope_section = [16, 24, 24]"]
    per_layer = SimpleNamespace(rope_parameters={"full_attention": {"rope_type": "default", "xdrope_section": [8, 8]}})
    assert mrope_sections(per_layer) == ["rope_parameters.xdrope_section = [8, 8]"]
    m: dict = {}
    ev: dict = {}
    ENGINE.draft_model_findings(vl, m, ev)
    assert m["engine_draft_unsupported"] == 1 and "does not support M-RoPE yet" in ev["engine_draft_unsupported"][0]
    ENGINE.draft_model_findings(plain, m, ev)
    assert m["engine_draft_unsupported"] == 0
