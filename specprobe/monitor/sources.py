"""Where acceptance numbers come from: an engine's /metrics endpoint (vLLM V1 and V0,
SGLang), a Prometheus server's query API (a whole fleet), and log lines (vLLM V1/V0,
SGLang, llama.cpp) from files or stdin.

Every source writes into a `ModelData` per model label; the windows module does the
maths. Transient trouble (a down or slow endpoint) raises `SourceError` so the runner
can retry, back off and show the source as stale; bad user input (an unreadable file, a
malformed URL) raises `ConfigError`/`InputError` at construction.
"""

from __future__ import annotations

import json
import math
import queue
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from specprobe.errors import ConfigError, InputError
from specprobe.monitor.windows import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    EMITTED,
    GAUGE_ACCEPT_LEN,
    GAUGE_ACCEPT_RATE,
    GAUGE_EFFICIENCY,
    ModelData,
    WindowCounts,
    pos_key,
    prom_duration,
)

ENGINES = ("auto", "vllm", "sglang")
MODEL_LABEL = "model_name"
UNLABELLED = "(no model_name)"

Store = dict[str, ModelData]
Warn = Callable[[str, str], None]  # (key, message): the runner prints each key once


class SourceError(Exception):
    """A transient failure of one poll: endpoint down, slow, or answering garbage."""


# ----------------------------------------------------------------------------- engine names
# Counter names without the `_total` suffix the client library adds on exposition.
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": DRAFTS,
    "vllm:spec_decode_num_draft_tokens": DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens": ACCEPTED,
    "vllm:spec_decode_num_emitted_tokens": EMITTED,  # V0
}
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
VLLM_GAUGES = {
    "vllm:spec_decode_draft_acceptance_rate": GAUGE_ACCEPT_RATE,  # V0
    "vllm:spec_decode_efficiency": GAUGE_EFFICIENCY,  # V0
}
SGLANG_GAUGES = {
    "sglang:spec_accept_length": GAUGE_ACCEPT_LEN,
    "sglang:spec_accept_rate": GAUGE_ACCEPT_RATE,
}
VLLM_V1_REQUIRED = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
VLLM_V0_REQUIRED = ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_emitted_tokens")


