"""Acceptance by context length (`diagnose --context-lengths 1k,2k,4k,8k`).

Long prompts are built from the prompt set to each requested token length, counted as the
target sees them (chat template included): one question per domain, after documents
concatenated as a RAG pipeline hands them over — the other prompts of the set, cycled as
long as the length needs — or, for a prompt already longer than the length (a user's own
long prompts), that prompt cut to it. The answers (references) and the scoring are the
run's own; `LengthCollector` keeps an accumulator per (context length, domain) beside
the run's, so α, τ and the decay across lengths are read within a domain. The decay —
α at the longest length ÷ α at the shortest, averaged over domains weighted by the
positions compared — is `accept_prob_long_context_ratio`, which SP209 judges."""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from specprobe.core.errors import InputError
from specprobe.metrics.accumulate import Accumulator
from specprobe.probe.references import encode_messages
from specprobe.prompts import Prompt
from specprobe.prompts.sets import PromptSet
from specprobe.settings.lengths import label

PREAMBLE = "Answer the question at the end. The documents below were retrieved for it; use them where they help."
TOLERANCE = 1  # a built prompt is within this many tokens of its length (the chat template's joins)


# ----------------------------------------------------------------------------- prompts of a length
def check_limit(lengths: Sequence[int], limit: int | None, max_new_tokens: int, name: str) -> None:
    """InputError when the longest length plus the answer would not fit the target's context."""
    if not limit:
        return
    room = limit - max_new_tokens
    too = [n for n in lengths if n > room]
    if too:
        raise InputError(
            f"--context-lengths {label(max(too))} does not fit {name}: with --max-new-tokens {max_new_tokens} its context of {limit} tokens leaves {room} for the prompt",
            f"use lengths up to {room} tokens (or lower --max-new-tokens)",
        )


def questions(prompts: Sequence[Prompt]) -> list[Prompt]:
    """The first prompt of each domain, in the set's order."""
    seen: dict[str, Prompt] = {}
    for p in prompts:
        seen.setdefault(p.domain, p)
    return list(seen.values())


def build(prompt_set: PromptSet, tokenizer: Any, lengths: Sequence[int], *, limit: int | None, max_new_tokens: int, name: str = "the target") -> tuple[PromptSet, dict[str, int]]:
    """The prompt set at each length -> (the new set, prompt id -> its length). Every
    prompt encodes to its length within `TOLERANCE` tokens."""
    check_limit(lengths, limit, max_new_tokens, name)
    qs = questions(prompt_set.prompts)
    if not qs:
        raise InputError("--context-lengths needs at least one prompt", "give a prompt set with prompts")
    out: list[Prompt] = []
    length_of: dict[str, int] = {}
    encode = lambda text: len(encode_messages(tokenizer, [{"role": "user", "content": text}]))  # noqa: E731
    for q in qs:
        others = [p for p in prompt_set.prompts if p.id != q.id] or [q]
        pool: list[int] = []
        doc = 0
        own = _ids(tokenizer, q.turns[0])
        for n in sorted(lengths):
            if encode(q.turns[0]) >= n:  # a long prompt of the user's: cut to the length
                text = _fit(lambda k, pad="", own=own: _decode(tokenizer, own[:k]) + pad, encode, n, len(own))
            else:
                while len(pool) < n + 64:  # the documents, cycled as long as the length needs
                    for p in others:
                        doc += 1
                        pool.extend(_ids(tokenizer, f"Document {doc}: {p.turns[0]}\n\n"))
                text = _fit(lambda k, pad="", pool=pool, q=q: f"{PREAMBLE}\n\n{_decode(tokenizer, pool[:k]).strip()}{pad}\n\nQuestion: {q.turns[0]}", encode, n, len(pool))
            pid = f"{q.id}@{label(n)}"
            out.append(Prompt(id=pid, domain=q.domain, category=q.category, turns=(text,)))
            length_of[pid] = n
    desc = f"{len(qs)} question(s), one per domain, each at {', '.join(label(n) for n in sorted(lengths))} tokens (documents from the set, concatenated)"
    return PromptSet.from_prompts(f"{prompt_set.name}@lengths", prompt_set.source, out, desc), length_of


