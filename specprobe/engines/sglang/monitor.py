"""SGLang in production, as `specprobe monitor` and `specprobe alerts` read it: its
Prometheus metric names and its "Decode batch … accept len" log lines.
"""

from __future__ import annotations

import re
from typing import Any

from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.records import LogRecord, LogState, line_time, need
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