def _base_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> tuple[list[Sample], int]:
    """Samples from Prometheus text exposition, and how many lines were malformed.

    The library parser rejects the whole text on one bad line, so on failure each sample
    line is tried alone and the bad ones are dropped (counted) before parsing the rest."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples_of(body: str) -> list[Sample]:
        return [
            Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(body)
            for s in fam.samples
        ]

    try:
        return samples_of(text), 0
    except ValueError:
        pass
    good: list[str] = []
    bad = 0
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            good.append(line)
            continue
        try:
            samples_of(line + "\n")
        except ValueError:
            bad += 1
            continue
        good.append(line)
    try:
        return samples_of("\n".join(good) + "\n"), bad
    except ValueError as e:  # a broken HELP/TYPE line: give up on this scrape
        raise SourceError(f"unparseable exposition text ({e})") from e


def _series_id(labels: dict[str, str], prefix: str) -> str:
    rest = sorted((k, v) for k, v in labels.items() if k not in (MODEL_LABEL, "position"))
    return prefix + ",".join(f"{k}={v}" for k, v in rest)


@dataclass
class IngestResult:
    engine: str | None  # "vllm-v1" | "vllm-v0" | "sglang" | None
    models: set[str]
    malformed: int = 0
    missing: list[str] = field(default_factory=list)
    detected: str | None = None  # the engine this source settled on so far


def detect_engine(names: set[str]) -> str | None:
    if any(n.startswith("vllm:spec_decode") for n in names):
        return "vllm-v1" if "vllm:spec_decode_num_drafts" in names else "vllm-v0"
    if any(n.startswith("sglang:spec_accept") for n in names):
        return "sglang"
    return None


def missing_families(engine: str | None, names: set[str], wanted: str) -> list[str]:
    """The spec-decode families this engine should export but did not."""
    if engine is None:
        if wanted == "sglang":
            return ["sglang:spec_accept_length"]
        if wanted == "vllm":
            return ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"]
        return ["vllm:spec_decode_* or sglang:spec_accept_*"]
    required: tuple[str, ...]
    if engine == "vllm-v1":
        required = (*VLLM_V1_REQUIRED, VLLM_PER_POS)
    elif engine == "vllm-v0":
        required = VLLM_V0_REQUIRED
    else:
        required = ("sglang:spec_accept_length",)
    return [n for n in required if n not in names]


def ingest_samples(samples: list[Sample], engine: str, t: float, store: Store, source: str) -> IngestResult:
    """Map one scrape onto the canonical quantities, per model_name."""
    names = {_base_name(s.name) for s in samples if not s.name.endswith("_created")}
    detected = detect_engine(names)
    if engine == "vllm" and detected == "sglang" or engine == "sglang" and detected and detected.startswith("vllm"):
        detected = None  # the user said which engine; the other one's names do not count
    result = IngestResult(detected, set(), missing=missing_families(detected, names, engine))
    if detected is None:
        return result
    totals: dict[str, dict[str, float]] = {}  # model → quantity → cumulative sum (for V0's K)
    for s in samples:
        if s.name.endswith("_created"):
            continue
        base = _base_name(s.name)
        model = s.labels.get(MODEL_LABEL, UNLABELLED)
        quantity: str | None = None
        kind = ""
        if detected.startswith("vllm"):
            if base in VLLM_COUNTERS:
                quantity, kind = VLLM_COUNTERS[base], "counter"
            elif base == VLLM_PER_POS:
                pos = s.labels.get("position", "")
                if not pos.isdigit():
                    result.malformed += 1
                    continue
                quantity, kind = pos_key(int(pos)), "counter"
            elif base in VLLM_GAUGES:
                quantity, kind = VLLM_GAUGES[base], "gauge"
        elif base in SGLANG_GAUGES:
            quantity, kind = SGLANG_GAUGES[base], "gauge"
        if quantity is None:
            continue
        if math.isnan(s.value) or math.isinf(s.value) or (kind == "counter" and s.value < 0):
            result.malformed += 1
            continue
        data = store.setdefault(model, ModelData())
        data.sources.add(source)
        sid = _series_id(s.labels, source + "|")
        if kind == "counter":
            data.add_counter(quantity, sid, t, s.value)
            totals.setdefault(model, {}).setdefault(quantity, 0.0)
            totals[model][quantity] += s.value
        else:
            data.add_gauge(quantity, sid, t, s.value)
            totals.setdefault(model, {})[quantity] = s.value
        result.models.add(model)
    if detected == "vllm-v0":
        for model, tot in totals.items():
            k = v0_num_spec_tokens(tot.get(DRAFT_TOKENS), tot.get(EMITTED), tot.get(GAUGE_EFFICIENCY))
            if k:
                store[model].num_spec_tokens = store[model].num_spec_tokens or k
    return result


def v0_num_spec_tokens(draft_tokens: float | None, emitted: float | None, efficiency: float | None) -> int | None:
    """K from vLLM V0's cumulative numbers: efficiency = emitted / (drafts·(K+1)) and
    draft_tokens = drafts·K, so drafts = emitted/efficiency − draft_tokens."""
    if not draft_tokens or not emitted or not efficiency or efficiency <= 0:
        return None
    drafts = emitted / efficiency - draft_tokens
    if drafts <= 0:
        return None
    k = round(draft_tokens / drafts)
    return k if 1 <= k <= 64 else None


# ----------------------------------------------------------------------------- HTTP
def check_http_url(url: str, what: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"bad {what} URL {url!r}", "write e.g. http://127.0.0.1:8000/metrics")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ConfigError(f"bad {what} URL {url!r}: {e}", "write e.g. http://127.0.0.1:8000/metrics") from e
    return url


def http_get(url: str, timeout: float) -> str:
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4, application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked above
            return resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise SourceError(f"HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        raise SourceError(f"unreachable ({e.reason})") from e
    except TimeoutError as e:
        raise SourceError(f"timed out after {timeout:g}s") from e
    except OSError as e:  # connection reset mid-body, etc.
        raise SourceError(str(e) or type(e).__name__) from e


def with_retries(fn: Callable[[], Any], retries: int, backoff: float, sleep: Callable[[float], None] = time.sleep) -> Any:
    """Call fn, retrying a SourceError `retries` times with doubling waits."""
    for attempt in range(retries + 1):
        try:
            return fn()
        except SourceError:
            if attempt == retries:
                raise
            sleep(backoff * 2**attempt)
    raise AssertionError("unreachable")


@dataclass
class ScrapeSource:
    """One engine /metrics endpoint, scraped each interval."""

    url: str
    engine: str = "auto"
    timeout: float = 5.0
    retries: int = 2
    backoff: float = 0.5
    kind: str = "scrape"
    detected: str | None = None

    def __post_init__(self) -> None:
        check_http_url(self.url, "--url")

    @property
    def name(self) -> str:
        return self.url

    def poll(self, t: float, store: Store, warn: Warn, **_: Any) -> IngestResult:
        text = with_retries(lambda: http_get(self.url, self.timeout), self.retries, self.backoff)
        samples, bad = parse_exposition(text)
        res = ingest_samples(samples, self.engine, t, store, self.name)
        res.malformed += bad
        self.detected = res.detected = res.engine or self.detected
        return res


# ----------------------------------------------------------------------------- Prometheus
@dataclass
class PrometheusSource:
    """A Prometheus server: windows are computed server-side with increase()/avg_over_time()
    and summed per model_name across every engine instance it scrapes."""

    url: str
    engine: str = "auto"
    timeout: float = 5.0
    retries: int = 2
    backoff: float = 0.5
    kind: str = "prometheus"
    detected: str | None = None

    def __post_init__(self) -> None:
        check_http_url(self.url, "--prometheus")
        self.url = self.url.rstrip("/")

    @property
    def name(self) -> str:
        return self.url

    def query(self, promql: str, t: float | None = None) -> list[tuple[dict[str, str], float]]:
        params = {"query": promql}
        if t is not None:
            params["time"] = f"{t:.3f}"
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        body = with_retries(lambda: http_get(url, self.timeout), self.retries, self.backoff)
        try:
            doc = json.loads(body)
        except json.JSONDecodeError as e:
            raise SourceError(f"Prometheus answered non-JSON ({e.msg})") from e
        if doc.get("status") != "success":
            raise SourceError(f"Prometheus query failed: {doc.get('error', 'unknown error')}")
        out = []
        for item in doc.get("data", {}).get("result", []):
            try:
                value = float(item["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if not math.isnan(value):
                out.append((dict(item.get("metric", {})), value))
        return out

    def _window(self, rng: str, offset: str, t: float | None) -> dict[str, dict[str, Any]]:
        off = f" offset {offset}" if offset else ""
        per_model: dict[str, dict[str, Any]] = {}

        def put(model: str, key: str, value: Any) -> None:
            per_model.setdefault(model, {})[key] = value

        want_vllm = self.engine in ("auto", "vllm")
        want_sglang = self.engine in ("auto", "sglang")
        if want_vllm:
            for base, quantity in VLLM_COUNTERS.items():
                q = f"sum by ({MODEL_LABEL}) (increase({base}_total[{rng}]{off}))"
                for labels, v in self.query(q, t):
                    put(labels.get(MODEL_LABEL, UNLABELLED), quantity, v)
            q = f"sum by ({MODEL_LABEL}, position) (increase({VLLM_PER_POS}_total[{rng}]{off}))"
            for labels, v in self.query(q, t):
                pos = labels.get("position", "")
                if pos.isdigit():
                    per_model.setdefault(labels.get(MODEL_LABEL, UNLABELLED), {}).setdefault("pos", {})[int(pos)] = v
        gauges = {**(SGLANG_GAUGES if want_sglang else {})}
        if want_vllm:
            gauges["vllm:spec_decode_draft_acceptance_rate"] = GAUGE_ACCEPT_RATE
        for name, quantity in gauges.items():
            q = f"avg by ({MODEL_LABEL}) (avg_over_time({name}[{rng}]{off}))"
            for labels, v in self.query(q, t):
                model = labels.get(MODEL_LABEL, UNLABELLED)
                if quantity not in per_model.get(model, {}):
                    put(model, quantity, v)
        return per_model

    def poll(self, t: float, store: Store, warn: Warn, *, window: float, baseline: float, num_spec_tokens: int | None = None, **_: Any) -> IngestResult:
        now = self._window(prom_duration(window), "", t)
        base = self._window(prom_duration(baseline), prom_duration(window), t)
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
            res.models.add(model)
        kinds = {k for d in now.values() for k in d}
        res.engine = self.detected = "vllm" if DRAFT_TOKENS in kinds else ("sglang" if kinds else self.detected)
        return res


def _counts(d: dict[str, Any], k: int | None) -> WindowCounts:
    pos = d.get("pos", {})
    per_pos = tuple(pos.get(i) for i in range(max(pos) + 1)) if pos else ()
    return WindowCounts(
        accepted=d.get(ACCEPTED),
        draft_tokens=d.get(DRAFT_TOKENS),
        drafts=d.get(DRAFTS),
        emitted=d.get(EMITTED),
        accepted_per_pos=per_pos,
        accept_len_gauge=d.get(GAUGE_ACCEPT_LEN),
        accept_rate_gauge=d.get(GAUGE_ACCEPT_RATE),
        num_spec_tokens=k,
    )


# ----------------------------------------------------------------------------- logs
class MalformedLine(ValueError):
    """A line that carries an engine's marker but not the fields that go with it."""


