"""TensorRT-LLM in production, as `specprobe monitor --requests` reads it.

Per-request records: an iteration's stats (`LLM.get_stats()`, trtllm-serve's `/metrics`
JSON) carry `specDecodingStats` — `numDraftTokens`, `numAcceptedTokens`,
`numRequestsWithDraftTokens` (each verifies once in the iteration: the steps) and
`acceptanceLength` (1 + accepted ÷ those requests). Such a record is one iteration of
the whole batch, not one request; a line holding a JSON array (one `/metrics` poll) is
the sum of its iterations.
"""

from __future__ import annotations

from typing import Any

from specprobe.monitor.records import RequestRecord, count

REQUEST_MARKER = "specDecodingStats"


def request_counters(d: dict[str, Any]) -> dict[str, Any] | None:
    """An iteration's `specDecodingStats`, when `d` carries one."""
    stats = d.get("specDecodingStats")
    return stats if isinstance(stats, dict) else None


def read_request(d: dict[str, Any], num_spec_tokens: int | None) -> RequestRecord | None:
    return _trtllm(d, "specDecodingStats")


def _trtllm(d: dict[str, Any], where: str) -> RequestRecord | None:
    drafted = count(d, "numDraftTokens", where)
    if not drafted:
        return None  # an iteration without drafting (prefill, or speculation switched off)
    accepted = count(d, "numAcceptedTokens", where) or 0
    steps = count(d, "numRequestsWithDraftTokens", where)
    return RequestRecord("trtllm", accepted, drafted, steps or None)
