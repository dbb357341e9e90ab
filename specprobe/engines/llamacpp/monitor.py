"""llama.cpp's server (and its speculative example) in production, as `specprobe
monitor` and `specprobe alerts` read it: its Prometheus metric names (`--metrics`) and
its log lines.

The server logs one summary per finished request. Older builds write
`draft acceptance rate = 0.57576 (   57 accepted /    99 generated)`; newer ones write
`draft acceptance = 0.57576 (   57 accepted /    99 generated), mean len =  1.71` and, at
trace verbosity (`-lv 4`), `acc per pos = (0.700, 0.450, …)` — accepted at each draft
position ÷ verify steps, one entry per position up to K. Accepted and drafted tokens are
exact; the verify-step count (drafts) is recovered from the rounded mean length and the
per-position rates (`fit_drafts`). The speculative example prints `n_draft`,
`n_drafted` and `n_accept` on lines of their own.

Per-request records (`specprobe monitor --requests`), llama.cpp's server: the response's `timings.draft_n` (drafted) and
`timings.draft_n_accepted`; it does not report the verify steps, so the mean
acceptance length is not known.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.records import (
    LogRecord,
    LogState,
    MalformedLine,
    RequestRecord,
    count,
    line_time,
)
from specprobe.monitor.windows import ModelData, pos_key

# ----------------------------------------------------------------------------- /metrics
# llama.cpp's server (`--metrics`, builds from 2025 on): the vLLM V1 set under its own prefix.
COUNTERS = {
    "llamacpp:spec_decode_num_drafts": windows.DRAFTS,
    "llamacpp:spec_decode_num_draft_tokens": windows.DRAFT_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens": windows.ACCEPTED,
}
PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
GAUGES: dict[str, str] = {}
PROM_GAUGES: dict[str, str] = {}
REQUIRED_NAMES = tuple(COUNTERS)
EXPECTED = list(REQUIRED_NAMES)
GLOB = "llamacpp:spec_decode_*"
REQUIRED = {"llamacpp": REQUIRED_NAMES}


def detect(names: set[str]) -> str | None:
    if any(n.startswith("llamacpp:spec_decode") for n in names):
        return "llamacpp"
    return None


def exports_without_spec(names: set[str]) -> bool:
    """A llama.cpp server without a draft model, or a build older than its spec_decode
    counters, still exports llamacpp:* names."""
    return any(n.startswith("llamacpp:") for n in names)


# ----------------------------------------------------------------------------- `specprobe alerts`
RULES: dict[str, Any] = {
    "by": "instance",  # the server has no model label: per scraped instance
    "counters": {
        "accepted": "llamacpp:spec_decode_num_accepted_tokens_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "drafts": "llamacpp:spec_decode_num_drafts_total",
    },
    "per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    "gauges": None,
}

# ----------------------------------------------------------------------------- logs
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_OLD = re.compile(r"draft acceptance rate = " + _NUM + r"\s*\(\s*(\d+) accepted\s*/\s*(\d+) generated\)")
_NEW = re.compile(
    r"draft acceptance = " + _NUM + r"\s*\(\s*(\d+) accepted\s*/\s*(\d+) generated\)(?:,\s*mean len =\s*" + _NUM + ")?"
)
_POS = re.compile(r"acc per pos = \(([^)]*)\)")
_EXAMPLE = re.compile(r"\b(n_draft|n_drafted|n_accept)\s*=\s*(\d+)\s*$")


def parse_log_line(line: str) -> LogRecord | None:
    if "draft acceptance rate =" in line:
        m = _OLD.search(line)
        if not m:
            raise MalformedLine("no '(N accepted / M generated)'")
        return LogRecord("llamacpp", {"accepted": int(m.group(2)), "drafted": int(m.group(3))}, line_time(line.split("draft acceptance", 1)[0]))
    if "draft acceptance =" in line:
        m = _NEW.search(line)
        if not m:
            raise MalformedLine("no '(N accepted / M generated)'")
        f: dict[str, Any] = {"accepted": int(m.group(2)), "drafted": int(m.group(3))}
        if m.group(4) is not None:
            f["mean_len"] = float(m.group(4))
        return LogRecord("llamacpp", f, line_time(line.split("draft acceptance", 1)[0]))
    if "acc per pos =" in line:
        m = _POS.search(line)
        if not m:
            raise MalformedLine("no '(r1, r2, …)'")
        body = m.group(1).strip()
        try:
            rates = [float(x) for x in body.split(",")] if body else []
        except ValueError as e:
            raise MalformedLine(f"bad per-position rate in ({body[:40]})") from e
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise MalformedLine("per-position rate outside [0, 1]")
        return LogRecord("llamacpp-per_pos", {"per_pos": rates}, None)
    m = _EXAMPLE.search(line)
    if m:
        return LogRecord(f"llamacpp-{m.group(1)}", {"value": int(m.group(2))}, None)
    return None


def detected_kind(kind: str) -> str:
    """The engine a record kind shows: llamacpp for all of them."""
    return kind.split("-n_")[0].split("-per_pos")[0]


@dataclass
class _Pending:
    """The last request summary (t, accepted, drafted, mean_len), waiting for its
    per-position line, and the drafts already counted for it (None = not yet)."""

    last: tuple[float, int, int, float | None] | None = None
    drafts: int | None = None
    pos_done: bool = True


def _pending(state: LogState) -> _Pending:
    p = state.scratch.get(__name__)
    if p is None:
        p = state.scratch[__name__] = _Pending()
    return p  # type: ignore[no-any-return]


def fit_drafts(accepted: int, drafted: int, mean_len: float | None, per_pos: list[float] | None = None, k: int | None = None) -> int | None:
    """The verify-step count S of one llama.cpp request, from what its log prints.

    Each step drafts 1..K tokens — K except in a request's last few steps — so
    drafted/K ≤ S ≤ drafted. The server prints mean len = 1 + accepted/S to two
    decimals and each per-position rate count_i/S to three, where count_i (steps that
    accepted more than i tokens) are integers summing to accepted. Of the S in range
    that reproduce the printed numbers, the smallest is taken when K is known (most steps
    draft K), else the one nearest accepted/(mean len − 1). None when nothing pins S
    down (the old format, or no K and nothing accepted)."""
    if drafted <= 0:
        return 0
    k = len(per_pos) if per_pos else k
    lo, hi = (math.ceil(drafted / k), drafted) if k else (1, drafted)
    if mean_len is None or (accepted == 0 and not k):
        return None
    if accepted == 0:
        return lo  # nothing accepted: the printed numbers say nothing about S

    def printed_len(s: int) -> bool:
        return f"{1.0 + accepted / s:.2f}" == f"{mean_len:.2f}"

    def printed_rates(s: int) -> bool:
        if not per_pos:
            return True
        cmin = [max(0, math.ceil((r - 0.0005) * s - 1e-9)) for r in per_pos]
        cmax = [min(s, math.floor((r + 0.0005) * s + 1e-9)) for r in per_pos]
        return all(a <= b for a, b in zip(cmin, cmax, strict=True)) and sum(cmin) <= accepted <= sum(cmax)

    # mean len bounds S to accepted/(excess ± 0.005): search only there.
    excess = mean_len - 1.0
    lo = max(lo, math.floor(accepted / (excess + 0.0051)))
    if excess > 0.0051:
        hi = min(hi, math.ceil(accepted / (excess - 0.0051)))
    fits = [s for s in range(max(lo, 1), hi + 1) if printed_len(s) and printed_rates(s)]
    if not fits:
        return None
    if k:
        return fits[0]
    centre = accepted / excess if excess > 0 else float(fits[0])
    return min(fits, key=lambda s: abs(s - centre))


def flush(data: ModelData, state: LogState) -> None:
    """Count the drafts of the last request from its mean length alone."""
    p = _pending(state)
    if p.last is None or p.drafts is not None:
        return
    t, accepted, drafted, mean_len = p.last
    s = fit_drafts(accepted, drafted, mean_len, k=state.k)
    p.drafts = s if s is not None else -1
    if s is not None:
        data.add_event(windows.DRAFTS, t, s)


def apply_record(rec: LogRecord, t: float, data: ModelData, state: LogState, series: str) -> None:
    f = rec.fields
    p = _pending(state)
    if rec.kind == "llamacpp":
        flush(data, state)  # the previous request had no per-position line
        data.add_event(windows.ACCEPTED, t, f["accepted"])
        data.add_event(windows.DRAFT_TOKENS, t, f["drafted"])
        p.last = (t, f["accepted"], f["drafted"], f.get("mean_len"))
        p.drafts = None
        p.pos_done = False
    elif rec.kind == "llamacpp-per_pos":
        if p.last is None or p.pos_done or not f["per_pos"]:
            return
        t0, accepted, drafted, mean_len = p.last
        per_pos = f["per_pos"]
        state.k = len(per_pos)
        data.num_spec_tokens = data.num_spec_tokens or len(per_pos)
        s = p.drafts
        if s is None:  # not counted yet: the per-position rates sharpen the fit
            s = fit_drafts(accepted, drafted, mean_len, per_pos)
            p.drafts = s if s is not None else -1
            if s is not None:
                data.add_event(windows.DRAFTS, t0, s)
        if s is not None and s > 0:
            for i, r in enumerate(per_pos):
                data.add_event(pos_key(i), t0, round(r * s))
        p.pos_done = True
    elif rec.kind == "llamacpp-n_draft":
        state.k = f["value"]
    elif rec.kind == "llamacpp-n_drafted":
        state.pending_drafted = f["value"]
    elif rec.kind == "llamacpp-n_accept" and state.pending_drafted is not None:
        data.add_event(windows.ACCEPTED, t, f["value"])
        data.add_event(windows.DRAFT_TOKENS, t, state.pending_drafted)
        state.pending_drafted = None


# ----------------------------------------------------------------------------- request records
REQUEST_MARKER = "draft_n_accepted"


def request_counters(d: dict[str, Any]) -> dict[str, Any] | None:
    """The response's `timings`, when `d` is one."""
    return d if "draft_n" in d and "draft_n_accepted" in d else None


def read_request(d: dict[str, Any], num_spec_tokens: int | None) -> RequestRecord:
    return _llamacpp(d, "timings")


def _llamacpp(d: dict[str, Any], where: str) -> RequestRecord:
    drafted = count(d, "draft_n", where)
    accepted = count(d, "draft_n_accepted", where) or 0
    return RequestRecord("llamacpp", accepted, drafted, None)
