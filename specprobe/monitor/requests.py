"""Per-request records: one JSON object a line (a gateway's request log, the engine's
responses saved as they come), the engine's own per-request speculative-decoding counters
found anywhere in the line by their fields, grouped by a field of the line (`task`,
`metadata.tenant`).

Each engine's `monitor` module says which object of a line holds its counters
(`request_counters`, the fields it writes into a response) and reads them
(`read_request`); the engines are asked in their order and the first to claim an
object reads it.

Per-position counts come from the histogram (or the per-step list): the draft tokens at
position i (0-based) accepted in a step are the steps that accepted more than i, since a
draft is accepted as a prefix. The records' counters are summed as integers, so a group's
acceptance is exact to the token.

`parse_request_line` is pure; `RequestSource` reads a file once, follows it as it grows
(rotation and truncation as for log files), or reads stdin.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError, InputError
from specprobe.monitor.base import IngestResult, Store, Warn
from specprobe.monitor.dialects import dialects
from specprobe.monitor.logs import LogSource
from specprobe.monitor.records import MalformedLine, RequestRecord
from specprobe.monitor.windows import ModelData, RequestPoint

ALL = "all"  # the row that sums every group
NO_VALUE = "(none)"  # a record without the group-by field
_MAX_DEPTH = 12
_TRT_TS = re.compile(r"^(\d{2})-(\d{2})-(\d{4}) (\d{2}:\d{2}:\d{2}(?:\.\d+)?)$")
_TIME_KEYS = ("ts", "timestamp", "@timestamp", "time", "end_time", "finished_at")
# A string field holding a JSON document (a gateway logging the response body as text)
# is opened when it names one of these.
# (each engine's REQUEST_MARKER)


# ----------------------------------------------------------------------------- finding the response
def _markers() -> tuple[str, ...]:
    return tuple(m.REQUEST_MARKER for _, _, m in dialects() if hasattr(m, "REQUEST_MARKER"))


def _walk(obj: Any, depth: int = 0) -> Iterator[dict[str, Any]]:
    if depth > _MAX_DEPTH:
        return
    if isinstance(obj, dict):
        yield obj
        values: Iterable[Any] = obj.values()
    elif isinstance(obj, list):
        values = obj
    else:
        return
    for v in values:
        if isinstance(v, (dict, list)):
            yield from _walk(v, depth + 1)
        elif isinstance(v, str) and v[:1] in "{[" and any(m in v for m in _markers()):
            try:
                inner = json.loads(v)
            except ValueError:
                continue
            yield from _walk(inner, depth + 1)


def _sum(records: list[RequestRecord]) -> RequestRecord:
    if len(records) == 1:
        return records[0]

    def add(vals: list[int | None]) -> int | None:
        return None if any(v is None for v in vals) else sum(v for v in vals if v is not None)

    depth = max(len(r.accepted_per_pos) for r in records)
    per_pos = tuple(sum(r.accepted_per_pos[i] if i < len(r.accepted_per_pos) else 0 for r in records) for i in range(depth)) \
        if all(r.accepted_per_pos for r in records) else ()
    return RequestRecord(records[0].engine, sum(r.accepted for r in records), add([r.drafted for r in records]),
                         add([r.steps for r in records]), per_pos, records[0].num_spec_tokens)


def _parse_time(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)) and math.isfinite(v) and v > 0:
        return v / 1000.0 if v > 1e11 else float(v)  # epoch milliseconds
    if isinstance(v, str) and v:
        text = v.strip().replace("Z", "+00:00")
        m = _TRT_TS.match(text)
        if m:  # TensorRT-LLM's iteration stats: "MM-DD-YYYY HH:MM:SS" (local time)
            mo, day, year, rest = m.groups()
            text = f"{year}-{mo}-{day} {rest}"
        try:
            dt = datetime.fromisoformat(text)
        except ValueError:
            try:
                return _parse_time(float(text))
            except ValueError:
                return None
        return dt.timestamp()
    return None


def record_time(obj: Mapping[str, Any], time_field: str | None = None) -> float | None:
    """The request's time: `time_field` (a dotted path) when given, else the line's own
    ts/timestamp/time, else an OpenAI-style response's `created` (epoch seconds)."""
    if time_field:
        return _parse_time(lookup(obj, time_field))
    for key in _TIME_KEYS:
        t = _parse_time(obj.get(key))
        if t is not None:
            return t
    for d in _walk(obj):
        if "created" in d and ("choices" in d or "object" in d):
            t = _parse_time(d.get("created"))
            if t is not None:
                return t
    return None


def lookup(obj: Any, path: str) -> Any:
    """A dotted path into nested objects ('metadata.tenant'); list items by index."""
    cur = obj
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            return None
    return cur


def check_field_path(path: str, flag: str) -> str:
    parts = path.split(".")
    if not path or any(not p.strip() for p in parts):
        raise ConfigError(f"{flag} {path!r} is not a field path", "write a field name or a dotted path, e.g. task or metadata.tenant")
    return path


