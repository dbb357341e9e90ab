"""The what-if of a target served quantized (--target-quant, --kv-cache-dtype fp8): the
drafter scored against the full-precision target at the same positions, beside the
score against the served one, and the served target against its full-precision self.

The full-precision logits come from a second target forward over each scoring batch
with the original weights swapped back in (and the attention as loaded); nothing runs
for a target served as loaded. Its metrics:

  accept_prob_full_target   the engine's acceptance of the drafter against the full target
  quant_accept_cost         that minus the acceptance against the served target, at the
                            same positions: what the target's quantization costs this drafter
  target_quant_accept       the engine's acceptance of the full target drafting for the
                            served one: how far the verifier moved
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specprobe.metrics.core import position_metrics
from specprobe.models.quant import as_loaded


def served_differently(target: Any) -> bool:
    return getattr(target, "quant", None) is not None or getattr(target, "kv_cache_dtype", None) is not None


class FullTargetWhatIf:
    """A scoring collector: its probe runs the full-precision target once per scoring
    batch (the batches `scoring.score` forms: by length, `batch_size` at a time) and
    scores the chunk's positions against it."""

    def __init__(self, target: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], sampling: Any, drafting: str, batch_size: int) -> None:
        self.target, self.encoded, self.conts, self.sampling = target, encoded, conts, sampling
        self.greedy = drafting == "greedy"
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]) + len(conts[i]))
        order = [i for i in order if conts[i]]
        self.batch_of = {i: order[(n // batch_size) * batch_size : (n // batch_size + 1) * batch_size] for n, i in enumerate(order)}
        self.hidden: dict[int, tuple[torch.Tensor, int]] = {}  # prompt -> (its row of the last hidden states [S, H])
        self.n = 0
        self.sums = np.zeros(3)  # served α, full α, full-vs-served α
        self._pending: list[np.ndarray] = []

    # the probe sees the served logits and the drafter's, while they exist
    def probe(self, chunk: Any, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> dict[str, np.ndarray]:
        rows = []
        for p in dict.fromkeys(int(x) for x in chunk.prompt):
            if p not in self.hidden:
                self._forward(self.batch_of[p])
        for p, tok in zip(chunk.prompt.tolist(), chunk.token_pos.tolist(), strict=True):
            rows.append(self.hidden[p][0][tok - 1])
        full = self.target.head(torch.stack(rows))  # [N, V]
        key = "accept_prob_greedy_draft" if self.greedy else "accept_prob"
        vs_full = getattr(position_metrics(full, draft_logits, self.sampling.target, self.sampling.draft), key)
        moved = getattr(position_metrics(target_logits, full, self.sampling.target, self.sampling.target), key)
        for p in dict.fromkeys(int(x) for x in chunk.prompt):  # a prompt's positions are contiguous: drop what is done
            if int(chunk.token_pos[chunk.prompt == p].max()) >= len(self.encoded[p]) + len(self.conts[p]) - 1:
                self.hidden.pop(p, None)
        return {"whatif_full_target": vs_full.float().cpu().numpy(), "whatif_target_moved": moved.float().cpu().numpy()}

    def _forward(self, batch: list[int]) -> None:
        seqs = [list(self.encoded[i]) + list(self.conts[i]) for i in batch]
        tok = self.target.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
            mask[r, : len(s)] = 1
        with as_loaded(self.target):
            h = self.target.last_hidden(ids.to(self.target.device), mask.to(self.target.device))
        for r, i in enumerate(batch):
            self.hidden[i] = (h[r], len(seqs[r]))

    def chunk(self, chunk: Any, scores: Any) -> None:
        key = "accept_prob_greedy_draft" if self.greedy else "accept_prob"
        served = scores.values.get(key)
        full = scores.extra.get("whatif_full_target")
        moved = scores.extra.get("whatif_target_moved")
        if served is None or full is None or moved is None:
            return
        ok = np.isfinite(served) & np.isfinite(full) & np.isfinite(moved)
        if scores.broken is not None:
            ok &= scores.broken == 0
        self._pending.append(np.stack([served[ok], full[ok], moved[ok]]))

    def batch_done(self) -> None:  # a batch cut short (Ctrl-C, out of memory) never counts
        for block in self._pending:
            self.n += block.shape[1]
            self.sums += block.sum(axis=1)
        self._pending = []

    def metrics(self) -> dict[str, float | None]:
        if not self.n:
            return {}
        served, full, moved = (float(x) for x in self.sums / self.n)
        return {"accept_prob_full_target": full, "quant_accept_cost": full - served, "target_quant_accept": moved}
