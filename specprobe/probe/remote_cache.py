"""What a `diagnose --target-server` run keeps on disk, so an interrupted run (Ctrl-C, a
server that stopped answering) continues where it stopped: the references the server
wrote and the server's scores of each prompt, one JSONL line per prompt as it is
answered.

Two files per key under the cache folder's `remote/`: `KEY.refs.jsonl` (the
references; `refcache.ReferenceCache` with one prompt per batch: each line checked,
locked, damaged lines dropped) and `KEY.scores.jsonl` (per prompt and top-n asked, the
rows the server returned for the reference's positions). The key is what changes the
server's answers: the served model, the checkpoint it loaded, the engine and its
release, the prompt ids, the sampling sent, the seed and the token budget. The server's
URL is not in it: a server restarted on another port continues the run. The drafter is
not in it either: another drafter scored against the same target reuses every answer,
and only its own forward pass runs again.

A line that cannot be used (cut by a kill, not JSON, another key, the wrong number of
rows, a token id outside the vocabulary) is dropped with one warning, and that prompt
is asked again. A cache that cannot be written costs the resume, never the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from specprobe.probe.refcache import ReferenceCache

Rows = list[dict[int, tuple[float, int]]]


def run_key(engine: str, model: str, root: str | None, version: str | None, encoded: Sequence[Sequence[int]], request: Mapping[str, Any], seed: int, max_tokens: int) -> str:
    """The key of one run's server answers (see the module docstring)."""
    src = json.dumps([engine, model, root, version, [list(map(int, e)) for e in encoded], dict(sorted(request.items())), int(seed), int(max_tokens)])
    return hashlib.sha256(src.encode()).hexdigest()[:24]


class RemoteCache:
    """The references and scores of one key. Safe to call from the threads that wait on
    the server (one lock around each write)."""

    def __init__(self, folder: Path, key: str, prompts: int, vocab: int, budget: int, warn: Callable[[str], None]) -> None:
        self.key, self.prompts, self.vocab, self.warn = key, prompts, vocab, warn
        self.refs = ReferenceCache(folder / f"{key}.refs.jsonl", [1] * prompts, vocab, budget, warn)
        self.scores_path = folder / f"{key}.scores.jsonl"
        self._lock = threading.Lock()
        self.usable = self.refs.usable

    # ------------------------------------------------------------------ references
    def references(self) -> dict[int, list[int]]:
        with self.refs.locked():
            return {b: c[0] for b, c in self.refs.read().items()}

    def add_reference(self, i: int, cont: list[int]) -> None:
        with self._lock, self.refs.locked():
            self.refs.append(i, [list(map(int, cont))])

    # ------------------------------------------------------------------ scores
    def scores(self, n: int, lengths: Mapping[int, int]) -> dict[int, Rows]:
        """prompt -> the rows of its reference's positions asked with top-`n` (all of them,
        or the first ones of a widening request), for every good line no longer than the
        reference of lengths[prompt] tokens."""
        if not self.usable:
            return {}
        try:
            raw = self.scores_path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            self._give_up(e)
            return {}
        out: dict[int, Rows] = {}
        good, bad = [], 0
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            entry = self._entry(line, lengths)
            if entry is None:
                bad += 1
                continue
            good.append(line)
            if entry[1] == n:
                out[entry[0]] = entry[2]
        if bad or (raw and not raw.endswith(b"\n")):
            self.warn(f"remote score cache {self.scores_path}: {bad} damaged or foreign line(s) dropped; those prompts are asked again")
            self._rewrite(b"".join(g + b"\n" for g in good))
        return out

    def _entry(self, line: bytes, lengths: Mapping[int, int]) -> tuple[int, int, Rows] | None:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(rec, dict) or rec.get("key") != self.key:
            return None
        i, n, rows = rec.get("prompt"), rec.get("n"), rec.get("rows")
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.prompts or not isinstance(n, int) or isinstance(n, bool):
            return None
        if not isinstance(rows, list) or (i in lengths and len(rows) > lengths[i]):
            return None
        out: Rows = []
        try:
            for r in rows:
                d = {}
                for t, v, rank in r:
                    if not isinstance(t, int) or not 0 <= t < self.vocab or not isinstance(rank, int):
                        return None
                    d[t] = (float(v), rank)
                if not d:
                    return None
                out.append(d)
        except (TypeError, ValueError):
            return None
        return i, n, out

    def add_scores(self, i: int, n: int, rows: Rows) -> None:
        """One prompt's rows: one unbuffered write of one whole line."""
        if not self.usable:
            return
        rec = {"key": self.key, "prompt": i, "n": n, "rows": [[[t, v, rank] for t, (v, rank) in r.items()] for r in rows]}
        line = (json.dumps(rec) + "\n").encode()
        with self._lock:
            try:
                self.scores_path.parent.mkdir(parents=True, exist_ok=True)
                with self.scores_path.open("ab", buffering=0) as fh:
                    fh.write(line)
            except OSError as e:
                self._give_up(e)

    def _rewrite(self, data: bytes) -> None:
        tmp = self.scores_path.with_name(f".{self.scores_path.name}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.scores_path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self._give_up(e)

    def _give_up(self, e: OSError) -> None:
        if self.usable:
            self.warn(f"remote cache {self.scores_path.parent} cannot be used ({e.strerror or e}); continuing without it")
        self.usable = False

    def where(self) -> str:
        return str(self.scores_path.parent / f"{self.key}.*")
