"""A result's recommendation as the serving config each engine takes.

Shared, engine-neutral: reading the result into a `Plan` (the K, the draft tree, the
drafter kind, the prediction it comes from, the batch-size schedule, the synthetic rates)
and the refusal below 1×. Everything an engine means — its method name per drafter kind,
its n-gram knobs, its adaptive-K threshold, its acceptance floor, the words of its config
— is its writer's (`specprobe.engines.export.Writer`), in `engines/<engine>/export.py`,
loaded by `writer(engine)`.

Every export names the numbers it rests on (in comments where the format has them, and
in `Export.note`), its first line the prediction it comes from (`Plan.prediction`).
`slower_than_plain` says when that prediction is below 1×: the CLI refuses it unless
--force."""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from specprobe.core.errors import ConfigError, InputError
from specprobe.engines import ENGINES, GREEDY, PROBABILISTIC, Engine, get
from specprobe.engines.export import BUILTIN, GGUF, REPO, Plan, Writer, model_form
from specprobe.engines.export import fmt as _f
from specprobe.result import Result

_SPEC_PREFIXES = ("eagle3:", "eagle:", "medusa:", "mtp:")


@dataclass(frozen=True)
class Export:
    text: str
    note: list[str]
    plan: Plan


def writer(engine: Engine) -> Writer:
    """The engine's serving-config writer: its package's `export` module's WRITER."""
    if not engine.serving_config:
        raise ConfigError(f"--engine {engine.name} has no serving config", "use " + ", ".join(e.name for e in ENGINES if e.serving_config))
    return cast(Writer, importlib.import_module(type(engine).__module__ + ".export").WRITER)


def _writers() -> list[Writer]:
    """Every engine's writer that has a serving config, in the engines' order."""
    return [writer(e) for e in ENGINES if e.serving_config]


def _drafter_path(result: Result) -> str | None:
    spec = result.drafter.spec or result.config.drafter or ""
    if spec in ("mtp",):
        return None
    for prefix in _SPEC_PREFIXES:
        if spec.startswith(prefix):
            return spec[len(prefix) :] or None
    return spec or None


def _kind(result: Result) -> str:
    kind = result.drafter.kind or ""
    spec = result.drafter.spec or ""
    if not kind or kind == "head":
        kind = next((p[:-1] for p in _SPEC_PREFIXES if spec.startswith(p)), kind)
        if spec == "mtp":
            kind = "mtp"
    return kind


def _k_row(result: Result, k: int) -> Any:
    return next((r for r in result.k_table if r.k == k), None)


def _tau(row: Any) -> float | None:
    if row is None:
        return None
    return row.tau_renewal_tokens if row.tau_renewal_tokens is not None else row.tau_tokens


def schedule_from_costs(result: Result) -> list[tuple[int, int, int]] | None:
    """Each timed batch size's best K (0 where no K paid), as inclusive batch-size ranges:
    a timed size serves up to the geometric mean of it and the next timed size; adjacent
    ranges with the same K are merged. None unless at least two batch sizes were timed."""
    if result.cost is None:
        return None
    timed = sorted((b for b in result.cost.batches if b.best_k is not None and not b.skipped and b.rows), key=lambda b: b.batch_size)
    if len(timed) < 2:
        return None
    out: list[tuple[int, int, int]] = []
    lo = 1
    for i, b in enumerate(timed):
        k = int(b.best_k or 0) if (b.speedup_best or 0.0) > 1.0 else 0
        hi = math.isqrt(b.batch_size * timed[i + 1].batch_size) if i + 1 < len(timed) else b.batch_size
        hi = max(hi, lo)
        if out and out[-1][2] == k:
            out[-1] = (out[-1][0], hi, k)
        else:
            out.append((lo, hi, k))
        lo = hi + 1
    return out


def _per_round_row(result: Result, k: int) -> Any:
    """The K row that carries per-position rates counted per round at this K, or None."""
    return next((r for r in result.k_table if r.k == k and len(r.per_position_renewal) >= k), None)


