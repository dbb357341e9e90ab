"""What an engine's log parser hands the log source: the record of one line, the error
for a line that carries an engine's marker but not its fields, the per-source parsing
state, and the timestamp at the start of a line. Below the engines' monitor modules
(`specprobe.engines.<engine>.monitor`), which parse their own lines into these.
"""

from __future__ import annotations

import re
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
