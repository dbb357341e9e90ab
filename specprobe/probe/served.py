"""The what-if of a side served quantized (--target-quant, --draft-quant, the fp8 KV
cache): the drafter scored against the full-precision target at the same positions,
beside the score against the served one; the served target against its full-precision
self; a drafter served quantized against the same drafter in full precision.

The full-precision logits come from a second forward over each scoring batch with the
original nn.Linear modules swapped back in for the quantized ones (the weights as loaded,
kept beside their quantized form: no second float copy; specprobe.precision.quant) and the
attention as loaded; nothing runs for sides served as loaded. A quantized checkpoint from
disk has no full-precision weights to swap in, so it gets no what-if. A self-draft is the target's own layers, so the full-precision
system is the full target with its full-precision first layers. Its metrics:

  accept_prob_full_target   the engine's acceptance of the drafter against the full target
                            (a self-draft: its own full-precision layers too)
  quant_accept_cost         that minus the acceptance against the served target, at the
                            same positions: what the target's quantization costs this drafter
  target_quant_accept       the engine's acceptance of the full target drafting for the
                            served one: how far the verifier moved
  accept_prob_full_drafter  a drafter model served quantized (--draft-quant, its fp8 KV
                            cache): the full-precision drafter against the served target
  draft_quant_accept_cost   that minus the acceptance of the served drafter
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from specprobe.metrics.core import position_metrics
from specprobe.precision.quant import as_loaded
from specprobe.probe.scoring import _pad_id, _right_padded


def served_differently(target: Any) -> bool:
    return getattr(target, "quant", None) is not None or getattr(target, "kv_cache_dtype", None) is not None


class FullTargetWhatIf:
    """A scoring collector: its probe runs the full-precision sides once per scoring batch
    (the batches `scoring.score` forms: by length, `batch_size` at a time) and scores the
    chunk's positions against them."""

    KEYS = ("served", "full_target", "target_moved", "full_drafter")

    def __init__(self, target: Any, drafter: Any, encoded: Sequence[Sequence[int]], conts: Sequence[Sequence[int]], sampling: Any, drafting: str, batch_size: int) -> None:
        self.target, self.drafter, self.encoded, self.conts, self.sampling = target, drafter, encoded, conts, sampling
        own = getattr(drafter, "loaded", None)
        self.draft_model = own if own is not None and served_differently(own) else None
        self.do_target = served_differently(target)
        self.greedy = drafting == "greedy"
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]) + len(conts[i]))
        order = [i for i in order if conts[i]]
        self.batch_of = {i: order[(n // batch_size) * batch_size : (n // batch_size + 1) * batch_size] for n, i in enumerate(order)}
        self.hidden: dict[int, dict[str, torch.Tensor]] = {}  # prompt -> side -> its row of hidden states [S, H]
        self.n = np.zeros(len(self.KEYS))
        self.sums = np.zeros(len(self.KEYS))
        self._pending: list[dict[str, np.ndarray]] = []

    @property
    def key(self) -> str:
        return "accept_prob_greedy_draft" if self.greedy else "accept_prob"

    def _alpha(self, target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_sampling: Any) -> np.ndarray:
        return getattr(position_metrics(target_logits, draft_logits, self.sampling.target, draft_sampling), self.key).float().cpu().numpy()

    # the probe sees the served logits and the drafter's, while they exist
    def probe(self, chunk: Any, target_logits: torch.Tensor, draft_logits: torch.Tensor) -> dict[str, np.ndarray]:
        for p in dict.fromkeys(int(x) for x in chunk.prompt):
            if p not in self.hidden:
                self._forward(self.batch_of[p])

        def rows(side: str) -> torch.Tensor:
            return torch.stack([self.hidden[p][side][tok - 1] for p, tok in zip(chunk.prompt.tolist(), chunk.token_pos.tolist(), strict=True)])

        out: dict[str, np.ndarray] = {}
        if self.do_target:
            full = self.target.head(rows("target"))  # [N, V]
            if "self_draft" in self.hidden[int(chunk.prompt[0])]:
                own_full = self.drafter.logits(rows("self_draft"), 1)
            elif getattr(self.drafter, "loaded", None) is None:  # `self`: the full target drafts for itself
                own_full = full
            else:
                own_full = draft_logits
            out["whatif_full_target"] = self._alpha(full, own_full, self.sampling.draft)
            out["whatif_target_moved"] = self._alpha(target_logits, full, self.sampling.target)
        if self.draft_model is not None:
            out["whatif_full_drafter"] = self._alpha(target_logits, self.draft_model.head(rows("drafter")), self.sampling.draft)
        for p in dict.fromkeys(int(x) for x in chunk.prompt):  # a prompt's positions are contiguous: drop what is done
            if int(chunk.token_pos[chunk.prompt == p].max()) >= len(self.encoded[p]) + len(self.conts[p]) - 1:
                self.hidden.pop(p, None)
        return out

    def _forward(self, batch: list[int]) -> None:
        from specprobe.drafters.base import TargetPass
        from specprobe.models.anatomy import capture_layers

        seqs = [list(self.encoded[i]) + list(self.conts[i]) for i in batch]
        ids, mask = _right_padded(seqs, _pad_id(self.target.tokenizer), self.target.device)  # as the scoring pass pads them
        sides: dict[str, torch.Tensor] = {}
        if self.do_target:
            layer_skip = self.drafter.kind == "layer_skip"
            with as_loaded(self.target), capture_layers(self.target.model, self.drafter.target_layers_needed() if layer_skip else ()) as captured:
                sides["target"] = self.target.last_hidden(ids, mask)
                if layer_skip:  # the self-draft's own full-precision layers
                    sides["self_draft"] = self.drafter.hidden(TargetPass(ids, mask, sides["target"], dict(captured)))[1]
        if self.draft_model is not None:
            with as_loaded(self.draft_model):
                sides["drafter"] = self.draft_model.last_hidden(ids.to(self.draft_model.device), mask.to(self.draft_model.device))
        for r, i in enumerate(batch):
            self.hidden[i] = {k: v[r] for k, v in sides.items()}

    def chunk(self, chunk: Any, scores: Any) -> None:
        served = scores.values.get(self.key)
        if served is None:
            return
        ok = np.isfinite(served)
        if scores.broken is not None:
            ok &= scores.broken == 0
        cols = {"served": served, "full_target": scores.extra.get("whatif_full_target"), "target_moved": scores.extra.get("whatif_target_moved"), "full_drafter": scores.extra.get("whatif_full_drafter")}
        self._pending.append({k: v[ok] for k, v in cols.items() if v is not None})

    def batch_done(self) -> None:  # a batch cut short (Ctrl-C, out of memory) never counts
        for block in self._pending:
            for j, k in enumerate(self.KEYS):
                if k in block:
                    self.n[j] += block[k].size
                    self.sums[j] += float(block[k].sum())
        self._pending = []

    def metrics(self) -> dict[str, float]:
        mean = {k: float(self.sums[j] / self.n[j]) for j, k in enumerate(self.KEYS) if self.n[j]}
        if "served" not in mean:
            return {}
        out: dict[str, float] = {}
        if "full_target" in mean:
            out.update(accept_prob_full_target=mean["full_target"], quant_accept_cost=mean["full_target"] - mean["served"], target_quant_accept=mean["target_moved"])
        if "full_drafter" in mean:
            out.update(accept_prob_full_drafter=mean["full_drafter"], draft_quant_accept_cost=mean["full_drafter"] - mean["served"])
        return out