def synthetic_rates(result: Result, k: int) -> list[float]:
    """r_1..r_K: the probability that the first i drafts of a round are all accepted, as
    the engine counts it at this K (the K row's renewal per-position rates; the depth
    curve, which counts every start position, for results without them), clamped to
    [0, 1] and made non-increasing (a running minimum; the curve is one by construction,
    the clamp only guards rounding)."""
    depth = result.depth
    row = _per_round_row(result, k)
    cum = list(row.per_position_renewal) if row is not None else list(depth.cumulative) if depth is not None else []
    if len(cum) < k or any(c is None for c in cum[:k]):
        have = len(cum)
        raise InputError(
            f"the result's depth curve has {have} depth{'s' if have != 1 else ''}; --synthetic at K = {k} needs {k}",
            "pass --k at most the depths it measured, or re-run diagnose with a larger --k-max",
        )
    rates: list[float] = []
    prev = 1.0
    for c in cum[:k]:
        r = min(prev, max(0.0, min(1.0, float(c or 0.0))))  # None refused above
        rates.append(r)
        prev = r
    return rates


LAYER_SKIP = "layer_skip"


def plan(result: Result, source: Path, engine: str, k: int | None = None, synthetic: bool = False, draft_folder: Path | None = None) -> Plan:
    """What to export, checked against what the engine takes (InputError, one line, when
    the result cannot be written for it). `draft_folder`: where a layer-skip self-draft is
    written as a checkpoint of its own (`write_draft`), served as a draft model."""
    w = writer(get(engine))
    label = w.label
    if not result.scored or not result.k_table:
        raise InputError(f"{source.name} has no τ(K) table ({result.command}{', stopped: ' + result.stopped if result.stopped else ''})", "export a result of 'specprobe diagnose' or 'simulate' that scored its prompts")
    kind = _kind(result)
    if draft_folder is not None and kind != LAYER_SKIP:
        raise InputError(f"--write-draft writes a layer-skip self-draft's layers as a checkpoint, and {source.name}'s drafter is {result.drafter.spec} ({kind or 'unknown'})", "leave --write-draft out: that drafter is exported as it is")
    if draft_folder is not None:
        kind = "independent"  # the cut checkpoint is an ordinary draft model
    method = w.methods.get(kind)
    if method is None:
        what = {LAYER_SKIP: f"a layer-skip self-draft ({result.drafter.spec})"}.get(kind, f"a {kind or 'unknown'} drafter ({result.drafter.spec})")
        engines = [o.label for o in _writers() if kind in o.methods]
        hint = f"export it for {', '.join(engines)}" if engines else "the engines serve a layer-skip self-draft only as a checkpoint of its own: add --write-draft DIR to write the target's first layers there as one"
        raise InputError(f"{label} has no method for {what}", hint)
    if synthetic and w.synthetic is None:
        raise InputError(f"--synthetic: {label} has no synthetic-acceptance mode that takes per-position rates", "use " + " or ".join(f"--engine {o.engine.name} ({o.synthetic})" for o in _writers() if o.synthetic is not None))
    best = result.best_k
    chosen = k if k is not None else best
    if chosen is None:
        raise InputError(f"{source.name} recommends no K (no cost could be judged)", "pass --k")
    ks = [r.k for r in result.k_table]
    if chosen not in ks:
        raise InputError(f"--k {chosen} is not in the result's τ(K) table (K {min(ks)}–{max(ks)})", "pass a K the result measured, or re-run diagnose with a larger --k-max")
    drafting = result.procedure.drafting if result.procedure is not None else GREEDY
    p = Plan(engine=engine, source=source, kind=kind, method=method, target=result.target.spec or result.config.target, drafter=_drafter_path(result) if kind != "ngram" else None, k=chosen, drafting=drafting)
    if draft_folder is not None:
        p.drafter = str(draft_folder.expanduser().resolve())
        p.notes.append(f"the draft model is {result.drafter.spec} written as a checkpoint of its own, {p.drafter}: the target's first {_self_layers(result)} decoder layers, its final norm and LM head (--write-draft)")
    if kind == "ngram":
        w.ngram(p, result.drafter.spec or "", synthetic)
    if result.sampling is not None:  # served as the result measured it (each engine's own defaults differ)
        t = result.sampling.target
        p.sampling = {"temperature": float(t.temperature), "top_k": int(t.top_k), "top_p": float(t.top_p), "min_p": float(t.min_p)}
    env = result.environment
    if env is not None and result.remote is None and env.dtype in _WIDTH:  # scored here (a --target-server's target: the server's)
        p.dtype = _served_dtype(p, env.dtype)
    followed = result.procedure.engine if result.procedure is not None else None
    if followed and followed != engine:
        p.notes.append(f"the result's numbers follow {get(followed).label}'s draft-and-verify procedure, not {label}'s: 'specprobe diagnose … --engine {engine}' gives {label}'s")
    row = _k_row(result, chosen)
    tau, speedup = _tau(row), row.speedup if row is not None else None
    alpha = result.metric("accept_prob_engine_mean") or result.metric("accept_prob_mean")
    batch = result.cost.batch_size if result.cost is not None else result.config.batch_size
    cost_ratio = result.cost.cost_ratio if result.cost is not None else None
    words = result.best_k_equivalent_words()  # the timing could not tell these Ks apart: the best K is the smallest
    why = ("the result's best K" + (f" ({words} within the cost timing's noise: the smallest taken)" if words else "")) if k is None else f"--k {k}" + (f" (the result's best K is {best})" if best is not None and best != k else "")
    p.notes.append(f"from {source.name} ({result.command}, {result.created}): drafter {result.drafter.spec} → target {result.target.spec}, {result.procedure.description if result.procedure else drafting + ' drafts'}")
    p.notes.append(f"K = {chosen}: {why}; τ({chosen}) = {_f(tau)} tokens per verify step, speedup {_f(speedup)}× at batch {batch} (drafter/target cost c = {_f(cost_ratio)}), α = {_f(alpha)} per token")
    p.speedup, p.speedup_at = speedup, f"K = {chosen}"
    p.prediction = f"prediction: speedup {_f(speedup)}× at K = {chosen}, α = {_f(alpha)} per token, τ = {_f(tau)} tokens per verify step, from {source.resolve()}"

    # per-batch-size schedule, where the engine takes one: only for the result's own recommendation
    if w.schedule and k is None and not synthetic:
        sched = schedule_from_costs(result)
        if sched is not None:
            p.schedule = sched
            p.k = max(chosen, max(kk for _, _, kk in sched))
            p.notes.append("batch-size schedule (each timed batch size's best K; K 0 where no K paid): " + ", ".join(f"batch {lo}–{hi} K {kk}" for lo, hi, kk in sched))
    elif w.schedule and k is not None and schedule_from_costs(result) is not None:
        p.notes.append("no batch-size schedule: --k fixes one K for every batch size")

    # the adaptive threshold, in the engine's own knob
    ad = result.adaptive
    if ad is not None and not synthetic and (ad.beats_fixed and ad.threshold is not None or ad.beats_fixed is False):
        w.adaptive(p, ad, max(ks), k is not None)

    # where the engine switches speculation off below an acceptance length
    w.stop_floor(p, result, chosen, tau, speedup)

    if synthetic:
        p.rates = synthetic_rates(result, chosen)
        rates_from = (f"the K = {chosen} row's per-position rates, rounds starting where the previous one ended" if _per_round_row(result, chosen) is not None
                  else f"the result's depth curve ({result.depth.source if result.depth else '?'})")
        p.notes.append(f"synthetic acceptance: rates r_i = P(the first i drafts all accepted) from {rates_from}, i = 1..{chosen}; tokens per verify step 1 + Σ r_i = {p.tau_synthetic:.4g}")
    if drafting == PROBABILISTIC and w.sampled_drafts_note is not None:
        p.notes.append(w.sampled_drafts_note)
    # the target and drafter as files the engine opens (a built-in name is none)
    w.locate(p)
    return p