@dataclass(frozen=True)
class LogRecord:
    kind: str  # vllm-v1 | vllm-v0 | sglang | llamacpp | llamacpp-n_draft | llamacpp-n_drafted | llamacpp-n_accept
    fields: dict[str, Any]
    t: float | None = None


_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_ISO_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_VLLM_TS = re.compile(r"\b(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b")
_V1 = {
    "mean_len": re.compile(r"Mean acceptance length: " + _NUM),
    "accepted": re.compile(r"Accepted: (\d+) tokens"),
    "drafted": re.compile(r"Drafted: (\d+) tokens"),
    "rate_pct": re.compile(r"Draft acceptance rate: " + _NUM + "%"),
    "per_pos": re.compile(r"Per-position acceptance rate: (" + _NUM + r"(?:,\s*" + _NUM + r")*)"),
}
_V0 = {
    "rate": re.compile(r"Draft acceptance rate: " + _NUM),
    "efficiency": re.compile(r"System efficiency: " + _NUM),
    "k": re.compile(r"Number of speculative tokens: (\d+)"),
    "accepted": re.compile(r"Number of accepted tokens: (\d+)"),
    "drafted": re.compile(r"Number of draft tokens: (\d+)"),
    "emitted": re.compile(r"Number of emitted tokens: (\d+)"),
}
_SGL_LEN = re.compile(r"accept len: " + _NUM)
_SGL_RATE = re.compile(r"accept rate: " + _NUM)
_LLAMA = re.compile(r"draft acceptance rate = " + _NUM + r"\s*\(\s*(\d+) accepted\s*/\s*(\d+) generated\)")
_LLAMA_EX = re.compile(r"\b(n_draft|n_drafted|n_accept)\s*=\s*(\d+)\s*$")


