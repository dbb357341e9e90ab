"""A Prometheus server as a source: windows are computed server-side with
increase()/avg_over_time() and summed per model_name across every engine instance it
scrapes, so one source covers a whole fleet. The drift tests read the run from its
history: query_range of increase() over consecutive windows across --drift-window
(default 6 h), for the engines that count accepted and drafted tokens. Each engine's
metric names are its `monitor` module's (see `dialects`).
"""

from __future__ import annotations

import json
import math
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.base import MODEL_LABEL, UNLABELLED, IngestResult, SourceError, Store, Warn
from specprobe.monitor.dialects import dialects
from specprobe.monitor.drift import Bucket
from specprobe.monitor.exposition import missing_families
from specprobe.monitor.http_source import HttpSource, check_http_url, http_get, with_retries
from specprobe.monitor.windows import ModelData, WindowCounts, prom_duration

DEFAULT_DRIFT_SPAN = 6 * 3600.0  # the run a Prometheus source's drift tests look back over
MAX_RANGE_POINTS = 2000  # per series and query_range (Prometheus refuses more than 11 000)


@dataclass
class PrometheusSource(HttpSource):
    """A Prometheus server: windows are computed server-side with increase()/avg_over_time()
    and summed per model_name across every engine instance it scrapes."""

    kind: str = "prometheus"
    _seen: set[str] = field(default_factory=set)  # engine families answering in this poll

    def __post_init__(self) -> None:
        check_http_url(self.url, "--prometheus")
        self.url = self.url.rstrip("/")

    @property
    def name(self) -> str:
        return self.url

    def _api(self, endpoint: str, params: dict[str, str]) -> dict[str, Any]:
        """One call of the HTTP API (/api/v1/query or /query_range), retried; its JSON
        document, refused unless Prometheus says success."""
        url = f"{self.url}/api/v1/{endpoint}?{urllib.parse.urlencode(params)}"
        body = with_retries(lambda: http_get(url, self.timeout), self.retries, self.backoff)
        try:
            doc = json.loads(body)
        except json.JSONDecodeError as e:
            raise SourceError(f"Prometheus answered non-JSON ({e.msg})") from e
        if doc.get("status") != "success":
            raise SourceError(f"Prometheus query failed: {doc.get('error', 'unknown error')}")
        return dict(doc)

    def query(self, promql: str, t: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql}
        if t is not None:
            params["time"] = f"{t:.3f}"
        doc = self._api("query", params)
        out = []
        for item in doc.get("data", {}).get("result", []):
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if not math.isnan(value):
                out.append((dict(item.get("metric", {})), value))
        return out

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        doc = self._api("query_range", params)
        out = []
        for item in doc.get("data", {}).get("result", []):
            pts = []
            for pair in item.get("values", []):
                try:
                    ts, v = float(pair[0]), float(pair[1])
                except (IndexError, TypeError, ValueError):
                    continue
                if not math.isnan(v):
                    pts.append((ts, v))
            out.append((dict(item.get("metric", {})), pts))
        return out

    def _drift_series(self, t: float, window: float, span: float) -> dict[str, list[Bucket]]:
        """The run as consecutive windows, server-side: increase() over `window` every
        `window` seconds across `span`, accepted and drafted tokens per model."""
        step = max(window, span / MAX_RANGE_POINTS)
        rng = prom_duration(step)
        out: dict[str, list[Bucket]] = {}
        sets = [getattr(mod, "COUNTERS", {}) for _, family, mod in dialects() if self.engine in ("auto", family)]
        for counters in sets:
            names = {q: base for base, q in counters.items()}
            if windows.ACCEPTED not in names or windows.DRAFT_TOKENS not in names:
                continue
            got: dict[str, dict[str, dict[float, float]]] = {}
            for quantity in (windows.ACCEPTED, windows.DRAFT_TOKENS):
                q = f"sum by ({MODEL_LABEL}) (increase({names[quantity]}_total[{rng}]))"
                for labels, pts in self.query_range(q, t - span, t, step):
                    got.setdefault(labels.get(MODEL_LABEL, UNLABELLED), {})[quantity] = dict(pts)
            for model, series in got.items():
                acc, dra = series.get(windows.ACCEPTED, {}), series.get(windows.DRAFT_TOKENS, {})
                buckets = [Bucket(ts - step, ts, acc[ts] / dra[ts], acc[ts], dra[ts]) for ts in sorted(set(acc) & set(dra)) if dra[ts] > 0]
                if buckets:
                    out[model] = buckets
        return out

    def _window(self, rng: str, offset: str, t: float | None) -> dict[str, dict[str, Any]]:
        off = f" offset {offset}" if offset else ""
        per_model: dict[str, dict[str, Any]] = {}

        def put(model: str, key: str, value: Any) -> None:
            per_model.setdefault(model, {})[key] = value

        wanted = [(family, mod) for _, family, mod in dialects() if self.engine in ("auto", family)]
        counter_sets: list[tuple[str, dict[str, str], str | None]] = [
            (family, getattr(mod, "COUNTERS", {}), getattr(mod, "PER_POS", None)) for family, mod in wanted
        ]
        counter_sets.sort(key=lambda c: c[2] is None)  # the per-position engines' queries run first
        for family, counters, per_pos in counter_sets:
            for base, quantity in counters.items():
                q = f"sum by ({MODEL_LABEL}) (increase({base}_total[{rng}]{off}))"
                for labels, v in self.query(q, t):
                    put(labels.get(MODEL_LABEL, UNLABELLED), quantity, v)
                    self._seen.add(family)
            if per_pos is None:
                continue
            q = f"sum by ({MODEL_LABEL}, position) (increase({per_pos}_total[{rng}]{off}))"
            for labels, v in self.query(q, t):
                pos = labels.get("position", "")
                if pos.isdigit():
                    per_model.setdefault(labels.get(MODEL_LABEL, UNLABELLED), {}).setdefault("pos", {})[int(pos)] = v
        gauges: dict[str, str] = {}
        for _, mod in reversed(wanted):  # a later engine's gauge is asked first
            gauges.update(getattr(mod, "PROM_GAUGES", {}))
        for name, quantity in gauges.items():
            q = f"avg by ({MODEL_LABEL}) (avg_over_time({name}[{rng}]{off}))"
            for labels, v in self.query(q, t):
                model = labels.get(MODEL_LABEL, UNLABELLED)
                if quantity not in per_model.get(model, {}):
                    put(model, quantity, v)
                    self._seen.add(name.split(":")[0])
        return per_model

    def poll(self, t: float, store: Store, warn: Warn, *, window: float, baseline: float, num_spec_tokens: int | None = None,
             drift_span: float | None = None, **_: Any) -> IngestResult:
        self._seen = set()
        now = self._window(prom_duration(window), "", t)
        base = self._window(prom_duration(baseline), prom_duration(window), t)
        drift = self._drift_series(t, window, drift_span or DEFAULT_DRIFT_SPAN)
        res = IngestResult(None, set())
        if not now and not base:
            res.missing = missing_families(None, set(), self.engine)
            return res
        for model in set(now) | set(base):
            data = store.setdefault(model, ModelData())
            data.sources.add(self.name)
            data.last_time = t
            k = data.num_spec_tokens or num_spec_tokens
            data.precomputed = (_counts(now.get(model, {}), k), _counts(base.get(model, {}), k))
            data.drift_buckets = drift.get(model, [])
            res.models.add(model)
        res.engine = self.detected = ",".join(sorted(self._seen)) or self.detected
        return res


def _counts(d: dict[str, Any], k: int | None) -> WindowCounts:
    pos = d.get("pos", {})
    per_pos = tuple(pos.get(i) for i in range(max(pos) + 1)) if pos else ()
    return WindowCounts(
        accepted=d.get(windows.ACCEPTED),
        draft_tokens=d.get(windows.DRAFT_TOKENS),
        drafts=d.get(windows.DRAFTS),
        emitted=d.get(windows.EMITTED),
        accepted_per_pos=per_pos,
        accept_len_gauge=d.get(windows.GAUGE_ACCEPT_LEN),
        accept_rate_gauge=d.get(windows.GAUGE_ACCEPT_RATE),
        num_spec_tokens=k,
    )
