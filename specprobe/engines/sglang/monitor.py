"""SGLang in production, as `specprobe monitor` and `specprobe alerts` read it: its
Prometheus metric names and its "Decode batch … accept len" log lines.

Per-request records (`specprobe monitor --requests`), SGLang: the response's `meta_info` — `spec_verify_ct` (verify steps), and in newer
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
"""

from __future__ import annotations

import re
from typing import Any

from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.records import (
    LogRecord,
    LogState,
    MalformedLine,
    RequestRecord,
    count,
    first_count,
    histogram,
    line_time,
    need,
    per_pos_from_histogram,
)
from specprobe.monitor.windows import ModelData

# ----------------------------------------------------------------------------- /metrics
GAUGES = {
    "sglang:spec_accept_length": windows.GAUGE_ACCEPT_LEN,  # bonus token included
    "sglang:spec_accept_rate": windows.GAUGE_ACCEPT_RATE,
}
PROM_GAUGES = GAUGES
# Newer SGLang: verify steps as a counter (one per draft, added when a request finishes)
# and the active draft shape as gauges (adaptive speculation changes them at run time).
COUNTERS = {"sglang:spec_verify_calls": windows.DRAFTS}
PER_POS = None
NUM_STEPS = "sglang:spec_num_steps"  # draft depth K of a chain
NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"  # tokens per verify, root included: K + 1 for a chain
SHAPES = (NUM_STEPS, NUM_DRAFT_TOKENS)
EXPECTED = ["sglang:spec_accept_length"]
GLOB = "sglang:spec_accept_*"
REQUIRED = {"sglang": ("sglang:spec_accept_length",)}


def detect(names: set[str]) -> str | None:
    if any(n.startswith("sglang:spec_accept") or n == "sglang:spec_verify_calls" for n in names):
        return "sglang"
    return None


def k_from_shapes(shape: dict[str, float]) -> int | None:
    return num_spec_tokens(shape.get(NUM_STEPS), shape.get(NUM_DRAFT_TOKENS))


def num_spec_tokens(num_steps: float | None, num_draft_tokens: float | None) -> int | None:
    """K, the drafted tokens per verify of a chain, from SGLang's draft-shape gauges:
    the step count, else the tokens per verify less the root token (0 = not speculating)."""
    if num_steps and num_steps >= 1:
        return int(num_steps)
    if num_draft_tokens and num_draft_tokens >= 2:
        return int(num_draft_tokens) - 1
    return None


# ----------------------------------------------------------------------------- `specprobe alerts`
RULES: dict[str, Any] = {
    "by": "model_name",
    "counters": None,
    "per_pos": None,
    "gauges": {"accept_rate": "sglang:spec_accept_rate", "accept_len": "sglang:spec_accept_length"},
}

# ----------------------------------------------------------------------------- logs
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_LEN = re.compile(r"accept len: " + _NUM)
_RATE = re.compile(r"accept rate: " + _NUM)


def parse_log_line(line: str) -> LogRecord | None:
    if "Decode batch" in line and "accept len" in line:
        head = line.split("Decode batch", 1)[0]
        length = float(need(_LEN, line, "'accept len: X'"))
        m = _RATE.search(line)
        return LogRecord("sglang", {"accept_len": length, "accept_rate": float(m.group(1)) if m else None}, line_time(head))
    return None


def apply_record(rec: LogRecord, t: float, data: ModelData, state: LogState, series: str) -> None:
    f = rec.fields
    data.add_gauge(windows.GAUGE_ACCEPT_LEN, series, t, f["accept_len"])
    if f["accept_rate"] is not None:
        data.add_gauge(windows.GAUGE_ACCEPT_RATE, series, t, f["accept_rate"])


# ----------------------------------------------------------------------------- request records
REQUEST_MARKER = "spec_verify_ct"


def request_counters(d: dict[str, Any]) -> dict[str, Any] | None:
    """The response's `meta_info`, when `d` is one."""
    return d if "spec_verify_ct" in d else None


def read_request(d: dict[str, Any], num_spec_tokens: int | None) -> RequestRecord | None:
    return _sglang(d, "meta_info", num_spec_tokens)


def _sglang(d: dict[str, Any], where: str, k: int | None) -> RequestRecord | None:
    steps = count(d, "spec_verify_ct", where)
    accepted = first_count(d, ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num", "spec_accepted_tokens"), where)
    drafted = first_count(d, ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"), where)
    completion = count(d, "completion_tokens", where)
    if steps == 0 and not accepted and not drafted:
        return None  # never verified a draft (finished at prefill, or speculation off)
    if accepted is None:
        if completion is None or steps is None:
            raise MalformedLine(f"{where} has spec_verify_ct but neither accepted drafts nor completion_tokens")
        # spec_accept_length = completion_tokens / spec_verify_ct: each step yields its
        # accepted drafts and one token of the target's own.
        accepted = max(0, completion - steps)
    hist = histogram(d.get("spec_correct_drafts_histogram", d.get("spec_accept_histogram")), f"{where}.spec_correct_drafts_histogram")
    if drafted is None and steps is not None and k:
        drafted = steps * k
    per_step_k = drafted // steps if drafted is not None and steps else k
    per_pos = per_pos_from_histogram(hist, per_step_k) if hist else ()
    return RequestRecord("sglang", accepted, drafted, steps, per_pos, per_step_k)