def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(x) for x in tokenizer(text, add_special_tokens=False)["input_ids"]]


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))


def _fit(make: Callable[..., str], encode: Callable[[str], int], n: int, k_max: int) -> str:
    """The text `make(k)` for the largest k ≤ k_max whose encoding is at most n tokens
    (binary search, the encoding being nearly monotone in k), then topped up to n with a
    few one-token words (`make(k, pad)`) where decode/encode joins left it short — never
    past n: the length is a limit too (the target's context)."""
    lo, hi = 0, k_max
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if encode(make(mid)) <= n:
            lo = mid
        else:
            hi = mid - 1
    best = make(lo)
    got = encode(best)
    for word in (" the", " .", " a", "\n"):
        for j in range(1, n - got + 3):
            if got == n:
                return best
            t = make(lo, word * j)
            m = encode(t)
            if got < m <= n:
                best, got = t, m
            if m > n:
                break
    return best


# ----------------------------------------------------------------------------- scoring by length
def _fresh(cfg: Any) -> Accumulator:
    """An accumulator made as the run's own is (the procedure's knobs that this version has)."""
    names = {f.name for f in dataclasses.fields(Accumulator)}
    kw: dict[str, Any] = {"k_max": cfg.k_max, "drafting": cfg.drafting}
    for mine, theirs in (("p_min", "draft_p_min"), ("n_min", "draft_n_min"), ("threshold_single", "accept_threshold_single"), ("threshold_acc", "accept_threshold_acc")):
        if mine in names and hasattr(cfg, theirs):
            kw[mine] = getattr(cfg, theirs)
    return Accumulator(**kw)


def _take(x: Any, m: np.ndarray) -> Any:
    if isinstance(x, np.ndarray):
        return x[m]
    if isinstance(x, dict):
        return {k: _take(v, m) for k, v in x.items()}
    return x


