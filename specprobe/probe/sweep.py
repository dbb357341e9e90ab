"""`sweep`: several drafters — self-draft depths (`--layers 16..29`) and/or a list of
drafter specs — scored against one target on ONE set of references, with ONE target
pass per batch: the references are generated once, and each chunk's target logits are
computed once and handed to every drafter's scorer. Each drafter then gets its own cost
ratio, estimates, rules and drill-down (a full diagnose `Result`), and the table of α,
KL, cost ratio, τ and speedup per K recommends the best.

An n-gram drafter (`ngram…`, llama.cpp's `ngram-*`; no model) takes part on the same
references: its proposals are walked along them (`probe.ngram`) instead of scored.

By group: every drafter's τ and speedup in each domain and each of the prompt file's
categories — a model drafter's from accumulators of that group's sequences alone, priced
at its own cost; an n-gram drafter's from its walk — each at the K that is best in that
group, and the fastest recommended there ("prompt lookup for summarisation, the EAGLE
head for chat").
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Literal, cast

from pydantic import Field

from specprobe import __version__
from specprobe.core.errors import ConfigError
from specprobe.core.progress import Progress
from specprobe.drafters.base import TargetPass
from specprobe.judge.rules import load_table
from specprobe.models.anatomy import capture_layers
from specprobe.probe.assemble import build_result, evaluate_rules, result_header, stopped_result
from specprobe.probe.references import load_prompt_set, references_by_turn
from specprobe.result import Document, Num, Part, Result

_RANGE = re.compile(r"^(\d+)\s*\.\.\s*(\d+)$")


def parse_layers(text: str, where: str = "--layers") -> list[int]:
    """'16..29' (inclusive), '16,20,24' or a mix -> sorted unique layer counts."""
    out: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _RANGE.match(part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(f"{where} {text!r}: the range {part} runs backwards", "write it low..high, e.g. 16..29")
            out.update(range(lo, hi + 1))
        elif part.isdigit():
            out.add(int(part))
        else:
            raise ConfigError(f"{where} {text!r} is not a list of layer counts", "use e.g. --layers 16..29 or --layers 20,24,28")
    if not out or min(out) < 1:
        raise ConfigError(f"{where} {text!r} must name layer counts of at least 1", "use e.g. --layers 16..29")
    return sorted(out)


# ----------------------------------------------------------------------------- the report
class SweepRow(Part):
    """One drafter of the sweep (estimates at its own best K)."""

    drafter: str
    kind: str | None = None
    num_layers: int | None = None
    accept_prob_mean: Num = None  # Σ min(p, q): the alignment measure
    accept_prob_engine_mean: Num = None  # one draft token's acceptance under the procedure
    kl_target_draft_nats: Num = None
    cost_ratio: Num = None
    cost_measured: bool = False
    best_k: int | None = None
    tau_tokens: Num = None
    tau_tokens_se: Num = Field(default=None, description="Standard error of tau_tokens over prompts (the best K's row).")
    speedup_best: Num = None
    speedup_best_se: Num = Field(default=None, description="Standard error of speedup_best over prompts (from τ's; the cost timing's own spread not included).")
    tau_by_k: list[Num] = Field(default_factory=list, description="τ(K) for K = 1..k_max: the renewal estimate (as tau_tokens), the window τ where a result has none.")
    speedup_by_k: list[Num] = Field(default_factory=list, description="Estimated speedup for K = 1..k_max.")
    verdict: str = ""
    stopped: str | None = None
    tree_tau_tokens: Num = Field(default=None, description="The run's draft tree (--tree, or the serving config's): estimated τ.")
    tree_speedup: Num = None
    tree_best: str | None = Field(default=None, description="The best tree of the drafter's grid (steps=S,topk=T,tokens=N), when trees were estimated.")
    tree_best_speedup: Num = None


class GroupEntry(Part):
    """One drafter in one group: τ and speedup at the K best for that group."""

    drafter: str
    best_k: int | None = None
    tau_tokens: Num = None
    speedup: Num = None


class SweepGroup(Part):
    """One domain or category of the prompts: each drafter's estimate there and the fastest."""

    scope: Literal["domain", "category"]
    group: str
    positions: int = Field(description="Reference tokens in this group.")
    drafters: list[GroupEntry] = Field(default_factory=list)
    recommended: str | None = Field(default=None, description="The drafter with the highest estimated speedup in this group (ties: the overall order).")


