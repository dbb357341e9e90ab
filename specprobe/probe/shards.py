"""Sharded runs: which prompts a shard owns, what a shard hands over (a *part*), and how
parts become the one result a single process would have written.

A shard owns whole reference batches: prompt i falls in turn-1 batch i // batch_size,
and batch b belongs to shard b % N. Generation is seeded per batch, so a shard samples
exactly the references a single-process run samples for those prompts, and it shares the
per-batch reference cache with every other shard and with a later unsharded run.

A part holds the mergeable accumulator state, and per scored item (prompt turn) its
tokens and the per-position scores every collector reads — so the per-position rows and
the token-level drill-down are rebuilt by replaying the items through fresh collectors
in the order a single process would have scored them. It also holds the run's identity
(settings, models, prompt set): parts of different runs never merge.

`run_shard` is the pipeline's side (save the part, reuse a finished one, or exchange
parts with the other ranks of a torchrun job); `merge_parts` the merge's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from specprobe.core.errors import InputError
from specprobe.core.files import write_text_atomic
from specprobe.judge.rules import load_table
from specprobe.metrics.accumulate import Accumulator
from specprobe.metrics.sampling import Sampling
from specprobe.metrics.tree import TreeAccumulator
from specprobe.models.loader import cache_root, load_info
from specprobe.probe import distributed, long_context
from specprobe.probe.alignment import SamplingPair
from specprobe.probe.assemble import build_result
from specprobe.probe.chunks import ROW_FIELDS, Chunk, ChunkScores, _runs
from specprobe.probe.drilldown import DrillCollector
from specprobe.probe.references import TurnReferences
from specprobe.probe.scoring import Scored, SequenceCollector
from specprobe.prompts import Prompt
from specprobe.settings.pipeline import DiagnoseConfig, SamplingFlags
from specprobe.settings.values import Shard

FORMAT = "specprobe-part"
# 2: the greedy-draft acceptance per position and depth, and the accumulator's drafting
VERSION = 2
# settings that may differ between the shards of one run (where it runs, what it writes)
_NOT_IDENTITY = ("shard", "use_cache", "part_path", "device", "device_map", "max_memory")
# what a part keeps per item and position: the row fields, and per head depth Σ min(p, q),
# p(argmax q) and max q, and what collectors asked for
_RECORDED = ("values", "alpha", "greedy", "conf", "extra")


def owns(prompt_index: int, batch_size: int, shard: Shard | None) -> bool:
    """Whether `shard` scores the prompt at this place in the prompt set."""
    return shard is None or (prompt_index // batch_size) % shard.count == shard.index


# ----------------------------------------------------------------------------- what a shard keeps
class RecordCollector:
    """A `chunks.Collector` that keeps each item's per-position scores (token order)
    for the part file; items keyed by their index in the run's item list."""

    def __init__(self) -> None:
        self.items: dict[int, dict[str, Any]] = {}
        self._pending: list[tuple[Chunk, ChunkScores]] = []

    def chunk(self, chunk: Chunk, scores: ChunkScores) -> None:
        self._pending.append((chunk, scores))

    def batch_done(self) -> None:
        pending, self._pending = self._pending, []
        for c, s in pending:
            for sl in _runs(c.prompt):
                rec = self.items.setdefault(int(c.prompt[sl.start]), {"pos": [], "values": {}, "alpha": {}, "greedy": {}, "conf": {}, "extra": {}})
                rec["pos"].append(c.token_pos[sl])
                for name, src in (("values", s.values), ("alpha", s.alpha_by_depth), ("greedy", s.greedy_by_depth), ("conf", s.confidence_by_depth), ("extra", s.extra)):
                    for k, v in src.items():
                        rec[name].setdefault(str(k), []).append(v[sl])

    def records(self) -> dict[int, dict[str, Any]]:
        """-> item index -> {pos [n], values/alpha/greedy/conf/extra: name -> [n, ...] arrays}."""
        out: dict[int, dict[str, Any]] = {}
        for i, rec in self.items.items():
            n = sum(len(p) for p in rec["pos"])
            out[i] = {"pos": np.concatenate(rec["pos"])}
            for name in _RECORDED:
                # a key missing from some chunks (a probe's sampled rows) is NaN there
                out[i][name] = {k: np.concatenate(v) if sum(len(a) for a in v) == n else _nan_fill(rec, name, k) for k, v in rec[name].items()}
        return out