def slower_than_plain(ex: Export) -> str | None:
    """The one-line refusal for an export whose predicted speedup is below 1× (SP301's
    rule: speculative decoding would slow this target down), else None. A synthetic
    export is exempt: it is a benchmark of the rates, not a serving config."""
    p = ex.plan
    if p.rates is not None or p.speedup is None or p.speedup >= 1.0:
        return None
    return f"{p.source.name} predicts a speedup of {_f(p.speedup)}× for {p.speedup_at} (SP301 no-speedup: speedup below 1.0, speculative decoding would slow this target down); nothing written — serve without speculation, export a result with a faster drafter, or pass --force to write it anyway"


def choose_tree(result: Result, source: Path, engine: str, k: int | None, synthetic: bool, tree: str | None, given: bool) -> dict[str, Any] | None:
    """The draft tree an export writes, or None for a chain: `tree` as asked (it must be
    the result's own tree or in its grid); without it, the result's own tree, else its
    best tree when that beats the best chain — for engines that verify trees only. An
    explicit --k (or --synthetic) asks for a chain."""
    label = get(engine).label
    trees = result.trees
    verifies_trees = get(engine).verifies_trees
    if tree is not None and given:
        if not verifies_trees:
            raise InputError(f"--tree: {label} verifies chains, not trees", f"export the tree for --engine {' or '.join(e.name for e in ENGINES if e.verifies_trees and e.serving_config)}, or leave --tree out")
        if k is not None or synthetic:
            raise InputError(f"--tree and {'--k' if k is not None else '--synthetic'} ask for different things (a tree, a chain)", "give one of them")
        rows = ([trees.tree] if trees is not None and trees.tree is not None else []) + (list(trees.grid) if trees is not None else [])
        row = next((r for r in rows if _tree_text(r) == tree), None)
        if row is None:
            raise InputError(f"--tree {tree}: {source.name} did not estimate this tree", "pick one of the result's tree grid (its trees section), or re-run diagnose with this --tree")
        return _tree_dict(row, "--tree")
    if not verifies_trees or k is not None or synthetic or trees is None:
        return None
    if trees.tree is not None:
        return _tree_dict(trees.tree, "the result's own tree")
    best, chain = trees.best_tree, result.metric("speedup_best")
    if best is not None and best.speedup is not None and chain is not None and best.speedup > chain:
        return _tree_dict(best, f"the result's best tree, faster than its best chain ({_f(best.speedup)}× vs {_f(chain)}×)")
    return None


