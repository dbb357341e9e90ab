"""Alerts: SP4xx findings per model, as records that go out as JSON lines.

An alert "fires" when a rule starts failing for a model and "resolves" when it stops,
so a pager sees one event per incident rather than one per poll; `--once` reports every
alert that is firing at that moment."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

from specprobe.core.errors import OutputError
from specprobe.result import Finding


@dataclass(frozen=True)
class Alert:
    ts: str  # ISO 8601, UTC
    status: str  # firing | resolved
    rule_id: str
    name: str
    severity: str
    model: str
    metric: str
    value: float | None
    threshold: str
    message: str
    remedy: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.model, self.rule_id)

    def to_json(self) -> str:
        d = asdict(self)
        if isinstance(d["value"], float) and math.isnan(d["value"]):
            d["value"] = None
        return json.dumps(d, ensure_ascii=False)


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def alert_from_finding(f: Finding, model: str, t: float, status: str = "firing") -> Alert:
    metric = next(iter(f.measured), "")
    value = f.measured.get(metric)
    return Alert(
        ts=iso(t),
        status=status,
        rule_id=f.rule_id,
        name=f.name,
        severity=f.severity,
        model=model,
        metric=metric,
        value=float(value) if isinstance(value, (int, float)) else None,
        threshold=f.threshold,
        message=f.message,
        remedy=f.remedy,
    )


class AlertTracker:
    """Turns the set of alerts firing now into firing/resolved transitions."""

    def __init__(self) -> None:
        self.active: dict[tuple[str, str], Alert] = {}
        self.fired_total = 0

    def update(self, firing: list[Alert], t: float) -> list[Alert]:
        events: list[Alert] = []
        now_keys = {a.key for a in firing}
        for a in firing:
            if a.key not in self.active:
                events.append(a)
                self.fired_total += 1
            self.active[a.key] = a
        for key in list(self.active):
            if key not in now_keys:
                old = self.active.pop(key)
                events.append(Alert(**{**asdict(old), "ts": iso(t), "status": "resolved"}))
        return events


class AlertSink:
    """JSON lines to a file (appended) or to stdout; flushed per line for tail -f/pipes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fh: IO[str] | None = None
        if path is not None:
            try:
                self._fh = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
            except OSError as e:
                raise OutputError(f"cannot write alerts to {path}: {e.strerror}", "pass a writable path to --alerts") from e

    def write(self, alerts: list[Alert]) -> None:
        fh = self._fh or sys.stdout
        for a in alerts:
            fh.write(a.to_json() + "\n")
        fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path) if self.path else "stdout"}
