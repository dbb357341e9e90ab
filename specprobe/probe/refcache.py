"""The on-disk cache of on-policy references: one JSONL file per key (weights, sampling,
budget, seed, batching, prompts — `references._cache_file`), one line per finished batch,
so an interrupted run resumes where it stopped.

Runs that share a key at the same time (two jobs, shards of one run) take an exclusive
lock on the file around each batch and read what the others wrote first, so every batch
is generated once and every run reads the same tokens. Each line is checked before it is
used: a line cut by an interrupt or a full disk, bytes that are not JSON, an entry of
another key, a batch of the wrong size, ids outside the vocabulary or past the token
budget. A file with such lines is rewritten with its good ones, and the batches it lost
are generated again. A cache that cannot be used (a read-only or full disk, a file where
its folder should be) costs the resume, never the run: it is reported once and skipped.

A batch that Ctrl-C cut short is kept as a `partial` line: what each continuation had
reached, and which of them had finished (EOS or the token budget). It never counts as
the batch: a resumed run generates the batch again (seeded, so the same tokens), and a
run cut short in the same batch keeps whichever reached further. An older specprobe
drops such a line as foreign and regenerates the batch, as it would anyway.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from specprobe.core.files import exclusive_lock


class ReferenceCache:
    """The cache file of one key. `sizes[b]`: prompts in batch b; `vocab`: ids must be
    below it; `budget`: at most this many tokens per continuation."""

    def __init__(self, path: Path, sizes: Sequence[int], vocab: int, budget: int, warn: Callable[[str], None]) -> None:
        self.path = path
        self.key = path.stem
        self.sizes = list(sizes)
        self.vocab = vocab
        self.budget = budget
        self.warn = warn
        self.usable = True
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) when last read
        self._done: dict[int, list[list[int]]] = {}
        self._partial: dict[int, tuple[list[list[int]], list[bool]]] = {}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._give_up(e)

    # ------------------------------------------------------------------ the lock
    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive use of the file (blocks while another run holds it)."""
        if not self.usable:
            yield
            return
        with exclusive_lock(self.path.with_suffix(".lock"), self._give_up):
            yield

    # ------------------------------------------------------------------ reading
    def read(self) -> dict[int, list[list[int]]]:
        """Batch -> continuations for every good line (re-read only when the file changed);
        a file with bad lines is rewritten without them. Call it holding the lock."""
        if not self.usable:
            return self._done
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self._done
        except OSError as e:
            self._give_up(e)
            return self._done
        if self._seen == (st.st_size, st.st_mtime_ns):
            return self._done
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            self._give_up(e)
            return self._done
        done: dict[int, list[list[int]]] = {}
        partial: dict[int, tuple[list[list[int]], list[bool]]] = {}
        good: list[bytes] = []
        bad = 0
        for line in raw.split(b"\n"):
            if not line.strip():
                continue
            entry = self._entry(line)
            if entry is None:
                bad += 1
                continue
            b, conts, finished = entry
            if finished is None:
                done[b] = conts
            else:
                partial[b] = (conts, finished)
            good.append(line)
        self._done = done
        self._partial = partial
        if bad or (raw and not raw.endswith(b"\n")):
            self.warn(f"reference cache {self.path}: {bad} damaged or foreign line(s) dropped; their batches are generated again")
            self._rewrite(b"".join(g + b"\n" for g in good))
        else:
            self._seen = (st.st_size, st.st_mtime_ns)
        return done

    def partial(self, batch: int) -> tuple[list[list[int]], list[bool]] | None:
        """(continuations, finished) of a batch that a run cut short, from the last read."""
        return None if batch in self._done else self._partial.get(batch)

    def _entry(self, line: bytes) -> tuple[int, list[list[int]], list[bool] | None] | None:
        """(batch, continuations, None) of a good batch line, (batch, continuations,
        finished) of a good partial line, None for anything else."""
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, cut short
            return None
        if not isinstance(rec, dict) or rec.get("key") != self.key:
            return None
        finished = None
        if "partial" in rec:
            b, finished = rec.get("partial"), rec.get("finished")
        else:
            b = rec.get("batch")
        conts = rec.get("continuations")
        if not isinstance(b, int) or isinstance(b, bool) or not 0 <= b < len(self.sizes):
            return None
        if not isinstance(conts, list) or len(conts) != self.sizes[b]:
            return None
        if "partial" in rec and (not isinstance(finished, list) or len(finished) != len(conts) or not all(isinstance(f, bool) for f in finished)):
            return None
        for c in conts:
            if not isinstance(c, list) or len(c) > self.budget:
                return None
            if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < self.vocab for t in c):
                return None
        return b, conts, finished

    # ------------------------------------------------------------------ writing
    def append(self, batch: int, conts: list[list[int]]) -> None:
        """Add one finished batch: one unbuffered write of one whole line. Call it holding
        the lock."""
        if self._write({"key": self.key, "batch": batch, "continuations": conts}):
            self._done[batch] = conts

    def append_partial(self, batch: int, conts: list[list[int]], finished: list[bool]) -> None:
        """Keep what a batch cut short had generated (see the module docstring). Call it
        holding the lock."""
        if self._write({"key": self.key, "partial": batch, "continuations": conts, "finished": finished}):
            self._partial[batch] = (conts, finished)

    def _write(self, record: dict[str, object]) -> bool:
        if not self.usable:
            return False
        line = (json.dumps(record) + "\n").encode()
        try:
            with self.path.open("ab", buffering=0) as fh:
                fh.write(line)
        except OSError as e:
            self._give_up(e)
            self._truncate_to_last_line()
            return False
        try:
            st = self.path.stat()
            self._seen = (st.st_size, st.st_mtime_ns)
        except OSError:
            self._seen = None
        return True

    def _rewrite(self, data: bytes) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
            st = self.path.stat()
            self._seen = (st.st_size, st.st_mtime_ns)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            self._give_up(e)

    def _truncate_to_last_line(self) -> None:
        """After a failed write (a full disk): drop the half line it may have left, so the
        next append does not glue onto it."""
        try:
            data = self.path.read_bytes()
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                os.truncate(self.path, cut)
        except OSError:
            pass

    def _give_up(self, e: OSError) -> None:
        if self.usable:
            self.warn(f"reference cache {self.path.parent} cannot be used ({e.strerror or e}); continuing without it")
        self.usable = False