def line_time(prefix: str, year: int | None = None) -> float | None:
    """The timestamp at the start of a log line, as epoch seconds (local time)."""
    m = _ISO_TS.search(prefix)
    if m:
        frac = float("0." + m.group(3)) if m.group(3) else 0.0
        try:
            return datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp() + frac
        except ValueError:
            return None
    m = _VLLM_TS.search(prefix)
    if m:  # vLLM writes "MM-DD HH:MM:SS" without a year
        mo, day, hh, mi, ss = (int(g) for g in m.groups())
        try:
            return datetime(year or datetime.now().year, mo, day, hh, mi, ss).timestamp()
        except ValueError:
            return None
    return None


def _need(rx: re.Pattern[str], text: str, what: str) -> str:
    m = rx.search(text)
    if not m:
        raise MalformedLine(f"no {what}")
    return m.group(1)


def parse_log_line(line: str) -> LogRecord | None:
    """One log line → a record, None for unrelated lines, MalformedLine for broken ones."""
    if "SpecDecoding metrics:" in line:
        head, body = line.split("SpecDecoding metrics:", 1)
        f: dict[str, Any] = {
            "accepted": int(_need(_V1["accepted"], body, "'Accepted: N tokens'")),
            "drafted": int(_need(_V1["drafted"], body, "'Drafted: N tokens'")),
        }
        m = _V1["mean_len"].search(body)
        f["mean_len"] = float(m.group(1)) if m else None
        m = _V1["per_pos"].search(body)
        f["per_pos"] = [float(x) for x in re.split(r",\s*", m.group(1))] if m else []
        return LogRecord("vllm-v1", f, line_time(head))
    if "Speculative metrics:" in line:
        head, body = line.split("Speculative metrics:", 1)
        f = {key: _need(rx, body, key) for key, rx in _V0.items()}
        return LogRecord(
            "vllm-v0",
            {"rate": float(f["rate"]), "efficiency": float(f["efficiency"]), "k": int(f["k"]),
             "accepted": int(f["accepted"]), "drafted": int(f["drafted"]), "emitted": int(f["emitted"])},
            line_time(head),
        )
    if "Decode batch" in line and "accept len" in line:
        head = line.split("Decode batch", 1)[0]
        length = float(_need(_SGL_LEN, line, "'accept len: X'"))
        m = _SGL_RATE.search(line)
        return LogRecord("sglang", {"accept_len": length, "accept_rate": float(m.group(1)) if m else None}, line_time(head))
    if "draft acceptance rate =" in line:
        m = _LLAMA.search(line)
        if not m:
            raise MalformedLine("no '(N accepted / M generated)'")
        return LogRecord("llamacpp", {"accepted": int(m.group(2)), "drafted": int(m.group(3))}, line_time(line.split("draft acceptance", 1)[0]))
    m = _LLAMA_EX.search(line)
    if m:
        return LogRecord(f"llamacpp-{m.group(1)}", {"value": int(m.group(2))}, None)
    return None


