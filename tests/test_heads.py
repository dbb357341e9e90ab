"""Head drafters from their real on-disk layouts: every layout recognised, checked and
scored; broken twins stopped by their rules; oracle heads accepted at every depth; the
d2t map and the coverage ceiling in closed form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ModelLoadError
from specprobe.probe.alignment import compare, effective_sampling
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers import heads as hh
from tests.helpers.tiny import prompts_file

runner = CliRunner()


@pytest.fixture(scope="module")
def layouts(tiny_pair, tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """name -> (target folder, drafter spec) for one good checkpoint of every layout."""
    return hh.every_layout(tmp_path_factory.mktemp("heads"), tiny_pair["target"])


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    return prompts_file(tmp_path_factory.mktemp("hp") / "p.jsonl", n=6, words=8)


def _cfg(target: Path, drafter: str, prompts: Path, **kw: Any) -> DiagnoseConfig:
    base: dict[str, Any] = dict(target=str(target), drafter=drafter, prompts=str(prompts), max_new_tokens=10, batch_size=6, k_max=3, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0))
    return DiagnoseConfig(**{**base, **kw})


def _check_metrics(target: Path, drafter: str, serving_k: int | None = None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    from specprobe.models.drafters import drafter_info
    from specprobe.models.loader import load_info

    tinfo = load_info(str(target))
    dinfo = drafter_info(drafter, tinfo)
    if serving_k is not None:
        dinfo.extra["serving_k"] = serving_k
    rep = compare(tinfo, dinfo, effective_sampling(SamplingFlags(), tinfo.generation_config, None))
    return rep.metrics, rep.evidence


def _rewrite(folder: Path, drop: tuple[str, ...] = (), add: dict[str, torch.Tensor] | None = None, config: dict[str, Any] | None = None, file: str = "model.safetensors") -> Path:
    sd = {k: v for k, v in load_file(str(folder / file)).items() if k not in drop}
    sd.update(add or {})
    save_file(sd, str(folder / file), metadata={"format": "pt"})
    if config is not None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(config)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


# ----------------------------------------------------------------------------- every layout
EXPECTED = {
    "eagle3-speculators": ("eagle3", "EAGLE-3 (speculators)"),
    "eagle3-export": ("eagle3", "EAGLE-3 (EAGLE/SpecForge export)"),
    "eagle1": ("eagle", "EAGLE-1/2"),
    "medusa-fd-v2": ("medusa", "Medusa (FasterDecoding v2)"),
    "medusa-fd-v1": ("medusa", "Medusa (FasterDecoding v1)"),
    "medusa-vllm": ("medusa", "Medusa (vLLM)"),
    "mtp-deepseek": ("mtp", "MTP (DeepSeek-V3 / GLM-4.5 layout)"),
    "mtp-qwen3_next": ("mtp", "MTP (Qwen3-Next layout)"),
    "mtp-mimo": ("mtp", "MTP (MiMo layout)"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_layout_is_recognised_checked_and_scored(layouts, prompts, name) -> None:
    from specprobe.models.drafters import drafter_kind_of
    from specprobe.models.heads import detect
    from specprobe.models.loader import load_info
    from specprobe.probe.diagnose import run_diagnose

    target, spec = layouts[name]
    kind, label = EXPECTED[name]
    layout = detect(spec, load_info(str(target)))
    assert layout is not None and (layout.kind, layout.layout) == (kind, label)
    assert drafter_kind_of(spec) == kind
    if spec != "mtp":  # the explicit prefix names the same head
        assert detect(f"{kind}:{spec}").layout == label  # type: ignore[union-attr]
    res = runner.invoke(app, ["check", str(target), spec])
    assert res.exit_code == 0, res.output  # warnings at most (SP023: engines read other layers)
    r = run_diagnose(_cfg(target, spec, prompts))
    assert r.scored and r.drafter.kind == kind
    cum = r.depth.cumulative  # type: ignore[union-attr]
    assert len(cum) == 3 and all(0.0 <= c <= 1.0 for c in cum)
    assert r.depth.head_depths == [2, 3]  # type: ignore[union-attr]  # depths 2, 3 predicted by the head, not chained i.i.d.
    assert 0.0 <= r.metrics["accept_prob_mean"] < 0.9  # random heads: a real, poor drafter


def test_a_prefix_that_does_not_fit_the_files_is_a_one_line_error(layouts) -> None:
    from specprobe.models.heads import detect

    with pytest.raises(ModelLoadError, match="does not hold Medusa heads"):
        detect("medusa:" + layouts["eagle1"][1])
    res = runner.invoke(app, ["check", str(layouts["eagle1"][0]), "mtp"])
    assert res.exit_code == 2 and "has no MTP layers" in " ".join(res.output.split())


# ----------------------------------------------------------------------------- broken twins
def test_broken_eagle3_twins_are_stopped_by_their_rules(tiny_pair, tmp_path, prompts) -> None:
    t = tiny_pair["target"]
    from specprobe.probe.diagnose import run_diagnose

    # d2t shifted by one entry: every draft id now lands on its neighbour's target id
    shifted = hh.eagle3_speculators(tmp_path / "shift", t, vd=150)
    d2t = load_file(str(shifted / "model.safetensors"))["d2t"]
    _rewrite(shifted, add={"d2t": torch.roll(d2t, 1)})
    m, ev = _check_metrics(t, str(shifted))
    assert m["d2t_invalid_frac"] > 0.3 and "not marked in t2d" in " ".join(ev["d2t_invalid_frac"])
    res = runner.invoke(app, ["check", str(t), str(shifted)])
    assert res.exit_code == 1 and "SP016" in res.output
    r = run_diagnose(_cfg(t, str(shifted), prompts))
    assert not r.scored and "SP016" in (r.stopped or "")

    # d2t missing while the draft vocabulary is smaller: vLLM reads draft ids as target ids
    missing = _rewrite(hh.eagle3_speculators(tmp_path / "nod2t", t, vd=150), drop=("d2t", "t2d"))
    m, _ = _check_metrics(t, str(missing))
    assert m["d2t_missing"] == 1
    assert "SP020" in runner.invoke(app, ["check", str(t), str(missing)]).output
    # …and scored anyway (--force), it is the 0%-acceptance case's mechanism: ids 0..149 only
    forced = run_diagnose(_cfg(t, str(missing), prompts, force=True))
    assert forced.scored and forced.metrics["accept_prob_mean"] < 0.5

    # a head trained for a target with another hidden size (fc reads 3 × 96)
    wide = _rewrite(hh.eagle3_speculators(tmp_path / "wide", t), add={"fc.weight": torch.zeros(hh.H, 3 * 96)})
    m, ev = _check_metrics(t, str(wide))
    assert m["hidden_size_mismatch"] == 1 and "3 target states × hidden 64 = 192" in ev["hidden_size_mismatch"][0]
    assert "SP015" in runner.invoke(app, ["check", str(t), str(wide)]).output

    # an aux layer id beyond the target's 2 layers
    far = hh.eagle3_speculators(tmp_path / "far", t, aux=(0, 1, 7))
    m, ev = _check_metrics(t, str(far))
    assert m["aux_layer_out_of_range"] == 1 and "hidden_states[0, 1, 7]" in ev["aux_layer_out_of_range"][0]
    assert "SP022" in runner.invoke(app, ["check", str(t), str(far)]).output


def test_speculators_config_checks(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]
    ok, ev = _check_metrics(t, str(hh.eagle3_speculators(tmp_path / "ok", t)))
    assert (ok["norm_before_residual_unset"], ok["verifier_mismatch"], ok["eagle3_layer_type_unsupported"], ok["t2d_inconsistent"]) == (0, 0, 0, 0)
    # explicit ids: vLLM reads hidden_states[id], SGLang hidden_states[id + 1]; both are named
    assert ok["aux_layers_engines_differ"] == 1
    assert "vLLM reads hidden_states[0, 1, 2], SGLang hidden_states[1, 2, 3]" in ev["aux_layers_engines_differ"][0]
    default, _ = _check_metrics(t, str(hh.eagle3_speculators(tmp_path / "dflt", t, aux=None)))
    assert default["aux_layers_engines_differ"] == 0
    m, _ = _check_metrics(t, str(hh.eagle3_speculators(tmp_path / "nbr", t, norm_before_residual=None, verifier="meta-llama/Llama-3.1-8B-Instruct", layer_type="mistral")))
    assert (m["norm_before_residual_unset"], m["verifier_mismatch"], m["eagle3_layer_type_unsupported"]) == (1, 1, 1)
    t2d = _rewrite(hh.eagle3_speculators(tmp_path / "t2d", t, vd=150), add={"t2d": torch.ones(284, dtype=torch.bool)})
    m, ev = _check_metrics(t, str(t2d))
    assert m["t2d_inconsistent"] == 1 and m["d2t_invalid_frac"] == 0.0 and "marks 284 target ids" in " ".join(ev["t2d_inconsistent"])
    # no embedding of its own and another width than the target's: cannot share it
    narrow = hh.eagle3_speculators(tmp_path / "narrow", t, hidden=48)
    m, _ = _check_metrics(t, str(narrow))
    assert m["embedding_unshareable"] == 1 and m["hidden_size_mismatch"] == 0
    res = runner.invoke(app, ["check", str(t), str(narrow)])
    assert res.exit_code == 1 and "SP027" in res.output


def test_mtp_and_medusa_twins(tiny_pair, tmp_path, prompts) -> None:
    from specprobe.probe.diagnose import run_diagnose

    t = tiny_pair["target"]
    # two MTP layers declared, one stored (transformers' save_pretrained drops them)
    two = hh.target_with_mtp(tmp_path / "two", t, "deepseek")
    _rewrite(two, config={"num_nextn_predict_layers": 2})
    m, ev = _check_metrics(two, "mtp")
    assert m["head_weights_missing"] == 1 and "MTP layer 1 (model.layers.3.)" in ev["head_weights_missing"][0]
    r = run_diagnose(_cfg(two, "mtp", prompts))
    assert not r.scored and "SP028" in (r.stopped or "")
    # MTP eh_proj for another hidden size
    bad = hh.target_with_mtp(tmp_path / "bad", t, "deepseek")
    _rewrite(bad, add={"model.layers.2.eh_proj.weight": torch.zeros(64, 96)})
    assert _check_metrics(bad, "mtp")[0]["hidden_size_mismatch"] == 1
    # the serving config asks for more tokens than there are heads
    medusa = hh.medusa_fasterdecoding(tmp_path / "m", t, heads=3)
    assert _check_metrics(t, str(medusa), serving_k=5)[0]["spec_tokens_beyond_heads"] == 2
    cfgfile = tmp_path / "spec.json"
    cfgfile.write_text(json.dumps({"method": "medusa", "model": str(medusa), "num_speculative_tokens": 5}))
    res = runner.invoke(app, ["check", str(t), str(medusa), "--serving-config", str(cfgfile)])
    assert "SP029" in res.output
    # Medusa blocks for another hidden size
    wide = hh.medusa_fasterdecoding(tmp_path / "mw", t, hidden=96)
    assert "SP015" in runner.invoke(app, ["check", str(t), str(wide)]).output


def test_truncated_head_file_is_a_one_line_error(tiny_pair, tmp_path) -> None:
    t = tiny_pair["target"]
    head = hh.eagle3_speculators(tmp_path / "cut", t)
    data = (head / "model.safetensors").read_bytes()
    (head / "model.safetensors").write_bytes(data[: len(data) // 3])
    res = runner.invoke(app, ["check", str(t), str(head)])
    text = " ".join(res.output.split())
    assert res.exit_code == 2 and "error:" in text and "corrupt or truncated" in text and "Traceback" not in res.output


# ----------------------------------------------------------------------------- oracles
@pytest.fixture(scope="module")
def bigram(tmp_path_factory) -> Path:
    return hh.bigram_target(tmp_path_factory.mktemp("bigram") / "bigram")


def _oracles(root: Path, bg: Path) -> dict[str, tuple[Path, str]]:
    out = {
        "eagle3-speculators": (bg, str(hh.eagle3_speculators(root / "e3s", bg, oracle=True, verifier="bigram"))),
        "eagle3-norm-before-residual": (bg, str(hh.eagle3_speculators(root / "e3n", bg, oracle=True, verifier="bigram", norm_before_residual=True))),
        "eagle3-export": (bg, str(hh.eagle3_export(root / "e3x", bg, oracle=True))),
        "eagle1": (bg, str(hh.eagle1(root / "e1", bg, oracle=True))),
    }
    for style in ("deepseek", "qwen3_next", "mimo"):
        out[f"mtp-{style}"] = (hh.target_with_mtp(root / f"t-{style}", bg, style, oracle=True), "mtp")
    return out


def test_oracle_heads_are_accepted_at_every_depth(bigram, prompts, tmp_path) -> None:
    """Weights built so that the depth-d distribution is the target's: α = 1 at every
    depth, through the chained teacher-forced depths of every layout (sampling at T=0.8,
    sampled drafts). Drafted greedily, the same heads propose the target's argmax at every
    depth: each accepted with the target's top probability (the bigram target is nearly
    deterministic: close to 1, never above Σ min(p, q) = 1)."""
    from specprobe.probe.diagnose import run_diagnose

    for i, (name, (target, spec)) in enumerate(_oracles(tmp_path, bigram).items()):
        r = run_diagnose(_cfg(target, spec, prompts, k_max=4, sampling=SamplingFlags(temperature=0.8), draft_sampling="probabilistic"))
        assert r.scored, name
        assert r.depth.cumulative == pytest.approx([1.0] * 4, abs=1e-5), name  # type: ignore[union-attr]
        if i == 0:
            g = run_diagnose(_cfg(target, spec, prompts, k_max=4, sampling=SamplingFlags(temperature=0.8)))
            assert g.procedure is not None and g.procedure.drafting == "greedy" and g.metrics["greedy_agree_frac"] == 1.0
            pos = g.positions
            assert pos is not None and len(pos.accept_prob_greedy_draft) == len(pos.position)
            assert g.metrics["accept_prob_mean"] == pytest.approx(1.0, abs=1e-5) and 0.5 < g.metrics["accept_prob_engine_mean"] < 1.0
            cum = g.depth.cumulative  # type: ignore[union-attr]
            assert cum[0] == pytest.approx(g.metrics["accept_prob_engine_mean"]) and cum[3] < cum[2] < cum[1] < cum[0]
    # MiMo concatenates [hidden; embed]: the same oracle weights read in the other order fail
    swapped = hh.target_with_mtp(tmp_path / "swap", bigram, "mimo", oracle=True, swap=True)
    r = run_diagnose(_cfg(swapped, "mtp", prompts))
    assert r.metrics["accept_prob_mean"] < 0.05 and "SP216" in [f.rule_id for f in r.findings]  # check passes: read as untrained


def test_medusa_oracle_and_head_indexing(tiny_pair, tmp_path, prompts) -> None:
    """Medusa heads cannot see the next token: the oracle target is a unigram model (every
    position has the same distribution). Indexing: depth d at position s is head d−1 on
    the target's state at s−1."""
    from specprobe.drafters.base import TargetPass
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.loader import load_model
    from specprobe.probe.diagnose import run_diagnose

    uni = hh.bigram_target(tmp_path / "uni", unigram=True)
    oracle = hh.medusa_fasterdecoding(tmp_path / "mo", uni, heads=4, version=2, oracle=True)
    r = run_diagnose(_cfg(uni, str(oracle), prompts, k_max=4, draft_sampling="probabilistic"))
    assert r.depth.cumulative == pytest.approx([1.0] * 4, abs=1e-5)  # type: ignore[union-attr]

    t = tiny_pair["target"]
    head = hh.medusa_fasterdecoding(tmp_path / "mi", t, heads=3, layers=2, version=1)
    target = load_model(str(t), device="cpu", dtype="float32")
    d = build_drafter(str(head), target, info=drafter_info(str(head), target.info))
    sd = load_file(str(head / "medusa_lm_head.safetensors"))
    ids = torch.tensor([[1, 9, 17, 33, 41, 52, 60]])
    with torch.inference_mode():
        h = target.model.model(input_ids=ids).last_hidden_state
        feats = d.hidden(TargetPass(ids, torch.ones_like(ids), h, {}))
        for depth in (1, 2, 3):
            x = h[0, 3]  # position s = 4 reads the target's state at s − 1 = 3
            for layer in range(2):
                w, b = sd[f"{depth - 1}.{layer}.linear.weight"], sd[f"{depth - 1}.{layer}.linear.bias"]
                x = x + torch.nn.functional.silu(x @ w.T + b)
            want = x @ sd[f"{depth - 1}.2.weight"].T
            assert torch.allclose(d.logits(feats[depth][0, 4:5], depth)[0], want, atol=1e-4)


