"""An engine's /metrics endpoint scraped over HTTP, and the HTTP helpers (URL check,
GET with a timeout, retries with doubling waits) the Prometheus source shares.

Network trouble becomes `SourceError` (the runner retries and marks the source stale);
a malformed URL is the user's input and raises `ConfigError` at construction.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.monitor.base import IngestResult, SourceError, Store, Warn
from specprobe.monitor.exposition import ingest_samples, parse_exposition


def check_http_url(url: str, what: str) -> str:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"bad {what} URL {url!r}", "write e.g. http://127.0.0.1:8000/metrics")
    try:
        parsed.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise ConfigError(f"bad {what} URL {url!r}: {e}", "write e.g. http://127.0.0.1:8000/metrics") from e
    return url


# A /metrics page or a query answer is kilobytes; anything this big is not one, and is
# not read into memory.
MAX_BODY_BYTES = 32 << 20


def http_get(url: str, timeout: float) -> str:
    """The body of a GET, within `timeout` seconds for the whole request (a server that
    trickles its answer a byte at a time times out too) and at most MAX_BODY_BYTES."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain;version=0.0.4, application/json"})
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) checked above
            chunks: list[bytes] = []
            size = 0
            while True:
                if time.monotonic() > deadline:
                    raise TimeoutError
                block = resp.read1(1 << 16)
                if not block:
                    if resp.length:  # the connection closed before Content-Length bytes came
                        raise http.client.IncompleteRead(b"".join(chunks), resp.length)
                    break
                size += len(block)
                if size > MAX_BODY_BYTES:
                    raise SourceError(f"answer larger than {MAX_BODY_BYTES >> 20} MiB: not a metrics page")
                chunks.append(block)
            return b"".join(chunks).decode("utf-8", errors="replace")
    except urllib.error.HTTPError as e:
        raise SourceError(f"HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        raise SourceError(f"unreachable ({e.reason})") from e
    except TimeoutError as e:
        raise SourceError(f"timed out after {timeout:g}s") from e
    except http.client.IncompleteRead as e:
        raise SourceError(f"answer cut short ({len(e.partial)} bytes read, {e.expected} more expected)") from e
    except (OSError, http.client.HTTPException) as e:  # connection reset mid-body, a malformed status line, etc.
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
class HttpSource:
    """What an HTTP source is told: where, which engine's names, and how hard to try."""

    url: str
    engine: str = "auto"
    timeout: float = 5.0
    retries: int = 2
    backoff: float = 0.5
    detected: str | None = None  # the engine its answers showed


@dataclass
class ScrapeSource(HttpSource):
    """One engine /metrics endpoint, scraped each interval."""

    kind: str = "scrape"
    last_ok: float | None = None  # time of the previous good scrape
    per_engine: bool = False  # vLLM's `engine` label: a row per engine beside the sum

    def __post_init__(self) -> None:
        check_http_url(self.url, "--url")

    @property
    def name(self) -> str:
        return self.url

    def poll(self, t: float, store: Store, warn: Warn, **_: Any) -> IngestResult:
        text = with_retries(lambda: http_get(self.url, self.timeout), self.retries, self.backoff)
        samples, bad = parse_exposition(text)
        res = ingest_samples(samples, self.engine, t, store, self.name, prev_t=self.last_ok, per_engine=self.per_engine)
        self.last_ok = t
        res.malformed += bad
        self.detected = res.detected = res.engine or self.detected
        return res
