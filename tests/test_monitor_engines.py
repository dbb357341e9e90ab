"""Engine name maps beyond vLLM: llama.cpp's server /metrics (its exposition text
exactly as `server_task_result_metrics::to_metrics` writes it, and a scrape captured from
a real llama-server), SGLang's newer verify counter and draft-shape gauges, engine
pinning, and the `--json` window summary. Parsing only — the real server in the loop is
tests/test_llamacpp.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from typer.testing import CliRunner

from specprobe.cli.main import app
from specprobe.engines.sglang.monitor import num_spec_tokens as sglang_num_spec_tokens
from specprobe.monitor.base import ModelData
from specprobe.monitor.exposition import ingest_samples, parse_exposition
from specprobe.monitor.windows import window_stats

DATA = Path(__file__).parent / "data" / "monitor"
runner = CliRunner()


def llamacpp_text(drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> str:
    """The llama.cpp server's /metrics body: `# HELP`/`# TYPE` then one sample per item,
    counter names carrying `_total` themselves, values streamed by C++ `operator<<`."""
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", 120),
        ("tokens_predicted_total", "Number of generation tokens processed", accepted + drafts),
        ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding", 9),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated", draft_tokens),
        ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model", accepted),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps", drafts),
    ]
    gauges = [("predicted_tokens_seconds", "Average generation throughput in tokens/s", 97.5), ("requests_processing", "Number of requests processing", 0)]
    out = []
    for kind, items in (("counter", counters), ("gauge", gauges)):
        for name, doc, value in items:
            out += [f"# HELP llamacpp:{name} {doc}", f"# TYPE llamacpp:{name} {kind}", f"llamacpp:{name} {value}"]
    if per_pos:
        out += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
                "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
        out += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}' for i, n in enumerate(per_pos)]
    return "\n".join(out) + "\n"


def _ingest(texts: list[str], engine: str = "auto") -> tuple[dict[str, ModelData], list]:
    store: dict[str, ModelData] = {}
    results = []
    for t, text in enumerate(texts):
        samples, bad = parse_exposition(text)
        assert bad == 0
        results.append(ingest_samples(samples, engine, float(t), store, "src"))
    return store, results


def test_llamacpp_exposition_counts_and_per_position():
    before = llamacpp_text(10, 40, 20, [8, 6, 4, 2])
    after = llamacpp_text(30, 120, 75, [27, 22, 16, 10])
    store, results = _ingest([before, after])
    assert results[-1].engine == "llamacpp" and results[-1].missing == []
    (model,) = store
    stats = window_stats(store[model].counts(0.0, 1.0))
    assert (stats.accepted, stats.draft_tokens, stats.drafts) == (55, 80, 20)
    assert stats.accept_rate == pytest.approx(55 / 80)
    assert stats.mean_accept_len == pytest.approx(1 + 55 / 20)
    assert stats.per_pos_cum == pytest.approx((19 / 20, 16 / 20, 12 / 20, 8 / 20))


def test_series_born_between_scrapes_count_from_zero():
    """llama.cpp creates its per-position series at the first verify step: absent from the
    scrape before the traffic, present after. They count from zero, not from their first
    sample (which would lose the whole window); so does a model_name seen for the first
    time. The first scrape of all has no predecessor and sets no zeros."""
    store: dict[str, ModelData] = {}
    first = parse_exposition(llamacpp_text(0, 0, 0, []))[0]
    second = parse_exposition(llamacpp_text(12, 48, 30, [10, 9, 7, 4]))[0]
    ingest_samples(first, "auto", 10.0, store, "src", prev_t=None)
    ingest_samples(second, "auto", 20.0, store, "src", prev_t=10.0)
    stats = window_stats(store["(no model_name)"].counts(0.0, 30.0))
    assert (stats.accepted, stats.drafts) == (30, 12)
    assert stats.per_pos_cum == pytest.approx((10 / 12, 9 / 12, 7 / 12, 4 / 12))
    fresh: dict[str, ModelData] = {}
    ingest_samples(second, "auto", 20.0, fresh, "src", prev_t=None)
    assert window_stats(fresh["(no model_name)"].counts(0.0, 30.0)).empty


def test_llamacpp_without_draft_model_names_missing_families():
    text = "\n".join(line for line in llamacpp_text(0, 0, 0, []).splitlines() if "spec_decode" not in line) + "\n"
    store, results = _ingest([text])
    assert results[0].engine is None and store == {}
    assert results[0].missing == ["llamacpp:spec_decode_num_drafts", "llamacpp:spec_decode_num_draft_tokens", "llamacpp:spec_decode_num_accepted_tokens"]


@pytest.mark.parametrize(("engine", "expect"), [("llamacpp", "llamacpp"), ("auto", "llamacpp"), ("vllm", None), ("sglang", None)])
def test_engine_pinning(engine, expect):
    _, results = _ingest([llamacpp_text(1, 4, 2, [1, 1, 0, 0])], engine=engine)
    assert results[0].engine == expect


def test_real_llama_server_scrape_fixture():
    """A /metrics body captured from the llama-server built by
    benchmarks/build_llama_server.sh, after greedy requests with a 28-block self-draft."""
    text = (DATA / "llamacpp_metrics.prom").read_text()
    samples, bad = parse_exposition(text)
    assert bad == 0
    values = {s.name: s.value for s in samples if not s.labels}
    assert values["llamacpp:spec_decode_num_accepted_tokens_total"] == 43
    # a freshly started server (all zero) scraped before the two requests, then this
    store, results = _ingest([llamacpp_text(0, 0, 0, [0, 0, 0, 0]), text])
    assert results[-1].engine == "llamacpp" and results[-1].missing == []
    stats = window_stats(store["(no model_name)"].counts(0.0, 1.0))
    assert (stats.accepted, stats.draft_tokens, stats.drafts) == (43, 137, 35)
    assert stats.per_pos_cum == pytest.approx((20 / 35, 13 / 35, 6 / 35, 4 / 35))


# ----------------------------------------------------------------------------- SGLang
def sglang_text(verify_calls: int, length: float, rate: float, steps: int | None, draft_tokens: int | None) -> str:
    reg = CollectorRegistry()
    labels = ["model_name", "engine_type", "tp_rank"]
    lv = ("qwen", "unified", "0")
    Gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", labels, registry=reg).labels(*lv).set(length)
    Gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding.", labels, registry=reg).labels(*lv).set(rate)
    Counter("sglang:spec_verify_calls", "Number of speculative decoding verification calls.", labels, registry=reg).labels(*lv).inc(verify_calls)
    if steps is not None:
        Gauge("sglang:spec_num_steps", "Active speculative num steps.", labels, registry=reg).labels(*lv).set(steps)
    if draft_tokens is not None:
        Gauge("sglang:spec_num_draft_tokens", "Active speculative num draft tokens.", labels, registry=reg).labels(*lv).set(draft_tokens)
    return generate_latest(reg).decode()


def test_sglang_verify_counter_and_shape_gauges():
    store, results = _ingest([sglang_text(100, 2.5, 0.5, 3, 4), sglang_text(160, 2.7, 0.55, 3, 4)])
    assert results[-1].engine == "sglang"
    data = store["qwen"]
    assert data.num_spec_tokens == 3
    c = data.counts(0.0, 1.0)
    assert c.drafts == 60
    stats = window_stats(c)
    assert stats.drafts == 60 and stats.mean_accept_len == pytest.approx(2.7)  # the gauge at t=1 (t=0 is the window's open edge)
    assert stats.accept_rate == pytest.approx(0.55)


@pytest.mark.parametrize(("steps", "tokens", "k"), [(3, 4, 3), (None, 4, 3), (0, 1, None), (None, None, None), (5, 8, 5)])
def test_sglang_k_from_shape(steps, tokens, k):
    assert sglang_num_spec_tokens(steps, tokens) == k


def test_sglang_gauges_only_still_read():
    """Older SGLang: no verify counter, no shape gauges — the two gauges as before."""
    reg = CollectorRegistry()
    Gauge("sglang:spec_accept_length", "len", ["model_name"], registry=reg).labels("m").set(3.0)
    store, results = _ingest([generate_latest(reg).decode()])
    assert results[0].engine == "sglang" and store["m"].num_spec_tokens is None


# ----------------------------------------------------------------------------- --json
def test_cli_json_window_from_log(tmp_path):
    log = tmp_path / "srv.log"
    log.write_text(
        "slot print_timing: id  0 | task 0 | draft acceptance = 0.50000 (   20 accepted /    40 generated), mean len =  3.00\n"
        "slot print_timing: id  0 | task 0 |      acc per pos = (0.800, 0.600, 0.400, 0.200)\n"
    )
    out = tmp_path / "w.json"
    res = runner.invoke(app, ["monitor", "--log", str(log), "--json", str(out), "--no-live"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    (m,) = doc["models"]
    assert m["model"] == "srv" and m["now"]["accepted_tokens"] == 20 and m["now"]["draft_tokens"] == 40
    assert m["now"]["drafts"] == 10 and m["now"]["per_pos_cum"] == [0.8, 0.6, 0.4, 0.2]
    assert m["baseline"]["accept_rate"] is None  # nothing before the window: null, not NaN
    assert doc["sources"][0]["engine"] == "llamacpp"
    assert not any(isinstance(v, float) and math.isnan(v) for v in m["now"].values() if not isinstance(v, list))


def test_cli_json_needs_once_for_urls(tmp_path):
    res = runner.invoke(app, ["monitor", "--url", "http://127.0.0.1:9/metrics", "--json", str(tmp_path / "w.json")])
    assert res.exit_code == 2 and "--json needs --once" in res.output
    res = runner.invoke(app, ["monitor", "--log", "-", "--once", "--json", str(tmp_path)], input="")
    assert res.exit_code == 2 and "is a folder" in res.output