@dataclass
class LogState:
    """Per-source parsing state: llama.cpp's example prints drafted and accepted on
    separate lines; vLLM V0 prints cumulative totals that are counters."""

    pending_drafted: int | None = None
    k: int | None = None


def apply_record(rec: LogRecord, t: float, data: ModelData, state: LogState, series: str) -> None:
    f = rec.fields
    if rec.kind == "vllm-v1":
        # Interval deltas. Every draft proposes K tokens, so drafts = drafted / K with K
        # the number of positions listed; without the list, from the mean length.
        k = len(f["per_pos"]) or state.k
        drafts: float | None = None
        if k:
            drafts = f["drafted"] / k
            state.k = k
            data.num_spec_tokens = data.num_spec_tokens or k
        elif f["mean_len"] and f["mean_len"] > 1:
            drafts = f["accepted"] / (f["mean_len"] - 1)
        data.add_event(ACCEPTED, t, f["accepted"])
        data.add_event(DRAFT_TOKENS, t, f["drafted"])
        if drafts is not None:
            data.add_event(DRAFTS, t, drafts)
            for i, r in enumerate(f["per_pos"]):
                data.add_event(pos_key(i), t, r * drafts)
    elif rec.kind == "vllm-v0":
        # V0 logs cumulative totals since start: counters (a restart shows as a reset).
        data.num_spec_tokens = f["k"]
        data.add_counter(ACCEPTED, series, t, f["accepted"])
        data.add_counter(DRAFT_TOKENS, series, t, f["drafted"])
        data.add_counter(EMITTED, series, t, f["emitted"])
    elif rec.kind == "sglang":
        data.add_gauge(GAUGE_ACCEPT_LEN, series, t, f["accept_len"])
        if f["accept_rate"] is not None:
            data.add_gauge(GAUGE_ACCEPT_RATE, series, t, f["accept_rate"])
    elif rec.kind == "llamacpp":
        data.add_event(ACCEPTED, t, f["accepted"])
        data.add_event(DRAFT_TOKENS, t, f["drafted"])
    elif rec.kind == "llamacpp-n_draft":
        state.k = f["value"]
    elif rec.kind == "llamacpp-n_drafted":
        state.pending_drafted = f["value"]
    elif rec.kind == "llamacpp-n_accept" and state.pending_drafted is not None:
        data.add_event(ACCEPTED, t, f["value"])
        data.add_event(DRAFT_TOKENS, t, state.pending_drafted)
        state.pending_drafted = None


