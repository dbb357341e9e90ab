"""What a scoring chunk is and what it hands on: which positions it scored (`Chunk`), their
per-position metrics (`ChunkScores`, the fields of a row: `ROW_FIELDS`), a collector's
probe (`Probe`) and the collector every chunk goes to (`Collector`). `probe/scoring.py`
makes them; its collectors (drill-down, shards, out-of-memory buffering in `memory.py`)
read them from here, below the scoring loop, so none of them imports the loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

Row = str | int | float  # a per-position row's value: prompt id, domain, position, metrics
# accept_prob: Σ min(p, q), sampled drafts (and the alignment measure); accept_prob_greedy_draft:
# p(argmax q), the acceptance of the drafter's argmax (greedy drafting)
ROW_FIELDS = ("accept_prob", "accept_prob_greedy_draft", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence")


@dataclass(frozen=True)
class Chunk:
    """Which positions a chunk scored, in batch order (a prompt's positions are contiguous)."""

    prompt: np.ndarray  # [N] index into the prompt list
    token_pos: np.ndarray  # [N] index of the predicted reference token in prompt + continuation


@dataclass
class ChunkScores:
    """Per-position metrics of one chunk, as numpy arrays [N]."""

    values: dict[str, np.ndarray]  # ROW_FIELDS of the depth-1 prediction
    # head drafters only (depths d > 1 predicted directly): acceptance probability Σ min(p, q)
    # (0 where position t+1−d lies before the sequence) and drafter confidence max q
    alpha_by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    confidence_by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    # what collectors asked for beyond the metrics (depth 1): each side's top-k ([N, k],
    # `Collector.top_k`) and the outputs of their probes ([N], `Collector.probe`)
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    # [N] whose logits were not numbers (NaN, +inf, or all −inf): 0 neither, 1 the target,
    # 2 the drafter, 3 both; None when every position is fine. Those values are not metrics.
    broken: np.ndarray | None = None
    # the head depths' greedy-draft acceptance p(argmax q) (0 before the sequence, as α)
    greedy_by_depth: dict[int, np.ndarray] = field(default_factory=dict)
    # draft trees (`Collector.tree_width` > 0): depth -> (q [N, W], accept [N, W]), each
    # depth's top-W draft candidates and their acceptance probabilities (metrics.tree)
    tree: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


# A collector's probe sees the raw depth-1 logits of a chunk while they exist
# (chunk, target [N, V], drafter [N, V']) and returns [N] arrays for ChunkScores.extra.
Probe = Callable[[Chunk, torch.Tensor, torch.Tensor], dict[str, np.ndarray]]


class Collector(Protocol):
    """Receives every chunk of a batch, then `batch_done()`; a batch cut by Ctrl-C never
    gets `batch_done()`, so a collector that commits per batch keeps only whole ones.
    One with `wants_pass` also gets the batch's target pass before `batch_done()`:
    `target_pass(prompt indices, TargetPass, its KV cache)`."""

    def chunk(self, chunk: Chunk, scores: ChunkScores) -> None: ...

    def batch_done(self) -> None: ...


def _runs(labels: np.ndarray) -> list[slice]:
    """Slices of equal consecutive labels: [3, 3, 5, 5, 5] -> [0:2, 2:5]."""
    cuts = [0, *(np.flatnonzero(np.diff(labels)) + 1).tolist(), len(labels)]
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
