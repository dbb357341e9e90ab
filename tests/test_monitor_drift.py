"""Drift over a run (monitor/drift): synthetic windows with a known change point, a slow
linear decay, and noise without change; and the SP405/SP406 rules through the monitor on
hours of per-request records."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from specprobe.judge.rules import load_table
from specprobe.monitor.drift import Bucket, cusum_split, drift, mann_kendall_z, theil_sen
from specprobe.monitor.requests import ALL, RequestSource
from specprobe.monitor.runner import Monitor


def _windows(level, n: int = 60, tokens: int = 400, seed: int = 0, width: float = 600.0) -> list[Bucket]:
    """n windows of `tokens` drafted tokens each, every token accepted with probability level(i)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        acc = sum(rng.random() < level(i) for _ in range(tokens))
        out.append(Bucket(i * width, (i + 1) * width, acc / tokens, acc, tokens))
    return out


def test_theil_sen_ignores_outliers_and_mann_kendall_signs():
    xs = list(range(20))
    ys = [2.0 - 0.05 * x for x in xs]
    ys[3], ys[11] = 9.0, -5.0  # two wild windows
    slope, icept = theil_sen(xs, ys)
    assert slope == pytest.approx(-0.05) and icept == pytest.approx(2.0)
    assert mann_kendall_z(ys) < -3 and mann_kendall_z(ys[::-1]) > 3


@pytest.mark.parametrize(("at", "before", "after"), [(40, 0.7, 0.5), (15, 0.8, 0.55), (30, 0.6, 0.45)])
def test_known_change_point_is_found_where_it_is(at: int, before: float, after: float):
    bs = _windows(lambda i: before if i < at else after, seed=at)
    d = drift(bs)
    assert d is not None and d.change_index is not None
    assert abs(d.change_index - at) <= 1
    assert d.change_at == bs[d.change_index].t_start
    assert d.change_drop_rel == pytest.approx(1 - after / before, abs=0.03)
    # the two sides' acceptance are summed from the windows' counters
    k = d.change_index
    assert d.before == sum(b.num for b in bs[:k]) / sum(b.den for b in bs[:k])


def test_slow_linear_decay_is_a_trend():
    # mean acceptance length 3.07 → 2.8 at K = 3 is acceptance 0.69 → 0.60 over 10 hours
    bs = _windows(lambda i: 0.69 - 0.09 * i / 59, n=60, seed=7)
    d = drift(bs)
    assert d is not None
    assert d.trend_drop_rel == pytest.approx(0.09 / 0.69, abs=0.04)
    assert d.slope_per_h == pytest.approx(-0.09 / 10, rel=0.35)
    assert d.span_s == 60 * 600


@pytest.mark.parametrize("seed", range(12))
def test_noise_without_change_raises_nothing(seed: int):
    bs = _windows(lambda i: 0.65, n=48, tokens=200, seed=100 + seed)
    d = drift(bs)
    assert d is not None
    metrics = d.metrics()
    assert metrics["monitor_drift_drop_rel"] < 0.1 and metrics["monitor_change_drop_rel"] < 0.15
    findings = {f.rule_id for f in load_table().findings({**metrics, "monitor_accept_rate": 0.65}, families=["monitoring"])}
    assert not findings & {"SP405", "SP406"}


def test_too_few_windows_are_not_evaluated():
    assert drift(_windows(lambda i: 0.7, n=5)) is None
    assert cusum_split([0.5] * 10) == (None, 0.0)


def _records(path: Path, level, hours: float = 6.0, every: float = 20.0, seed: int = 1) -> None:
    rng = random.Random(seed)
    t0 = 1_764_000_000.0
    with path.open("w") as fh:
        t = 0.0
        while t < hours * 3600:
            per_step = []
            for _ in range(rng.randint(10, 40)):
                a = 0
                while a < 3 and rng.random() < level(t / 3600):
                    a += 1
                per_step.append(a)
            acc, n = sum(per_step), len(per_step)
            sd = {"num_spec_steps": n, "num_draft_tokens": 3 * n, "num_accepted_draft_tokens": acc, "num_spec_tokens": 3,
                  "acceptance_histogram": [per_step.count(j) for j in range(4)]}
            fh.write(json.dumps({"ts": t0 + t, "task": "chat", "response": {"metrics": {"speculative_decoding": sd}}}) + "\n")
            t += every


