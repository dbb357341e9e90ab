"""Token-level drill-down: a scoring collector that keeps, within a fixed budget, the
evidence a verdict stands on — every scored token of every prompt with α, KL and both
sides' top-1; the worst positions with both top-5 lists and the text around; the
(target top-1 → drafter top-1) confusions ranked by the α they cost; the tokens the
drafter over-proposes; α by token class — and the what-ifs of `counterfactual`.

It reads only what `scoring` hands every collector (the chunk's metrics, each side's
top-5 computed with them, the counterfactual probe's outputs): no [N, V] tensor is kept.
`section` turns what was collected into the result's `drilldown` fields and the
catalogue metrics the rules read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from specprobe.probe.chunks import ROW_FIELDS, Chunk, ChunkScores, _runs
from specprobe.probe.counterfactual import (
    Chain,
    CounterfactualProbe,
    default_every,
    domain_gains,
    what_if_metrics,
    what_if_rows,
)

TOP = 5  # both sides' top-k handed over per position
WORST = 25  # worst positions kept, by α and by KL
DETAIL_PROMPTS = 8  # worst prompts that keep both top-5 lists for every token
MAX_TOKENS = 200_000  # scored tokens kept in the per-prompt rows (the best prompts go first)
CONFUSIONS = 30
OVER_PROPOSED = 30
BEFORE, AFTER = 12, 4  # tokens of context around a worst position
PROMPT_TAIL = 48  # tokens of the encoded prompt (chat template included) kept per prompt
_TOP_KEYS = ("target_ids", "target_probs", "draft_ids", "draft_probs", "target_probs_at_draft", "draft_probs_at_target")
_PROSE = set(".,;:!?'\"()-–—…«»“”‘’")


def token_class(text: str, special: bool) -> str:
    """special | whitespace/punct | digits | code symbols | words (by the token's text)."""
    if special:
        return "special"
    s = text.strip()
    if not s or all(c in _PROSE for c in s):
        return "whitespace/punct"
    if any(c.isalpha() for c in s):
        return "words"
    if any(c.isdigit() for c in s):
        return "digits"
    return "code symbols"


class _Dense:
    """Per-token-id sums that grow with the largest id seen."""

    def __init__(self, width: int) -> None:
        self.a = np.zeros((0, width))

    def add(self, ids: np.ndarray, weights: np.ndarray) -> None:
        """ids [M], weights [M, width]."""
        if ids.size == 0:
            return
        top = int(ids.max()) + 1
        if top > self.a.shape[0]:
            self.a = np.concatenate([self.a, np.zeros((max(top, 2 * self.a.shape[0]) - self.a.shape[0], self.a.shape[1]))])
        np.add.at(self.a, ids, weights)


class DrillCollector:
    """A `chunks.Collector` (with `top_k` and a `probe`) for the drill-down."""

    top_k = TOP

    def __init__(self, tokenizer: Any, prompts: Sequence[Any], encoded: Sequence[list[int]], conts: Sequence[list[int]], pair: Any, k_max: int = 8, every: int | None = None) -> None:
        self.tok, self.items, self.encoded, self.conts, self.pair = tokenizer, prompts, encoded, conts, pair
        self.k_max = k_max
        self.probe = CounterfactualProbe(pair, every or default_every(sum(1 for c in conts if c)))
        self._pending: list[tuple[Chunk, ChunkScores]] = []
        self.rows: dict[int, dict[str, Any]] = {}  # prompt index -> its token columns
        self.tops: dict[int, dict[str, np.ndarray]] = {}  # worst prompts' top-5 per token
        self.omitted = 0
        self.positions = 0
        self.loss = 0.0  # Σ (1 − α)
        self.pairs: dict[tuple[int, int], np.ndarray] = {}  # (target, draft) top-1 -> [count, Σ(1−α), Σα]
        self.by_token = _Dense(3)  # reference token -> [count, Σα, ΣKL]
        self.by_draft = _Dense(3)  # token -> [Σ excess q − p, times drafter top-1, times target top-1]
        self.worst: dict[str, dict[str, np.ndarray]] = {}
        self.chains: dict[str, Chain] = {}
        self.real: dict[str, Chain] = {}  # the real α on each what-if's positions
        self.sample_prompts = self.sample_positions = 0

    # ------------------------------------------------------------------ collecting
    def chunk(self, chunk: Chunk, scores: ChunkScores) -> None:
        self._pending.append((chunk, scores))

    def batch_done(self) -> None:
        pending, self._pending = self._pending, []
        if not pending or not all(k in pending[0][1].extra for k in _TOP_KEYS):
            return
        prompt = np.concatenate([c.prompt for c, _ in pending])
        pos = np.concatenate([c.token_pos for c, _ in pending])
        vals = {f: np.concatenate([s.values[f] for _, s in pending]).astype(np.float64) for f in ROW_FIELDS}
        keys = sorted({k for _, s in pending for k in s.extra})
        ex = {k: np.concatenate([s.extra[k] if k in s.extra else np.full(len(c.prompt), np.nan, np.float32) for c, s in pending]) for k in keys}
        a, kl = vals["accept_prob"], vals["kl_target_draft_nats"]
        tokens = np.empty(len(prompt), dtype=np.int64)
        runs = _runs(prompt)
        for sl in runs:
            i = int(prompt[sl.start])
            tokens[sl] = np.asarray(self.encoded[i] + self.conts[i])[pos[sl]]
        self._totals(tokens, a, kl, ex)
        self._keep_worst(prompt, pos, tokens, a, kl, ex)
        for sl in runs:
            self._keep_prompt(int(prompt[sl.start]), sl, pos, tokens, a, kl, ex, vals)
        self._trim()

    def _totals(self, tokens: np.ndarray, a: np.ndarray, kl: np.ndarray, ex: Mapping[str, np.ndarray]) -> None:
        lost = 1.0 - a
        self.positions += len(a)
        self.loss += float(lost.sum())
        t1, d1 = ex["target_ids"][:, 0].astype(np.int64), ex["draft_ids"][:, 0].astype(np.int64)
        self.by_token.add(tokens, np.stack([np.ones_like(a), a, kl], axis=1))
        excess = np.clip(ex["draft_probs"] - ex["target_probs_at_draft"], 0.0, None).astype(np.float64)  # [P, 5]
        dids = ex["draft_ids"].astype(np.int64)
        self.by_draft.add(dids.ravel(), np.stack([excess.ravel(), np.zeros(excess.size), np.zeros(excess.size)], axis=1))
        self.by_draft.add(d1, np.tile([0.0, 1.0, 0.0], (len(d1), 1)))
        self.by_draft.add(t1, np.tile([0.0, 0.0, 1.0], (len(t1), 1)))
        m = t1 != d1
        if m.any():
            pk = np.stack([t1[m], d1[m]], axis=1)
            uniq, inv = np.unique(pk, axis=0, return_inverse=True)
            inv = inv.reshape(-1)
            sums = np.stack([np.bincount(inv), np.bincount(inv, lost[m]), np.bincount(inv, a[m])], axis=1)
            for (t, d), row in zip(uniq.tolist(), sums, strict=True):
                key = (int(t), int(d))
                self.pairs[key] = self.pairs[key] + row if key in self.pairs else row.astype(np.float64)

    def _keep_worst(self, prompt: np.ndarray, pos: np.ndarray, tokens: np.ndarray, a: np.ndarray, kl: np.ndarray, ex: Mapping[str, np.ndarray]) -> None:
        """The WORST lowest-α and highest-KL positions so far, with both top-5 lists."""
        cand = {"prompt": prompt, "pos": pos, "token": tokens, "a": a, "kl": kl, **{k: ex[k] for k in _TOP_KEYS}}
        for name, order in (("alpha", lambda c: np.lexsort((-c["kl"], c["a"]))), ("kl", lambda c: np.argsort(-c["kl"], kind="stable"))):
            old = self.worst.get(name)
            both = cand if old is None else {k: np.concatenate([old[k], cand[k]]) for k in cand}
            keep = order(both)[:WORST]
            self.worst[name] = {k: v[keep] for k, v in both.items()}

    def _keep_prompt(self, i: int, sl: slice, pos: np.ndarray, tokens: np.ndarray, a: np.ndarray, kl: np.ndarray, ex: Mapping[str, np.ndarray], vals: Mapping[str, np.ndarray]) -> None:
        order = np.argsort(pos[sl], kind="stable")  # token order (chunks already are)
        take = lambda v: v[sl][order]  # noqa: E731
        self.rows[i] = {
            "start": int(pos[sl].min()), "tokens": take(tokens), "a": take(a).astype(np.float32), "kl": take(kl).astype(np.float32),
            "t1": take(ex["target_ids"][:, 0]), "tp1": take(ex["target_probs"][:, 0]), "d1": take(ex["draft_ids"][:, 0]), "dp1": take(ex["draft_probs"][:, 0]),
            "mean_a": float(a[sl].mean()), "mean_kl": float(kl[sl].mean()),
        }
        self.tops[i] = {k: take(ex[k]) for k in ("target_ids", "target_probs", "draft_ids", "draft_probs")}
        if len(self.tops) > DETAIL_PROMPTS:
            del self.tops[max(self.tops, key=lambda j: self.rows[j]["mean_a"])]
        if self.probe.sampled(np.asarray([i]))[0]:
            self.sample_prompts += 1
            self.sample_positions += sl.stop - sl.start
            real = take(a)
            self._add("greedy", take(vals["greedy_agree"]), real)
            for k, v in ex.items():
                cf = take(v)
                if k.startswith("cf_") and not np.isnan(cf).all():  # this prompt's turn
                    self._add(k, np.nan_to_num(cf, nan=0.0), real)
            for k in self.probe.same_as_real:  # a what-if that is the run's own setting
                self._add(k, real, real)

    def _add(self, key: str, what_if: np.ndarray, real: np.ndarray) -> None:
        """One sampled prompt into a what-if's chain and its real twin (same positions)."""
        self.chains.setdefault(key, Chain(self.k_max)).add(what_if)
        self.real.setdefault(key, Chain(self.k_max)).add(real)

    def _trim(self) -> None:
        """Keep the per-prompt rows within MAX_TOKENS: the best prompts go first."""
        total = sum(len(r["tokens"]) for r in self.rows.values())
        for i in sorted(self.rows, key=lambda j: -self.rows[j]["mean_a"]):
            if total <= MAX_TOKENS:
                break
            total -= len(self.rows.pop(i)["tokens"])
            self.tops.pop(i, None)
            self.omitted += 1

    # ------------------------------------------------------------------ the section
    def section(self, best_k: int | None, by_domain: Sequence[Mapping[str, Any]], overall_alpha: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """-> (the result's `drilldown` dict, catalogue metrics for the rules)."""
        cf_rows = what_if_rows(self.real, self.chains, self.pair, best_k)
        used: set[int] = set()
        worst = {name: self._worst_rows(self.worst.get(name), used) for name in ("alpha", "kl")}
        prompts = [self._prompt_row(i, used) for i in sorted(self.rows, key=lambda j: (self.rows[j]["mean_a"], j))]
        confusions = self._confusions(used)
        over = self._over_proposed(used)
        specials = {int(x) for x in (getattr(self.tok, "all_special_ids", None) or [])}
        vocab = {i: self._text([i]) for i in sorted(used | set(self._token_ids()))}
        section = {
            "joiner": self._joiner(),
            "vocab": vocab,
            "special_ids": sorted(specials),
            "positions": self.positions,
            "token_classes": self._classes(vocab, specials),
            "confusions": confusions,
            "over_proposed": over,
            "worst": worst["alpha"],
            "worst_kl": worst["kl"],
            "prompts": prompts,
            "prompts_omitted": self.omitted,
            "counterfactuals": {"every": self.probe.every, "sample_prompts": self.sample_prompts, "sample_positions": self.sample_positions, "k": best_k, "rows": cf_rows},
            "domains": domain_gains(by_domain, overall_alpha),
        }
        return section, what_if_metrics(cf_rows)

    def _token_ids(self) -> np.ndarray:
        return np.flatnonzero(self.by_token.a[:, 0] > 0) if self.by_token.a.size else np.zeros(0, dtype=np.int64)

    def _text(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode([int(i) for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _joiner(self) -> str:
        """' ' when decoding two tokens puts a space between them (word-level vocabularies)."""
        ids = [int(i) for i in self._token_ids()[:2]]
        if len(ids) < 2:
            return ""
        return " " if self._text(ids) == self._text(ids[:1]) + " " + self._text(ids[1:]) else ""

    def _classes(self, vocab: Mapping[int, str], specials: set[int]) -> list[dict[str, Any]]:
        sums: dict[str, np.ndarray] = {}
        ids = self._token_ids()
        for i in ids.tolist():
            c = token_class(vocab.get(i, ""), i in specials)
            sums[c] = sums.get(c, np.zeros(3)) + self.by_token.a[i]
        loss = self.loss or 1.0
        rows = [{"token_class": c, "positions": int(s[0]), "accept_prob_mean": s[1] / s[0], "kl_target_draft_nats": s[2] / s[0], "share_of_loss": (s[0] - s[1]) / loss} for c, s in sums.items()]
        return sorted(rows, key=lambda r: -r["share_of_loss"])

    def _confusions(self, used: set[int]) -> list[dict[str, Any]]:
        ranked = sorted(self.pairs.items(), key=lambda kv: (-kv[1][1], -kv[1][0]))[:CONFUSIONS]
        loss = self.loss or 1.0
        out = []
        for (t, d), (n, lost, asum) in ranked:
            used.update((t, d))
            out.append({"target": t, "draft": d, "count": int(n), "accept_prob_lost": lost, "share_of_loss": lost / loss, "accept_prob_mean": asum / n})
        return out

    def _over_proposed(self, used: set[int]) -> list[dict[str, Any]]:
        a = self.by_draft.a
        if not a.size:
            return []
        ids = [i for i in np.argsort(-a[:, 0], kind="stable")[:OVER_PROPOSED].tolist() if a[i, 0] > 0]
        used.update(ids)
        n = max(self.positions, 1)
        return [{"token": i, "excess_mass": a[i, 0], "excess_per_position": a[i, 0] / n, "draft_top1_count": int(a[i, 1]), "target_top1_count": int(a[i, 2])} for i in ids]

    def _worst_rows(self, w: Mapping[str, np.ndarray] | None, used: set[int]) -> list[dict[str, Any]]:
        if w is None:
            return []
        out = []
        for r in range(len(w["a"])):
            i, p = int(w["prompt"][r]), int(w["pos"][r])
            seq = self.encoded[i] + self.conts[i]
            tids, dids = w["target_ids"][r].tolist(), w["draft_ids"][r].tolist()
            used.update(tids + dids + [int(w["token"][r])])
            out.append({
                "prompt_id": self.items[i].id, "domain": self.items[i].domain, "position": p, "index": p - len(self.encoded[i]), "token": int(w["token"][r]),
                "accept_prob": _r(w["a"][r]), "kl_target_draft_nats": _r(w["kl"][r]),
                "target": {"ids": tids, "probs": _rl(w["target_probs"][r]), "other_probs": _rl(w["draft_probs_at_target"][r])},
                "draft": {"ids": dids, "probs": _rl(w["draft_probs"][r]), "other_probs": _rl(w["target_probs_at_draft"][r])},
                "before": self._text(seq[max(0, p - BEFORE) : p]), "after": self._text(seq[p + 1 : p + 1 + AFTER]),
            })
        return out

    def _prompt_row(self, i: int, used: set[int]) -> dict[str, Any]:
        r = self.rows[i]
        for k in ("tokens", "t1", "d1"):
            used.update(int(x) for x in np.unique(r[k]))
        tops = None
        if i in self.tops:
            t = self.tops[i]
            used.update(int(x) for x in np.unique(np.concatenate([t["target_ids"].ravel(), t["draft_ids"].ravel()])))
            tops = {"target_ids": t["target_ids"].tolist(), "target_probs": np.round(t["target_probs"], 3).tolist(), "draft_ids": t["draft_ids"].tolist(), "draft_probs": np.round(t["draft_probs"], 3).tolist()}
        item = self.items[i]
        return {
            "prompt_id": item.id, "domain": item.domain, "prompt_tail": self._text(self.encoded[i][-PROMPT_TAIL:]), "accept_prob_mean": r["mean_a"], "kl_target_draft_nats": r["mean_kl"], "start": r["start"],
            "tokens": r["tokens"].tolist(), "accept_prob": _rl(r["a"]), "kl_target_draft_nats_by_token": _rl(r["kl"]),
            "target_top1": r["t1"].tolist(), "target_top1_prob": _rl(r["tp1"]), "draft_top1": r["d1"].tolist(), "draft_top1_prob": _rl(r["dp1"]),
            "tops": tops,
        }


def _r(x: Any) -> float:
    return round(float(x), 4)


def _rl(x: np.ndarray) -> list[float]:
    """Three decimals: enough to rank and colour, and it keeps the file small."""
    return np.round(np.asarray(x, dtype=np.float64), 3).tolist()
