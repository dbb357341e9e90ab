"""Memory for scoring on large vocabularies: the chunk of positions scored at once,
chosen from the device's free memory, and the out-of-memory backoff (halve the chunk,
then the batch, and go on) — so a 128k–256k vocabulary on a busy GPU slows down
instead of crashing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import numpy as np
    import torch

    from specprobe.probe.chunks import Chunk, ChunkScores, Collector, Probe

T = TypeVar("T")

# [N, V] float32 buffers alive per scored position: the target's and the drafter's
# logits, four scratch buffers of the metrics, and the upcast/temperature copies
BUFFERS_PER_POSITION = 8
MIN_CHUNK, MAX_CHUNK = 8, 2048


def is_oom(e: BaseException) -> bool:
    """CUDA (or MPS/XPU) out of memory, whichever exception type this torch raises."""
    import torch

    oom = getattr(torch.cuda, "OutOfMemoryError", None)
    return (oom is not None and isinstance(e, oom)) or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def chunk_for(vocab: int, device: str, default: int, free_bytes: int | None = None, share: float = 0.25) -> int:
    """Positions per metrics chunk. On a CPU the default (cache-sized) chunk; on a GPU
    the largest power of two whose buffers fit `share` of the free memory."""
    if not str(device).startswith("cuda") and free_bytes is None:
        return default
    if free_bytes is None:
        import torch

        free_bytes = int(torch.cuda.mem_get_info(torch.device(device))[0])
    fit = int(free_bytes * share) // (vocab * 4 * BUFFERS_PER_POSITION)
    n = MIN_CHUNK
    while n * 2 <= min(fit, MAX_CHUNK):
        n *= 2
    return n


@dataclass
class Backoff:
    """Chunk size and batch split that survived so far; `notes` says what was halved."""

    chunk: int
    notes: list[str] = field(default_factory=list)

    def run(self, idx: list[int], attempt: Callable[[list[int], int], T], on_done: Callable[[], None]) -> list[T]:
        """attempt(prompt indices, chunk) scores one batch; on out-of-memory the chunk is
        halved (down to 1 position), then the batch is split in two; each finished
        (sub-)batch is committed with on_done(). -> the results of the attempts."""
        try:
            out = [attempt(idx, self.chunk)]
            on_done()
            return out
        except Exception as e:  # only out-of-memory is retried
            if not is_oom(e):
                raise
            _free()
        if self.chunk > 1:
            self.chunk = max(1, self.chunk // 2)
            self.notes.append(f"out of memory: metrics chunk halved to {self.chunk} positions")
            return self.run(idx, attempt, on_done)
        if len(idx) == 1:
            raise MemoryError("out of memory scoring a single prompt at one position per chunk") from None
        half = len(idx) // 2
        self.notes.append(f"out of memory: batch of {len(idx)} split in two")
        return [*self.run(idx[:half], attempt, on_done), *self.run(idx[half:], attempt, on_done)]


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Buffered:
    """Holds a batch's chunks until the batch finished, so a batch cut by an
    out-of-memory error leaves no half batch in the collectors."""

    def __init__(self, sinks: Sequence[Collector]) -> None:
        self.sinks = sinks
        self.held: list[tuple[Chunk, ChunkScores]] = []
        self.top_k = max((int(getattr(s, "top_k", 0) or 0) for s in sinks), default=0)
        self.tree_width = max((int(getattr(s, "tree_width", 0) or 0) for s in sinks), default=0)
        self.probes: list[Probe] = [p for p in (getattr(s, "probe", None) for s in sinks) if p is not None]
        self.probe = self._probe if self.probes else None
        self.passes: list[Any] = [s for s in sinks if getattr(s, "wants_pass", False)]
        self.wants_pass = bool(self.passes)

    def target_pass(self, idx: list[int], tp: Any, cache: Any) -> None:
        """Handed on at once: the collectors that want it hold it until `batch_done`."""
        for s in self.passes:
            s.target_pass(idx, tp, cache)

    def _probe(self, chunk: Chunk, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for p in self.probes:
            out.update(p(chunk, target_logits, draft_logits))
        return out

    def chunk(self, chunk: Chunk, scores: ChunkScores) -> None:
        self.held.append((chunk, scores))

    def batch_done(self) -> None:  # the batch is committed by `commit`, once it survived
        pass

    def drop(self) -> None:
        self.held = []

    def commit(self) -> None:
        held, self.held = self.held, []
        for c, s in held:
            for sink in self.sinks:
                sink.chunk(c, s)
        for sink in self.sinks:
            sink.batch_done()
