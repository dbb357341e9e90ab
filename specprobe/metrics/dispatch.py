"""Which implementation computes a chunk's per-position metrics: one table (`ROUTES`),
read top to bottom, the first row whose condition holds wins. The implementations:

    head     `probe.scoring.score_head_chunk`: a head drafter's logits kept in its own
             vocabulary, the target's side computed once for every depth (the caller
             runs it: it reads the head's vocabulary, which metrics never sees)
    fused    `core.position_metrics_fused`: one torch.compile'd function per chunk
    rows     `blocked.blocked_metrics` through `kernel`: numba-compiled rows
    blocks   `blocked.blocked_metrics` in torch ops, a few rows at a time

`core.position_metrics_reference`, the eager whole-chunk computation, is never picked:
it is what every implementation is tested against.

What the table cannot know beforehand is settled while a chunk runs: a compile error of
the rows or of the fused function hands the chunk on (rows: to the torch blocks; fused:
to the rows or blocks) and switches that implementation off for the process, and rows
whose logits hold NaN or +inf are redone one at a time in torch ops."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import Literal

import torch

from specprobe.metrics.sampling import Sampling


class Scorer(Enum):
    HEAD = "head"
    FUSED = "fused"
    ROWS = "rows"
    BLOCKS = "blocks"


# "full": a head over the target's whole vocabulary (Medusa, MTP, EAGLE without d2t);
# "draft": a head with a vocabulary of its own (EAGLE-3's d2t, a Medusa token map)
Head = Literal["", "full", "draft"]


@dataclass(frozen=True)
class Case:
    """What the choice reads about a chunk (the environment is read when choosing)."""

    device: torch.device
    dtype: torch.dtype  # both sides' logits, promoted to one dtype
    target: Sampling
    draft: Sampling
    head: Head = ""

    @property
    def truncates(self) -> bool:
        """Either side samples through top-k/top-p/min-p (a greedy side ignores them)."""
        return any(s.truncates and not s.greedy for s in (self.target, self.draft))


def case(target_logits: torch.Tensor, draft_logits: torch.Tensor | None, target: Sampling, draft: Sampling, head: Head = "") -> Case:
    """The case of [N, V] target and [N, V'] drafter logits; draft_logits None (a head's,
    not computed yet): the target's dtype."""
    dtype = target_logits.dtype if draft_logits is None else torch.promote_types(target_logits.dtype, draft_logits.dtype)
    return Case(target_logits.device, dtype, target, draft, head)


_NUMBA: dict[str, ModuleType | None] = {}


def compiled_rows() -> ModuleType | None:
    """`metrics.kernel`, or None when numba cannot be imported (then the torch blocks
    score). Imported on first use, so that a run whose chunks the rows never take (a GPU,
    truncating sampling) does without numba."""
    if "kernel" not in _NUMBA:
        try:
            # deferred: numba is optional — a missing or broken one leaves the torch blocks
            from specprobe.metrics import kernel

            _NUMBA["kernel"] = kernel
        except Exception:  # numba missing or broken: the torch blocks
            _NUMBA["kernel"] = None
    return _NUMBA["kernel"]


def _rows_work() -> bool:
    kernel = compiled_rows()
    return kernel is not None and bool(kernel.enabled())


# Why the compiled rows cannot take a case, in the order asked; none applies: they take it.
ROWS_REFUSE: tuple[tuple[Callable[[Case], bool], str], ...] = (
    (lambda c: os.environ.get("SPECPROBE_SCORER", "") == "torch", "SPECPROBE_SCORER=torch asks for the torch ops"),
    (lambda c: c.device.type != "cpu", "not a CPU: the rows are host code, and a GPU scores the whole chunk as one block of torch ops"),
    (lambda c: c.truncates, "truncating sampling: the engine's transform (`sampling.truncate_`) needs p and q materialised"),
    (lambda c: c.dtype not in (torch.float32, torch.bfloat16, torch.float16), "the rows read float32 (half precision is copied to it; float64 is not narrowed)"),
    (lambda c: not _rows_work(), "numba cannot be imported, or the rows failed to compile earlier in this process"),
)


def rows_refuse(c: Case) -> str | None:
    """Why the compiled rows cannot take `c`, or None when they can."""
    return next((why for cond, why in ROWS_REFUSE if cond(c)), None)


@dataclass(frozen=True)
class Route:
    scorer: Scorer
    when: Callable[[Case], bool]
    why: str


ROUTES: tuple[Route, ...] = (
    Route(Scorer.HEAD, lambda c: c.head == "draft",
          "a head with a vocabulary of its own: scored inside it (no [N, V] of −inf written per depth), the target's side once for every depth"),
    # measured on SmolLM2's width (K = 4, 64-row chunks, top-5): 13.5 ms a chunk through the
    # rows per depth, 46.8 ms for the head path's shared target side in torch ops; the same
    # numbers to 1e-5 (a tie at the target's top counts as agreement there, an argmax match here)
    Route(Scorer.HEAD, lambda c: c.head == "full" and rows_refuse(c) is not None,
          "a head over the whole vocabulary that the compiled rows cannot take: the target's side once for every depth beats redoing it per depth"),
    Route(Scorer.FUSED, lambda c: os.environ.get("SPECPROBE_FUSED", "0") == "1" and not c.truncates,
          "SPECPROBE_FUSED=1 (off by default: the first compile costs 0.5–2 minutes per process on a CPU, more than a small run's whole scoring; it pays off on long runs and GPUs); truncation is not in the compiled function"),
    Route(Scorer.BLOCKS, lambda c: rows_refuse(c) is not None, "the compiled rows cannot take it (`ROWS_REFUSE`)"),
    Route(Scorer.ROWS, lambda c: True,
          "a CPU under untruncated sampling: one read of each row from memory, every metric finished there, instead of a dozen torch-op passes"),
)


def pick(c: Case, among: tuple[Scorer, ...] = tuple(Scorer)) -> Route:
    """The first row of `ROUTES` for `c`, among the rows naming a scorer in `among`."""
    return next(r for r in ROUTES if r.scorer in among and r.when(c))