@dataclass
class LogSource:
    """A log file (read once, or followed) or '-' for stdin. The model label is the
    file's stem (engines do not log the model name next to these lines) unless given."""

    path: str
    follow: bool = False
    model: str | None = None
    kind: str = "log"
    detected: str | None = None
    lines_read: int = 0
    _fh: IO[str] | None = None
    _queue: queue.Queue[str | None] | None = None
    _thread: threading.Thread | None = None
    _eof: bool = False
    _state: LogState = field(default_factory=LogState)

    def __post_init__(self) -> None:
        if self.path == "-":
            self._fh = sys.stdin
            self.model = self.model or "stdin"
        else:
            p = Path(self.path)
            if not p.exists():
                raise InputError(f"log file {self.path} does not exist", "pass an existing file to --log, or '-' for stdin")
            if p.is_dir():
                raise InputError(f"log file {self.path} is a directory", "pass a file to --log")
            try:
                self._fh = p.open("r", encoding="utf-8", errors="replace")
            except OSError as e:
                raise InputError(f"cannot read log file {self.path}: {e.strerror}", "check the path and its permissions") from e
            self.model = self.model or p.stem
        if self.follow:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._reader, name=f"log:{self.path}", daemon=True)
            self._thread.start()

    @property
    def name(self) -> str:
        return "stdin" if self.path == "-" else self.path

    def _reader(self) -> None:
        assert self._fh is not None and self._queue is not None
        while True:
            line = self._fh.readline()
            if line:
                self._queue.put(line)
            elif self.path == "-":
                self._queue.put(None)  # stdin closed
                return
            else:
                time.sleep(0.2)  # tail -f: wait for the writer

    def _new_lines(self) -> list[str]:
        if self._queue is not None:
            lines = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._eof = True
                    break
                lines.append(item)
            return lines
        if self._eof or self._fh is None:
            return []
        lines = self._fh.readlines()
        self._eof = True
        return lines

    def poll(self, t: float, store: Store, warn: Warn, **_: Any) -> IngestResult:
        res = IngestResult(None, set())
        data: ModelData | None = None
        kinds: set[str] = set()
        for line in self._new_lines():
            self.lines_read += 1
            try:
                rec = parse_log_line(line.rstrip("\n"))
            except (MalformedLine, ValueError) as e:
                res.malformed += 1
                warn(f"malformed-line:{self.name}", f"{self.name}: skipping malformed line {self.lines_read} ({e}): {line.strip()[:120]}")
                continue
            if rec is None:
                continue
            if data is None:  # a model appears with its first record, not with the file
                data = store.setdefault(self.model or "log", ModelData())
                data.sources.add(self.name)
            apply_record(rec, rec.t if rec.t is not None else t, data, self._state, f"{self.name}|log")
            kinds.add(rec.kind.split("-n_")[0])
        if kinds:
            self.detected = ",".join(sorted(kinds))
            res.models.add(self.model or "log")
        res.engine = self.detected
        return res

    def close(self) -> None:
        if self._fh is not None and self._fh is not sys.stdin and self._thread is None:
            self._fh.close()


Source = ScrapeSource | PrometheusSource | LogSource
