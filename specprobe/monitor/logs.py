"""Acceptance numbers from engine log lines (vLLM V1 "SpecDecoding metrics", vLLM V0
"Speculative metrics", SGLang "Decode batch … accept len", llama.cpp's server and
speculative example), read from a file once, followed like `tail -f`, or from stdin.

llama.cpp's server logs one summary per finished request. Older builds write
`draft acceptance rate = 0.57576 (   57 accepted /    99 generated)`; newer ones write
`draft acceptance = 0.57576 (   57 accepted /    99 generated), mean len =  1.71` and, at
trace verbosity (`-lv 4`), `acc per pos = (0.700, 0.450, …)` — accepted at each draft
position ÷ verify steps, one entry per position up to K. Accepted and drafted tokens are
exact; the verify-step count (drafts) is recovered from the rounded mean length and the
per-position rates (`fit_llamacpp_drafts`).

`parse_log_line` and `apply_record` are pure; `LogSource` owns the file handle and, when
following, a reader thread feeding a queue so a poll never blocks.
"""

from __future__ import annotations

import math
import os
import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from specprobe.core.errors import InputError
from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.base import IngestResult, Store, Warn
from specprobe.monitor.windows import ModelData, pos_key


class MalformedLine(ValueError):
    """A line that carries an engine's marker but not the fields that go with it."""


@dataclass(frozen=True)
class LogRecord:
    kind: str  # vllm-v1 | vllm-v0 | sglang | llamacpp | llamacpp-per_pos | llamacpp-n_draft | llamacpp-n_drafted | llamacpp-n_accept
    fields: dict[str, Any]
    t: float | None = None


_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_ISO_TS = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:[.,](\d+))?")
_VLLM_TS = re.compile(r"\b(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b")
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
_SGL_LEN = re.compile(r"accept len: " + _NUM)
_SGL_RATE = re.compile(r"accept rate: " + _NUM)
_LLAMA = re.compile(r"draft acceptance rate = " + _NUM + r"\s*\(\s*(\d+) accepted\s*/\s*(\d+) generated\)")
_LLAMA_NEW = re.compile(
    r"draft acceptance = " + _NUM + r"\s*\(\s*(\d+) accepted\s*/\s*(\d+) generated\)(?:,\s*mean len =\s*" + _NUM + ")?"
)
_LLAMA_POS = re.compile(r"acc per pos = \(([^)]*)\)")
_LLAMA_EX = re.compile(r"\b(n_draft|n_drafted|n_accept)\s*=\s*(\d+)\s*$")


def line_time(prefix: str, year: int | None = None) -> float | None:
    """The timestamp at the start of a log line, as epoch seconds (local time)."""
    m = _ISO_TS.search(prefix)
    if m:
        frac = float("0." + m.group(3)) if m.group(3) else 0.0
        try:
            return datetime.strptime(f"{m.group(1)} {m.group(2)}", "%Y-%m-%d %H:%M:%S").timestamp() + frac
        except ValueError:
            return None
    m = _VLLM_TS.search(prefix)
    if m:  # vLLM writes "MM-DD HH:MM:SS" without a year
        mo, day, hh, mi, ss = (int(g) for g in m.groups())
        try:
            return datetime(year or datetime.now().year, mo, day, hh, mi, ss).timestamp()
        except ValueError:
            return None
    return None


def _need(rx: re.Pattern[str], text: str, what: str) -> str:
    m = rx.search(text)
    if not m:
        raise MalformedLine(f"no {what}")
    return m.group(1)


def parse_log_line(line: str) -> LogRecord | None:
    """One log line → a record, None for unrelated lines, MalformedLine for broken ones."""
    if "SpecDecoding metrics:" in line:
        head, body = line.split("SpecDecoding metrics:", 1)
        f: dict[str, Any] = {
            "accepted": int(_need(_V1["accepted"], body, "'Accepted: N tokens'")),
            "drafted": int(_need(_V1["drafted"], body, "'Drafted: N tokens'")),
        }
        m = _V1["mean_len"].search(body)
        f["mean_len"] = float(m.group(1)) if m else None
        m = _V1["per_pos"].search(body)
        f["per_pos"] = [float(x) for x in re.split(r",\s*", m.group(1))] if m else []
        return LogRecord("vllm-v1", f, line_time(head))
    if "Speculative metrics:" in line:
        head, body = line.split("Speculative metrics:", 1)
        f = {key: _need(rx, body, key) for key, rx in _V0.items()}
        return LogRecord(
            "vllm-v0",
            {"rate": float(f["rate"]), "efficiency": float(f["efficiency"]), "k": int(f["k"]),
             "accepted": int(f["accepted"]), "drafted": int(f["drafted"]), "emitted": int(f["emitted"])},
            line_time(head),
        )
    if "Decode batch" in line and "accept len" in line:
        head = line.split("Decode batch", 1)[0]
        length = float(_need(_SGL_LEN, line, "'accept len: X'"))
        m = _SGL_RATE.search(line)
        return LogRecord("sglang", {"accept_len": length, "accept_rate": float(m.group(1)) if m else None}, line_time(head))
    if "draft acceptance rate =" in line:
        m = _LLAMA.search(line)
        if not m:
            raise MalformedLine("no '(N accepted / M generated)'")
        return LogRecord("llamacpp", {"accepted": int(m.group(2)), "drafted": int(m.group(3))}, line_time(line.split("draft acceptance", 1)[0]))
    if "draft acceptance =" in line:
        m = _LLAMA_NEW.search(line)
        if not m:
            raise MalformedLine("no '(N accepted / M generated)'")
        f = {"accepted": int(m.group(2)), "drafted": int(m.group(3))}
        if m.group(4) is not None:
            f["mean_len"] = float(m.group(4))
        return LogRecord("llamacpp", f, line_time(line.split("draft acceptance", 1)[0]))
    if "acc per pos =" in line:
        m = _LLAMA_POS.search(line)
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
    m = _LLAMA_EX.search(line)
    if m:
        return LogRecord(f"llamacpp-{m.group(1)}", {"value": int(m.group(2))}, None)
    return None