class LengthCollector:
    """A scoring collector (`probe.chunks.Collector`): every chunk's positions go to the
    accumulator of their prompt's (context length, domain); `section` turns them into the
    result's table and the metrics SP209 reads."""

    def __init__(self, prompts: Sequence[Prompt], length_of: dict[str, int], cfg: Any) -> None:
        from specprobe.probe.scoring import SequenceCollector

        self.prompts = list(prompts)
        self.lengths = np.asarray([length_of.get(p.id, 0) for p in self.prompts])  # [P]
        self.domains = [p.domain for p in self.prompts]
        self.accs: dict[tuple[int, str], Accumulator] = {}
        self.sinks: dict[tuple[int, str], Any] = {}
        for n, d in sorted({(int(self.lengths[i]), self.domains[i]) for i in range(len(self.prompts)) if self.lengths[i]}):
            self.accs[(n, d)] = _fresh(cfg)
            self.sinks[(n, d)] = SequenceCollector(self.accs[(n, d)], self.prompts, keep_positions=False)
        self.key = np.asarray([list(self.sinks).index((int(self.lengths[i]), self.domains[i])) if self.lengths[i] else -1 for i in range(len(self.prompts))])

    def chunk(self, chunk: Any, scores: Any) -> None:
        keys = self.key[chunk.prompt]  # [N]
        for j, k in enumerate(self.sinks):
            m = keys == j
            if not m.any():
                continue
            sub = dataclasses.replace(chunk, prompt=chunk.prompt[m], token_pos=chunk.token_pos[m])
            part = dataclasses.replace(scores, **{f.name: _take(getattr(scores, f.name), m) for f in dataclasses.fields(scores)})
            self.sinks[k].chunk(sub, part)

    def batch_done(self) -> None:
        for s in self.sinks.values():
            s.batch_done()

    def section(self, best_k: int | None, k_max: int, cost: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """-> (rows: per domain and 'all', per length: prompts, positions, α (Σ min(p, q)),
        the engine's acceptance, τ at the run's best K and α ÷ α at the shortest length,
        and — with the run's cost section — the round cost and speedup at that K from the
        costs timed at the length's own context (the verify pass grows with it), and the
        best K there; the metrics: accept_prob_long_context_ratio from this table)."""
        k = best_k or k_max
        priced = _length_prices(cost)
        by_domain: dict[str, dict[int, Accumulator]] = {}
        for (n, d), acc in self.accs.items():
            if acc.num_positions:
                by_domain.setdefault(d, {})[n] = acc
        everything: dict[int, Accumulator] = {}
        for per_length in by_domain.values():
            for n, acc in per_length.items():
                everything[n] = everything[n].merge(acc) if n in everything else _copy(acc)
        rows: list[dict[str, Any]] = []
        num = den = 0.0
        for domain, accs in [*sorted(by_domain.items()), ("all", everything)]:
            base = None
            for n in sorted(accs):
                acc = accs[n]
                s = acc.summary()
                tau = acc.renewal_tau()
                a = float(s["accept_prob_mean"])
                base = a if base is None else base
                rows.append({
                    "domain": domain, "context_tokens": n, "prompts": acc.num_prompts, "positions": acc.num_positions,
                    "accept_prob_mean": a, "accept_prob_engine_mean": float(s["accept_prob_engine_mean"]),
                    "k": k, "tau_tokens": float(tau[k - 1]) if len(tau) >= k else None,
                    "decay": a / base if base else None,
                    **_speedups([float(x) for x in tau], k, priced.get(n, priced.get(0))),
                })
            if domain != "all" and len(accs) >= 2:
                first, last = accs[min(accs)], accs[max(accs)]
                a0 = float(first.summary()["accept_prob_mean"])
                if a0 > 0:
                    w = float(min(first.num_positions, last.num_positions))
                    num += w * float(last.summary()["accept_prob_mean"]) / a0
                    den += w
        ratio = num / den if den else math.nan
        return rows, ({"accept_prob_long_context_ratio": ratio} if den else {})


def _length_prices(cost: dict[str, Any] | None) -> dict[int, dict[str, Any]]:
    """The cost section -> prompt length -> {round_costs per K, cost_ratio, source}; key 0:
    the run's headline costs, for a length not timed on its own (or costs given)."""
    if not cost:
        return {}
    out: dict[int, dict[str, Any]] = {}
    head = next((b for b in cost.get("batches") or [] if b.get("batch_size") == cost.get("batch_size")), None)
    if head is not None and head.get("rows"):
        src = "the run's costs at its typical context" if cost.get("measured") else "the run's costs (given, not timed per length)"
        out[0] = {"round_costs": [r.get("round_cost") for r in head["rows"]], "cost_ratio": head.get("cost_ratio"), "source": src}
    for x in cost.get("by_length") or []:
        out[int(x["length"])] = {"round_costs": list(x.get("round_costs") or []), "cost_ratio": x.get("cost_ratio"), "source": x.get("source")}
    return out


def _speedups(tau: Sequence[float], k: int, price: dict[str, Any] | None) -> dict[str, Any]:
    """τ(K) at one length over that length's round costs: the speedup at the run's K and the
    best K there (empty without costs)."""
    if not price:
        return {}
    rc = price["round_costs"]
    sp = [t / r if r and not math.isnan(t) and r is not None and not math.isnan(r) else math.nan for t, r in zip(tau, rc, strict=False)]
    valid = [(s, j + 1) for j, s in enumerate(sp) if not math.isnan(s)]
    best = max(valid, key=lambda x: (x[0], -x[1])) if valid else None
    return {
        "cost_ratio": price.get("cost_ratio"),
        "round_cost": rc[k - 1] if len(rc) >= k else None,
        "speedup": sp[k - 1] if len(sp) >= k else None,
        "best_k": best[1] if best else None,
        "speedup_best": best[0] if best else None,
        "costs_source": price.get("source"),
    }


def _copy(acc: Accumulator) -> Accumulator:
    import copy

    return copy.deepcopy(acc)


# the collector that scored a run, found again when its result is assembled (keyed by the
# Scored object's identity while it lives: a dataclass, so not hashable)
_ATTACHED: dict[int, LengthCollector] = {}


def attach(scored: Any, collector: LengthCollector) -> None:
    _ATTACHED[id(scored)] = collector
    weakref.finalize(scored, _ATTACHED.pop, id(scored), None)


def attached(scored: Any) -> LengthCollector | None:
    return _ATTACHED.get(id(scored))
