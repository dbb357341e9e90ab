"""What-ifs from the logits already in hand during scoring, each set beside the real value
on the same positions:

- the drafter sampling with the target's settings (only when the two sides' sampling
  transforms differ): how much of the loss is configuration, not training;
- both sides greedy (α = greedy agreement) and both sides at each temperature of a small
  grid (the target's top-k / top-p / min-p kept): what another serving temperature buys;
- the vocabulary ceiling: the target's mass on ids the drafter can propose at all (its
  logits are −inf on ids beyond its vocabulary and, for a head with a reduced draft
  vocabulary, on every id the map leaves out); α cannot exceed it;
- α per domain against the overall, ranked by what matching the best domain would add.

The logit what-ifs cost passes over [N, V], so they run on every n-th prompt
(`default_every`), one what-if per sampled prompt in turn; whole prompts, so τ can be
chained along each sequence (the depth-1 acceptance, as for an autoregressive drafter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from specprobe.metrics.blocked import blocked_metrics
from specprobe.metrics.core import align_vocab
from specprobe.metrics.sampling import probs

# Both sides at these temperatures (greedy is the extra row "both greedy").
TEMPERATURE_GRID = (0.5, 0.7, 1.0)


def default_every(num_prompts: int) -> int:
    """Counterfactual sample stride: every prompt of a run of one or two; beyond, every
    second prompt, fewer from 48 prompts on (about 16), and 1 in 8 from 128 on. A sampled
    position costs about one more metrics pass, so this keeps the what-ifs near 5 % of
    scoring (every prompt would be 10 % or more: the metrics are a fifth of it on CPU)."""
    if num_prompts <= 2:
        return 1
    return max(2, min(8, -(-num_prompts // 16)))


def _transform(s: Any) -> tuple[Any, ...]:
    return ("greedy",) if s.greedy else (float(s.temperature), int(s.top_k or 0), float(s.top_p), float(s.min_p), s.semantics if s.truncates else None)


def settings_differ(pair: Any) -> bool:
    """True when the drafter's sampling transform is not the target's."""
    return _transform(pair.target) != _transform(pair.draft)


# ----------------------------------------------------------------------------- pure maths
def _probs(logits: Any, s: Any) -> Any:
    """A side's sampling distribution [N, V] as a fresh tensor; untruncated sampling is
    written in place over one copy (the what-ifs run per chunk: allocations count)."""
    if s.greedy or s.truncates:
        return probs(logits, s)
    x = logits.float().mul(1.0 / float(s.temperature))  # a copy
    x.sub_(x.amax(-1, keepdim=True)).exp_()
    return x.div_(x.sum(-1, keepdim=True))


def accept_prob(target_logits: Any, draft_logits: Any, target_sampling: Any, draft_sampling: Any) -> Any:
    """α = Σ min(p, q) per row, each side under the given settings. [N, V], [N, V'] -> [N]."""
    import torch


    dl = align_vocab(draft_logits, target_logits.shape[-1])
    if target_sampling.greedy and draft_sampling.greedy:
        return (target_logits.argmax(-1) == dl.argmax(-1)).float()
    if target_logits.dtype == dl.dtype and not (target_sampling.truncates or draft_sampling.truncates):
        # the scorer's cache-blocked pass (a few rows at a time): far fewer trips to memory

        return blocked_metrics(target_logits, dl, target_sampling, draft_sampling)["alpha"].clamp_(0.0, 1.0)
    p = _probs(target_logits, target_sampling)
    return torch.minimum(p, _probs(dl, draft_sampling), out=p).sum(-1).clamp_(0.0, 1.0)


def never_proposed(draft_logits: Any, vocab: int) -> Any:
    """[V] bool: target ids whose drafter logit is −inf in every row (beyond its
    vocabulary, outside a head's draft vocabulary): ids it can never propose."""
    import torch


    return torch.isneginf(align_vocab(draft_logits, vocab)).all(0)


def vocab_ceiling(target_logits: Any, draft_logits: Any, target_sampling: Any, never: Any = None) -> Any:
    """[N] target mass (its sampling distribution) on ids the drafter can propose: the
    most α can be, whatever the drafter's training. never: `never_proposed` (computed
    here when not given)."""
    import torch

    if never is None:
        never = never_proposed(draft_logits, target_logits.shape[-1])
    if not bool(never.any()):
        return torch.ones(target_logits.shape[0], device=target_logits.device)
    p = _probs(target_logits, target_sampling)
    return p.masked_fill_(never.to(p.device), 0.0).sum(-1).clamp_(0.0, 1.0)


class CounterfactualProbe:
    """A scoring probe (`chunks.Probe`): on the rows of every `every`-th prompt, α under
    one what-if setting and the vocabulary ceiling, as [N] arrays (NaN elsewhere).

    The what-ifs take turns over the sampled prompts — the drafter at the target's
    settings (when they differ), then each grid temperature — so each sampled position
    costs one α computation however many what-ifs there are. A grid temperature that
    reproduces the run's own settings is not computed at all: its α is the real one
    (`same_as_real`, filled in by the collector). The ids the drafter can never propose
    are a property of the drafter, read from the first chunk."""

    def __init__(self, pair: Any, every: int) -> None:
        self.pair = pair
        self.every = max(1, int(every))
        self.aligned = settings_differ(pair)
        grid = [(t, replace(pair.target, temperature=t)) for t in TEMPERATURE_GRID]
        real = None if self.aligned else _transform(pair.target)
        self.same_as_real = {f"cf_temperature_{t:g}" for t, s in grid if _transform(s) == real}
        # (key, target side, drafter side), one per turn
        self.turns = [("cf_aligned_sampling", pair.target, pair.target)] if self.aligned else []
        self.turns += [(f"cf_temperature_{t:g}", s, s) for t, s in grid if f"cf_temperature_{t:g}" not in self.same_as_real]
        self._never: Any = None

    def sampled(self, prompt_index: np.ndarray) -> np.ndarray:
        return np.asarray(prompt_index) % self.every == 0

    def __call__(self, chunk: Any, target_logits: Any, draft_logits: Any) -> dict[str, np.ndarray]:
        import torch

        prompt = np.asarray(chunk.prompt)
        rows = np.flatnonzero(self.sampled(prompt))
        if rows.size == 0:
            return {}
        n = len(prompt)
        if self._never is None:
            self._never = never_proposed(draft_logits, target_logits.shape[-1])

        def pick(r: np.ndarray) -> tuple[Any, Any]:
            if r.size == n:  # the whole chunk: no copy
                return target_logits, draft_logits
            idx = torch.from_numpy(r).to(target_logits.device)
            return target_logits[idx], draft_logits[idx]  # [n, V], [n, V']

        def put(name: str, r: np.ndarray, v: Any) -> None:
            a = np.full(n, np.nan, dtype=np.float32)
            a[r] = v.float().cpu().numpy()
            out[name] = a

        out: dict[str, np.ndarray] = {}
        turn = (prompt[rows] // self.every) % max(len(self.turns), 1)  # whose turn each row's prompt is
        for g, (key, ts, ds) in enumerate(self.turns):
            mine = rows[turn == g]
            if mine.size:
                put(key, mine, accept_prob(*pick(mine), ts, ds))
        tl, dl = pick(rows)
        put("cf_vocab_ceiling", rows, vocab_ceiling(tl, dl, self.pair.target, self._never))
        return out


# ----------------------------------------------------------------------------- summaries
@dataclass
class Chain:
    """Mean α and the window depth sums of one what-if over whole sequences: r_j(t) =
    Π_{i<j} α_{t+i}, the chaining the diagnose estimate uses for an autoregressive drafter."""

    k_max: int
    positions: int = 0
    alpha_sum: float = 0.0
    depth_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))
    depth_count: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.depth_sum = np.zeros(self.k_max)
        self.depth_count = np.zeros(self.k_max)

    def add(self, alpha: np.ndarray) -> None:
        a = np.asarray(alpha, dtype=np.float64)
        n = a.shape[0]
        self.positions += n
        self.alpha_sum += float(a.sum())
        r = np.ones(n)
        for j in range(1, self.k_max + 1):
            m = n - j + 1
            if m <= 0:
                break
            r = r[:m] * a[j - 1 : j - 1 + m]
            self.depth_sum[j - 1] += r.sum()
            self.depth_count[j - 1] += m

    @property
    def mean(self) -> float | None:
        return self.alpha_sum / self.positions if self.positions else None

    def tau(self, k: int | None) -> float | None:
        """τ(K) = 1 + Σ_{j≤K} r_j (bonus token included)."""
        if not self.positions or not k:
            return None
        k = min(k, self.k_max)
        with np.errstate(invalid="ignore", divide="ignore"):
            r = np.where(self.depth_count[:k] > 0, self.depth_sum[:k] / np.maximum(self.depth_count[:k], 1), 0.0)
        return float(1.0 + r.sum())


