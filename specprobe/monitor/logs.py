"""Acceptance numbers from engine log lines (each engine's own lines, parsed by its
`monitor` module: vLLM V1 "SpecDecoding metrics" and V0 "Speculative metrics", SGLang
"Decode batch … accept len", llama.cpp's server and speculative example), read from a
file once, followed like `tail -f`, or from stdin.

`parse_log_line` and `apply_record` are pure: they hand a line to each engine's parser in
the engines' order and a record to the engine whose family its kind names. `LogSource`
owns the file handle and, when following, a reader thread feeding a queue so a poll
never blocks.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from specprobe.core.errors import InputError
from specprobe.monitor.base import IngestResult, Store, Warn
from specprobe.monitor.dialects import dialects, module
from specprobe.monitor.records import LogRecord, LogState, MalformedLine
from specprobe.monitor.windows import ModelData


def parse_log_line(line: str) -> LogRecord | None:
    """One log line → a record, None for unrelated lines, MalformedLine for broken ones."""
    for _, _, mod in dialects():
        rec = mod.parse_log_line(line) if hasattr(mod, "parse_log_line") else None
        if rec is not None:
            return rec  # type: ignore[no-any-return]
    return None


def apply_record(rec: LogRecord, t: float, data: ModelData, state: LogState, series: str) -> None:
    """Add one record to a model's series: the engine its kind names does."""
    mod = module(rec.kind)
    if mod is not None and hasattr(mod, "apply_record"):
        mod.apply_record(rec, t, data, state, series)


def _flush(data: ModelData, state: LogState) -> None:
    """Every line read so far is in: the engines count what waited for a next line."""
    for _, _, mod in dialects():
        if hasattr(mod, "flush"):
            mod.flush(data, state)


def _detected(kind: str) -> str:
    mod = module(kind)
    return str(mod.detected_kind(kind)) if mod is not None and hasattr(mod, "detected_kind") else kind


@dataclass
class LogSource:
    """A log file (read once, or followed) or '-' for stdin. The model label is the
    file's stem (engines do not log the model name next to these lines) unless given."""

    path: str
    follow: bool = False
    model: str | None = None
    kind: str = "log"
    detected: str | None = None
    lines_read: int = 0
    _fh: IO[str] | None = None
    _queue: queue.Queue[str | None] | None = None
    _thread: threading.Thread | None = None
    _eof: bool = False
    _state: LogState = field(default_factory=LogState)

    def __post_init__(self) -> None:
        if self.path == "-":
            self._fh = sys.stdin
            self.model = self.model or "stdin"
        else:
            p = Path(self.path)
            if not p.exists():
                raise InputError(f"log file {self.path} does not exist", "pass an existing file to --log, or '-' for stdin")
            if p.is_dir():
                raise InputError(f"log file {self.path} is a directory", "pass a file to --log")
            try:
                self._fh = p.open("r", encoding="utf-8", errors="replace")
            except OSError as e:
                raise InputError(f"cannot read log file {self.path}: {e.strerror}", "check the path and its permissions") from e
            self.model = self.model or p.stem
        if self.follow:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._reader, name=f"log:{self.path}", daemon=True)
            self._thread.start()

    @property
    def name(self) -> str:
        return "stdin" if self.path == "-" else self.path

    def _reader(self) -> None:
        assert self._fh is not None and self._queue is not None
        partial = ""  # a line the writer has not finished yet
        while True:
            line = self._fh.readline()
            if line.endswith("\n"):
                self._queue.put(partial + line)
                partial = ""
            elif line:
                partial += line  # at the end of the file mid-line: wait for the rest
            elif self.path == "-":
                if partial:
                    self._queue.put(partial)
                self._queue.put(None)  # stdin closed
                return
            elif self._reopened():  # tail -F: the log was rotated or truncated
                if partial:
                    self._queue.put(partial)
                partial = ""
            else:
                time.sleep(0.2)  # tail -f: wait for the writer

    def _reopened(self) -> bool:
        """At the end of a followed file: reopen the path when it now names another file
        (rotated: renamed away and created again) and start over when the file shrank
        below what was read (truncated in place, logrotate's copytruncate)."""
        assert self._fh is not None
        try:
            now = os.stat(self.path)
            was = os.fstat(self._fh.fileno())
        except OSError:
            return False  # renamed away and not created again yet
        if (now.st_ino, now.st_dev) != (was.st_ino, was.st_dev):
            try:
                fresh = open(self.path, encoding="utf-8", errors="replace")  # noqa: SIM115 - kept open while following
            except OSError:
                return False
            self._fh.close()
            self._fh = fresh
            return True
        if now.st_size < os.lseek(self._fh.fileno(), 0, os.SEEK_CUR):
            self._fh.seek(0)
            return True
        return False

    def _new_lines(self) -> list[str]:
        if self._queue is not None:
            lines = []
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._eof = True
                    break
                lines.append(item)
            return lines
        if self._eof or self._fh is None:
            return []
        lines = self._fh.readlines()
        self._eof = True
        return lines

    def poll(self, t: float, store: Store, warn: Warn, **_: Any) -> IngestResult:
        res = IngestResult(None, set())
        data: ModelData | None = None
        kinds: set[str] = set()
        for line in self._new_lines():
            self.lines_read += 1
            for *_engine, mod in dialects():  # what an engine's other lines say (its version)
                said = mod.notice(line, self._state) if hasattr(mod, "notice") else None
                if said is not None:
                    warn(*said)
            try:
                rec = parse_log_line(line.rstrip("\n"))
            except (MalformedLine, ValueError) as e:
                res.malformed += 1
                warn(f"malformed-line:{self.name}", f"{self.name}: skipping malformed line {self.lines_read} ({e}): {line.strip()[:120]}")
                continue
            if rec is None:
                continue
            if data is None:  # a model appears with its first record, not with the file
                data = store.setdefault(self.model or "log", ModelData())
                data.sources.add(self.name)
            apply_record(rec, rec.t if rec.t is not None else t, data, self._state, f"{self.name}|log")
            kinds.add(_detected(rec.kind))
        if data is not None:
            # Every line read so far is in: a summary without its per-position line yet
            # counts its drafts from the mean length (a late per-position line still adds
            # its positions).
            _flush(data, self._state)
        if kinds:
            self.detected = ",".join(sorted(kinds))
            res.models.add(self.model or "log")
        res.engine = self.detected
        return res

    def close(self) -> None:
        if self._fh is not None and self._fh is not sys.stdin and self._thread is None:
            self._fh.close()