# ----------------------------------------------------------------------------- vocabulary maps
def test_d2t_maps_draft_logits_exactly_as_vllm() -> None:
    from specprobe.models.heads.vocab import map_logits, target_ids

    ids = target_ids(torch.tensor([0, 1, 1, 3]), 4)  # draft ids 0..3 -> target 0, 2, 3, 6
    assert ids.tolist() == [0, 2, 3, 6]
    out = map_logits(torch.tensor([[1.0, 2.0, 3.0, 4.0]]), ids, 8)
    assert out[0, [0, 2, 3, 6]].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert torch.isneginf(out[0, [1, 4, 5, 7]]).all()
    # no d2t: offsets stay 0 and draft id i is target id i (vLLM's zero-initialised buffer)
    assert target_ids(None, 3).tolist() == [0, 1, 2]
    # an id past the target vocabulary is dropped, not written out of bounds
    out = map_logits(torch.tensor([[1.0, 2.0]]), torch.tensor([1, 9]), 4)
    assert out[0, 1] == 1.0 and torch.isneginf(out[0, [0, 2, 3]]).all()


def test_vocab_ceiling_closed_form_and_oracle(bigram, tmp_path) -> None:
    """The ceiling c_t = Σ_{v in draft vocab} p_t(v) under the target's sampling, read from
    the head's mapped logits (−inf outside its vocabulary); an oracle head cut to Vd ids
    proposes p renormalised on them, so α_t = c_t exactly, at every depth."""
    from specprobe.drafters.base import TargetPass
    from specprobe.metrics.core import position_metrics
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.anatomy import capture_layers
    from specprobe.models.drafters import build_drafter, drafter_info
    from specprobe.models.heads.vocab import map_logits
    from specprobe.models.loader import load_model
    from specprobe.probe.counterfactual import vocab_ceiling

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 12, generator=g) * 2
    ids = torch.tensor([0, 3, 4, 9])
    draft = map_logits(torch.randn(5, 4, generator=g), ids, 12)  # a synthetic 4-id draft vocabulary
    warm = Sampling(temperature=0.7)
    p = torch.softmax(logits / 0.7, dim=-1)
    assert torch.allclose(vocab_ceiling(logits, draft, warm), p[:, ids].sum(-1), atol=1e-6)
    greedy = vocab_ceiling(logits, draft, Sampling(temperature=0.0))
    assert greedy.tolist() == [float(int(a) in ids.tolist()) for a in logits.argmax(-1)]

    head = hh.eagle3_speculators(tmp_path / "cut", bigram, oracle=True, vd=150, verifier="bigram")
    target = load_model(str(bigram), device="cpu", dtype="float32")
    d = build_drafter(str(head), target, info=drafter_info(str(head), target.info))
    assert d.target_vocab_mask is not None and int(d.target_vocab_mask.sum()) == 150
    seq = torch.tensor([[1, 9, 17, 33, 41, 52, 60, 75, 80]])
    lowest = 1.0
    with torch.inference_mode(), capture_layers(target.model, d.target_layers_needed()) as cap:
        h = target.model.model(input_ids=seq).last_hidden_state
        feats = d.hidden(TargetPass(seq, torch.ones_like(seq), h, dict(cap)))
        for depth in (1, 2, 3):
            s = torch.arange(3, 9 - depth + 1)  # positions whose depth-d prediction lies inside
            tl = target.head(h[0, s + depth - 1])  # the target's distribution of token s + d
            q = d.logits(feats[depth][0, s], depth)
            pm = position_metrics(tl, q, warm, warm)
            ceiling = vocab_ceiling(tl, q, warm)
            assert torch.allclose(pm.accept_prob, ceiling, atol=1e-5)
            assert torch.isfinite(pm.kl_target_draft_nats).all()
            lowest = min(lowest, float(ceiling.min()))
    assert lowest < 0.99  # the cut vocabulary does lose mass somewhere