def _nan_fill(rec: dict[str, Any], name: str, key: str) -> np.ndarray:
    parts = []
    for j, pos in enumerate(rec["pos"]):
        arrs = rec[name][key]
        parts.append(arrs[j] if j < len(arrs) and len(arrs[j]) == len(pos) else np.full(len(pos), np.nan, np.float32))
    return np.concatenate(parts)


# ----------------------------------------------------------------------------- identity
def model_stamp(path: Any) -> list[Any]:
    """Weight files by name and size (not mtime: shards run on different machines)."""
    p = Path(str(path))
    files = [p] if p.is_file() else sorted([*p.glob("*.safetensors"), *p.glob("*.bin"), *p.glob("*.gguf")])
    return [[f.name, f.stat().st_size] for f in files if f.exists()]


def identity(header: dict[str, Any], pair: Any) -> dict[str, Any]:
    """What must be equal for parts to merge: settings, both models, the prompt set."""
    cfg = {k: v for k, v in header["config"].items() if k not in _NOT_IDENTITY}
    return {
        "config": cfg,
        "target": {**header["target"], "weights": model_stamp(pair.target.info.path)},
        "drafter": {**header["drafter"], "weights": model_stamp(getattr(getattr(pair.drafter, "info", None), "path", "") or "")},
        "prompt_set": header["prompt_set"],
        "sampling": {k: header["sampling"][k] for k in ("target", "draft")},
    }


def identity_key(ident: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:20]


def part_cache_path(ident: dict[str, Any], shard: Shard) -> Path:
    return cache_root() / "parts" / identity_key(ident) / f"{shard.index}-of-{shard.count}.json"


# ----------------------------------------------------------------------------- the part file
def make_part(shard: Shard, ident: dict[str, Any], header: dict[str, Any], metrics: dict[str, Any], refs: Any, scored: Scored, records: dict[int, dict[str, Any]], cost: dict[str, Any] | None, cfg: Any, kind: str, evidence: dict[str, Any], drill_every: int | None) -> dict[str, Any]:
    items = []
    for i, rec in sorted(records.items()):
        item = refs.items[i]
        items.append({
            "id": item.id, "domain": item.domain, "category": item.category, "encoded": list(refs.encoded[i]), "cont": list(refs.conts[i]),
            "pos": rec["pos"].tolist(),
            **{name: {k: np.asarray(v).tolist() for k, v in rec[name].items()} for name in _RECORDED},
        })
    return {
        "format": FORMAT, "version": VERSION, "shard": [shard.index, shard.count], "identity": ident, "header": header, "metrics": metrics,
        "kind": kind, "evidence": evidence, "cost": cost, "cost_origins": dict(cfg.cost_origins), "drill_every": drill_every,
        "interrupted": bool(scored.interrupted), "head_depths": list(scored.head_depths), "accumulator": scored.acc.to_state(), "items": items,
        # draft trees (probe.tree): the grid's and the run's own tree sums, merged by adding
        "trees": scored.tree.to_state() if scored.tree is not None else None,
    }


