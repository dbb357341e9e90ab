"""diagnose --context-lengths: prompts built to the requested token lengths exactly (±1
chat-template token), a length past the target's context refused with one line (exit 2)
before any forward pass, and the result's table of α, τ and decay by (domain, length)
that SP209 reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.core.errors import ConfigError, InputError
from specprobe.probe import long_context
from specprobe.probe.references import encode_prompt
from specprobe.prompts import builtin_suite
from specprobe.settings.lengths import parse_context_lengths
from tests.conftest import requires_smollm2
from tests.helpers.tiny import prompts_file

runner = CliRunner()


def test_lengths_are_read_as_people_write_them() -> None:
    assert parse_context_lengths("1k,2k,4k,8k") == [1024, 2048, 4096, 8192]
    assert parse_context_lengths("1500, 1k") == [1024, 1500]
    assert parse_context_lengths([4096, "2k"]) == [2048, 4096]
    for bad in ("", "4q", "8"):
        with pytest.raises(ConfigError):
            parse_context_lengths(bad)


def _tokenizer(tiny_pair: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_pair["target"]))


def test_prompts_are_built_to_each_length_exactly(tiny_pair: Any, tmp_path: Path) -> None:
    from specprobe.prompts.readers import load_prompts

    tok = _tokenizer(tiny_pair)
    ps = load_prompts(prompts_file(tmp_path / "p.jsonl", n=6, words=8))
    lengths = [40, 100, 300]
    built, length_of = long_context.build(ps, tok, lengths, limit=512, max_new_tokens=8)
    assert {p.domain for p in built.prompts} == {"code", "math", "chat"}  # one question per domain, at every length
    assert len(built.prompts) == 3 * len(lengths)
    for p in built.prompts:
        n = len(encode_prompt(tok, p))
        assert abs(n - length_of[p.id]) <= long_context.TOLERANCE, (p.id, n)
        assert p.turns[0].startswith(long_context.PREAMBLE)  # documents first, the question last
    # a user's own prompt longer than the length is cut to it
    long = load_prompts(prompts_file(tmp_path / "long.jsonl", n=1, words=200))
    built, length_of = long_context.build(long, tok, [64], limit=512, max_new_tokens=8)
    assert abs(len(encode_prompt(tok, built.prompts[0])) - 64) <= 1 and not built.prompts[0].turns[0].startswith(long_context.PREAMBLE)


@requires_smollm2
def test_prompts_reach_smollm2_lengths_exactly() -> None:
    from specprobe.models.loader import load_info

    info = load_info("smollm2")
    built, length_of = long_context.build(builtin_suite(), info.tokenizer, [1024, 4096, 8000], limit=info.config.max_position_embeddings, max_new_tokens=32)
    for p in built.prompts:
        assert abs(len(encode_prompt(info.tokenizer, p)) - length_of[p.id]) <= 1, p.id
    with pytest.raises(InputError, match="8k does not fit"):
        long_context.check_limit([1024, 8192], info.config.max_position_embeddings, 32, "SmolLM2")


def test_a_length_past_the_targets_context_is_refused_in_one_line(tiny_pair: Any, tmp_path: Path) -> None:
    t = str(tiny_pair["target"])
    res = runner.invoke(app, ["diagnose", t, t, "--context-lengths", "1k", "--max-new-tokens", "8", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "--context-lengths 1k does not fit" in lines[0] and "512" in lines[0]
    assert not (tmp_path / "r.json").exists()  # nothing half-written


def test_diagnose_reports_acceptance_by_context_length(tiny_pair: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    prompts = prompts_file(tmp_path / "p.jsonl", n=6, words=8)
    res = runner.invoke(app, [
        "diagnose", str(tiny_pair["target"]), str(tiny_pair["random"]), "--prompts", str(prompts), "--context-lengths", "64,256",
        "--max-new-tokens", "12", "--cost-ratio", "0.1", "--verify-factor", "1", "--json", str(out), "--fail-on", "never",
    ])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    rows = r["context_lengths"]
    assert {(x["domain"], x["context_tokens"]) for x in rows} == {(d, n) for d in ("code", "math", "chat", "all") for n in (64, 256)}
    for x in rows:
        assert x["prompts"] == (3 if x["domain"] == "all" else 1) and x["positions"] > 0 and x["tau_tokens"] >= 1.0
        if x["context_tokens"] == 64:
            assert x["decay"] == pytest.approx(1.0)
    # SP209's metric is the decay from this table: α(longest) ÷ α(shortest) within each domain, weighted by positions
    num = den = 0.0
    for d in ("code", "math", "chat"):
        a = {x["context_tokens"]: x for x in rows if x["domain"] == d}
        w = min(a[64]["positions"], a[256]["positions"])
        num, den = num + w * a[256]["accept_prob_mean"] / a[64]["accept_prob_mean"], den + w
    assert r["metrics"]["accept_prob_long_context_ratio"] == pytest.approx(num / den)
    assert "by context length" in res.output and r["config"]["context_lengths"] == [64, 256]


def test_two_shards_merged_give_the_one_shot_context_length_table(tiny_pair: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers.same import REL_OTHER_BATCHING, differences, whole_and_merged

    monkeypatch.setenv("SPECPROBE_CACHE_DIR", str(tmp_path / "cache"))
    prompts = prompts_file(tmp_path / "p.jsonl", n=6, words=8)
    args = ["diagnose", str(tiny_pair["target"]), str(tiny_pair["random"]), "--prompts", str(prompts), "--context-lengths", "64,128",
            "--max-new-tokens", "8", "--batch-size", "2", "--cost-ratio", "0.1", "--verify-factor", "1", "--fail-on", "never"]
    one, merged = whole_and_merged(args, tmp_path)
    assert len(one["context_lengths"]) == 8  # 3 domains + all, at 2 lengths
    assert differences(one["context_lengths"], merged["context_lengths"], rel=REL_OTHER_BATCHING) == []
    assert merged["metrics"]["accept_prob_long_context_ratio"] == pytest.approx(one["metrics"]["accept_prob_long_context_ratio"], rel=REL_OTHER_BATCHING)
    # each shard scored only part of the lengths' prompts
    parts = [json.loads((tmp_path / f"part{i}.json").read_text()) for i in range(2)]
    assert sorted(p["accumulator"]["num_prompts"] for p in parts) == [2, 4] and all(len(p["length_of"]) == 6 for p in parts)


def test_costs_are_timed_at_each_lengths_own_context_from_one_prefill_within_the_cap() -> None:
    from specprobe.estimates import costs
    from specprobe.probe import timing
    from tests.test_timing_budget import FakeClock, Watch, _pair

    t, d, target, drafter = _pair()
    tw, dw = Watch(t), Watch(d)
    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[1, 2], context_tokens=150, budget_s=0.0,
                            length_contexts={64: 70, 256: 262}, length_batch=2)
    assert [(x["length"], x["batch_size"], x["context_tokens"]) for x in raw["by_length"]] == [(64, 2, 70), (256, 2, 262)]
    assert all(x["repeats"] == costs.MIN_REPEATS and x["draft_ratios"] for x in raw["by_length"])
    # one prefill per model; every timed pass at batch 2 ran over the typical context or a length's own
    assert len([c for c in tw.calls if c[1] > 4]) == 1 and len([c for c in dw.calls if c[1] > 4]) == 1
    # batch 2, the run's, is timed at the lengths only: its headline costs are the length nearest the typical 150 tokens
    assert {c[2] for c in tw.calls if c[1] <= 4 and c[0] == 2} == {70, 262} and {c[2] for c in tw.calls if c[1] <= 4 and c[0] == 1} == {150}
    head = next(x for x in raw["batches"] if x["batch_size"] == 2)
    assert head["from_length"] == 64 and head["draft_ratios"] == raw["by_length"][0]["draft_ratios"] and any("the headline costs are context length 64" in n for n in raw["notes"])
    sec = costs.price(raw, cumulative=[0.8, 0.6, 0.5], alpha_mean=0.8, renewal=None, k_max=3, batch_size=2).section
    assert [x["length"] for x in sec["by_length"]] == [64, 256] and all(x["source"] == "timed at this length's context" for x in sec["by_length"])
    assert all(len(x["round_costs"]) == 3 for x in sec["by_length"])
    from specprobe.result.run import Cost

    Cost(**sec)
    # the same cap: a slow model leaves the longest length untimed, said so, and priced at the run's costs
    clock = FakeClock()
    t, d, target, drafter = _pair()
    Watch(t, clock, per_row=1.0), Watch(d, clock, per_row=0.3)
    raw = timing.cost_block(target, drafter, None, k_max=3, batch_sizes=[1], context_tokens=40, budget_s=4.0, cap_s=14.0, clock=clock,
                            length_contexts={64: 70, 128: 134, 256: 262}, length_batch=1)
    assert raw["elapsed_s"] <= 14.0 + 4.0
    cut = [x for x in raw["by_length"] if not x["repeats"]]
    assert cut and cut[-1]["length"] == 256 and "past the 14.0 s cap" in (cut[-1]["skipped"] or "")
    sec = costs.price(raw, cumulative=[0.8, 0.6, 0.5], alpha_mean=0.8, renewal=None, k_max=3, batch_size=1).section
    last = sec["by_length"][-1]
    assert last["source"].startswith("not timed at this length") and last["round_costs"] == [r["round_cost"] for r in sec["batches"][0]["rows"]]


def test_each_lengths_speedup_uses_its_own_costs(tiny_pair: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specprobe.estimates import costs

    monkeypatch.setattr(costs, "MIN_BUDGET_S", 20.0)  # a tiny model scores in a blink: room for every length's timing
    out = tmp_path / "r.json"
    prompts = prompts_file(tmp_path / "p.jsonl", n=6, words=8)
    res = runner.invoke(app, [
        "diagnose", str(tiny_pair["target"]), str(tiny_pair["random"]), "--prompts", str(prompts), "--context-lengths", "64,256",
        "--max-new-tokens", "12", "--k-max", "3", "--json", str(out), "--fail-on", "never",
    ])
    assert res.exit_code == 0, res.output
    r = json.loads(out.read_text())
    by_len = {x["length"]: x for x in r["cost"]["by_length"]}
    assert set(by_len) == {64, 256} and by_len[256]["context_tokens"] > by_len[64]["context_tokens"] >= 64
    assert all(x["repeats"] >= 1 and x["source"] == "timed at this length's context" for x in by_len.values())
    for x in r["context_lengths"]:
        own = by_len[x["context_tokens"]]
        assert x["round_cost"] == pytest.approx(own["round_costs"][x["k"] - 1]) and x["cost_ratio"] == pytest.approx(own["cost_ratio"])
        assert x["speedup"] == pytest.approx(x["tau_tokens"] / x["round_cost"]) and 1 <= x["best_k"] <= 3 and x["costs_source"]