# ----------------------------------------------------------------------------- conventions
def test_chain_mask_and_aux_conventions() -> None:
    from specprobe.models.heads.chain import chain_mask, shifted_tokens, slots_to_positions
    from specprobe.models.heads.layout import aux_layers_by_engine, default_aux_layers

    m = chain_mask(3, 2, torch.float32, "cpu")[0, 0] == 0  # [3, 9]: allowed keys
    assert m[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert m[:, 3:6].tolist() == m[:, 6:9].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert shifted_tokens(torch.tensor([[5, 6, 7, 8]]), 1).tolist() == [[7, 8, 0, 0]]
    assert slots_to_positions(torch.tensor([[1, 2, 3]])).tolist() == [[1, 1, 2]]
    assert default_aux_layers(30) == (2, 15, 27)
    assert aux_layers_by_engine(None, 30) == {"vllm": (2, 15, 27), "sglang": (2, 15, 27)}
    assert aux_layers_by_engine((1, 14, 26), 30) == {"vllm": (1, 14, 26), "sglang": (2, 15, 27)}


# ----------------------------------------------------------------------------- the head scoring path
def _reference_chunk(tl: torch.Tensor, raw: list[torch.Tensor], ids: torch.Tensor | None, pair: Any, top: int = 0) -> Any:
    """The plain path: every depth mapped into the target vocabulary (−inf elsewhere) and
    scored by `position_metrics`, the target's softmax redone per depth."""
    from specprobe.models.heads.vocab import map_logits
    from specprobe.probe.scoring import score_chunk

    v = tl.shape[-1]
    drafts = ((d, r if ids is None else map_logits(r, ids, v)) for d, r in enumerate(raw, 1))
    return score_chunk(tl, drafts, torch.arange(10, 10 + tl.shape[0]), pair, top=top)


def _draft_vocab_kl(tl: torch.Tensor, dl: torch.Tensor, ids: torch.Tensor, t: float, dt: float) -> torch.Tensor:
    """Closed form: KL(p̃ ‖ q), p̃ the tempered target renormalised over the draft ids."""
    p = torch.softmax(tl.double() / t, -1)[:, ids]
    p = p / p.sum(-1, keepdim=True)
    q = torch.softmax(dl.double() / dt, -1)
    return (p * (p.log() - q.log())).sum(-1)


@pytest.mark.parametrize("case", ["warm", "greedy", "truncated", "greedy-target", "greedy-draft", "sglang-top"])
def test_head_scoring_path_equals_the_mapped_reference(case) -> None:
    """`score_head_chunk` (target side once per chunk, every depth in the draft vocabulary)
    gives what mapping every depth into the target vocabulary gives, to 1e-5: α, p(argmax q)
    and max q at every depth; α, p(argmax q), agreement, entropy, max q and the top-k
    columns at depth 1. KL is
    over the draft vocabulary (closed form); with the full vocabulary it is the reference's."""
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.heads.vocab import scoring_vocab
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.chunks import ROW_FIELDS
    from specprobe.probe.scoring import _plain_head, score_chunk, score_head_chunk

    warm = Sampling(temperature=0.7)
    sides = {
        "warm": (warm, warm), "greedy": (Sampling(temperature=0.0), Sampling(temperature=0.0)),
        "truncated": (Sampling(temperature=0.9, top_k=20, top_p=0.9, min_p=0.01), Sampling(temperature=0.9, top_k=20, top_p=0.9, min_p=0.01)),
        "greedy-target": (Sampling(temperature=0.0), warm), "greedy-draft": (warm, Sampling(temperature=0.0)),
        "sglang-top": (Sampling(temperature=1.0, top_k=7, top_p=0.8, semantics="sglang"), Sampling(temperature=1.0, top_k=7, top_p=0.8, semantics="sglang")),
    }[case]
    pair = SamplingPair(*sides)
    g = torch.Generator().manual_seed(7)
    v, vd, n = 300, 120, 24
    ids = torch.randperm(v, generator=g)[:vd].sort().values
    tl = torch.randn(n, v, generator=g) * 3
    tl[:, ids[::3]] += 2.0  # the target's mass mostly, not only, inside the draft vocabulary
    tl[0, ids[5]] = 40.0  # one position whose argmax is in the draft vocabulary for sure
    raw = [torch.randn(n, vd, generator=g) * 3 for _ in range(4)]
    raw[0][0, 5] = 40.0  # …and the drafter agrees with it there
    for with_ids in (True, False):
        vocab = scoring_vocab(ids if with_ids else None, v)
        rw = raw if with_ids else [torch.randn(n, v, generator=g) * 3 for _ in range(4)]
        ref = _reference_chunk(tl, rw, ids if with_ids else None, pair, top=5)
        # CPU: blocks of 16 rows; a full-vocabulary head under untruncated sampling goes
        # through the compiled rows like any drafter instead (scoring._plain_head)
        fast = score_chunk(tl, iter(enumerate(rw, 1)), torch.arange(10, 10 + n), pair, top=5, vocab=vocab)
        assert _plain_head(tl, vocab, pair) == (not with_ids and case not in ("truncated", "sglang-top"))
        whole = score_head_chunk(tl, iter(enumerate(rw, 1)), torch.arange(10, 10 + n), pair, vocab, top=5, block_rows=0)  # as on a GPU
        for f in ROW_FIELDS:
            # KL reaches ~20 nats, where one float32 ulp is 2e-6: its rounding error scales with it (rel), a probability's does not (abs)
            assert whole.values[f] == pytest.approx(fast.values[f], rel=1e-6, abs=1e-6 if with_ids else 1e-5), (case, with_ids, f)
        for f in ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "target_entropy_nats", "draft_confidence"):
            assert fast.values[f] == pytest.approx(ref.values[f], abs=1e-5), (case, with_ids, f)
        for d in (2, 3, 4):
            assert fast.alpha_by_depth[d] == pytest.approx(ref.alpha_by_depth[d], abs=1e-5), (case, d)
            assert fast.greedy_by_depth[d] == pytest.approx(ref.greedy_by_depth[d], abs=1e-5), (case, d)
            assert whole.greedy_by_depth[d] == pytest.approx(fast.greedy_by_depth[d], abs=1e-6), (case, d)
            assert fast.confidence_by_depth[d] == pytest.approx(ref.confidence_by_depth[d], abs=1e-5), (case, d)
        for k in ("target_ids", "draft_ids"):
            assert (fast.extra[k][:, 0] == ref.extra[k][:, 0]).all(), (case, k)
        for k in ("target_probs", "draft_probs", "target_probs_at_draft", "draft_probs_at_target"):
            assert fast.extra[k][:, 0] == pytest.approx(ref.extra[k][:, 0], abs=1e-5), (case, k)
        if with_ids:
            t = 1.0 if pair.target.greedy else pair.target.temperature
            dt = 1.0 if pair.draft.greedy else pair.draft.temperature
            want = _draft_vocab_kl(tl, raw[0], ids, t, dt).float().numpy()
            assert fast.values["kl_target_draft_nats"] == pytest.approx(want, abs=1e-4)
            assert ref.values["kl_target_draft_nats"].mean() > 10 * fast.values["kl_target_draft_nats"].mean()  # the −1e4 clamp's share
            assert fast.values["greedy_agree"][0] == 1.0  # the agreement was forced there
        else:
            assert fast.values["kl_target_draft_nats"] == pytest.approx(ref.values["kl_target_draft_nats"], abs=1e-4)


