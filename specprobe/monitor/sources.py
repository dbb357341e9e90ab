"""Where acceptance numbers come from, in one import: an engine's /metrics endpoint
, a Prometheus server's query API (a whole fleet), and log lines from files or stdin,
each engine's names and lines read by its own `monitor` module (`dialects`).

Each kind lives in its own module — `exposition` (parsing /metrics text), `http_source`
(scraping), `prometheus` (server-side windows), `logs` (file/stdin followers), `records`
and `base` (what they share). This module re-exports
them for callers that want every source at once.

Every source writes into a `ModelData` per model label; the windows module does the
maths. Transient trouble (a down or slow endpoint) raises `SourceError` so the runner
can retry, back off and show the source as stale; bad user input (an unreadable file, a
malformed URL) raises `ConfigError`/`InputError` at construction.
"""

from __future__ import annotations

from specprobe.monitor.base import (
    MODEL_LABEL,
    UNLABELLED,
    IngestResult,
    SourceError,
    Store,
    Warn,
)
from specprobe.monitor.exposition import (
    Sample,
    detect_engine,
    ingest_samples,
    missing_families,
    parse_exposition,
)
from specprobe.monitor.http_source import ScrapeSource, check_http_url, http_get, with_retries
from specprobe.monitor.logs import LogSource, apply_record, parse_log_line
from specprobe.monitor.prometheus import PrometheusSource
from specprobe.monitor.records import LogRecord, LogState, MalformedLine, line_time

Source = ScrapeSource | PrometheusSource | LogSource

__all__ = [
    "MODEL_LABEL",
    "UNLABELLED",
    "IngestResult",
    "LogRecord",
    "LogSource",
    "LogState",
    "MalformedLine",
    "PrometheusSource",
    "Sample",
    "ScrapeSource",
    "Source",
    "SourceError",
    "Store",
    "Warn",
    "apply_record",
    "check_http_url",
    "detect_engine",
    "http_get",
    "ingest_samples",
    "line_time",
    "missing_families",
    "parse_exposition",
    "parse_log_line",
    "with_retries",
]
