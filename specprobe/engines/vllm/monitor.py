"""vLLM in production, as `specprobe monitor` and `specprobe alerts` read it: its
Prometheus metric names (V1 and V0), its log lines ("SpecDecoding metrics" of V1,
"Speculative metrics" of V0) and what each one counts.

Per-request records (`specprobe monitor --requests`), vLLM, `--per-request-spec-decode-metrics summary|detailed`: the response's
`metrics.speculative_decoding` object — `num_spec_steps` (verify steps),
`num_draft_tokens`, `num_accepted_draft_tokens` (bonus not included),
`num_spec_tokens` (K), `mean_acceptance_length`, `draft_acceptance_rate`,
`acceptance_histogram` (a dense list of K + 1 buckets: index j counts the steps that
accepted exactly j draft tokens), `acceptance_histogram_by_draft_length` and, with
`detailed`, the ordered `per_step_accepted` / `per_step_drafted`. Earlier builds of the
same feature attached it to each choice as `speculative_decoding_stats`, with the
histogram as a sparse mapping {"j": steps}; both shapes are read.
"""

from __future__ import annotations

import re
from typing import Any

from specprobe.engines.vllm import ENGINE  # its known bugs
from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.records import (
    LogRecord,
    LogState,
    MalformedLine,
    RequestRecord,
    count,
    histogram,
    line_time,
    need,
    per_pos_from_histogram,
    per_pos_from_steps,
)
from specprobe.monitor.windows import ModelData, pos_key