class SweepReport(Document):
    """What `specprobe sweep --json` writes."""

    command: Literal["sweep"] = "sweep"
    specprobe_version: str | None = None
    created: str
    target: str
    reference: str
    num_prompts: int
    num_positions: int
    target_passes: int = Field(description="Teacher-forced target forward passes (one per batch, shared by every drafter).")
    procedure: str | None = Field(default=None, description="The draft-and-verify procedure τ and speedups follow, in words.")
    rows: list[SweepRow]
    recommended: str | None = Field(default=None, description="The drafter with the highest estimated speedup (ties: higher α).")
    by_group: list[SweepGroup] = Field(default_factory=list, description="Per domain and per category of the prompt file: every drafter's τ and speedup there, and the fastest.")
    interrupted: bool = False

    def advice_scope(self) -> str:
        """The prompt file's categories when they say more than its domains (Spec-Bench's
        13 tasks onto 6 domains), else the domains."""
        cats = [g.group for g in self.by_group if g.scope == "category"]
        return "category" if cats and cats != [g.group for g in self.by_group if g.scope == "domain"] else "domain"

    def advice(self, scope: str | None = None) -> list[tuple[str, list[str]]]:
        """(drafter, the groups it is fastest in) for one scope (`advice_scope` unless
        given), the overall recommendation first."""
        scope = scope or self.advice_scope()
        out: dict[str, list[str]] = {}
        for g in self.by_group:
            if g.scope == scope and g.recommended is not None:
                out.setdefault(g.recommended, []).append(g.group)
        return sorted(out.items(), key=lambda kv: (kv[0] != self.recommended, -len(kv[1])))


def sweep_row(r: Result) -> SweepRow:
    m = r.metrics
    # indexed from K = 1: an n-gram drafter with a draft length of its own has one row, at that K
    by_k = {k.k: k for k in r.k_table}
    ks = range(1, max(by_k, default=0) + 1)
    return SweepRow(
        drafter=r.drafter.spec, kind=r.drafter.kind, num_layers=r.drafter.num_layers,
        accept_prob_mean=m.get("accept_prob_mean"), accept_prob_engine_mean=m.get("accept_prob_engine_mean", m.get("ngram_accept_frac")), kl_target_draft_nats=m.get("kl_target_draft_nats"),
        cost_ratio=m.get("cost_ratio"), cost_measured=bool(r.cost.measured) if r.cost else False,
        best_k=r.best_k, tau_tokens=m.get("tau_tokens"), speedup_best=m.get("speedup_best"),
        tau_tokens_se=by_k[r.best_k].tau_renewal_se if r.best_k in by_k else None, speedup_best_se=by_k[r.best_k].speedup_se if r.best_k in by_k else None,
        tau_by_k=[_tau(by_k[k]) if k in by_k else None for k in ks], speedup_by_k=[by_k[k].speedup if k in by_k else None for k in ks],
        verdict=r.verdict, stopped=r.stopped,
        tree_tau_tokens=m.get("tree_tau_tokens"), tree_speedup=m.get("tree_speedup"),
        tree_best=_tree_best(r), tree_best_speedup=m.get("tree_best_speedup"),
    )


def _tau(row: Any) -> Num:
    """τ(K) of a K row as the headline counts it: renewal, else the window τ."""
    return row.tau_renewal_tokens if row.tau_renewal_tokens is not None else row.tau_tokens


def _tree_best(r: Result) -> str | None:
    """The best tree of a drafter's grid, as SGLang's knobs."""
    b = r.trees.best_tree if r.trees is not None else None
    return None if b is None else f"steps={b.steps},topk={b.topk},tokens={b.tokens}"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")


def group_table(estimates: dict[str, dict[tuple[str, str], dict[int, tuple[float, float]]]], positions: dict[tuple[str, str], int], order: list[str]) -> list[SweepGroup]:
    """drafter → (scope, group) → K → (τ, speedup) -> one row per group, each drafter at
    the K best there, the fastest recommended (ties: the drafters' order)."""
    out = []
    for key in sorted(positions, key=lambda kv: (kv[0] != "domain", kv[1])):
        entries = []
        for d in order:
            by_k = {k: v for k, v in estimates.get(d, {}).get(key, {}).items() if _finite(v[1])}
            if not by_k:
                entries.append(GroupEntry(drafter=d))
                continue
            k = max(by_k, key=lambda k: (by_k[k][1], -k))
            entries.append(GroupEntry(drafter=d, best_k=k, tau_tokens=by_k[k][0], speedup=by_k[k][1]))
        priced = [e for e in entries if e.speedup is not None]
        best = max(priced, key=lambda e: (e.speedup or 0.0, -order.index(e.drafter))).drafter if priced else None
        out.append(SweepGroup(scope=key[0], group=key[1], positions=positions[key], drafters=entries, recommended=best))  # type: ignore[arg-type]
    return out