def _monitor(path: Path, **kw) -> dict:
    src = RequestSource(str(path), group_by="task")
    mon = Monitor([src], load_table(), window=600, baseline=3600, interval=1, **kw)
    mon.poll(0.0)
    snap = mon.evaluate(0.0, anchor_to_data=True)
    src.close()
    return {m.model: m for m in snap.models}


def test_monitor_sees_hours_of_slow_decay_that_the_baseline_drop_does_not(tmp_path: Path):
    path = tmp_path / "decay.jsonl"
    _records(path, lambda h: 0.72 - 0.12 * h / 6)  # p per position 0.72 → 0.60 over six hours
    views = _monitor(path)

    def rate(p: float) -> float:  # a chain of K = 3 accepted as a prefix
        return (p + p**2 + p**3) / 3

    v = views["task=chat"]
    ids = {f.rule_id for f in v.findings}
    assert "SP405" in ids and "SP403" not in ids  # the window against the hour before: −3 %, no alert
    assert v.drift is not None and v.drift.trend_drop_rel == pytest.approx(1 - rate(0.60) / rate(0.72), abs=0.05)
    assert v.drift.windows == 35  # whole 10-minute windows up to the last record
    # --drift-window 1h: six windows are too few to tell a trend from noise
    views = _monitor(path, drift_span=3600)
    assert views[ALL].drift is None and "SP405" not in {f.rule_id for f in views[ALL].findings}


def test_monitor_change_point_in_the_run(tmp_path: Path):
    path = tmp_path / "step.jsonl"
    _records(path, lambda h: 0.75 if h < 2.5 else 0.55, hours=5)
    v = _monitor(path)[ALL]
    assert "SP406" in {f.rule_id for f in v.findings}
    assert v.drift.change_at == pytest.approx(1_764_000_000.0 + 2.5 * 3600, abs=700)


def test_prometheus_source_reads_the_run_from_query_range():
    """A fleet's history through the query API: increase() over consecutive windows across
    --drift-window; a six-hour fall of 20 % fires SP405 for that model only."""
    import threading
    import urllib.parse
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from specprobe.monitor.prometheus import PrometheusSource

    now = 1_764_000_000.0
    seen: list[dict] = []

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            url = urllib.parse.urlparse(self.path)
            q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
            result: list[dict] = []
            if url.path.endswith("/query_range"):
                seen.append(q)
                start, end, step = float(q["start"]), float(q["end"]), float(q["step"])
                for model, fall in (("falling", 0.2), ("steady", 0.0)):
                    values, ts = [], start
                    while ts <= end:
                        level = 0.7 * (1 - fall * (ts - start) / (end - start))
                        drafted = 3000.0
                        values.append([ts, str(round(level * drafted) if "accepted" in q["query"] else drafted)])
                        ts += step
                    result.append({"metric": {"model_name": model}, "values": values})
                kind = "matrix"
            else:
                kind = "vector"
                if "vllm:spec_decode_num_accepted_tokens_total" in q["query"] and "offset" not in q["query"]:
                    result = [{"metric": {"model_name": m}, "value": [now, "2100"]} for m in ("falling", "steady")]
                elif "vllm:spec_decode_num_draft_tokens_total" in q["query"]:
                    result = [{"metric": {"model_name": m}, "value": [now, "3000"]} for m in ("falling", "steady")]
            body = json.dumps({"status": "success", "data": {"resultType": kind, "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        src = PrometheusSource(f"http://127.0.0.1:{server.server_address[1]}", engine="vllm", timeout=5, retries=0)
        mon = Monitor([src], load_table(), window=600, baseline=3600, interval=15)
        mon.poll(now)
        views = {m.model: m for m in mon.evaluate(now).models}
    finally:
        server.shutdown()
        server.server_close()
    assert {q["step"] for q in seen} == {"600"} and float(seen[0]["end"]) - float(seen[0]["start"]) == 6 * 3600
    assert "increase(vllm:spec_decode_num_accepted_tokens_total[600s])" in seen[0]["query"]
    falling, steady = views["falling"], views["steady"]
    assert falling.drift is not None and falling.drift.windows == 37
    assert falling.drift.trend_drop_rel == pytest.approx(0.2, abs=0.01)
    assert "SP405" in {f.rule_id for f in falling.findings}
    assert steady.drift.trend_drop_rel == 0.0 and "SP405" not in {f.rule_id for f in steady.findings}
