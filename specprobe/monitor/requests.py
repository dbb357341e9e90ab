"""Per-request records: one JSON object a line (a gateway's request log, the engine's
responses saved as they come), the engine's own per-request speculative-decoding counters
found anywhere in the line by their fields, grouped by a field of the line (`task`,
`metadata.tenant`).

What each engine writes into a response:

- vLLM, `--per-request-spec-decode-metrics summary|detailed`: the response's
  `metrics.speculative_decoding` object — `num_spec_steps` (verify steps),
  `num_draft_tokens`, `num_accepted_draft_tokens` (bonus not included),
  `num_spec_tokens` (K), `mean_acceptance_length`, `draft_acceptance_rate`,
  `acceptance_histogram` (a dense list of K + 1 buckets: index j counts the steps that
  accepted exactly j draft tokens), `acceptance_histogram_by_draft_length` and, with
  `detailed`, the ordered `per_step_accepted` / `per_step_drafted`. Earlier builds of the
  same feature attached it to each choice as `speculative_decoding_stats`, with the
  histogram as a sparse mapping {"j": steps}; both shapes are read.
- SGLang: the response's `meta_info` — `spec_verify_ct` (verify steps), and in newer
  builds `spec_num_correct_drafts` / `spec_num_proposed_drafts` (older names
  `spec_accept_token_num` / `spec_draft_token_num`, the aliases `spec_accepted_drafts` /
  `spec_proposed_drafts`), `spec_accept_rate`, `spec_accept_length`
  (completion_tokens ÷ verify steps, bonus included) and
  `spec_correct_drafts_histogram` (alias `spec_accept_histogram`, index j = steps that
  accepted j drafts). The oldest builds give only `spec_verify_ct` next to
  `completion_tokens`: accepted = completion tokens − verify steps (the count SGLang's
  own accept length implies; it counts the prefill's first token too, so this is at most
  one token a request high), drafted = steps × K with K from `--num-spec-tokens`. A
  request with `spec_verify_ct` 0 never verified a draft and is no record.
- llama.cpp's server: the response's `timings.draft_n` (drafted) and
  `timings.draft_n_accepted`; it does not report the verify steps, so the mean
  acceptance length is not known.
- TensorRT-LLM: an iteration's stats (`LLM.get_stats()`, trtllm-serve's `/metrics`
  JSON) carry `specDecodingStats` — `numDraftTokens`, `numAcceptedTokens`,
  `numRequestsWithDraftTokens` (each verifies once in the iteration: the steps) and
  `acceptanceLength` (1 + accepted ÷ those requests). Such a record is one iteration of
  the whole batch, not one request; a line holding a JSON array (one `/metrics` poll) is
  the sum of its iterations.

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
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError, InputError
from specprobe.monitor.base import IngestResult, Store, Warn
from specprobe.monitor.logs import LogSource
from specprobe.monitor.records import MalformedLine
from specprobe.monitor.windows import ModelData, RequestPoint

ALL = "all"  # the row that sums every group
NO_VALUE = "(none)"  # a record without the group-by field
_MAX_DEPTH = 12
_TRT_TS = re.compile(r"^(\d{2})-(\d{2})-(\d{4}) (\d{2}:\d{2}:\d{2}(?:\.\d+)?)$")
_TIME_KEYS = ("ts", "timestamp", "@timestamp", "time", "end_time", "finished_at")
# A string field holding a JSON document (a gateway logging the response body as text)
# is opened when it names one of these.
_MARKERS = ("num_accepted_draft_tokens", "spec_verify_ct", "draft_n_accepted", "specDecodingStats")


@dataclass(frozen=True)
class RequestRecord:
    engine: str  # vllm | sglang | llamacpp | trtllm
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


# ----------------------------------------------------------------------------- finding the response
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
        elif isinstance(v, str) and v[:1] in "{[" and any(m in v for m in _MARKERS):
            try:
                inner = json.loads(v)
            except ValueError:
                continue
            yield from _walk(inner, depth + 1)


def _int(d: Mapping[str, Any], key: str, where: str) -> int | None:
    if key not in d or d[key] is None:
        return None
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or v != int(v):
        raise MalformedLine(f"{where}.{key} is {v!r}, not a count")
    return int(v)


def _first_int(d: Mapping[str, Any], keys: tuple[str, ...], where: str) -> int | None:
    for k in keys:
        v = _int(d, k, where)
        if v is not None:
            return v
    return None


def _histogram(raw: Any, where: str) -> list[int] | None:
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
            dense[j] = _int({"v": v}, "v", where) or 0
        return dense
    if isinstance(raw, list):
        return [_int({"v": v}, "v", where) or 0 for v in raw]
    raise MalformedLine(f"{where} is a {type(raw).__name__}, not a list")


def _per_pos_from_hist(hist: list[int], k: int | None) -> tuple[int, ...]:
    """Accepted at position i = steps that accepted more than i draft tokens."""
    depth = max(len(hist) - 1, k or 0)
    return tuple(sum(hist[i + 1:]) for i in range(depth))


def _per_pos_from_steps(per_step: list[int], k: int | None) -> tuple[int, ...]:
    depth = max(max(per_step, default=0), k or 0)
    return tuple(sum(1 for a in per_step if a > i) for i in range(depth))


def _vllm(d: dict[str, Any], where: str) -> RequestRecord:
    accepted = _int(d, "num_accepted_draft_tokens", where) or 0
    drafted = _int(d, "num_draft_tokens", where)
    steps = _int(d, "num_spec_steps", where)
    k = _int(d, "num_spec_tokens", where)
    per_step = d.get("per_step_accepted")
    per_pos: tuple[int, ...] = ()
    if isinstance(per_step, list):
        counts = [_int({"v": v}, "v", f"{where}.per_step_accepted") or 0 for v in per_step]
        if sum(counts) != accepted:
            raise MalformedLine(f"{where}.per_step_accepted sums to {sum(counts)}, not num_accepted_draft_tokens {accepted}")
        per_pos = _per_pos_from_steps(counts, k)
        steps = steps if steps is not None else len(counts)
    else:
        hist = _histogram(d.get("acceptance_histogram"), f"{where}.acceptance_histogram")
        if hist:
            if sum(j * n for j, n in enumerate(hist)) != accepted:
                raise MalformedLine(f"{where}.acceptance_histogram counts {sum(j * n for j, n in enumerate(hist))} accepted tokens, not {accepted}")
            per_pos = _per_pos_from_hist(hist, k)
            steps = steps if steps is not None else sum(hist)
    return RequestRecord("vllm", accepted, drafted, steps, per_pos, k)


def _sglang(d: dict[str, Any], where: str, k: int | None) -> RequestRecord | None:
    steps = _int(d, "spec_verify_ct", where)
    accepted = _first_int(d, ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num", "spec_accepted_tokens"), where)
    drafted = _first_int(d, ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"), where)
    completion = _int(d, "completion_tokens", where)
    if steps == 0 and not accepted and not drafted:
        return None  # never verified a draft (finished at prefill, or speculation off)
    if accepted is None:
        if completion is None or steps is None:
            raise MalformedLine(f"{where} has spec_verify_ct but neither accepted drafts nor completion_tokens")
        # spec_accept_length = completion_tokens / spec_verify_ct: each step yields its
        # accepted drafts and one token of the target's own.
        accepted = max(0, completion - steps)
    hist = _histogram(d.get("spec_correct_drafts_histogram", d.get("spec_accept_histogram")), f"{where}.spec_correct_drafts_histogram")
    if drafted is None and steps is not None and k:
        drafted = steps * k
    per_step_k = drafted // steps if drafted is not None and steps else k
    per_pos = _per_pos_from_hist(hist, per_step_k) if hist else ()
    return RequestRecord("sglang", accepted, drafted, steps, per_pos, per_step_k)


def _llamacpp(d: dict[str, Any], where: str) -> RequestRecord:
    drafted = _int(d, "draft_n", where)
    accepted = _int(d, "draft_n_accepted", where) or 0
    return RequestRecord("llamacpp", accepted, drafted, None)


def _trtllm(d: dict[str, Any], where: str) -> RequestRecord | None:
    drafted = _int(d, "numDraftTokens", where)
    if not drafted:
        return None  # an iteration without drafting (prefill, or speculation switched off)
    accepted = _int(d, "numAcceptedTokens", where) or 0
    steps = _int(d, "numRequestsWithDraftTokens", where)
    return RequestRecord("trtllm", accepted, drafted, steps or None)


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
        if "num_accepted_draft_tokens" in d and ("num_spec_steps" in d or "num_draft_tokens" in d):
            found.setdefault("vllm", []).append(_vllm(d, "speculative_decoding"))
        elif "spec_verify_ct" in d:
            sgl = _sglang(d, "meta_info", num_spec_tokens)
            if sgl is not None:
                found.setdefault("sglang", []).append(sgl)
        elif "draft_n" in d and "draft_n_accepted" in d:
            found.setdefault("llamacpp", []).append(_llamacpp(d, "timings"))
        elif isinstance(d.get("specDecodingStats"), dict):
            seen.add(id(d["specDecodingStats"]))
            trt = _trtllm(d["specDecodingStats"], "specDecodingStats")
            if trt is not None:
                found.setdefault("trtllm", []).append(trt)
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