def _tree_text(row: Any) -> str:
    return json.dumps(row.paths, separators=(",", ":")) if row.paths else f"steps={row.steps},topk={row.topk},tokens={row.tokens}"


def _tree_dict(row: Any, why: str) -> dict[str, Any]:
    return {"steps": row.steps, "topk": row.topk, "tokens": row.tokens, "paths": row.paths, "tau": row.tau_tokens, "speedup": row.speedup, "why": why}


_WIDTH = {"float32": 32, "bfloat16": 16, "float16": 16}


def _checkpoint_dtype(spec: str | None) -> str | None:
    """The precision the target's checkpoint stores (its config.json's torch_dtype / dtype),
    as far as this machine can read it without loading anything: a built-in or GGUF target
    is served from the float32 folder specprobe dequantises it into; a repo id from its
    cached snapshot; None where unknown."""
    if not spec:
        return None
    form = model_form(spec)
    if form in (BUILTIN, GGUF):
        return "float32"
    folder: Path | None = Path(spec).expanduser()
    if form == REPO:
        from specprobe.models.hub import hub_snapshot

        folder = hub_snapshot(spec)
    if folder is None:
        return None
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    text: dict[str, Any] = cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else {}
    got = cfg.get("torch_dtype") or cfg.get("dtype") or text.get("torch_dtype") or text.get("dtype")
    return str(got) if got in _WIDTH else None


