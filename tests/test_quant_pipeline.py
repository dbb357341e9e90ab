"""--target-quant / --draft-quant through the pipeline on the tiny models: the weights are
quantized after loading, the result says so (and that it is RTN simulation), a bad pairing
of the flag with a drafter is refused before anything loads, and simulate runs the
quantized target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specprobe.core.errors import ConfigError
from specprobe.probe.diagnose import run_diagnose
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers.tiny import prompts_file


def _cfg(tiny_pair: dict[str, Path], drafter: str, tmp_path: Path, **kw: Any) -> DiagnoseConfig:
    pf = prompts_file(tmp_path / "prompts.jsonl", n=3)
    base: dict[str, Any] = dict(target=str(tiny_pair["target"]), drafter=drafter, prompts=str(pf), max_new_tokens=8, batch_size=3, k_max=3, cost_ratio=0.1, sampling=SamplingFlags(temperature=1.0), device="cpu")
    return DiagnoseConfig(**{**base, **kw})


def test_twin_against_int4_target_is_no_longer_identical(tiny_pair, tmp_path) -> None:
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, target_quant="int4", draft_sampling="probabilistic"))
    q = r.target.quant
    assert q is not None and q.weights == "int4" and q.layers == 2 * 7 and 0 < q.weight_rel_error < 0.3
    assert "not AWQ/GPTQ" in q.note
    assert r.drafter.quant is None  # the twin drafter was loaded as it is
    assert r.config.target_quant == "int4"  # type: ignore[attr-defined]
    assert 0.3 < r.metrics["accept_prob_mean"] < 0.999
    doc = r.model_dump(mode="json")
    assert "quant" in doc["target"] and "quant" not in doc["drafter"]


def test_layer_skip_shares_the_quantized_target(tiny_pair, tmp_path) -> None:
    r = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, target_quant="fp8"))
    assert r.target.quant is not None and r.drafter.quant is not None
    assert r.drafter.quant.shared_with_target and r.drafter.quant.weights == "fp8"


def test_draft_quant_on_a_self_draft_is_refused_before_loading(tiny_pair, tmp_path, monkeypatch) -> None:
    import specprobe.probe.diagnose as diagnose

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("the target's weights were loaded before the refusal")

    monkeypatch.setattr(diagnose, "load_model", boom)
    with pytest.raises(ConfigError, match="--draft-quant int8 needs a drafter model of its own"):
        run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, draft_quant="int8"))


def test_bad_scheme_in_a_config_built_in_code() -> None:
    with pytest.raises(ConfigError, match="--target-quant 'int2' is not one of"):
        DiagnoseConfig(target="t", drafter="d", target_quant="int2")


def test_quantized_target_greedy_speculation_equals_its_own_decoding() -> None:
    # the loop verifies against the quantized weights: its greedy output is the quantized
    # model's plain greedy decoding, token for token, whatever the (full-precision) drafter
    import copy

    import torch

    from specprobe.precision.quant import quantize_model
    from specprobe.simulate import speculate
    from tests.test_simulate import GREEDY, hf_greedy, rand_prompts, tiny

    full = tiny(0, dtype=torch.float32)
    served = copy.deepcopy(full)
    quantize_model(served, "int4")
    prompts = rand_prompts(3)
    reference = hf_greedy(served, prompts, 16)
    assert reference != hf_greedy(full, prompts, 16)  # int4 moved the target's own text
    run = speculate(served, full, prompts, k=3, target_sampling=GREEDY, max_new_tokens=16, batch_size=3)
    assert run.outputs == reference
    assert run.counters.accept_rate < 1


def test_simulate_runs_the_quantized_target(tiny_pair, tmp_path) -> None:
    from specprobe.settings.pipeline import SimulateConfig
    from specprobe.simulate import run_simulate

    d = _cfg(tiny_pair, "self", tmp_path, target_quant="int8", sampling=SamplingFlags(temperature=0.0), keep_positions=False)
    r = run_simulate(SimulateConfig(d, ks=[2], baseline=False))
    assert r.target.quant is not None and r.target.quant.weights == "int8"
    assert r.drafter.quant is not None and r.drafter.quant.shared_with_target
    # the drafter is the served target itself: every greedy draft is accepted
    assert r.measured.k_table[0].accept_rate == pytest.approx(1.0)


def test_references_of_a_quantized_target_are_cached_apart(tiny_pair) -> None:
    from types import SimpleNamespace

    from specprobe.models.loader import load_info
    from specprobe.probe.references import _model_identity

    info = load_info(str(tiny_pair["target"]))
    plain = _model_identity(SimpleNamespace(info=info))
    assert _model_identity(SimpleNamespace(info=info, quant=None)) == plain
    assert _model_identity(SimpleNamespace(info=info, quant=SimpleNamespace(scheme="int4"))) != plain


def test_fp8_kv_cache_on_the_drafter_alone(tiny_pair, tmp_path) -> None:
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, draft_kv_cache_dtype="fp8", draft_sampling="probabilistic"))
    assert r.target.quant is None  # vLLM's speculative_config.kv_cache_dtype: the drafter's cache only
    dq = r.drafter.quant
    assert dq is not None and dq.kv_cache_dtype == "fp8" and dq.weights is None and "e4m3" in dq.note
    assert 0.5 < r.metrics["accept_prob_mean"] < 1  # the twin is no longer the target's exact copy


def test_draft_kv_cache_on_a_self_draft_is_refused(tiny_pair, tmp_path, monkeypatch) -> None:
    import specprobe.probe.diagnose as diagnose

    monkeypatch.setattr(diagnose, "load_model", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    with pytest.raises(ConfigError, match="--draft-kv-cache-dtype fp8 needs a drafter model of its own"):
        run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, draft_kv_cache_dtype="fp8"))


def test_whatif_full_precision_target_beside_the_served_one(tiny_pair, tmp_path) -> None:
    # the twin is the full-precision target's exact copy: against the full target it
    # accepts as the target itself does, against the int4 one less — the difference is
    # what quantization costs; the served target against its full self is below 1
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, target_quant="int4", draft_sampling="probabilistic"))
    m = r.metrics
    assert m["accept_prob_full_target"] == pytest.approx(1.0, abs=1e-4)  # Σ min(p, p) = 1
    assert m["quant_accept_cost"] == pytest.approx(1.0 - m["accept_prob_mean"], abs=1e-4)
    assert 0.3 < m["target_quant_accept"] < 0.999
    # the twin's α against the served target is the served target's α against its full self
    assert m["target_quant_accept"] == pytest.approx(m["accept_prob_mean"], abs=1e-4)
    assert "SP217" in [f.rule_id for f in r.findings] or m["quant_accept_cost"] <= 0.05


def test_no_whatif_without_quantization(tiny_pair, tmp_path, monkeypatch) -> None:
    import specprobe.probe.served as served

    monkeypatch.setattr(served.FullTargetWhatIf, "_forward", lambda *a: (_ for _ in ()).throw(AssertionError("a second target forward")))
    r = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path))
    assert "accept_prob_full_target" not in r.metrics
    doc = r.model_dump(mode="json")
    assert "quant" not in doc["target"] and "quant" not in doc["drafter"] and "target_quant" not in doc["config"]


def test_fp8_moves_the_target_less_than_int4(tiny_pair, tmp_path) -> None:
    moved = {}
    for scheme in ("fp8", "int4"):
        (tmp_path / scheme).mkdir()
        r = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path / scheme, target_quant=scheme))
        moved[scheme] = r.metrics["target_quant_accept"]
    assert moved["int4"] < moved["fp8"] < 1


def test_whatif_of_a_quantized_drafter(tiny_pair, tmp_path) -> None:
    # the twin quantized to int4 against the full target: in full precision it is the
    # target's copy (α 1 under sampled drafts), so the cost is everything it lost
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, draft_quant="int4", draft_sampling="probabilistic"))
    m = r.metrics
    assert r.target.quant is None and r.drafter.quant is not None and r.drafter.quant.weights == "int4"
    assert m["accept_prob_full_drafter"] == pytest.approx(1.0, abs=1e-4)
    assert m["draft_quant_accept_cost"] == pytest.approx(1.0 - m["accept_prob_mean"], abs=1e-4) and m["draft_quant_accept_cost"] > 0.001
    assert "accept_prob_full_target" not in m  # the target was served as loaded


def test_whatif_of_a_self_draft_uses_its_full_precision_layers(tiny_pair, tmp_path) -> None:
    import json

    from tests.helpers.tiny import WORDS

    # dataset references: both runs score the same positions
    lines = [json.dumps({"id": f"p{i}", "prompt": " ".join(WORDS[i * 5 : i * 5 + 6]), "response": " ".join(WORDS[i * 3 + 40 : i * 3 + 48]), "domain": "chat"}) for i in range(3)]
    (tmp_path / "refs.jsonl").write_text("\n".join(lines) + "\n")
    kw: dict[str, Any] = dict(prompts=str(tmp_path / "refs.jsonl"), reference="dataset", draft_sampling="probabilistic")
    plain = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, **kw))
    served = run_diagnose(_cfg(tiny_pair, "self:layers=1", tmp_path, target_quant="int4", **kw))
    # the full-precision system is the unquantized run, position for position
    assert served.metrics["accept_prob_full_target"] == pytest.approx(plain.metrics["accept_prob_mean"], abs=1e-4)


def test_a_compressed_tensors_fp8_target_from_disk(tiny_pair, tmp_path) -> None:
    import shutil

    from transformers import AutoModelForCausalLM

    from tests.test_quant import _write_fp8_checkpoint

    folder = tmp_path / "target-fp8"
    shutil.copytree(tiny_pair["target"], folder)
    _write_fp8_checkpoint(AutoModelForCausalLM.from_pretrained(tiny_pair["target"]), folder)
    cfg = _cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, draft_sampling="probabilistic")
    r = run_diagnose(DiagnoseConfig(**{**cfg.__dict__, "target": str(folder)}))
    q = r.target.quant
    assert q is not None and q.method == "checkpoint" and q.weights == "fp8" and "not a simulation" in q.note
    assert 0.5 < r.metrics["accept_prob_mean"] < 0.9999  # the bf16 twin against the fp8 served weights
    # --target-quant on a checkpoint already quantized: nothing to round, refused in one line
    with pytest.raises(ConfigError, match="is a quantized checkpoint \\(fp8\\), which is already served as stored"):
        run_diagnose(DiagnoseConfig(**{**cfg.__dict__, "target": str(folder), "target_quant": "int4"}))


def test_llama_cpp_kv_cache_through_diagnose(tiny_pair, tmp_path) -> None:
    # llama-server -ctk f16 -ctv f16 and -ctkd bf16 -ctvd bf16 (the tiny models' head size
    # of 16 takes no 32-blocks: llama.cpp refuses q8_0 for them, and so does specprobe)
    r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, kv_cache_dtype="f16", draft_kv_cache_dtype="bf16", draft_sampling="probabilistic"))
    tq, dq = r.target.quant, r.drafter.quant
    assert tq is not None and tq.kv_cache_dtype == "f16" and "llama.cpp" in tq.note
    assert dq is not None and dq.kv_cache_dtype == "bf16"
    assert 0.5 < r.metrics["accept_prob_mean"] < 1  # the twin no longer sees the target's exact logits
    assert "accept_prob_full_target" in r.metrics  # the what-if against the target with its own cache


def test_a_block_type_the_head_size_does_not_take_is_one_line(tiny_pair, tmp_path) -> None:
    from specprobe.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="the K cache type q8_0 has blocks of 32, which do not divide the head size 16"):
        run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path, kv_cache_dtype="q8_0"))


def test_w8a8_schemes_through_diagnose(tiny_pair, tmp_path) -> None:
    """fp8-dynamic and w8a8-int8 quantize the activations too: recorded on the result, and the
    target moves away from its weight-only (W8A16) self; the parameter count is the model's."""
    moved, params = {}, {}
    for scheme in ("int8", "w8a8-int8", "fp8-dynamic"):
        (tmp_path / scheme).mkdir()
        r = run_diagnose(_cfg(tiny_pair, str(tiny_pair["twin"]), tmp_path / scheme, target_quant=scheme, draft_sampling="probabilistic"))
        q = r.target.quant
        assert q is not None and q.weights == scheme
        assert q.activations == (None if scheme == "int8" else ("int8 dynamic per token" if scheme == "w8a8-int8" else "fp8 dynamic per token"))
        moved[scheme], params[scheme] = r.metrics["target_quant_accept"], r.target.params
    assert all(0.3 < v < 1 for v in moved.values()) and moved["w8a8-int8"] != moved["int8"]
    assert len(set(params.values())) == 1 and params["int8"] == r.drafter.params  # the twin: the same architecture, unquantized
