"""Advice stable under noise: the same head weights saved in two layouts (EAGLE-3 in the
speculators layout vLLM loads and in the EAGLE / SpecForge export) get the same verdict,
best K and export, though their verify costs are timed with different noise. Acceptance
is ~0 here (a random head), so τ is flat in K and only the costs pick K: the raw timings
below make v_2 < v_1 for one run and v_2 > v_1 for the other, which used to give best
K = 2 and 1. The timings are injected through the cost step (no wall clock)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specprobe.estimates.costs import Samples, batch_timings
from specprobe.export.serving import export_config
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from tests.helpers import heads as hh
from tests.helpers.tiny import prompts_file

K_MAX, BATCH = 3, 4
# per repeat, seconds: target step, drafter step, verify over K + 1 tokens (K = 1..3)
TARGET = [1.0e-3] * 5
DRAFT = [0.05e-3, 0.06e-3, 0.05e-3, 0.04e-3, 0.05e-3]
NOISE = {  # the same pass, two machines' loads: v_2 timed below v_1 in "a", above it in "b"
    "a": ([1.30, 1.10, 1.25, 1.08, 1.20], [1.02, 1.15, 1.00, 1.18, 1.05], [1.40, 1.35, 1.45, 1.30, 1.38]),
    "b": ([1.05, 1.12, 1.02, 1.10, 1.06], [1.15, 1.09, 1.20, 1.12, 1.10], [1.25, 1.30, 1.22, 1.28, 1.35]),
}


def _timed(noise: str) -> Any:
    def cost_block(target: Any, drafter: Any, given: float | None = None, **kw: Any) -> dict[str, Any]:
        from specprobe.probe.timing import cost_block as real

        raw = real(target, drafter, given)  # the untimed block: no batch sizes
        if not kw:
            return raw
        times = {"target": TARGET, "draft": DRAFT, **{f"verify{k + 1}": [v * 1e-3 for v in vs] for k, vs in enumerate(NOISE[noise])}}
        raw.update({"measured": True, "batches": [{**batch_timings(Samples(times, 0.1, False, 1), K_MAX, BATCH), "context_tokens": raw["context_tokens"]}]})
        return raw

    return cost_block


@pytest.fixture(scope="module")
def two_layouts(tiny_pair, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("layouts")
    t = tiny_pair["target"]
    # the same tensors (same seed); the aux ids name the same layers in each convention
    # (speculators: vLLM's hidden_states[id]; the export: SGLang's hidden_states[id + 1])
    return t, {
        "speculators": str(hh.eagle3_speculators(root / "e3s", t, vd=150, aux=(1, 1, 2))),
        "export": str(hh.eagle3_export(root / "e3x", t, vd=150, aux=(0, 0, 1))),
    }


def test_two_layouts_of_the_same_weights_get_the_same_advice(two_layouts, tmp_path, monkeypatch) -> None:
    import specprobe.probe.diagnose as diagnose
    from specprobe.probe.diagnose import run_diagnose

    target, specs = two_layouts
    prompts = prompts_file(tmp_path / "p.jsonl", n=4, words=8)
    out = {}
    for (name, spec), noise in zip(specs.items(), ("a", "b"), strict=True):
        monkeypatch.setattr(diagnose, "cost_block", _timed(noise))
        cfg = DiagnoseConfig(target=str(target), drafter=spec, prompts=str(prompts), max_new_tokens=8, batch_size=BATCH, k_max=K_MAX, sampling=SamplingFlags(temperature=1.0))
        r = run_diagnose(cfg)
        assert r.scored and r.cost is not None and r.cost.measured, name
        src = tmp_path / f"{name}.json"
        src.write_text(r.model_dump_json())
        ex = export_config(r, src, "vllm")
        out[name] = (r, ex)
    (ra, ea), (rb, eb) = out["speculators"], out["export"]
    # the noise is real: as timed, v_2 < v_1 in one run and v_2 > v_1 in the other
    raw_a = [row.verify_factor_raw for row in ra.cost.batches[0].rows]  # type: ignore[union-attr]
    raw_b = [row.verify_factor_raw for row in rb.cost.batches[0].rows]  # type: ignore[union-attr]
    assert raw_a[1] < raw_a[0] and raw_b[1] > raw_b[0]
    for r in (ra, rb):  # priced: non-decreasing in K
        v = [row.verify_factor for row in r.k_table]
        assert v == sorted(v)
    # the same weights, read the same way: the same acceptance
    assert ra.metrics["accept_prob_mean"] == pytest.approx(rb.metrics["accept_prob_mean"], rel=1e-4)
    assert ra.verdict == rb.verdict
    assert ra.best_k == rb.best_k == 1
    assert sorted(f.rule_id for f in ra.findings) == sorted(f.rule_id for f in rb.findings)

    def text(ex: Any, spec: str, name: str) -> str:
        return ex.text.replace(spec, "<drafter>")

    assert ea.plan.k == eb.plan.k == 1
    assert text(ea, specs["speculators"], "speculators") == text(eb, specs["export"], "export")