def what_if_rows(real: Mapping[str, Chain], accs: Mapping[str, Chain], pair: Any, k: int | None) -> list[dict[str, Any]]:
    """Rows of the what-if table, each with the real α and τ on the same positions
    (real[key]). keys: "greedy", "cf_aligned_sampling", "cf_temperature_<T>",
    "cf_vocab_ceiling"."""
    rows: list[dict[str, Any]] = []

    def row(key: str, name: str, src: str, temperature: float | None = None, with_tau: bool = True) -> None:
        acc, r = accs[src], real[src]
        rows.append({
            "key": key, "name": name, "temperature": temperature, "positions": acc.positions, "accept_prob": acc.mean, "accept_prob_real": r.mean,
            "tau_tokens": acc.tau(k) if with_tau else None, "tau_tokens_real": r.tau(k) if with_tau else None,
        })

    if "cf_aligned_sampling" in accs:
        row("aligned_sampling", f"drafter at the target's settings ({pair.target.describe()}; now {pair.draft.describe()})", "cf_aligned_sampling")
    if "greedy" in accs:
        row("greedy", "both greedy", "greedy", 0.0)
    for t in TEMPERATURE_GRID:
        if f"cf_temperature_{t:g}" in accs:
            row("temperature", f"both at T={t:g}" + (" (target's top-k/p kept)" if pair.target.truncates else ""), f"cf_temperature_{t:g}", t)
    if "cf_vocab_ceiling" in accs:
        row("vocab_ceiling", "vocabulary ceiling (target mass it can propose)", "cf_vocab_ceiling", with_tau=False)
    return rows


