"""Reading saved result files (`diagnose --json`, `simulate --json`, `compare --json`).

The one gate that says whether a file is one we can render: it parses the JSON,
upgrades an older schema version to the current one, validates it into the typed
models of `specprobe.result`, and turns every way a file can be wrong into a one-line
InputError with a hint. It imports nothing heavy: `specprobe report` must start
without torch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from specprobe.core.errors import InputError
from specprobe.judge.rules import SEVERITY_RANK
from specprobe.result import READABLE_VERSIONS, SCHEMA_VERSION, Comparison, Result, upgrade

RESULT_COMMANDS = ("diagnose", "simulate")
_WRITTEN_BY = "pass a file written by 'specprobe diagnose --json' or 'simulate --json'"


def _parse(text: str, source: str, allowed: Iterable[str]) -> dict[str, Any]:
    """JSON text → an upgraded dict of one of the allowed commands (not yet validated)."""
    allowed = tuple(allowed)
    if not text.strip():
        raise InputError(f"{source} is empty", "re-run the command that writes it (e.g. 'specprobe diagnose … --json FILE')")
    try:
        data = json.loads(text)
    except RecursionError:
        raise InputError(f"{source} is nested too deeply to be a result file", _WRITTEN_BY) from None
    except json.JSONDecodeError as e:
        # A file cut off mid-write fails at its very end (or inside a string that runs
        # to the end): say "truncated", not just "invalid".
        at_end = e.pos >= len(text.rstrip()) - 1 or e.msg.startswith("Unterminated string")
        what = "truncated" if at_end else "not valid JSON"
        raise InputError(
            f"{source} is {what} (line {e.lineno}, column {e.colno}: {e.msg})",
            "re-run the command that wrote it; the file was cut short or edited by hand" if at_end else "fix or regenerate the file",
        ) from None
    if not isinstance(data, dict):
        raise InputError(f"{source} holds a JSON {type(data).__name__}, not a specprobe result object", _WRITTEN_BY)
    version = data.get("schema_version")
    command = data.get("command")
    if version is None or command is None:
        raise InputError(f"{source} is not a specprobe result (no schema_version/command)", _WRITTEN_BY)
    if version not in READABLE_VERSIONS:
        raise InputError(
            f"{source} has schema_version {version!r}; this specprobe reads versions {READABLE_VERSIONS[0]} to {SCHEMA_VERSION}",
            "render it with the specprobe version that wrote it, or upgrade specprobe",
        )
    if command not in allowed:
        raise InputError(
            f"{source} is a {command!r} result; expected {' or '.join(repr(c) for c in allowed)}",
            "pass the JSON that 'specprobe diagnose --json' or 'simulate --json' wrote" if "compare" not in allowed else "pass the JSON that 'specprobe compare --json' wrote",
        )
    return upgrade(data)


def _invalid(source: str, e: ValidationError) -> InputError:
    """The first validation error, as one line that names the section."""
    err = e.errors(include_url=False)[0]
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "missing":
        return InputError(f"{source} has no {where!r} section", "the file is incomplete; re-run the command that wrote it")
    if err["type"] == "extra_forbidden":
        return InputError(f"{source}: unexpected field {where!r}", "the file was written by a newer specprobe or another tool")
    msg = err["msg"].split("\n")[0]
    return InputError(f"{source}: section {where!r} has the wrong type or value ({msg})", "the file was edited or written by another tool")


def parse_result(text: str, source: str = "<result>") -> Result:
    """Parse, upgrade and validate diagnose/simulate result JSON; `source` names it in errors."""
    data = _parse(text, source, RESULT_COMMANDS)
    try:
        return Result.model_validate(data)
    except ValidationError as e:
        raise _invalid(source, e) from None


def parse_comparison(text: str, source: str = "<comparison>") -> Comparison:
    """Parse, upgrade and validate `compare --json` output."""
    data = _parse(text, source, ("compare",))
    try:
        return Comparison.model_validate(data)
    except ValidationError as e:
        raise _invalid(source, e) from None


def _read(path: str | Path) -> tuple[str, str]:
    p = Path(path)
    if not p.exists():
        raise InputError(f"result file {p} does not exist", "pass the JSON written by 'specprobe diagnose --json FILE'")
    if p.is_dir():
        raise InputError(f"{p} is a folder, not a result file", "pass the JSON file itself")
    try:
        return p.read_text(encoding="utf-8"), str(p)
    except UnicodeDecodeError:
        raise InputError(f"{p} is not a text file", "pass the JSON written by 'specprobe diagnose --json FILE'") from None
    except OSError as e:
        raise InputError(f"cannot read {p}: {e.strerror}", "check the path and its permissions") from None


def load_result(path: str | Path) -> Result:
    """Read a diagnose/simulate result file (any readable schema version)."""
    return parse_result(*_read(path))


def load_comparison(path: str | Path) -> Comparison:
    """Read a `compare --json` file."""
    return parse_comparison(*_read(path))


def gate_exit_code(result: Result | Comparison, fail_on: str) -> int:
    """0 when no finding is at or above fail_on, else 1."""
    if fail_on == "never":
        return 0
    limit = SEVERITY_RANK[fail_on]
    return 1 if any(SEVERITY_RANK.get(f.severity, 0) >= limit for f in result.findings) else 0
