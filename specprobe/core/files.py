"""Safe output files: every output path checked before any work starts (and before any
other output is written), and none of them one of the command's inputs; then written
atomically (temp + rename) so an interrupted or failed run leaves nothing half-written.
New files and folders get the permissions the user's umask gives, as every other tool
does (a temp file alone would be 0600)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from specprobe.core.errors import OutputError


@dataclass(frozen=True)
class OutputPath:
    """One output a command was asked to write: where the path came from (`--json`, or
    `probe.yaml: outputs.json`), the path, and whether it is a file or a folder."""

    origin: str
    path: Path
    kind: Literal["file", "dir"] = "file"


@dataclass(frozen=True)
class InputPath:
    """One file a command reads: where it was named (`--prompts`, `RESULT.json`,
    `probe.yaml: rules`) and the path."""

    origin: str
    path: Path


def _same_file(a: Path, b: Path) -> bool:
    # (st_dev, st_ino) catches a hard link or a second mount, which no path text shows;
    # a path that does not exist yet can only be the same through where it resolves to
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def _input_hit(o: OutputPath, inputs: Iterable[InputPath]) -> OutputError | None:
    """Why writing `o` would destroy an input, or None. A file output must not be an
    input; a folder output must not be one, nor hold one (its tables are written into it)."""
    for i in inputs:
        named = i.origin if str(i.path) == str(o.path) else f"{i.origin} {i.path}"
        if _same_file(o.path, i.path):
            return OutputError(f"{o.origin} {o.path} is also an input ({named})", "write the result elsewhere")
        if o.kind == "dir" and _same_file(Path(os.path.realpath(i.path)).parent, o.path):
            return OutputError(f"{o.origin} {o.path} holds an input ({i.origin} {i.path})", "write the tables into another folder")
    return None


def _umask() -> int:
    # Read without changing it where the kernel tells (Linux); os.umask is set-and-return.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _can_create_in(folder: Path) -> str | None:
    """None when a file can be created in folder, else why not. Tries for real: the
    permission bits say nothing to root, and /proc or a read-only mount refuse anyway."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".specprobe-probe-", dir=folder)
    except OSError as e:
        return e.strerror or str(e)
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)
    return None


def check_writable_file(path: Path | None, flag: str) -> None:
    if path is None:
        return
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {path} is a folder", f"give {flag} a file name")
    # Missing folders are created when the file is written; the nearest existing
    # ancestor must be a folder we can create things in.
    parent = _nearest_existing(path.parent if str(path.parent) else Path("."))
    if not parent.is_dir():
        raise OutputError(f"cannot write {flag} {path}: {parent} is a file, not a folder", "choose another path")
    why = _can_create_in(parent)
    if why:
        raise OutputError(f"cannot write {flag} {path}: folder {parent}: {why}", "choose a writable path")
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {flag} {path}: the file is read-only", "choose a writable path")


def check_writable_dir(path: Path | None, flag: str) -> None:
    if path is None:
        return
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputError(f"{flag} {path} exists and is not a folder", f"give {flag} a folder")
    probe = _nearest_existing(path)
    if not probe.is_dir():
        raise OutputError(f"cannot write {flag} {path}: {probe} is a file, not a folder", "choose another path")
    why = _can_create_in(probe)
    if why:
        raise OutputError(f"cannot write {flag} {path}: {probe}: {why}", "choose a writable folder")


def check_outputs(outputs: Iterable[OutputPath], inputs: Iterable[InputPath] = ()) -> None:
    """Check every output before any is written: a bad last path must not leave the
    first ones written and the run's work lost, and an output that is an input would
    replace what the run reads (the prompts, a baseline) with what it wrote."""
    seen: dict[Path, str] = {}
    inputs = list(inputs)
    for o in outputs:
        hit = _input_hit(o, inputs)
        if hit is not None:
            raise hit
        if o.kind == "dir":
            check_writable_dir(o.path, o.origin)
        else:
            check_writable_file(o.path, o.origin)
        key = Path(os.path.abspath(o.path))
        if key in seen:
            raise OutputError(f"{seen[key]} and {o.origin} both write {o.path}", "give each output its own path")
        seen[key] = o.origin


def new_file_mode(path: Path) -> int:
    """An existing file keeps its mode; a new one gets 0666 less the umask."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def make_temp_dir(parent: Path, name: str) -> Path:
    """A fresh folder next to its destination, to be filled then renamed into place;
    mode 0777 less the umask (mkdtemp alone makes it 0700)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write next to the destination, then rename: a reader never sees half a report."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{p} is a folder", "pass a file path")
    parent = p.parent if str(p.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        mode = new_file_mode(p)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise OutputError(f"cannot write {p}: {e.strerror or e}", "choose a writable path") from None
    return p


def write_json(path: str | Path, result: dict[str, Any]) -> Path:
    return write_text_atomic(path, json.dumps(result, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


@contextmanager
def exclusive_lock(path: Path, on_error: Callable[[OSError], None] | None = None) -> Iterator[None]:
    """Exclusive use, while the block runs, of what the lock file `path` (created) stands
    for: an advisory lock that another run blocks on, released when the process ends
    however it ends. No lock where the platform has none (Windows) or the file cannot be
    opened (`on_error` is told why)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if on_error is not None:
            on_error(e)
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