def what_if_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Catalogue metrics the rules read: α with aligned sampling, the share of α the
    configuration costs, the vocabulary ceiling."""
    by = {r["key"]: r for r in rows}
    out: dict[str, Any] = {"accept_prob_aligned_sampling": None, "accept_prob_config_loss_frac": None, "accept_prob_vocab_ceiling": None}
    al = by.get("aligned_sampling")
    if al and al["accept_prob"] is not None and al["accept_prob_real"] is not None:
        out["accept_prob_aligned_sampling"] = al["accept_prob"]
        if al["accept_prob"] > 0:
            out["accept_prob_config_loss_frac"] = (al["accept_prob"] - al["accept_prob_real"]) / al["accept_prob"]
    ceil = by.get("vocab_ceiling")
    if ceil and ceil["accept_prob"] is not None:
        out["accept_prob_vocab_ceiling"] = ceil["accept_prob"]
    return out


def domain_gains(by_domain: Sequence[Mapping[str, Any]], overall: float | None) -> list[dict[str, Any]]:
    """Each domain's α against the overall, ranked by the overall α it would add by
    reaching the best domain's α (its share of positions × its gap to the best)."""
    rows = [d for d in by_domain if d.get("positions") and d.get("accept_prob_mean") is not None]
    if not rows or overall is None:
        return []
    total = sum(int(d["positions"]) for d in rows)
    best = max(float(d["accept_prob_mean"]) for d in rows)
    out = [
        {
            "domain": d["group"], "positions": int(d["positions"]), "accept_prob_mean": float(d["accept_prob_mean"]),
            "vs_overall": float(d["accept_prob_mean"]) - overall,
            "gain_if_best": int(d["positions"]) / total * (best - float(d["accept_prob_mean"])),
        }
        for d in rows
    ]
    return sorted(out, key=lambda r: (-r["gain_if_best"], r["accept_prob_mean"]))
