"""Safe output files: checked before any work starts, written atomically (temp + rename)
so an interrupted or failed run leaves nothing half-written."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from specprobe.errors import OutputError


def check_writable_file(path: Path | None, flag: str) -> None:
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {path} is a directory", f"give {flag} a file name")
    # Missing folders are created when the file is written; the nearest existing
    # ancestor must be a writable folder.
    parent = path.parent if str(path.parent) else Path(".")
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {flag} {path}: {parent} is a file, not a folder", "choose another path")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {flag} {path}: folder {parent} is not writable", "choose a writable path")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {flag} {path}: the file is read-only", "choose a writable path")


def check_writable_dir(path: Path | None, flag: str) -> None:
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{flag} {path} exists and is not a folder", f"give {flag} a folder")
    probe = path if path.exists() else path.parent if str(path.parent) else Path(".")
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"cannot write {flag} {path}: {probe} is a file, not a folder", "choose another path")
    if not os.access(probe, os.W_OK):
        raise OutputError(f"cannot write {flag} {path}: {probe} is not writable", "choose a writable folder")


def write_text_atomic(path: Path, text: str) -> None:
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}", "choose a writable path") from e


def write_json(path: Path, result: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(result, indent=1, ensure_ascii=False, allow_nan=False) + "\n")