@pytest.mark.parametrize("target", ["warm", "truncated", "greedy"])
def test_a_heads_greedy_draft_is_accepted_with_p_at_its_mapped_argmax(target: str) -> None:
    """A head drafts its argmax over its own vocabulary (the lowest draft id on ties),
    mapped to the target id d2t gives it; accepted with the target's probability of that
    id, in float64, at every depth and on both head paths (blocks, whole chunk)."""
    from specprobe.metrics.sampling import Sampling, truncate_
    from specprobe.models.heads.vocab import scoring_vocab
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.scoring import score_chunk, score_head_chunk

    ts = {"warm": Sampling(0.7), "truncated": Sampling(0.9, top_k=30, top_p=0.9), "greedy": Sampling(0.0)}[target]
    pair = SamplingPair(ts, Sampling(1.1))
    g = torch.Generator().manual_seed(11)
    v, vd, n = 200, 80, 20
    ids = torch.randperm(v, generator=g)[:vd].sort().values
    tl = torch.randn(n, v, generator=g) * 3
    raw = [torch.randn(n, vd, generator=g) * 3 for _ in range(3)]
    raw[0][1, [3, 4]] = 50.0  # a tie: draft id 3, not 4
    tl[2, ids[7]] = 60.0
    raw[1][2, 7] = 60.0  # depth 2 drafts the greedy target's own argmax there
    p64 = torch.nn.functional.one_hot(tl.argmax(-1), v).double() if ts.greedy else truncate_(torch.softmax(tl.double() / ts.temperature, -1), ts)
    for block_rows in (None, 0):
        got = score_head_chunk(tl, iter(enumerate(raw, 1)), torch.arange(10, 10 + n), pair, scoring_vocab(ids, v), block_rows=block_rows)
        for d, r in enumerate(raw, 1):
            want = p64[torch.arange(n), ids[r.argmax(-1)]].float().numpy()
            have = got.values["accept_prob_greedy_draft"] if d == 1 else got.greedy_by_depth[d]
            assert have == pytest.approx(want, abs=2e-7), (target, block_rows, d)
        assert got.values["accept_prob_greedy_draft"][1] == pytest.approx(float(p64[1, ids[3]]), abs=2e-7)
        if ts.greedy:
            assert got.greedy_by_depth[2][2] == 1.0
    assert score_chunk(tl, iter(enumerate(raw, 1)), torch.arange(10, 10 + n), pair, vocab=scoring_vocab(ids, v)).greedy_by_depth.keys() == {2, 3}