def group_value(obj: Mapping[str, Any], path: str) -> str:
    v = lookup(obj, path)
    if v is None or v == "":
        return NO_VALUE
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(",", ":"))[:60]
    return str(v)


def _iter_time(x: Any) -> dict[str, Any]:
    if isinstance(x, str):
        try:
            x = json.loads(x)
        except ValueError:
            return {}
    return {"timestamp": x["timestamp"]} if isinstance(x, dict) and x.get("timestamp") else {}


def parse_request_line(line: str, *, num_spec_tokens: int | None = None, time_field: str | None = None) -> RequestRecord | None:
    """One JSON line → its request's counters; None for a line with no engine's
    speculative-decoding fields (a request served without drafting, another log line).
    Raises MalformedLine for a line that is not JSON or whose counters make no sense."""
    text = line.strip()
    if not text:
        return None
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise MalformedLine(f"not JSON ({e})") from None
    if isinstance(obj, list) and all(isinstance(x, (dict, str)) for x in obj):
        # a /metrics poll of TensorRT-LLM: a list of iteration stats (or their JSON texts)
        obj = {"iterations": obj, **next((_iter_time(x) for x in reversed(obj) if _iter_time(x)), {})}
    if not isinstance(obj, dict):
        raise MalformedLine(f"a JSON {type(obj).__name__}, not an object")
    found: dict[str, list[RequestRecord]] = {}
    seen: set[int] = set()
    for d in _walk(obj):
        if id(d) in seen:
            continue
        seen.add(id(d))
        for _, family, mod in dialects():
            counters = mod.request_counters(d) if hasattr(mod, "request_counters") else None
            if counters is None:
                continue
            if counters is not d:
                seen.add(id(counters))
            read = mod.read_request(counters, num_spec_tokens)
            if read is not None:
                found.setdefault(family, []).append(read)
            break
    if not found:
        return None
    if len(found) > 1:
        raise MalformedLine(f"the line carries counters of more than one engine ({', '.join(sorted(found))})")
    rec = _sum(next(iter(found.values())))
    if rec.drafted is not None and rec.accepted > rec.drafted:
        raise MalformedLine(f"accepted ({rec.accepted}) exceeds drafted ({rec.drafted})")
    return RequestRecord(rec.engine, rec.accepted, rec.drafted, rec.steps, rec.accepted_per_pos,
                         rec.num_spec_tokens or num_spec_tokens, record_time(obj, time_field), obj)


def to_point(rec: RequestRecord, t: float) -> RequestPoint:
    return RequestPoint(t=t, accepted=rec.accepted, drafted=rec.drafted, steps=rec.steps, per_pos=rec.accepted_per_pos)


# ----------------------------------------------------------------------------- the source
class RequestSource(LogSource):
    """A JSON-lines file of requests (read once, or followed like `tail -F`) or '-' for
    stdin. Each record is added to its group (`FIELD=value`) and to the `all` row."""

    def __init__(self, path: str, follow: bool = False, *, group_by: str | None = None,
                 num_spec_tokens: int | None = None, time_field: str | None = None) -> None:
        if path != "-":
            p = Path(path)
            if not p.exists():
                raise InputError(f"requests file {path} does not exist", "pass an existing JSON-lines file to --requests, or '-' for stdin")
            if p.is_dir():
                raise InputError(f"requests file {path} is a directory", "pass a JSON-lines file to --requests")
        super().__init__(path, follow=follow, model=ALL)
        self.kind = "requests"
        self.group_by = group_by
        self.num_spec_tokens = num_spec_tokens
        self.time_field = time_field
        self.records = 0
        self.without_counters = 0  # JSON lines with no engine's counters (no drafting)

    def label(self, rec: RequestRecord) -> str:
        if not self.group_by:
            return ALL
        return f"{self.group_by}={group_value(rec.fields or {}, self.group_by)}"

    def poll(self, t: float, store: Store, warn: Warn, **_: Any) -> IngestResult:
        res = IngestResult(None, set())
        engines: set[str] = set()
        for line in self._new_lines():
            self.lines_read += 1
            try:
                rec = parse_request_line(line, num_spec_tokens=self.num_spec_tokens, time_field=self.time_field)
            except MalformedLine as e:
                res.malformed += 1
                warn(f"malformed-line:{self.name}", f"{self.name}: skipping malformed line {self.lines_read} ({e}): {line.strip()[:120]}")
                continue
            if rec is None:
                if line.strip():
                    self.without_counters += 1
                continue
            self.records += 1
            engines.add(rec.engine)
            point = to_point(rec, rec.t if rec.t is not None else t)
            for label in dict.fromkeys((ALL, self.label(rec))):
                data = store.setdefault(label, ModelData())
                data.sources.add(self.name)
                if rec.num_spec_tokens and not data.num_spec_tokens:
                    data.num_spec_tokens = rec.num_spec_tokens
                data.add_request(point)
                res.models.add(label)
        if engines:
            self.detected = ",".join(sorted(engines | set((self.detected or "").split(",")) - {""}))
        res.engine = self.detected
        return res
