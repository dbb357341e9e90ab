"""Mergeable accumulators for per-position metrics: sums, counts and histograms only, so
memory does not grow with the number of prompts and shards of a run can be merged.

Two estimates of the depth curves live here side by side: the window sums (every start
position) and the renewal sums (expected counters of the rounds a real loop would run,
`estimate.renewal_counts`).

Both read the acceptance of one draft token under the engine's procedure (`drafting`):
greedy drafts are accepted with p(argmax q) (`accept_prob_greedy_draft`), sampled drafts
with Σ min(p, q) (`accept_prob`). Both are summed in every group whatever the drafting, so
Σ min(p, q) stays the alignment measure KL and the drafter-quality bands read; the depth
curves, τ, adaptive K and `accept_prob_engine_mean` take the procedure's."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specprobe.estimates.estimate import renewal_counts, renewal_tau, renewal_tokens_per_verify
from specprobe.metrics.uncertainty import ratio_se, squares, thin

# Fields summed per group; index order is fixed.
FIELDS = ("accept_prob", "greedy_agree", "kl_target_draft_nats", "target_entropy_nats", "draft_confidence", "accept_prob_greedy_draft")
_NF = len(FIELDS)
GREEDY, PROBABILISTIC = "greedy", "probabilistic"
# the column of FIELDS that is one draft token's acceptance under each drafting
_ACCEPT = {GREEDY: FIELDS.index("accept_prob_greedy_draft"), PROBABILISTIC: FIELDS.index("accept_prob")}
ENTROPY_EDGES = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, math.inf)
POSITION_EDGES = (0, 32, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096, 8192, math.inf)
ALPHA_EDGES = tuple(np.linspace(0.0, 1.0, 21).tolist())
# Fine log-spaced KL bins for percentiles; reports show a coarser histogram derived from it.
KL_FINE_EDGES = tuple([0.0, *np.geomspace(1e-4, 100.0, 361).tolist(), math.inf])
KL_REPORT_EDGES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0, 8.0, math.inf)
THRESHOLDS = tuple(round(x, 2) for x in np.arange(0.0, 1.0, 0.05).tolist())
HIGH_ENTROPY_NATS = 2.0


def _bucket_label(lo: float, hi: float, unit: str) -> str:
    if math.isinf(hi):
        return f"≥{lo:g}{unit}"
    if unit:
        return f"{lo:g}–{hi:g}{unit}"
    return f"{int(lo)}–{int(hi) - 1}"


@dataclass
class Accumulator:
    k_max: int = 8
    drafting: str = PROBABILISTIC  # whose acceptance the depth curves, τ and adaptive K read
    # llama.cpp's early stop: a round drafts while the drafter's confidence (draft_confidence,
    # llama.cpp's own under --engine llama.cpp) stays ≥ p_min, and drops a draft shorter
    # than n_min; the depth curves and the renewal τ follow it (0, 0: K tokens every round)
    p_min: float = 0.0
    n_min: int = 0
    # SGLang's relaxed acceptance of a greedy draft x: 1 where p(x) ≥ threshold_single,
    # else min(1, p(x) / threshold_acc) — p(x) itself at (1, 1)
    threshold_single: float = 1.0
    threshold_acc: float = 1.0
    overall: np.ndarray = field(default_factory=lambda: np.zeros(_NF + 1))
    domains: dict[str, np.ndarray] = field(default_factory=dict)
    # the prompt file's own categories (Spec-Bench's 13, MT-Bench's 8) beside the folded domains
    categories: dict[str, np.ndarray] = field(default_factory=dict)
    # context-position buckets within each domain: long-context decay is read inside a
    # domain, so a suite whose long prompts are all summarisation does not fake it
    domain_position: dict[str, np.ndarray] = field(default_factory=dict)
    entropy: np.ndarray = field(default_factory=lambda: np.zeros((len(ENTROPY_EDGES) - 1, _NF + 1)))
    position: np.ndarray = field(default_factory=lambda: np.zeros((len(POSITION_EDGES) - 1, _NF + 1)))
    alpha_hist: np.ndarray = field(default_factory=lambda: np.zeros(len(ALPHA_EDGES) - 1, dtype=np.int64))
    kl_hist: np.ndarray = field(default_factory=lambda: np.zeros(len(KL_FINE_EDGES) - 1, dtype=np.int64))
    depth_sum: np.ndarray = field(default_factory=lambda: np.zeros(8))
    depth_count: np.ndarray = field(default_factory=lambda: np.zeros(8))
    # adaptive K: per threshold, Σ expected accepted tokens, Σ drafter passes, Σ drafted, windows
    adaptive: np.ndarray = field(default_factory=lambda: np.zeros((len(THRESHOLDS), 4)))
    high_entropy: np.ndarray = field(default_factory=lambda: np.zeros(2))
    num_prompts: int = 0
    # renewal estimate, per K = 1..k_max (row K−1): Σ tokens, Σ expected rounds, and the
    # expected vLLM counters Σ accepted / Σ drafted at depth i (column i−1)
    renewal_tokens: float = 0.0
    renewal_rounds: np.ndarray = field(default_factory=lambda: np.zeros(0))
    renewal_accepted: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    renewal_drafted: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    # the renewal counters' spread over prompts, for their standard errors (`renewal_se`):
    # per K (row K−1), over sequences, Σ A², Σ A·D and Σ D² of each sequence's accepted
    # tokens A and drafted tokens D; per (K, depth i), Σ a_i², Σ a_i·d_i and Σ d_i² of its
    # rounds accepting depths 1..i (a_i) and its rounds drafting depth i (d_i). Sums again,
    # so shards still merge.
    renewal_sq: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    renewal_pos_sq: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 3)))
    # the depth curve's spread over prompts (`depth_se`): per depth j (row j−1), Σ s², Σ s·c,
    # Σ c² of each sequence's Σ_t r_j(t) (s) and its windows (c), and how many sequences
    # reached depth j; nan in states saved before they were kept
    depth_sq: np.ndarray = field(default_factory=lambda: np.zeros((0, 3)))
    depth_prompts: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.drafting not in _ACCEPT:
            raise ValueError(f"drafting {self.drafting!r} is not one of {', '.join(_ACCEPT)}")
        if len(self.depth_sum) != self.k_max:
            self.depth_sum = np.zeros(self.k_max)
            self.depth_count = np.zeros(self.k_max)
        if len(self.renewal_rounds) != self.k_max:
            self.renewal_rounds = np.zeros(self.k_max)
            self.renewal_accepted = np.zeros((self.k_max, self.k_max))
            self.renewal_drafted = np.zeros((self.k_max, self.k_max))
        if len(self.depth_sq) != self.k_max:
            self.depth_sq = np.zeros((self.k_max, 3))
            self.depth_prompts = np.zeros(self.k_max)
        if len(self.renewal_sq) != self.k_max:
            self.renewal_sq = np.zeros((self.k_max, 3))
            self.renewal_pos_sq = np.zeros((self.k_max, self.k_max, 3))

    # ------------------------------------------------------------------ adding
    @staticmethod
    def _rows(values: np.ndarray) -> np.ndarray:
        """[N, F] values -> [F+1] (count, sums...)."""
        return np.concatenate([[values.shape[0]], values.sum(axis=0)])

    def _add_grouped(self, table: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        np.add.at(table[:, 0], keys, 1)
        for j in range(_NF):
            np.add.at(table[:, j + 1], keys, values[:, j])

    def add_sequence(
        self,
        domain: str,
        positions: np.ndarray,
        values: dict[str, np.ndarray],
        alpha_by_depth: dict[int, np.ndarray] | None = None,
        confidence_by_depth: dict[int, np.ndarray] | None = None,
        category: str | None = None,
        greedy_by_depth: dict[int, np.ndarray] | None = None,
    ) -> None:
        """One reference sequence: per-position metric arrays in token order.

        alpha_by_depth[d][t] is Σ min(p, q) of the depth-d prediction of reference token t
        (head drafters), greedy_by_depth[d][t] its p(argmax q); missing depths chain depth 1
        (autoregressive). The depth curves read the one `drafting` names."""
        if self.drafting == GREEDY and min(self.threshold_single, self.threshold_acc) < 1:
            values = {**values, "accept_prob_greedy_draft": self.relaxed(values["accept_prob_greedy_draft"])}
            greedy_by_depth = {d: self.relaxed(g) for d, g in (greedy_by_depth or {}).items()} or greedy_by_depth
        mat = np.stack([np.asarray(values[f], dtype=np.float64) for f in FIELDS], axis=1)  # [N, F]
        n = mat.shape[0]
        if n == 0:
            return
        self.num_prompts += 1
        self.overall += self._rows(mat)
        row = self.domains.setdefault(domain, np.zeros(_NF + 1))
        row += self._rows(mat)
        cat = self.categories.setdefault(category or domain, np.zeros(_NF + 1))
        cat += self._rows(mat)
        ent = mat[:, 3]
        self._add_grouped(self.entropy, np.digitize(ent, ENTROPY_EDGES[1:-1]), mat)
        pos_bucket = np.digitize(positions, POSITION_EDGES[1:-1])
        self._add_grouped(self.position, pos_bucket, mat)
        dpos = self.domain_position.setdefault(domain, np.zeros((len(POSITION_EDGES) - 1, _NF + 1)))
        self._add_grouped(dpos, pos_bucket, mat)
        self.alpha_hist += np.histogram(np.clip(mat[:, 0], 0, 1), bins=ALPHA_EDGES)[0]
        self.kl_hist += np.histogram(mat[:, 2], bins=KL_FINE_EDGES)[0]
        hi = ent >= HIGH_ENTROPY_NATS
        self.high_entropy += (hi.sum(), mat[hi, 0].sum())

        by_depth = greedy_by_depth if self.drafting == GREEDY else alpha_by_depth
        if self.drafting == GREEDY and alpha_by_depth and not greedy_by_depth:
            # a head's deeper depths without their greedy acceptance would silently chain depth 1
            raise ValueError("greedy drafting needs greedy_by_depth where alpha_by_depth is given")
        alpha1 = mat[:, _ACCEPT[self.drafting]]
        conf1 = mat[:, 4]
        depth_alpha = [np.asarray((by_depth or {}).get(d, alpha1), dtype=np.float64) for d in range(1, self.k_max + 1)]
        depth_conf = [np.asarray((confidence_by_depth or {}).get(d, conf1), dtype=np.float64) for d in range(1, self.k_max + 1)]
        # r_j(t) = Π_{i<j} α^{(i+1)}_{t+i}, for every start t with t+j−1 inside the sequence.
        drafts = self._draft_lengths(depth_conf, n)  # [n] how deep a round at t drafts (None: K)
        r = np.ones(n)
        r_by_j = []
        for j in range(1, self.k_max + 1):
            m = n - j + 1
            if m <= 0:
                break
            r = r[:m] * depth_alpha[j - 1][j - 1 : j - 1 + m]
            # under the early stop depth j counts only where the round drafted it
            got = float((r if drafts is None else r * (drafts[:m] >= j)).sum())
            self.depth_sum[j - 1] += got
            self.depth_count[j - 1] += m
            self.depth_sq[j - 1] += squares(got, m)
            self.depth_prompts[j - 1] += 1
            r_by_j.append(r)
        # Adaptive K over full windows only (starts t ≤ n − k_max).
        w = n - self.k_max + 1
        if w > 0 and len(r_by_j) == self.k_max:
            R = np.stack([rj[:w] for rj in r_by_j], axis=1)  # [w, K] cumulative acceptance
            C = np.stack([depth_conf[j][j : j + w] for j in range(self.k_max)], axis=1)  # [w, K]
            for i, theta in enumerate(THRESHOLDS):
                keep = np.cumprod(theta <= C, axis=1)  # drafting continues while confident
                drafted = keep.sum(axis=1)
                passes = np.minimum(drafted + 1, self.k_max)
                self.adaptive[i] += ((R * keep).sum(), passes.sum(), drafted.sum(), w)
        # Renewal: rounds start only where the previous round ended.
        ren = renewal_counts(np.stack(depth_alpha), drafts, self.n_min)  # [K, n] -> counts for every K
        self.renewal_tokens += ren.tokens
        self.renewal_rounds += ren.rounds
        self.renewal_accepted += ren.accepted
        self.renewal_drafted += ren.drafted
        a, d = ren.accepted.sum(axis=1), ren.drafted.sum(axis=1)  # [K] accepted, drafted tokens
        self.renewal_sq += np.stack([a * a, a * d, d * d], axis=1)
        # per position i: rounds accepting 1..i against the rounds that drafted depth i
        self.renewal_pos_sq += np.stack([ren.accepted**2, ren.accepted * ren.drafted, ren.drafted**2], axis=2)

    def relaxed(self, p: np.ndarray) -> np.ndarray:
        """SGLang's acceptance of a greedy draft whose target probability is p
        (tree_speculative_sampling_target_only: accept when a uniform coin ≤ p ÷ threshold_acc
        or p ≥ threshold_single)."""
        p = np.asarray(p, dtype=np.float64)
        return np.where(p >= self.threshold_single, 1.0, np.minimum(1.0, p / self.threshold_acc))

    def _draft_lengths(self, depth_conf: list[np.ndarray], n: int) -> np.ndarray | None:
        """[n] the depths a round starting at t drafts before the early stop: the leading
        depths i whose confidence (of token t+i−1, depth i) is ≥ p_min; with n_min, 0 where
        fewer than n_min (the draft is dropped). None when neither knob is set."""
        if self.p_min <= 0 and self.n_min <= 1:
            return None
        length = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        for j in range(self.k_max):
            ok = np.zeros(n, dtype=bool)
            m = n - j
            if m > 0:
                ok[:m] = depth_conf[j][j : j + m] >= self.p_min
            alive &= ok
            length += alive
        if self.n_min > 1:
            length[length < self.n_min] = 0
        return length

    # ------------------------------------------------------------------ merging
    def merge(self, other: Accumulator) -> Accumulator:
        if other.k_max != self.k_max:
            raise ValueError("cannot merge accumulators with different k_max")
        if other.drafting != self.drafting:
            raise ValueError("cannot merge accumulators of different drafting")
        if (other.p_min, other.n_min, other.threshold_single, other.threshold_acc) != (self.p_min, self.n_min, self.threshold_single, self.threshold_acc):
            raise ValueError("cannot merge accumulators of different early stops (p_min, n_min)")
        self.overall += other.overall
        for k, v in other.domains.items():
            self.domains.setdefault(k, np.zeros(_NF + 1))
            self.domains[k] += v
        for k, v in other.categories.items():
            self.categories.setdefault(k, np.zeros(_NF + 1))
            self.categories[k] += v
        for k, v in other.domain_position.items():
            self.domain_position.setdefault(k, np.zeros_like(v))
            self.domain_position[k] += v
        self.entropy += other.entropy
        self.position += other.position
        self.alpha_hist += other.alpha_hist
        self.kl_hist += other.kl_hist
        self.depth_sum += other.depth_sum
        self.depth_count += other.depth_count
        self.adaptive += other.adaptive
        self.high_entropy += other.high_entropy
        self.num_prompts += other.num_prompts
        self.renewal_tokens += other.renewal_tokens
        self.renewal_rounds += other.renewal_rounds
        self.renewal_accepted += other.renewal_accepted
        self.renewal_drafted += other.renewal_drafted
        self.renewal_sq += other.renewal_sq
        self.renewal_pos_sq += other.renewal_pos_sq
        self.depth_sq += other.depth_sq
        self.depth_prompts += other.depth_prompts
        return self

    def to_state(self) -> dict[str, Any]:
        return {
            "k_max": self.k_max,
            "drafting": self.drafting,
            "p_min": self.p_min,
            "n_min": self.n_min,
            "threshold_single": self.threshold_single,
            "threshold_acc": self.threshold_acc,
            "overall": self.overall.tolist(),
            "domains": {k: v.tolist() for k, v in self.domains.items()},
            "categories": {k: v.tolist() for k, v in self.categories.items()},
            "domain_position": {k: v.tolist() for k, v in self.domain_position.items()},
            "entropy": self.entropy.tolist(),
            "position": self.position.tolist(),
            "alpha_hist": self.alpha_hist.tolist(),
            "kl_hist": self.kl_hist.tolist(),
            "depth_sum": self.depth_sum.tolist(),
            "depth_count": self.depth_count.tolist(),
            "adaptive": self.adaptive.tolist(),
            "high_entropy": self.high_entropy.tolist(),
            "num_prompts": self.num_prompts,
            "renewal_tokens": self.renewal_tokens,
            "renewal_rounds": self.renewal_rounds.tolist(),
            "renewal_accepted": self.renewal_accepted.tolist(),
            "renewal_drafted": self.renewal_drafted.tolist(),
            "renewal_sq": self.renewal_sq.tolist(),
            "renewal_pos_sq_by_depth": self.renewal_pos_sq.tolist(),
            "depth_sq": self.depth_sq.tolist(),
            "depth_prompts": self.depth_prompts.tolist(),
        }

    @classmethod
    def from_state(cls, s: dict[str, Any]) -> Accumulator:
        acc = cls(k_max=int(s["k_max"]), drafting=str(s["drafting"]), p_min=float(s.get("p_min", 0.0)), n_min=int(s.get("n_min", 0)),
                  threshold_single=float(s.get("threshold_single", 1.0)), threshold_acc=float(s.get("threshold_acc", 1.0)))
        acc.overall = np.asarray(s["overall"], dtype=float)
        acc.domains = {k: np.asarray(v, dtype=float) for k, v in s["domains"].items()}
        acc.categories = {k: np.asarray(v, dtype=float) for k, v in s.get("categories", {}).items()}
        acc.domain_position = {k: np.asarray(v, dtype=float) for k, v in s.get("domain_position", {}).items()}
        acc.entropy = np.asarray(s["entropy"], dtype=float)
        acc.position = np.asarray(s["position"], dtype=float)
        acc.alpha_hist = np.asarray(s["alpha_hist"], dtype=np.int64)
        acc.kl_hist = np.asarray(s["kl_hist"], dtype=np.int64)
        acc.depth_sum = np.asarray(s["depth_sum"], dtype=float)
        acc.depth_count = np.asarray(s["depth_count"], dtype=float)
        acc.adaptive = np.asarray(s["adaptive"], dtype=float)
        acc.high_entropy = np.asarray(s["high_entropy"], dtype=float)
        acc.num_prompts = int(s["num_prompts"])
        # states saved before the renewal estimate existed load with zero renewal sums;
        # renewal_tau() then reports nan instead of an estimate over part of the data
        if "renewal_rounds" in s:
            acc.renewal_tokens = float(s["renewal_tokens"])
            acc.renewal_rounds = np.asarray(s["renewal_rounds"], dtype=float)
            acc.renewal_accepted = np.asarray(s["renewal_accepted"], dtype=float).reshape(acc.k_max, acc.k_max)
            acc.renewal_drafted = np.asarray(s["renewal_drafted"], dtype=float).reshape(acc.k_max, acc.k_max)
        if "renewal_sq" in s:  # states saved before the standard errors existed: none (nan)
            acc.renewal_sq = np.asarray(s["renewal_sq"], dtype=float).reshape(acc.k_max, 3)
            # (states saved when these sums were against depth 1's drafts, "renewal_pos_sq": none)
            pos_sq = s.get("renewal_pos_sq_by_depth")
            acc.renewal_pos_sq = np.full((acc.k_max, acc.k_max, 3), np.nan) if pos_sq is None else np.asarray(pos_sq, dtype=float).reshape(acc.k_max, acc.k_max, 3)
        else:
            acc.renewal_sq = np.full((acc.k_max, 3), np.nan)
            acc.renewal_pos_sq = np.full((acc.k_max, acc.k_max, 3), np.nan)
        if "depth_sq" in s:  # likewise the depth curve's
            acc.depth_sq = np.asarray(s["depth_sq"], dtype=float).reshape(acc.k_max, 3)
            acc.depth_prompts = np.asarray(s["depth_prompts"], dtype=float).reshape(acc.k_max)
        else:
            acc.depth_sq = np.full((acc.k_max, 3), np.nan)
            acc.depth_prompts = np.full(acc.k_max, np.nan)
        return acc

    # ------------------------------------------------------------------ reading
    def _means(self, row: np.ndarray) -> dict[str, float | int]:
        count = int(row[0])
        out: dict[str, float | int] = {"positions": count}
        for j, f in enumerate(FIELDS):
            if f in _MEAN_NAMES:
                out[_MEAN_NAMES[f]] = float(row[j + 1] / count) if count else float("nan")
        out["accept_prob_engine_mean"] = float(row[_ACCEPT[self.drafting] + 1] / count) if count else float("nan")
        out["tv_mean"] = 1.0 - out["accept_prob_mean"] if count else float("nan")  # type: ignore[operator]
        return out

    @property
    def num_positions(self) -> int:
        return int(self.overall[0])

    def summary(self) -> dict[str, float | int]:
        return self._means(self.overall)

    def by_domain(self) -> list[dict[str, Any]]:
        return [{"group": k, **self._means(v)} for k, v in self.domains.items()]

    def by_category(self) -> list[dict[str, Any]]:
        """The prompt file's own categories (equal to the domains for files without any)."""
        return [{"group": k, **self._means(v)} for k, v in self.categories.items()]

    def long_context_ratio(self, min_positions: int = 32) -> float:
        """α at the longest contexts ÷ α at the shortest, read within each domain and
        averaged over domains weighted by the positions compared: a decay with context,
        not a difference between domains whose prompts happen to be long or short. nan
        when no domain spans two position buckets with ≥ min_positions each."""
        num = den = 0.0
        for table in self.domain_position.values():
            rows = [i for i in range(table.shape[0]) if table[i, 0] >= min_positions]
            if len(rows) < 2:
                continue
            first, last = table[rows[0]], table[rows[-1]]
            a0, a1 = first[1] / first[0], last[1] / last[0]
            if a0 <= 0:
                continue
            w = min(first[0], last[0])
            num += w * a1 / a0
            den += w
        return num / den if den else float("nan")

    def _buckets(self, table: np.ndarray, edges: tuple[float, ...], unit: str) -> list[dict[str, Any]]:
        rows = []
        for i in range(len(edges) - 1):
            if table[i, 0] == 0:
                continue
            lo, hi = edges[i], edges[i + 1]
            rows.append({"group": _bucket_label(lo, hi, unit), "lo": lo, "hi": None if math.isinf(hi) else hi, **self._means(table[i])})
        return rows

    def by_entropy(self) -> list[dict[str, Any]]:
        return self._buckets(self.entropy, ENTROPY_EDGES, " nats")

    def by_position(self) -> list[dict[str, Any]]:
        return self._buckets(self.position, POSITION_EDGES, "")

    def kl_percentile(self, q: float) -> float:
        total = self.kl_hist.sum()
        if total == 0:
            return float("nan")
        cum = np.cumsum(self.kl_hist)
        i = int(np.searchsorted(cum, q * total))
        return float(KL_FINE_EDGES[min(i + 1, len(KL_FINE_EDGES) - 2)])

    def histograms(self) -> dict[str, dict[str, list[float]]]:
        coarse = np.zeros(len(KL_REPORT_EDGES) - 1, dtype=np.int64)
        fine_lo = np.asarray(KL_FINE_EDGES[:-1])
        idx = np.digitize(fine_lo, KL_REPORT_EDGES[1:-1])
        np.add.at(coarse, idx, self.kl_hist)
        edges = [e if not math.isinf(e) else None for e in KL_REPORT_EDGES]
        return {
            "accept_prob": {"edges": list(ALPHA_EDGES), "counts": self.alpha_hist.tolist()},
            "kl_target_draft_nats": {"edges": edges, "counts": coarse.tolist()},
        }

    def cumulative_depth(self) -> np.ndarray:
        """r_j for j = 1..k_max (nan where no window of that length existed)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.depth_count > 0, self.depth_sum / np.maximum(self.depth_count, 1), np.nan)

    def depth_se(self) -> np.ndarray:
        """[k_max] the standard error over prompts of each r_j (`cumulative_depth`); nan
        where fewer than two prompts reached depth j or the sums are unavailable (a state
        saved before they were kept took part)."""
        return ratio_se(self.depth_sum, self.depth_count, self.depth_sq, self.depth_prompts)

    def depth_thin(self) -> list[bool]:
        """Per depth: too thin to read (`uncertainty.thin`); empty when the spread over
        prompts is unavailable."""
        if np.isnan(self.depth_prompts).any():
            return []
        return thin(self.cumulative_depth(), self.depth_se(), self.depth_prompts, self.depth_count)

    def _renewal_complete(self) -> bool:
        """Every scored position went through the renewal sums (false after merging in a
        state saved before they existed)."""
        return self.num_positions > 0 and self.renewal_tokens == self.num_positions

    def renewal_tau(self) -> np.ndarray:
        """[K] renewal τ(K), K = 1..k_max: 1 + Σ_{i≤K} (expected rounds accepting depths
        1..i) ÷ (expected rounds drafting depth i), summed over sequences; nan when
        unavailable."""
        if not self._renewal_complete():
            return np.full(self.k_max, math.nan)
        # under an early stop drafts vary in length: tokens per draft, as llama-server counts
        return renewal_tau(self.renewal_accepted, self.renewal_drafted, per_draft=self.p_min > 0 or self.n_min > 1)

    def renewal_se(self) -> tuple[np.ndarray, np.ndarray]:
        """Standard errors over prompts of the renewal counters' ratios, prompts taken as
        the independent units (a ratio estimator's linearised variance, as a bootstrap over
        prompts approximates it): ([K] accepted ÷ drafted at each K, [K, K] rounds accepting
        depths 1..i ÷ rounds drafting depth i, the per-position rate, row K−1). nan where fewer than two
        prompts were scored or the sums are unavailable."""
        n = self.num_prompts
        if not self._renewal_complete() or n < 2:
            return np.full(self.k_max, math.nan), np.full((self.k_max, self.k_max), math.nan)
        rate = ratio_se(self.renewal_accepted.sum(axis=1), self.renewal_drafted.sum(axis=1), self.renewal_sq, n)
        pos = ratio_se(self.renewal_accepted, self.renewal_drafted, self.renewal_pos_sq, n)
        return rate, pos

    def renewal_per_position(self, k: int) -> tuple[list[float], list[float]]:
        """At K = k, per draft position i = 1..k: the rounds accepting depths 1..i ÷ the
        rounds that drafted depth i (A_i ÷ D_i, the terms of τ's sum: a round cut short at
        the end of a reference drafts fewer), and its standard error over prompts. vLLM's
        per-position counter over its drafts is this rate (it drafts K every round).
        ([], []) when unavailable."""
        if not 1 <= k <= self.k_max or not self._renewal_complete():
            return [], []
        a, d = self.renewal_accepted[k - 1, :k], self.renewal_drafted[k - 1, :k]
        if d[0] <= 0:
            return [], []
        _, pos_se = self.renewal_se()
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(d > 0, a / d, math.nan)
        return rates.tolist(), pos_se[k - 1, :k].tolist()

    def renewal_tokens_per_verify(self) -> np.ndarray:
        """[K] Σ tokens ÷ Σ expected rounds, final short rounds included; nan when unavailable."""
        if not self._renewal_complete():
            return np.full(self.k_max, math.nan)
        return renewal_tokens_per_verify(self.renewal_tokens, self.renewal_rounds)

    @property
    def high_entropy_accept(self) -> float:
        n, s = self.high_entropy
        return float(s / n) if n else float("nan")


# the group means by name; p(argmax q) is read as accept_prob_engine_mean, the procedure's
_MEAN_NAMES = {
    "accept_prob": "accept_prob_mean",
    "greedy_agree": "greedy_agree_frac",
    "kl_target_draft_nats": "kl_target_draft_nats",
    "target_entropy_nats": "target_entropy_nats",
    "draft_confidence": "draft_confidence_mean",
}
