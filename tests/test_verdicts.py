"""Verdicts that point to the right action: a layer-skip self-draft is never told to check
its pairing (it shares the target's weights and tokenizer), and the adaptive-K line never
recommends a threshold that loses to the best fixed K."""

from __future__ import annotations

from typing import Any

from specprobe.judge.rules import load_table
from specprobe.probe.assemble import alignment_errors


def _ids(result: Any) -> set[str]:
    return {f.rule_id for f in result.findings}


def test_a_layer_skip_self_draft_is_never_a_pairing_bug(real_results: Any) -> None:
    skip = real_results.skip  # the tiny target's first layer as a self-draft
    m = skip.metrics
    assert skip.drafter.kind == "layer_skip" and m["alignment_errors"] == 0
    assert not {"SP101", "SP108", "SP201", "SP216"} & _ids(skip)
    far = m["kl_target_draft_nats"] > 4 and m["accept_prob_mean"] < 0.3
    assert ("SP109" in _ids(skip)) == far  # too shallow, said as such, exactly when it is far off


def test_alignment_errors_count_the_error_level_preflight_findings() -> None:
    table = load_table()
    clean = {"token_id_mismatch_frac": 0.0, "vocab_size_mismatch": 0}
    broken = {"token_id_mismatch_frac": 0.95, "vocab_size_mismatch": 0}
    assert alignment_errors(table, clean, "independent") == 0
    assert alignment_errors(table, broken, "independent") >= 1  # SP003: ids mean other tokens


def test_the_adaptive_line_never_recommends_a_threshold_that_loses(real_results: Any) -> None:
    import io

    from rich.console import Console

    from specprobe.report.console import render

    for r in (real_results.twin, real_results.skip):
        a = r.adaptive
        assert a is not None and a.beats_fixed == (a.speedup > r.metrics["speedup_best"])
        buf = io.StringIO()
        render(r, Console(file=buf, width=200, color_system=None))
        text = buf.getvalue()
        if a.beats_fixed:
            assert "adaptive K: stop drafting when drafter confidence <" in text
        else:
            assert f"no confidence threshold beats fixed K = {r.metrics['best_k']}" in text