class GroupAccumulators:
    """The accumulator interface `SequenceCollector` feeds, routing each sequence to an
    accumulator of its own domain and one of its own category (made by `make`)."""

    def __init__(self, make: Any) -> None:
        self.make = make
        self.accs: dict[tuple[str, str], Any] = {}

    def add_sequence(self, domain: str, positions: Any, values: Any, alpha_by_depth: Any = None, confidence_by_depth: Any = None, category: str | None = None, greedy_by_depth: Any = None) -> None:
        for key in (("domain", domain), ("category", category or domain)):
            acc = self.accs.get(key)
            if acc is None:
                acc = self.accs[key] = self.make()
            acc.add_sequence(domain, positions, values, alpha_by_depth=alpha_by_depth, confidence_by_depth=confidence_by_depth, category=category, greedy_by_depth=greedy_by_depth)


def priced_groups(groups: GroupAccumulators, cost: dict[str, Any], cfg: Any, k_top: int) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
    """Each group's accumulator priced at the drafter's own cost -> K → (τ, speedup)."""
    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.estimates.costs import price
    from specprobe.estimates.estimate import headline_tau

    out = {}
    for key, acc in groups.accs.items():
        if not acc.num_positions:
            continue
        cum = acc.cumulative_depth().tolist()[:k_top]
        priced = price(
            cost, cumulative=cum, alpha_mean=float(acc.summary()["accept_prob_engine_mean"]), renewal=acc.renewal_tau()[:k_top].tolist(),
            k_max=k_top, batch_size=cfg.batch_size, cost_ratio=cfg.cost_ratio, verify_factor=cfg.verify_factor,
        )
        out[key] = {r.k: (headline_tau(r), r.speedup) for r in priced.k_table}
    return out


def ngram_groups(result: Result, walked: dict[tuple[str, str, int], Any]) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
    """An n-gram drafter's walk by (scope, group, K) -> K → (τ, speedup)."""
    out: dict[tuple[str, str], dict[int, tuple[float, float]]] = {}
    for (scope, group, k), (tau, speedup) in walked.items():
        out.setdefault((scope, group), {})[k] = (tau, speedup)
    return out


def recommend(rows: list[SweepRow]) -> str | None:
    scored = [r for r in rows if r.speedup_best is not None and r.stopped is None]
    if not scored:
        return None
    return max(scored, key=lambda r: (r.speedup_best or 0.0, r.accept_prob_mean or 0.0)).drafter


# ----------------------------------------------------------------------------- scoring many
@dataclass
class _Entry:
    drafter: Any
    sampling: Any
    sinks: list[Any]