def _served_dtype(p: Plan, scored: str) -> str | None:
    """The dtype the config pins: the one the result scored at, unless that is wider than
    the checkpoint's own (a 16-bit checkpoint scored in float32 on a CPU: pinning float32
    would serve it at twice the memory and slower, for a difference in the last bits) or
    the checkpoint's is unknown; a note says which."""
    stored = _checkpoint_dtype(p.target)
    if stored is not None and _WIDTH[scored] <= _WIDTH[stored]:
        return scored
    why = f"the checkpoint stores {stored}, which the engine serves as it is" if stored else "the checkpoint's own precision is not known here"
    p.notes.append(f"dtype not pinned: the result scored the target at {scored}, but {why} (acceptance at another precision can differ by a few percent; "
                   f"diagnose at --dtype {stored or 'bfloat16'} to predict it exactly)")
    return None


def _self_layers(result: Result) -> int:
    """N of the result's `self:layers=N` drafter."""
    spec = result.drafter.spec or ""
    try:
        return int(spec.rsplit("=", 1)[1])
    except (IndexError, ValueError):
        raise InputError(f"the result's layer-skip drafter {spec!r} is not self:layers=N", "export a result of 'specprobe diagnose TARGET self:layers=N'") from None


def write_draft(result: Result, folder: Path, progress: Any = None) -> Path:
    """The result's layer-skip self-draft (`self:layers=N`) written to `folder` as a
    checkpoint of its own: the target's first N layers, cut from its checkpoint (a built-in
    or GGUF target from the folder specprobe dequantised it into)."""
    # deferred: safetensors and torch, only for this
    from specprobe.models.cut import write_layer_cut
    from specprobe.models.loader import checkpoint_dir, resolve

    target = result.target.spec or result.config.target
    if not target:
        raise InputError("the result names no target to cut the draft from", "export a result of 'specprobe diagnose TARGET self:layers=N'")
    return write_layer_cut(checkpoint_dir(resolve(target), progress), folder.expanduser().resolve(), _self_layers(result))


def export_config(result: Result, source: Path, engine: str, k: int | None = None, synthetic: bool = False, output: Path | None = None, tree: str | None = None, tree_given: bool = False, forced: bool = False, draft_folder: Path | None = None) -> Export:
    """The engine's config text and the note it rests on. vLLM writes its JSON unless the
    output is a .yaml/.yml file (then a `vllm serve --config` YAML). SGLang and TensorRT-LLM
    get a draft tree where `choose_tree` picks one."""
    w = writer(get(engine))
    chosen_tree = choose_tree(result, source, engine, k, synthetic, tree, tree_given)
    p = plan(result, source, engine, k, synthetic, draft_folder)
    if chosen_tree is not None:
        t = chosen_tree
        w.check_tree(t)
        p.tree = t
        p.k = t["steps"]
        p.schedule = None
        shape = f"{len(t['paths'])} static nodes, depth {t['steps']}" if t["paths"] else f"steps {t['steps']}, topk {t['topk']}, {t['tokens']} tokens verified"
        p.notes.append(f"a draft tree ({shape}): {t['why']}; τ {_f(t['tau'])} tokens per verify step, speedup {_f(t['speedup'])}× (the K line above is the chain's)")
        p.speedup, p.speedup_at = t["speedup"], "its draft tree"
        p.prediction = f"prediction: speedup {_f(t['speedup'])}× for the draft tree ({shape}), τ = {_f(t['tau'])} tokens per verify step, from {source.resolve()}"
    if p.prediction:
        p.notes.insert(0, p.prediction + (" — below 1×, slower than plain decoding (SP301); written only because of --force" if forced else ""))
    text = w.write(p, output)
    return Export(text=text, note=list(p.notes), plan=p)
