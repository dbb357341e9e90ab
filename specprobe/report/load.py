"""Reading saved result files (`diagnose --json`, `simulate --json`, `compare --json`).

A result file is a plain dict on disk; this module is the one gate that says whether a
file is one we can render, and turns every way it can be wrong into a one-line
InputError with a hint. It imports nothing heavy: `specprobe report` must start
without torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from specprobe.errors import InputError

SCHEMA_VERSION = 1
RESULT_COMMANDS = ("diagnose", "simulate")
# Sections every diagnose/simulate result carries; the rest are optional (e.g. positions).
_REQUIRED = {
    "diagnose": ("config", "metrics", "findings"),
    "simulate": ("config", "metrics", "findings"),
    "compare": ("metrics", "findings", "baseline", "candidate"),
}
_SECTION_TYPES: dict[str, type | tuple[type, ...]] = {
    "config": dict,
    "metrics": dict,
    "findings": list,
    "evaluations": list,
    "by_domain": list,
    "by_entropy": list,
    "by_position": list,
    "histograms": dict,
    "depth": dict,
    "k_table": list,
    "cost": dict,
    "positions": dict,
    "measured": dict,
}


def parse_result(text: str, source: str = "<result>", *, commands: Iterable[str] = RESULT_COMMANDS) -> dict[str, Any]:
    """Parse and validate result JSON text; `source` names it in error messages."""
    allowed = tuple(commands)
    if not text.strip():
        raise InputError(f"{source} is empty", "re-run the command that writes it (e.g. 'specprobe diagnose … --json FILE')")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        # A file cut off mid-write fails at its very end: say "truncated", not just "invalid".
        at_end = e.pos >= len(text.rstrip()) - 1
        what = "truncated" if at_end else "not valid JSON"
        raise InputError(
            f"{source} is {what} (line {e.lineno}, column {e.colno}: {e.msg})",
            "re-run the command that wrote it; the file was cut short or edited by hand" if at_end else "fix or regenerate the file",
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{source} holds a JSON {type(data).__name__}, not a specprobe result object", "pass a file written by 'specprobe diagnose --json'")
    version = data.get("schema_version")
    command = data.get("command")
    if version is None or command is None:
        raise InputError(f"{source} is not a specprobe result (no schema_version/command)", "pass a file written by 'specprobe diagnose --json' or 'simulate --json'")
    if version != SCHEMA_VERSION:
        raise InputError(
            f"{source} has schema_version {version!r}; this specprobe reads version {SCHEMA_VERSION}",
            "re-run it with this specprobe version, or render it with the version that wrote it",
        )
    if command not in allowed:
        raise InputError(
            f"{source} is a {command!r} result; expected {' or '.join(repr(c) for c in allowed)}",
            "pass the JSON that 'specprobe diagnose --json' or 'simulate --json' wrote",
        )
    for key in _REQUIRED.get(command, ()):
        if key not in data:
            raise InputError(f"{source} has no {key!r} section", "the file is incomplete; re-run the command that wrote it")
    for key, typ in _SECTION_TYPES.items():
        if data.get(key) is not None and not isinstance(data[key], typ):
            raise InputError(f"{source}: section {key!r} has the wrong type ({type(data[key]).__name__})", "the file was edited or written by another tool")
    return data


def load_result(path: str | Path, *, commands: Iterable[str] = RESULT_COMMANDS) -> dict[str, Any]:
    """Read and validate a result file: a dict with schema_version 1 and a known command."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"result file {p} does not exist", "pass the JSON written by 'specprobe diagnose --json FILE'")
    if p.is_dir():
        raise InputError(f"{p} is a folder, not a result file", "pass the JSON file itself")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{p} is not a text file", "pass the JSON written by 'specprobe diagnose --json FILE'") from None
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}", "check the path and its permissions") from None
    return parse_result(text, str(p), commands=commands)


# ----------------------------------------------------------------------------- accessors
def num(value: Any) -> float | None:
    """A number from a result, or None for null/NaN/missing/non-numeric."""
    if value is None or isinstance(value, bool):
        return None if value is None else float(value)
    if isinstance(value, (int, float)):
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    return None


def rows(result: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    """A list-of-dicts table (by_domain, k_table, …), empty when absent."""
    value = result.get(key)
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def measured(result: Mapping[str, Any]) -> dict[str, Any]:
    m = result.get("measured")
    return m if isinstance(m, dict) else {}


def describe(result: Mapping[str, Any]) -> str:
    """'self:layers=28 → smollm2' for titles."""
    cfg = result.get("config") or {}
    drafter = (result.get("drafter") or {}).get("spec") or cfg.get("drafter") or "?"
    target = (result.get("target") or {}).get("spec") or cfg.get("target") or "?"
    return f"{drafter} → {target}"


def to_json_text(data: Any) -> str:
    """JSON with NaN/inf written as null (the schema's convention), UTF-8 kept readable."""

    def clean(x: Any) -> Any:
        if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(data), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write next to the destination, then rename: a reader never sees half a report."""
    import os
    import tempfile

    from specprobe.errors import OutputError

    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{p} is a folder", "pass a file path")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}", "choose a writable path") from None
    return p


def gate_exit_code(result: Mapping[str, Any], fail_on: str) -> int:
    """0 when no finding is at or above fail_on, else 1 (design.md §4 exit codes)."""
    from specprobe.rules import SEVERITY_RANK

    if fail_on == "never":
        return 0
    limit = SEVERITY_RANK[fail_on]
    return 1 if any(SEVERITY_RANK.get(str(f.get("severity")), 0) >= limit for f in result.get("findings") or []) else 0


def effective_temperatures(result: Mapping[str, Any]) -> tuple[Any, Any]:
    """(target, drafter) temperatures the run actually used: the resolved sampling
    settings when present (flags, generation_config and defaults applied), else the
    config's flags."""
    s = result.get("sampling") or {}
    cfg = result.get("config") or {}
    t = (s.get("target") or {}).get("temperature", cfg.get("temperature"))
    d = (s.get("draft") or {}).get("temperature", cfg.get("draft_temperature"))
    return t, d
