"""`sweep`: several drafters — self-draft depths (`--layers 16..29`) and/or a list of
drafter specs — scored against one target on ONE set of references, with ONE target
pass per batch: the references are generated once, and each chunk's target logits are
computed once and handed to every drafter's scorer. Each drafter then gets its own cost
ratio, estimates, rules and drill-down (a full diagnose `Result`), and the table of α,
KL, cost ratio, τ and speedup per K recommends the best.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import Field

from specprobe import __version__
from specprobe.core.errors import ConfigError
from specprobe.core.progress import Progress
from specprobe.judge.rules import load_table
from specprobe.models.anatomy import capture_layers
from specprobe.models.base import TargetPass
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
    speedup_best: Num = None
    tau_by_k: list[Num] = Field(default_factory=list, description="τ(K) for K = 1..k_max.")
    speedup_by_k: list[Num] = Field(default_factory=list, description="Estimated speedup for K = 1..k_max.")
    verdict: str = ""
    stopped: str | None = None


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
    interrupted: bool = False


def sweep_row(r: Result) -> SweepRow:
    m = r.metrics
    return SweepRow(
        drafter=r.drafter.spec, kind=r.drafter.kind, num_layers=r.drafter.num_layers,
        accept_prob_mean=m.get("accept_prob_mean"), accept_prob_engine_mean=m.get("accept_prob_engine_mean"), kl_target_draft_nats=m.get("kl_target_draft_nats"),
        cost_ratio=m.get("cost_ratio"), cost_measured=bool(r.cost.measured) if r.cost else False,
        best_k=r.best_k, tau_tokens=m.get("tau_tokens"), speedup_best=m.get("speedup_best"),
        tau_by_k=[k.tau_tokens for k in r.k_table], speedup_by_k=[k.speedup for k in r.k_table],
        verdict=r.verdict, stopped=r.stopped,
    )


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
    from specprobe.probe.scoring import (
        Chunk,
        _pad_id,
        _right_padded,
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
    step = cfg.chunk_positions
    with torch.inference_mode(), capture_layers(target.model, layers) as captured:
        tp = TargetPass(ids, mask, target.last_hidden(ids, mask), dict(captured))
        feats = [e.drafter.hidden(tp) for e in entries]  # depth -> [B, S, H'] per drafter
        depths = [sorted(d for d in f if 1 <= d <= cfg.k_max) for f in feats]
        for c0 in range(0, rows.numel(), step):
            bb, tt = rows[c0 : c0 + step], t[c0 : c0 + step]  # [N]
            tl = target.head(tp.last_hidden[bb, tt])  # [N, V], once for every drafter
            chunk = Chunk(prompt_of[c0 : c0 + step], t_np[c0 : c0 + step] + 1)
            for e, f, ds, (top, probes) in zip(entries, feats, depths, wants, strict=True):
                drafts = ((d, e.drafter.logits(f[d][bb, (tt + 1 - d).clamp(min=0)], d)) for d in ds)  # [N, V'] each
                passing, engine_conf = engine_confidence(drafts, cfg.confidence)
                scores = with_confidence(score_chunk(tl, passing, tt + 1, e.sampling, top, probes, chunk), engine_conf)
                for s in e.sinks:
                    s.chunk(chunk, scores)
            del tl


# ----------------------------------------------------------------------------- the pipeline
@dataclass
class Sweep:
    report: SweepReport
    results: list[Result]


def run_sweep(cfg: Any, drafters: list[str], progress: Any = None, table: Any = None, target: Any = None) -> Sweep:
    """Every drafter in `drafters` against cfg.target, on one set of references."""
    from pathlib import Path

    # deferred: loads torch, which the torch-free commands that import this module never need
    from specprobe.metrics.accumulate import Accumulator
    from specprobe.probe.alignment import BLOCKING_RULES
    from specprobe.probe.diagnose import load_pair
    from specprobe.probe.drilldown import DrillCollector
    from specprobe.probe.scoring import Scored, SequenceCollector
    from specprobe.probe.timing import cost_block, timing_settings

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
    live = [p for p, spec in zip(pairs, drafters, strict=True) if spec not in stopped]
    scored: dict[str, Scored] = {}
    entries = []
    for pair in live:
        acc = Accumulator(k_max=cfg.k_max, drafting=cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min,
                      threshold_single=cfg.accept_threshold_single, threshold_acc=cfg.accept_threshold_acc)
        drill = DrillCollector(target.tokenizer, refs.items, refs.encoded, refs.conts, pair.sampling, k_max=cfg.k_max)
        seq = SequenceCollector(acc, refs.items, False)
        scored[pair.drafter.spec] = Scored(acc, seq.rows, drill=drill)
        entries.append(_Entry(pair.drafter, pair.sampling, [seq, drill]))
    t0 = time.perf_counter()
    passes, interrupted = score_many(target, entries, refs.encoded, refs.conts, cfg, progress) if entries else (0, False)
    per_drafter_s = (time.perf_counter() - t0) / max(len(entries), 1)

    results = []
    for pair, spec in zip(pairs, drafters, strict=True):
        dcfg = replace(cfg, drafter=spec, keep_positions=False)
        header = result_header(dcfg, pair, prompt_set)
        metrics = dict(pair.alignment.metrics)
        if spec in stopped:
            results.append(stopped_result(header, metrics, table, pair.drafter.kind, pair.alignment.evidence, stopped[spec]))
            continue
        s = scored[spec]
        s.interrupted = interrupted or refs.interrupted
        if cfg.cost_ratio is None:
            progress.note(f"measuring the cost ratio of {spec}")
        cost = cost_block(target, pair.drafter, cfg.cost_ratio, **timing_settings(dcfg, refs.encoded, refs.conts, per_drafter_s))
        results.append(build_result(header, metrics, s, cost, dcfg, table, pair.drafter.kind, pair.alignment.evidence))

    rows = [sweep_row(r) for r in results]
    first = next((r for r in results if r.scored), results[0])
    report = SweepReport(
        specprobe_version=__version__, created=first.created, target=cfg.target, reference=first.reference or "on-policy",
        num_prompts=int(first.metrics.get("num_prompts") or 0), num_positions=int(first.metrics.get("num_positions") or 0),
        target_passes=passes, procedure=first.procedure.description if first.procedure else None,
        rows=rows, recommended=recommend(rows), interrupted=interrupted or refs.interrupted,
    )
    return Sweep(report, results)
