"""Closed-form checks of the monitor's maths: Prometheus-style increase with resets,
windowed acceptance statistics, the baseline comparison, durations."""

from __future__ import annotations

import math

import pytest

from specprobe.core.errors import ConfigError
from specprobe.monitor.windows import (
    ModelData,
    WindowCounts,
    compare,
    conditional_rates,
    gauge_mean,
    increase,
    parse_duration,
    prom_duration,
    relative_drop,
    window_stats,
)


def test_increase_without_reset():
    pts = [(0, 10.0), (15, 30.0), (30, 70.0)]
    assert increase(pts, 0, 30) == 60.0
    assert increase(pts, 10, 30) == 40.0
    assert increase(pts, 20, 30) is None  # one sample is not a rate


def test_increase_counts_from_zero_after_reset():
    # 100 → 150 (+50), restart, 20 (+20 since zero), 45 (+25)
    pts = [(0, 100.0), (1, 150.0), (2, 20.0), (3, 45.0)]
    assert increase(pts, 0, 3) == 95.0


def test_gauge_mean_is_half_open():
    pts = [(0, 1.0), (10, 3.0), (20, 5.0)]
    assert gauge_mean(pts, 0, 20) == 4.0
    assert gauge_mean(pts, 20, 30) is None


def test_window_stats_v1_conventions():
    # 100 drafts of K=4; per-position accepted 90, 70, 50, 30 → 240 accepted of 400 drafted.
    c = WindowCounts(accepted=240, draft_tokens=400, drafts=100, accepted_per_pos=(90, 70, 50, 30))
    s = window_stats(c)
    assert s.accept_rate == pytest.approx(0.6)
    assert s.mean_accept_len == pytest.approx(3.4)  # 1 + 240/100, bonus token included
    assert s.per_pos_cum == pytest.approx((0.9, 0.7, 0.5, 0.3))
    assert s.per_pos_cond == pytest.approx((0.9, 0.7 / 0.9, 0.5 / 0.7, 0.3 / 0.5))
    assert s.depth_decay == pytest.approx(0.3 / 0.9)


def test_window_stats_nothing_drafted_is_nan():
    s = window_stats(WindowCounts(accepted=0, draft_tokens=0, drafts=0))
    assert math.isnan(s.accept_rate) and math.isnan(s.mean_accept_len) and s.empty


def test_window_stats_v0_uses_emitted_and_k():
    # K=4: 800 draft tokens = 200 drafts; 560 emitted → 2.8 tokens per step.
    s = window_stats(WindowCounts(accepted=520, draft_tokens=800, emitted=560, num_spec_tokens=4))
    assert s.accept_rate == pytest.approx(0.65)
    assert s.mean_accept_len == pytest.approx(2.8)


def test_window_stats_gauges_only_with_k():
    s = window_stats(WindowCounts(accept_len_gauge=3.0, num_spec_tokens=4))
    assert s.mean_accept_len == 3.0
    assert s.accept_rate == pytest.approx(0.5)
    assert math.isnan(window_stats(WindowCounts(accept_len_gauge=3.0)).accept_rate)


def test_compare_drop_and_decay():
    base = window_stats(WindowCounts(accepted=300, draft_tokens=400, drafts=100, accepted_per_pos=(95, 85, 70, 50)))
    now = window_stats(WindowCounts(accepted=150, draft_tokens=400, drafts=100, accepted_per_pos=(70, 45, 25, 10)))
    m = compare(now, base)
    assert m["monitor_accept_rate_drop_rel"] == pytest.approx(0.5)
    assert m["monitor_depth_decay_excess"] == pytest.approx(1 - (10 / 70) / (50 / 95))
    # Without rates (gauge-only sources) the drop falls back on accepted per draft.
    g = compare(window_stats(WindowCounts(accept_len_gauge=2.0)), window_stats(WindowCounts(accept_len_gauge=3.0)))
    assert g["monitor_accept_rate_drop_rel"] == pytest.approx(0.5)
    assert math.isnan(g["monitor_accept_rate"])


def test_relative_drop_and_conditional_edge_cases():
    assert math.isnan(relative_drop(0.5, 0.0))
    assert relative_drop(0.6, 0.5) == pytest.approx(-0.2)
    assert conditional_rates(()) == ()


def test_model_data_sums_series_each_reset_checked():
    d = ModelData()
    for t, a, b in [(0, 100, 1000), (10, 160, 1020), (20, 220, 10)]:  # engine 1 restarts at t=20
        d.add_counter("accepted_tokens", "e0", t, a)
        d.add_counter("accepted_tokens", "e1", t, b)
    c = d.counts(0, 20)
    assert c.accepted == (220 - 100) + (20 + 10)
    assert d.resets(0, 20) == 1


@pytest.mark.parametrize(("text", "seconds"), [("300s", 300), ("5m", 300), ("1h", 3600), ("250ms", 0.25), ("2", 2), ("1.5m", 90)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5 parsecs", "-1s", "0s", "m5"])
def test_parse_duration_rejects(text):
    with pytest.raises(ConfigError, match="duration"):
        parse_duration(text)


def test_prom_duration():
    assert prom_duration(300) == "300s"
    assert prom_duration(1.5) == "1500ms"