@dataclass
class LogState:
    """Per-source parsing state: llama.cpp's example prints drafted and accepted on
    separate lines, and its server the per-position rates on the line after a request's
    summary; vLLM V0 prints cumulative totals that are counters."""

    pending_drafted: int | None = None
    k: int | None = None
    # llama.cpp server: the last request summary (t, accepted, drafted, mean_len), waiting
    # for its per-position line, and the drafts already counted for it (None = not yet).
    llama_last: tuple[float, int, int, float | None] | None = None
    llama_drafts: int | None = None
    llama_pos_done: bool = True


def fit_llamacpp_drafts(accepted: int, drafted: int, mean_len: float | None, per_pos: list[float] | None = None, k: int | None = None) -> int | None:
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


def _llama_flush(data: ModelData, state: LogState) -> None:
    """Count the drafts of the last llama.cpp request from its mean length alone."""
    if state.llama_last is None or state.llama_drafts is not None:
        return
    t, accepted, drafted, mean_len = state.llama_last
    s = fit_llamacpp_drafts(accepted, drafted, mean_len, k=state.k)
    state.llama_drafts = s if s is not None else -1
    if s is not None:
        data.add_event(windows.DRAFTS, t, s)


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
    elif rec.kind == "sglang":
        data.add_gauge(windows.GAUGE_ACCEPT_LEN, series, t, f["accept_len"])
        if f["accept_rate"] is not None:
            data.add_gauge(windows.GAUGE_ACCEPT_RATE, series, t, f["accept_rate"])
    elif rec.kind == "llamacpp":
        _llama_flush(data, state)  # the previous request had no per-position line
        data.add_event(windows.ACCEPTED, t, f["accepted"])
        data.add_event(windows.DRAFT_TOKENS, t, f["drafted"])
        state.llama_last = (t, f["accepted"], f["drafted"], f.get("mean_len"))
        state.llama_drafts = None
        state.llama_pos_done = False
    elif rec.kind == "llamacpp-per_pos":
        if state.llama_last is None or state.llama_pos_done or not f["per_pos"]:
            return
        t0, accepted, drafted, mean_len = state.llama_last
        per_pos = f["per_pos"]
        state.k = len(per_pos)
        data.num_spec_tokens = data.num_spec_tokens or len(per_pos)
        s = state.llama_drafts
        if s is None:  # not counted yet: the per-position rates sharpen the fit
            s = fit_llamacpp_drafts(accepted, drafted, mean_len, per_pos)
            state.llama_drafts = s if s is not None else -1
            if s is not None:
                data.add_event(windows.DRAFTS, t0, s)
        if s is not None and s > 0:
            for i, r in enumerate(per_pos):
                data.add_event(pos_key(i), t0, round(r * s))
        state.llama_pos_done = True
    elif rec.kind == "llamacpp-n_draft":
        state.k = f["value"]
    elif rec.kind == "llamacpp-n_drafted":
        state.pending_drafted = f["value"]
    elif rec.kind == "llamacpp-n_accept" and state.pending_drafted is not None:
        data.add_event(windows.ACCEPTED, t, f["value"])
        data.add_event(windows.DRAFT_TOKENS, t, state.pending_drafted)
        state.pending_drafted = None


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
            kinds.add(rec.kind.split("-n_")[0].split("-per_pos")[0])
        if data is not None:
            # Every line read so far is in: a summary without its per-position line yet
            # counts its drafts from the mean length (a late per-position line still adds
            # its positions).
            _llama_flush(data, self._state)
        if kinds:
            self.detected = ",".join(sorted(kinds))
            res.models.add(self.model or "log")
        res.engine = self.detected
        return res

    def close(self) -> None:
        if self._fh is not None and self._fh is not sys.stdin and self._thread is None:
            self._fh.close()