def save_part(part: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(path, json.dumps(part))


def load_part(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        part = json.loads(p.read_text())
    except FileNotFoundError:
        raise InputError(f"part {p} does not exist", "pass the files written by diagnose --shard I/N --json PART") from None
    except PermissionError:
        raise InputError(f"part {p} cannot be read (PermissionError)", "check the path and its permissions") from None
    except IsADirectoryError:
        raise InputError(f"part {p} is a directory", "pass the files written by diagnose --shard I/N --json PART") from None
    except (OSError, ValueError) as e:
        raise InputError(f"part {p} cannot be read ({type(e).__name__})", "the file is damaged or not a part; rerun that shard") from None
    if not isinstance(part, dict) or part.get("format") != FORMAT:
        raise InputError(f"{p} is not a specprobe part", "pass the files written by diagnose --shard I/N --json PART (a finished result is merged already)")
    if part.get("version") != VERSION:
        raise InputError(f"part {p} has version {part.get('version')}, this specprobe reads {VERSION}", "rerun the shard with this specprobe")
    part["_path"] = str(p)
    return part


def check_parts(parts: Sequence[dict[str, Any]]) -> None:
    """Every part of one run, each shard once: InputError naming the first problem."""
    if not parts:
        raise InputError("no parts to merge", "pass every PART.json of the run")
    first = parts[0]
    for p in parts[1:]:
        for what in ("config", "target", "drafter", "prompt_set", "sampling"):
            if p["identity"][what] != first["identity"][what]:
                diff = _first_difference(first["identity"][what], p["identity"][what])
                raise InputError(f"{p['_path']} is from another run than {first['_path']}: different {what}{diff}", "merge only the parts of one run (same settings, models and prompts)")
    counts = {p["shard"][1] for p in parts}
    if len(counts) > 1:
        raise InputError(f"parts split the run in different ways ({', '.join(f'/{c}' for c in sorted(counts))})", "merge the parts of one --shard I/N split")
    n = counts.pop()
    seen: dict[int, str] = {}
    for p in parts:
        i = p["shard"][0]
        if i in seen:
            raise InputError(f"shard {i}/{n} is given twice ({seen[i]} and {p['_path']})", "pass each shard's part once")
        seen[i] = p["_path"]
    missing = [i for i in range(n) if i not in seen]
    if missing:
        raise InputError(f"shard(s) {', '.join(f'{i}/{n}' for i in missing)} missing", "run the missing shards (finished ones are reused), then merge every part")


def _first_difference(a: Any, b: Any) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return f" ({k}: {a.get(k)!r} vs {b.get(k)!r})"
    return ""


# ----------------------------------------------------------------------------- merging
@dataclass
class Merged:
    """Everything `assemble.build_result` needs, from the parts of one run."""

    header: dict[str, Any]
    metrics: dict[str, Any]
    scored: Scored
    cost: dict[str, Any] | None
    cfg: Any  # DiagnoseConfig
    kind: str
    evidence: dict[str, Any]
    refs: Any  # references.TurnReferences of every item


def merge_parts(parts: Sequence[dict[str, Any]], tokenizer: Any, pair: Any, cfg: Any = None, complete: bool = True) -> Merged:
    """Parts -> the merged accumulators, and rows and drill-down replayed in the order a
    single process scores the items. tokenizer and pair (SamplingPair) feed the
    drill-down; cfg: the run's DiagnoseConfig (rebuilt from the parts when None);
    complete=False: a subset of the shards (one reused part) is fine."""
    if complete:
        check_parts(parts)
    parts = sorted(parts, key=lambda p: p["shard"][0])
    first = parts[0]
    cfg = cfg or config_from_part(first)
    acc = Accumulator.from_state(first["accumulator"])
    for p in parts[1:]:
        acc.merge(Accumulator.from_state(p["accumulator"]))
    # a single run lists every first turn in prompt order, then later turns turn by turn
    order = {pid: j for j, pid in enumerate(first.get("prompt_ids") or [])}
    items = [it for p in parts for it in p["items"]]
    items.sort(key=lambda it: (_turn(it["id"]), order.get(it["id"].split("#")[0], len(order)), it["id"]))
    refs = TurnReferences(
        [Prompt(id=it["id"], domain=it["domain"], category=it["category"], turns=()) for it in items],
        [it["encoded"] for it in items], [it["cont"] for it in items],
    )
    seq = SequenceCollector(Accumulator(k_max=cfg.k_max, drafting=cfg.drafting, p_min=cfg.draft_p_min, n_min=cfg.draft_n_min,
                      threshold_single=cfg.accept_threshold_single, threshold_acc=cfg.accept_threshold_acc), refs.items, cfg.keep_positions)
    drill = DrillCollector(tokenizer, refs.items, refs.encoded, refs.conts, pair, k_max=cfg.k_max, every=first.get("drill_every"))
    # --context-lengths: each built prompt's length, as the shards recorded it; the table by (length, domain) is replayed too
    length_of = {str(k): int(v) for p in parts for k, v in (p.get("length_of") or {}).items()}
    by_length = long_context.LengthCollector(refs.items, length_of, cfg) if length_of else None
    sinks: list[Any] = [seq, drill, *([by_length] if by_length is not None else [])]
    run_order = sorted(range(len(items)), key=lambda i: len(refs.encoded[i]) + len(refs.conts[i]))
    run_order = [i for i in run_order if refs.conts[i]]
    for start in range(0, len(run_order), cfg.batch_size):
        for i in run_order[start : start + cfg.batch_size]:
            chunk, scores = _replay(i, items[i])
            for sink in sinks:
                sink.chunk(chunk, scores)
        for sink in sinks:
            sink.batch_done()
    head_depths: tuple[int, ...] = max((tuple(p["head_depths"]) for p in parts), key=lambda t: len(t))
    scored = Scored(acc, seq.rows, any(p["interrupted"] for p in parts), head_depths, drill=drill)
    if by_length is not None:
        long_context.attach(scored, by_length)
    trees = [TreeAccumulator.from_state(p["trees"]) for p in parts if p.get("trees")]
    if trees:
        scored.tree = trees[0]
        for t in trees[1:]:
            scored.tree.merge(t)
    # the cost ratio is timed by one shard (the lowest that timed it), as one process would
    cost = next((p["cost"] for p in parts if p.get("cost") is not None), None)
    return Merged(dict(first["header"]), dict(first["metrics"]), scored, cost, cfg, first["kind"], first["evidence"], refs)


def _turn(item_id: str) -> int:
    return int(item_id.split("#")[1]) if "#" in item_id else 1


def _replay(i: int, it: dict[str, Any]) -> tuple[Chunk, ChunkScores]:
    pos = np.asarray(it["pos"], dtype=np.int64)
    arr = lambda v: np.asarray(v, dtype=np.float32)  # noqa: E731
    extra = {k: (np.asarray(v, dtype=np.int64) if k.endswith("_ids") else arr(v)) for k, v in it["extra"].items()}
    scores = ChunkScores({f: arr(it["values"][f]) for f in ROW_FIELDS}, {int(d): arr(v) for d, v in it["alpha"].items()}, {int(d): arr(v) for d, v in it["conf"].items()}, extra,
                         greedy_by_depth={int(d): arr(v) for d, v in it["greedy"].items()})
    return Chunk(np.full(len(pos), i, dtype=np.int64), pos), scores


def config_from_part(part: dict[str, Any]) -> Any:
    """The run's DiagnoseConfig, from the settings a part records."""
    d = dict(part["header"]["config"])
    flag_names = {f.name for f in fields(SamplingFlags)}
    sampling = SamplingFlags(**{k: d.pop(k) for k in list(d) if k in flag_names})
    names = {f.name for f in fields(DiagnoseConfig)}
    return DiagnoseConfig(**{k: v for k, v in d.items() if k in names}, sampling=sampling, cost_origins=dict(part.get("cost_origins") or {}))


def sampling_pair(part: dict[str, Any]) -> Any:
    s = part["header"]["sampling"]
    return SamplingPair(Sampling(**s["target"]), Sampling(**s["draft"]), dict(s.get("sources") or {}))


# ----------------------------------------------------------------------------- the pipeline's side
ScoreAll = Callable[[Sequence[Any]], tuple[Any, Scored]]


def run_shard(cfg: Any, pair: Any, header: dict[str, Any], metrics: dict[str, Any], prompt_ids: list[str], progress: Any, score_all: ScoreAll, kind: str, evidence: dict[str, Any], drill_every: int | None) -> tuple[Any, Scored, Callable[[dict[str, Any]], None]]:
    """Score this shard (or reuse its finished part), save the part; under torchrun,
    exchange parts with the other ranks and return the whole run's (refs, scored).
    The third value records the cost block, once timed, in the part files."""
    shard = Shard(*cfg.shard)
    ident = identity(header, pair)
    cached = part_cache_path(ident, shard)
    part = _reusable(cached, ident, shard) if cfg.use_cache else None
    if part is not None:
        progress.note(f"shard {shard.label}: reusing its finished part ({cached})")
        merged = merge_parts([part], pair.target.tokenizer, pair.sampling, cfg, complete=False)
        refs, scored = merged.refs, merged.scored
    else:
        rec = RecordCollector()
        refs, scored = score_all([rec])
        part = make_part(shard, ident, header, metrics, refs, scored, rec.records(), None, cfg, kind, evidence, drill_every)
        part["prompt_ids"] = prompt_ids
        part["length_of"] = lengths_of(scored)
    part["_path"] = f"shard {shard.label}"

    def with_cost(cost: dict[str, Any] | None) -> None:
        part["cost"] = cost
        body = {k: v for k, v in part.items() if k != "_path"}
        if cfg.use_cache and not part["interrupted"]:
            save_part(body, cached)
        if cfg.part_path is not None:
            save_part(body, Path(cfg.part_path))

    with_cost(part.get("cost"))
    if distributed.active():
        parts = distributed.gather_parts(part)
        merged = merge_parts(parts, pair.target.tokenizer, pair.sampling, cfg)
        return merged.refs, merged.scored, lambda cost: None
    return refs, scored, with_cost


def lengths_of(scored: Scored) -> dict[str, int]:
    """--context-lengths: each scored prompt's built length (from its length collector), for the merge."""
    lc = long_context.attached(scored)
    if lc is None:
        return {}
    return {p.id: int(n) for p, n in zip(lc.prompts, lc.lengths, strict=False) if n}


def _reusable(path: Path, ident: dict[str, Any], shard: Shard) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        part = load_part(path)
    except InputError:
        return None
    ok = part["identity"] == json.loads(json.dumps(ident, default=str)) and part["shard"] == [shard.index, shard.count] and not part["interrupted"]
    return part if ok else None


# ----------------------------------------------------------------------------- the merge command's side
def result_from_parts(parts: Sequence[dict[str, Any]], tokenizer: Any = None, rules: Sequence[str | Path] | None = None) -> Any:
    """Parts of one run -> the `Result` a single process would have made. The
    tokenizer (for the drill-down's token texts) is read from the target's files when
    not given; the rules are the run's own plus `rules`."""
    check_parts(parts)
    first = min(parts, key=lambda p: p["shard"][0])
    if tokenizer is None:
        tokenizer = load_info(first["header"]["config"]["target"]).tokenizer
    m = merge_parts(parts, tokenizer, sampling_pair(first))
    table = load_table([Path(r) for r in [*m.cfg.rules, *(rules or [])]])
    cost = m.cost
    if cost is None:  # no shard timed it (all interrupted): the estimate without timing
        cost = {"measured": False, "context_tokens": 0, "budget_s": None, "elapsed_s": 0.0, "stopped_by_budget": False, "notes": [], "batches": []}
    return build_result(m.header, m.metrics, m.scored, cost, m.cfg, table, m.kind, m.evidence)