def test_a_broken_id_map_is_scored_as_the_engine_maps_it() -> None:
    """Ids past the target vocabulary are dropped and a target id reached twice keeps its
    last draft id — what the [N, V] mapping leaves — so α equals the mapped reference's."""
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.heads.vocab import scoring_vocab
    from specprobe.probe.alignment import SamplingPair
    from specprobe.probe.scoring import score_chunk

    g = torch.Generator().manual_seed(3)
    ids = torch.tensor([0, 2, 2, 5, 7, 9, 40])  # 2 twice, 40 past a 10-id vocabulary
    vocab = scoring_vocab(ids, 10)
    assert vocab.keep.tolist() == [0, 2, 3, 4, 5] and vocab.ids.tolist() == [0, 2, 5, 7, 9]
    tl, raw = torch.randn(6, 10, generator=g), [torch.randn(6, 7, generator=g) for _ in range(2)]
    pair = SamplingPair(Sampling(temperature=0.8), Sampling(temperature=0.8))
    ref = _reference_chunk(tl, raw, ids, pair)
    fast = score_chunk(tl, iter(enumerate(raw, 1)), torch.arange(10, 16), pair, vocab=vocab)
    assert fast.values["accept_prob"] == pytest.approx(ref.values["accept_prob"], abs=1e-6)
    assert fast.alpha_by_depth[2] == pytest.approx(ref.alpha_by_depth[2], abs=1e-6)
    assert fast.values["accept_prob_greedy_draft"] == pytest.approx(ref.values["accept_prob_greedy_draft"], abs=1e-6)
    assert fast.greedy_by_depth[2] == pytest.approx(ref.greedy_by_depth[2], abs=1e-6)