# ----------------------------------------------------------------------------- /metrics
# Counter names without the `_total` suffix the client library adds on exposition.
COUNTERS = {
    "vllm:spec_decode_num_drafts": windows.DRAFTS,
    "vllm:spec_decode_num_draft_tokens": windows.DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens": windows.ACCEPTED,
    "vllm:spec_decode_num_emitted_tokens": windows.EMITTED,  # V0
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GAUGES = {
    "vllm:spec_decode_draft_acceptance_rate": windows.GAUGE_ACCEPT_RATE,  # V0
    "vllm:spec_decode_efficiency": windows.GAUGE_EFFICIENCY,  # V0
}
# the gauges a Prometheus server's windows average (V0's efficiency is only K's source)
PROM_GAUGES = {"vllm:spec_decode_draft_acceptance_rate": windows.GAUGE_ACCEPT_RATE}
V1_REQUIRED = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
V0_REQUIRED = ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_emitted_tokens")
EXPECTED = list(V1_REQUIRED)  # what a vLLM that exports nothing of spec decoding should
GLOB = "vllm:spec_decode_*"
REQUIRED = {"vllm-v1": (*V1_REQUIRED, PER_POS), "vllm-v0": V0_REQUIRED}


def detect(names: set[str]) -> str | None:
    """vllm-v1 | vllm-v0 from one scrape's metric names; None: not vLLM's."""
    if any(n.startswith("vllm:spec_decode") for n in names):
        return "vllm-v1" if "vllm:spec_decode_num_drafts" in names else "vllm-v0"
    return None


def k_from_totals(detected: str, totals: dict[str, float]) -> int | None:
    """K from one model's cumulative numbers in a scrape (V0 only)."""
    if detected != "vllm-v0":
        return None
    return v0_num_spec_tokens(totals.get(windows.DRAFT_TOKENS), totals.get(windows.EMITTED), totals.get(windows.GAUGE_EFFICIENCY))


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


# ----------------------------------------------------------------------------- `specprobe alerts`
RULES: dict[str, Any] = {
    "by": "model_name",
    "counters": {
        "accepted": "vllm:spec_decode_num_accepted_tokens_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "drafts": "vllm:spec_decode_num_drafts_total",
    },
    "per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "gauges": None,
    "engine_label": True,
}

# ----------------------------------------------------------------------------- logs
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
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


def parse_log_line(line: str) -> LogRecord | None:
    """A V1 "SpecDecoding metrics:" or V0 "Speculative metrics:" line → its record."""
    if "SpecDecoding metrics:" in line:
        head, body = line.split("SpecDecoding metrics:", 1)
        f: dict[str, Any] = {
            "accepted": int(need(_V1["accepted"], body, "'Accepted: N tokens'")),
            "drafted": int(need(_V1["drafted"], body, "'Drafted: N tokens'")),
        }
        m = _V1["mean_len"].search(body)
        f["mean_len"] = float(m.group(1)) if m else None
        m = _V1["per_pos"].search(body)
        f["per_pos"] = [float(x) for x in re.split(r",\s*", m.group(1))] if m else []
        return LogRecord("vllm-v1", f, line_time(head))
    if "Speculative metrics:" in line:
        head, body = line.split("Speculative metrics:", 1)
        f = {key: need(rx, body, key) for key, rx in _V0.items()}
        return LogRecord(
            "vllm-v0",
            {"rate": float(f["rate"]), "efficiency": float(f["efficiency"]), "k": int(f["k"]),
             "accepted": int(f["accepted"]), "drafted": int(f["drafted"]), "emitted": int(f["emitted"])},
            line_time(head),
        )
    return None


# its startup lines: "vLLM API server version 0.32.0", "Automatically detected platform cpu."
_VERSION = re.compile(r"vLLM API server version (\S+)")
_PLATFORM = re.compile(r"Automatically detected platform (\w+)")


def notice(line: str, state: LogState) -> tuple[str, str] | None:
    """Read the server's version and platform from its startup lines; once both are known
    and a known bug of that release applies, its one-line warning (key, message)."""
    m = _VERSION.search(line) if "server version" in line else _PLATFORM.search(line) if "detected platform" in line else None
    if m is None:
        return None
    seen: dict[str, str] = state.scratch.setdefault(__name__, {})
    seen["version" if m.re is _VERSION else "platform"] = m.group(1)
    for bug in ENGINE.known_bugs:
        if bug.affects(seen.get("version"), seen.get("platform")):
            return (f"known-bug:{bug.name}", f"vLLM {seen['version']} on {seen['platform'].upper()}: {bug.effect} ({bug.condition}); workaround: {bug.workaround}")
    return None


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
        data.add_event(windows.ACCEPTED, t, f["accepted"])
        data.add_event(windows.DRAFT_TOKENS, t, f["drafted"])
        if drafts is not None:
            data.add_event(windows.DRAFTS, t, drafts)
            for i, r in enumerate(f["per_pos"]):
                data.add_event(pos_key(i), t, r * drafts)
    elif rec.kind == "vllm-v0":
        # V0 logs cumulative totals since start: counters (a restart shows as a reset).
        data.num_spec_tokens = f["k"]
        data.add_counter(windows.ACCEPTED, series, t, f["accepted"])
        data.add_counter(windows.DRAFT_TOKENS, series, t, f["drafted"])
        data.add_counter(windows.EMITTED, series, t, f["emitted"])


# ----------------------------------------------------------------------------- request records
REQUEST_MARKER = "num_accepted_draft_tokens"  # a string field holding a response is opened when it names this


def request_counters(d: dict[str, Any]) -> dict[str, Any] | None:
    """`metrics.speculative_decoding` (or a choice's `speculative_decoding_stats`): the
    object itself, when it is one."""
    return d if "num_accepted_draft_tokens" in d and ("num_spec_steps" in d or "num_draft_tokens" in d) else None


def read_request(d: dict[str, Any], num_spec_tokens: int | None, where: str = "speculative_decoding") -> RequestRecord:
    """One response's counters, saved (`monitor --requests`) or live (`diagnose --against`)."""
    return _vllm(d, where)


def _vllm(d: dict[str, Any], where: str) -> RequestRecord:
    accepted = count(d, "num_accepted_draft_tokens", where) or 0
    drafted = count(d, "num_draft_tokens", where)
    steps = count(d, "num_spec_steps", where)
    k = count(d, "num_spec_tokens", where)
    per_step = d.get("per_step_accepted")
    per_pos: tuple[int, ...] = ()
    if isinstance(per_step, list):
        counts = [count({"v": v}, "v", f"{where}.per_step_accepted") or 0 for v in per_step]
        if sum(counts) != accepted:
            raise MalformedLine(f"{where}.per_step_accepted sums to {sum(counts)}, not num_accepted_draft_tokens {accepted}")
        per_pos = per_pos_from_steps(counts, k)
        steps = steps if steps is not None else len(counts)
    else:
        hist = histogram(d.get("acceptance_histogram"), f"{where}.acceptance_histogram")
        if hist:
            if sum(j * n for j, n in enumerate(hist)) != accepted:
                raise MalformedLine(f"{where}.acceptance_histogram counts {sum(j * n for j, n in enumerate(hist))} accepted tokens, not {accepted}")
            per_pos = per_pos_from_histogram(hist, k)
            steps = steps if steps is not None else sum(hist)
    return RequestRecord("vllm", accepted, drafted, steps, per_pos, k)