def score_many(target: Any, entries: list[_Entry], encoded: list[list[int]], conts: list[list[int]], cfg: Any, progress: Any) -> tuple[int, bool]:
    """Teacher-forced scoring of every drafter on the same batches: one target pass per
    batch (hooks catch the layers any drafter reads), each chunk's target logits once.
    -> (target passes, interrupted)."""
    order = sorted((i for i in range(len(encoded)) if conts[i]), key=lambda i: len(encoded[i]) + len(conts[i]))
    passes, interrupted = 0, False
    with progress.task(f"scoring {len(entries)} drafters on {sum(len(conts[i]) for i in order)} positions", len(order)) as advance:
        try:
            for start in range(0, len(order), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                _batch(target, entries, idx, encoded, conts, cfg)
                passes += 1
                for e in entries:
                    for s in e.sinks:
                        s.batch_done()
                advance(len(idx))
        except KeyboardInterrupt:
            interrupted = True
    return passes, interrupted


def _batch(target: Any, entries: list[_Entry], idx: list[int], encoded: list[list[int]], conts: list[list[int]], cfg: Any) -> None:
    import numpy as np
    import torch

    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.metrics.tree import passing as tree_passing
    from specprobe.probe.chunks import Chunk
    from specprobe.probe.scoring import (
        _pad_id,
        _right_padded,
        _tree_width,
        _wants,
        engine_confidence,
        score_chunk,
        with_confidence,
    )

    ids, mask = _right_padded([encoded[i] + conts[i] for i in idx], _pad_id(target.tokenizer), target.device)
    lengths = [len(conts[i]) for i in idx]
    t_np = np.concatenate([np.arange(len(encoded[i]) - 1, len(encoded[i]) - 1 + len(conts[i])) for i in idx])  # [P]
    prompt_of = np.repeat(np.asarray(idx), lengths)  # [P]
    rows = torch.from_numpy(np.repeat(np.arange(len(idx)), lengths)).to(ids.device)  # [P]
    t = torch.from_numpy(t_np).to(ids.device)  # [P]
    layers = tuple(sorted({n for e in entries for n in e.drafter.target_layers_needed()}))
    wants = [_wants(e.sinks) for e in entries]
    widths = [_tree_width(e.sinks) for e in entries]
    step = cfg.chunk_positions
    keepers = [s for e in entries for s in e.sinks if getattr(s, "wants_pass", False)]  # drafting trees from this pass
    cache_out: list[Any] | None = [] if keepers else None
    with torch.inference_mode(), capture_layers(target.model, layers) as captured:
        tp = TargetPass(ids, mask, target.last_hidden(ids, mask, cache_out=cache_out), dict(captured))
        feats = [e.drafter.hidden(tp) for e in entries]  # depth -> [B, S, H'] per drafter
        depths = [sorted(d for d in f if 1 <= d <= cfg.k_max) for f in feats]
        for c0 in range(0, rows.numel(), step):
            bb, tt = rows[c0 : c0 + step], t[c0 : c0 + step]  # [N]
            tl = target.head(tp.last_hidden[bb, tt])  # [N, V], once for every drafter
            chunk = Chunk(prompt_of[c0 : c0 + step], t_np[c0 : c0 + step] + 1)
            for e, f, ds, (top, probes), width in zip(entries, feats, depths, wants, widths, strict=True):
                drafts = ((d, e.drafter.logits(f[d][bb, (tt + 1 - d).clamp(min=0)], d)) for d in ds)  # [N, V'] each
                passing, engine_conf = engine_confidence(drafts, cfg.confidence)
                tree_seen: dict[int, Any] = {}
                if width:  # draft trees: each depth's top candidates as they pass (metrics.tree)
                    passing, tree_seen = tree_passing(passing, tl, e.sampling.target, width)
                scores = with_confidence(score_chunk(tl, passing, tt + 1, e.sampling, top, probes, chunk), engine_conf)
                scores.tree = tree_seen
                for s in e.sinks:
                    s.chunk(chunk, scores)
            del tl
        for s in keepers:  # each reads the pass and copies what it changes: one cache serves every drafter
            s.target_pass(idx, tp, cache_out[0] if cache_out else None)


# ----------------------------------------------------------------------------- the pipeline
@dataclass
class Sweep:
    report: SweepReport
    results: list[Result]


def run_sweep(cfg: Any, drafters: list[str], progress: Any = None, table: Any = None, target: Any = None) -> Sweep:
    """Every drafter in `drafters` against cfg.target, on one set of references."""
    from pathlib import Path

    from specprobe.estimates.tree import TreeShape

    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.metrics.accumulate import Accumulator
    from specprobe.probe.alignment import BLOCKING_RULES
    from specprobe.probe.diagnose import load_pair
    from specprobe.probe.drilldown import DrillCollector
    from specprobe.probe.ngram import diagnose_ngram
    from specprobe.probe.scoring import Scored, SequenceCollector
    from specprobe.probe.timing import cost_block, timing_settings, tree_grid
    from specprobe.probe.tree import PathsCollector, TreeCollector, paths_collector, wants_trees

    if not drafters:
        raise ConfigError("sweep needs at least one drafter", "give DRAFTER arguments or --layers, e.g. --layers 16..29")
    progress = progress or Progress()
    table = table or load_table([Path(p) for p in cfg.rules])
    prompt_set = load_prompt_set(cfg)
    pairs, stopped = [], {}
    for spec in drafters:
        pair = load_pair(replace(cfg, drafter=spec), progress, target=target)
        target = pair.target
        findings, _ = evaluate_rules(table, dict(pair.alignment.metrics), pair.drafter.kind, pair.alignment.evidence, families=("alignment",))
        blocking = [f.rule_id for f in findings if f.rule_id in BLOCKING_RULES and f.severity == "error"]
        if blocking and not cfg.force:
            stopped[spec] = blocking
        pairs.append(pair)

    # references once, with the target's sampling (the same for every drafter)
    refs = references_by_turn(target, list(prompt_set.prompts), cfg, pairs[0].sampling.target, progress)
    # an n-gram drafter has no model to score: it is walked along the references below
    live = [p for p, spec in zip(pairs, drafters, strict=True) if spec not in stopped and p.drafter.kind != "ngram"]
    scored: dict[str, Scored] = {}
    paths: dict[str, PathsCollector] = {}
    by_group: dict[str, GroupAccumulators] = {}
    entries = []

    def accumulator() -> Accumulator:
        return Accumulator(k_max=cfg.k_max, drafting=cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min,
                           threshold_single=cfg.accept_threshold_single, threshold_acc=cfg.accept_threshold_acc)

    for pair in live:
        acc = accumulator()
        drill = DrillCollector(target.tokenizer, refs.items, refs.encoded, refs.conts, pair.sampling, k_max=cfg.k_max)
        seq = SequenceCollector(acc, refs.items, False)
        groups = by_group[pair.drafter.spec] = GroupAccumulators(accumulator)
        scored[pair.drafter.spec] = Scored(acc, seq.rows, drill=drill)
        trees = [TreeCollector(cfg, refs.items)] if wants_trees(cfg) else []  # each drafter's trees, as diagnose estimates them
        if trees:
            scored[pair.drafter.spec].tree = trees[0].acc
            # the run's own tree drafted on its candidate paths from the shared target pass
            found = paths_collector(cfg, target, pair.drafter, pair.sampling.target, refs.encoded, refs.conts, progress)
            if found is not None:
                paths[pair.drafter.spec] = found
                trees.append(cast(Any, found))
        entries.append(_Entry(pair.drafter, pair.sampling, [seq, drill, SequenceCollector(cast(Any, groups), refs.items, False), *trees]))
    t0 = time.perf_counter()
    passes, interrupted = score_many(target, entries, refs.encoded, refs.conts, cfg, progress) if entries else (0, False)
    # each drafter's cost-timing budget: the scoring's time, not the paths drafting's
    per_drafter_s = (time.perf_counter() - t0 - sum(p.seconds for p in paths.values())) / max(len(entries), 1)

    results = []
    estimates: dict[str, dict[tuple[str, str], dict[int, tuple[float, float]]]] = {}
    for pair, spec in zip(pairs, drafters, strict=True):
        dcfg = replace(cfg, drafter=spec, keep_positions=False)
        header = result_header(dcfg, pair, prompt_set)
        metrics = dict(pair.alignment.metrics)
        if spec in stopped:
            results.append(stopped_result(header, metrics, table, pair.drafter.kind, pair.alignment.evidence, stopped[spec]))
            continue
        if pair.drafter.kind == "ngram":
            walked: dict[tuple[str, str, int], tuple[float, float]] = {}
            results.append(diagnose_ngram(dcfg, pair, prompt_set, header, metrics, table, pair.alignment.evidence, progress, refs=refs, walked=walked))
            estimates[spec] = ngram_groups(results[-1], walked)
            continue
        s = scored[spec]
        s.interrupted = interrupted or refs.interrupted
        if s.tree is not None and spec in paths and not s.interrupted:  # the run's tree on its candidate paths, as diagnose drafts it
            paths[spec].finish(s.tree)
        if cfg.cost_ratio is None:
            progress.note(f"measuring the cost ratio of {spec}")
        tree_n, tree_w = tree_grid(cfg.tree_shape or (TreeShape(1, 1, 2) if wants_trees(cfg) else None))
        cost = cost_block(target, pair.drafter, cfg.cost_ratio, **timing_settings(dcfg, refs.encoded, refs.conts, per_drafter_s, tree_n, tree_w))
        results.append(build_result(header, metrics, s, cost, dcfg, table, pair.drafter.kind, pair.alignment.evidence))
        k_top = max((k.k for k in results[-1].k_table), default=cfg.k_max)
        estimates[spec] = priced_groups(by_group[spec], cost, dcfg, k_top)

    positions: dict[tuple[str, str], int] = {}
    for item, cont in zip(refs.items, refs.conts, strict=True):
        if cont:
            for key in (("domain", item.domain), ("category", item.category)):
                positions[key] = positions.get(key, 0) + len(cont)
    rows = [sweep_row(r) for r in results]
    first = next((r for r in results if r.scored), results[0])
    report = SweepReport(
        specprobe_version=__version__, created=first.created, target=cfg.target, reference=first.reference or "on-policy",
        num_prompts=int(first.metrics.get("num_prompts") or 0), num_positions=int(first.metrics.get("num_positions") or 0),
        target_passes=passes, procedure=first.procedure.description if first.procedure else None,
        rows=rows, recommended=recommend(rows), by_group=group_table(estimates, positions, list(drafters)), interrupted=interrupted or refs.interrupted,
    )
    return Sweep(report, results)