def test_medusa_depths_beyond_its_heads_are_never_accepted(tmp_path, prompts) -> None:
    """Two Medusa heads draft two tokens at most: depths 3 and 4 count α = 0 (they used to
    chain depth 1's α) in the depth curve, and the K table — every recommendation — stops at
    K = 2: a K the heads cannot draft belongs nowhere in it."""
    from specprobe.probe.diagnose import run_diagnose

    uni = hh.bigram_target(tmp_path / "uni", unigram=True)
    two = hh.medusa_fasterdecoding(tmp_path / "m2", uni, heads=2, version=2, oracle=True)
    # a given verify factor: the speedup comparison below then holds by construction (the
    # same τ at a higher cost), not by how the timed verify passes of 3 and 5 tokens came out
    r = run_diagnose(_cfg(uni, str(two), prompts, k_max=4, verify_factor=1.0, draft_sampling="probabilistic"))
    assert r.depth.cumulative == pytest.approx([1.0, 1.0, 0.0, 0.0], abs=1e-5)  # type: ignore[union-attr]
    rows = {row.k: row for row in r.k_table}
    assert sorted(rows) == [1, 2] and r.best_k in (1, 2)
    assert rows[2].tau_tokens == pytest.approx(3.0, abs=1e-4)  # oracle heads: both drafts accepted
    assert rows[2].tau_renewal_tokens == pytest.approx(3.0, abs=0.05)


def test_heads_that_share_the_targets_positions_have_their_rope_checked(layouts) -> None:
    """EAGLE-1/2, EAGLE-3 and MTP heads rotate with a rope the target's positions feed:
    every such layout here is built with the target's (none differs); Medusa has no
    positions of its own."""
    for name, (target, spec) in layouts.items():
        m, ev = _check_metrics(target, spec)
        if name.startswith("medusa"):
            assert "head_rope_theta_rel_diff" not in m, name
        else:
            assert (m["head_rope_theta_rel_diff"], m["head_rope_scaling_mismatch"]) == (0.0, 0), name
            assert m["rope_theta_head"] == m["rope_theta_target"] == 10000.0, name
