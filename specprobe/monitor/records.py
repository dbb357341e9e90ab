"""What an engine's log and request-record readers hand the sources: the record of one
log line, the error for a line that carries an engine's marker but not its fields, the
per-source parsing state, the timestamp at the start of a line, one request's counters
and the small readers of counts and histograms they are made from. Below the engines'
monitor modules (`specprobe.engines.<engine>.monitor`), which read their own lines into
these.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class MalformedLine(ValueError):
    """A line that carries an engine's marker but not the fields that go with it."""


@dataclass(frozen=True)
class LogRecord:
    kind: str  # <monitor family>[-<what>]: vllm-v1 | vllm-v0 | sglang | llamacpp | llamacpp-per_pos | …
    fields: dict[str, Any]
    t: float | None = None


@dataclass
class LogState:
    """Per-source parsing state: K once a line has told it, a drafted count waiting for
    the line that carries its accepted count, and each engine's own scratch (keyed by
    its monitor family) for lines that complete one another."""

    pending_drafted: int | None = None
    k: int | None = None
    scratch: dict[str, Any] = field(default_factory=dict)


_ISO_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_MONTH_DAY_TS = re.compile(r"\b(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b")


def line_time(prefix: str, year: int | None = None) -> float | None:
    """The timestamp at the start of a log line, as epoch seconds (local time)."""
    m = _ISO_TS.search(prefix)
    if m:
        frac = float("0." + m.group(3)) if m.group(3) else 0.0
        try:
            return datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp() + frac
        except ValueError:
            return None
    m = _MONTH_DAY_TS.search(prefix)
    if m:  # vLLM writes "MM-DD HH:MM:SS" without a year
        mo, day, hh, mi, ss = (int(g) for g in m.groups())
        try:
            return datetime(year or datetime.now().year, mo, day, hh, mi, ss).timestamp()
        except ValueError:
            return None
    return None


def need(rx: re.Pattern[str], text: str, what: str) -> str:
    """The first group of `rx` in `text`, else MalformedLine('no `what`')."""
    m = rx.search(text)
    if not m:
        raise MalformedLine(f"no {what}")
    return m.group(1)


# ----------------------------------------------------------------------------- request records
@dataclass(frozen=True)
class RequestRecord:
    engine: str  # the monitor family of the engine that wrote it (its `monitor_family`)
    accepted: int  # accepted draft tokens (bonus tokens not included)
    drafted: int | None  # proposed draft tokens; None: not reported and K unknown
    steps: int | None  # verify steps; None: not reported (llama.cpp)
    accepted_per_pos: tuple[int, ...] = ()  # draft tokens accepted at position i (0-based)
    num_spec_tokens: int | None = None
    t: float | None = None
    fields: Mapping[str, Any] | None = None  # the line's own object, for --group-by

    @property
    def rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else math.nan

    @property
    def mean_len(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else math.nan


def count(d: Mapping[str, Any], key: str, where: str) -> int | None:
    """d[key] as a count (None: absent); MalformedLine when it is not a whole number ≥ 0."""
    if key not in d or d[key] is None:
        return None
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v):
        raise MalformedLine(f"{where}.{key} is {v!r}, not a count")
    return int(v)


def first_count(d: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for k in keys:
        v = count(d, k, where)
        if v is not None:
            return v
    return None


def histogram(raw: Any, where: str) -> list[int] | None:
    """A dense list [steps accepting 0, 1, …] from a list or a sparse {"j": steps} map."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        try:
            pairs = [(int(k), v) for k, v in raw.items()]
        except ValueError:
            raise MalformedLine(f"{where} has a key that is not a count") from None
        if not pairs:
            return []
        dense = [0] * (max(j for j, _ in pairs) + 1)
        for j, v in pairs:
            if j < 0:
                raise MalformedLine(f"{where} has a negative key")
            dense[j] = count({"v": v}, "v", where) or 0
        return dense
    if isinstance(raw, list):
        return [count({"v": v}, "v", where) or 0 for v in raw]
    raise MalformedLine(f"{where} is a {type(raw).__name__}, not a list")


def per_pos_from_histogram(hist: list[int], k: int | None) -> tuple[int, ...]:
    """Accepted at position i = steps that accepted more than i draft tokens."""
    depth = max(len(hist) - 1, k or 0)
    return tuple(sum(hist[i + 1:]) for i in range(depth))


def per_pos_from_steps(per_step: list[int], k: int | None) -> tuple[int, ...]:
    depth = max(max(per_step, default=0), k or 0)
    return tuple(sum(1 for a in per_step if a > i) for i in range(depth))
