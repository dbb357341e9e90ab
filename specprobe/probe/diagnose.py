"""The diagnose pipeline, top to bottom: prompts → reference continuations
(`references`) → teacher-forced scoring of target vs drafter (`scoring`) → cost ratio
(`costs`) → accumulators → estimates → rules → the typed result (`assemble`, `result`)
every report renders. The CLI only wires flags into `DiagnoseConfig`."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError
from specprobe.core.interrupts import shielded
from specprobe.core.progress import Progress
from specprobe.estimates.tree import TreeShape
from specprobe.judge.rules import RuleTable, load_table
from specprobe.models.drafters import build_drafter, drafter_info
from specprobe.models.loader import check_paths, load_info, load_model, local_spec
from specprobe.precision.kv_served import serve_kv_cache
from specprobe.precision.quant import serve_quantized
from specprobe.probe import live, long_context
from specprobe.probe.alignment import BLOCKING_RULES, compare, effective_sampling
from specprobe.probe.assemble import build_result, evaluate_rules, result_header, stopped_result
from specprobe.probe.counterfactual import default_every
from specprobe.probe.drilldown import DrillCollector
from specprobe.probe.ngram import diagnose_ngram
from specprobe.probe.references import (  # noqa: F401  (encode_prompt, load_prompt_set re-exported)
    encode_prompt,
    load_prompt_set,
    references_by_turn,
)
from specprobe.probe.scoring import Scored, score
from specprobe.probe.served import FullTargetWhatIf, served_differently
from specprobe.probe.shards import run_shard
from specprobe.probe.timing import cost_block, timing_settings, tree_grid
from specprobe.probe.tree import TreeCollector, paths_collector, wants_trees
from specprobe.result import Result
from specprobe.settings.options import relabel_sources
from specprobe.settings.pipeline import DiagnoseConfig
from specprobe.settings.values import parse_max_memory


# ----------------------------------------------------------------------------- the pair
@dataclass
class Pair:
    target: Any
    drafter: Any
    sampling: Any
    alignment: Any


def load_pair(cfg: DiagnoseConfig, progress: Progress, target: Any = None, drafter: Any = None, vet: Callable[[Any], None] | None = None) -> Pair:
    """Load target + drafter and run the alignment check (no forward pass yet). `vet`
    receives the drafter's info (configs and headers, no weights) before the target
    loads, to refuse what the caller cannot run (simulate: an MTP head with > 1 layer)."""
    # a Hugging Face repo id: its snapshot folder, downloaded unless cached (models.hub); the
    # result records the specs as given
    tspec = local_spec(cfg.target, cfg.revision, cfg.offline, progress.note) if target is None else cfg.target
    dspec = local_spec(cfg.drafter, cfg.draft_revision, cfg.offline, progress.note) if drafter is None else cfg.drafter
    # a drafter path that does not exist is refused before the target loads (minutes, for a big one)
    check_paths(tspec if target is None else None, dspec if drafter is None else None)
    if target is None:
        progress.note(f"loading target {cfg.target}")
        tinfo = load_info(tspec, progress, cfg.gguf_weights)
        dinfo = drafter_info(dspec, tinfo, progress, cfg.gguf_weights)
        refuse_draft_serving(cfg, dinfo is tinfo or "head" in dinfo.extra)
        if vet is not None:
            vet(dinfo)
        max_memory = parse_max_memory(cfg.max_memory) if cfg.max_memory else None  # a larger-than-one-GPU target
        target = load_model(tspec, cfg.device, cfg.dtype, progress, info=tinfo, device_map=cfg.device_map, max_memory=max_memory)
        if cfg.target_quant:  # the original weights kept aside for the full-precision what-if
            serve_quantized(target, cfg.target_quant, keep=True, progress=progress)
        if cfg.kv_served[0]:
            serve_kv_cache(target, cfg.kv_served[0])
    if drafter is None:
        dinfo = drafter_info(dspec, target.info, progress, cfg.gguf_weights)
        refuse_draft_serving(cfg, dinfo is target.info or "head" in dinfo.extra)
        progress.note(f"building drafter {cfg.drafter}")
        drafter = build_drafter(dspec, target, cfg.device, cfg.dtype, progress, info=None if dinfo is target.info else dinfo)
        if cfg.draft_quant:
            serve_quantized(drafter.loaded, cfg.draft_quant, keep=True, progress=progress)
        if cfg.kv_served[1] and getattr(drafter, "loaded", None) is not None:
            serve_kv_cache(drafter.loaded, cfg.kv_served[1])
    draft_gen = None if drafter.info is target.info else drafter.info.generation_config
    pair = effective_sampling(cfg.sampling, target.info.generation_config, draft_gen, engine=cfg.engine, drafting=cfg.drafting)
    pair.sources = relabel_sources(pair.sources, cfg.sampling_origins)  # "--temperature" / "probe.yaml", not "flag"
    return Pair(target, drafter, pair, compare(target.info, drafter.info, pair, models=(target, drafter)))


def refuse_draft_serving(cfg: DiagnoseConfig, no_model_of_its_own: bool) -> None:
    """--draft-quant and --draft-kv-cache-dtype act on a drafter model of its own: a
    self-draft shares the target's weights and attention (the target's flags cover it), an
    n-gram drafter has none, a head's are not simulated."""
    if not no_model_of_its_own:
        return
    if cfg.draft_quant:
        raise ConfigError(
            f"--draft-quant {cfg.draft_quant} needs a drafter model of its own; {cfg.drafter} is a self-draft, a head or an n-gram drafter",
            "a self-draft shares the target's weights: use --target-quant, which quantizes both; leave --draft-quant out for a head or an n-gram drafter",
        )
    if cfg.draft_kv_cache_dtype and cfg.kv_served[1] != cfg.kv_served[0]:
        raise ConfigError(
            f"--draft-kv-cache-dtype {cfg.draft_kv_cache_dtype} needs a drafter model of its own; {cfg.drafter} is a self-draft, a head or an n-gram drafter",
            "a self-draft shares the target's attention: use --kv-cache-dtype, which covers both; leave --draft-kv-cache-dtype out otherwise",
        )


# ----------------------------------------------------------------------------- the pipeline
def run_diagnose(
    cfg: DiagnoseConfig, progress: Progress | None = None, table: RuleTable | None = None, pair: Pair | None = None, on_partial: Callable[[Result], None] | None = None,
    on_references: Callable[[Any], None] | None = None,
) -> Result:
    """The whole diagnose job -> its result.

    Ctrl-C (or SIGTERM) stops the step that is running and keeps what it finished. The
    first press hands what was computed to `on_partial` (the CLI writes it) before
    anything else runs, then the run finishes (the prompts whose references were done are
    scored, the cost ratio measured); a second press skips what is left.
    `on_references` receives the references once made (`TurnReferences`), for a caller
    that needs them too (simulate), so they are not generated twice."""
    progress = progress or Progress()
    table = table or load_table([Path(p) for p in cfg.rules])
    if cfg.target_server is not None:  # the target is an engine's server, the drafter here
        from specprobe.probe.remote import run_remote

        return run_remote(cfg, progress, table)
    prompt_set = load_prompt_set(cfg)
    progress.note(f"prompts from {prompt_set.name}: {prompt_set.description}")
    server = None
    if cfg.against is not None:  # a live server to compare with: reached now, before any model loads
        server = live.connect(cfg.engine, cfg.against, cfg.against_model)
        progress.note(f"--against: {server.engine.label} {server.version or ''} at {server.url} serving {server.model}")
    pair = pair or load_pair(cfg, progress)
    target, drafter, align = pair.target, pair.drafter, pair.alignment
    length_of: dict[str, int] = {}  # --context-lengths: each built prompt's token length
    if cfg.context_lengths:
        limit = getattr(target.config, "max_position_embeddings", None)
        prompt_set, length_of = long_context.build(prompt_set, target.tokenizer, cfg.context_lengths, limit=limit, max_new_tokens=cfg.max_new_tokens, name=target.name)
        progress.note(f"prompts by context length: {prompt_set.description}")
    header = result_header(cfg, pair, prompt_set)
    metrics: dict[str, Any] = dict(align.metrics)

    # 1. alignment: a pair whose token ids or sampling disagree is not worth a forward pass
    findings0, _ = evaluate_rules(table, metrics, drafter.kind, align.evidence, families=("alignment",))
    blocking = [f for f in findings0 if f.rule_id in BLOCKING_RULES and f.severity == "error"]
    if blocking and not cfg.force:
        return stopped_result(header, metrics, table, drafter.kind, align.evidence, [f.rule_id for f in blocking])
    if server is not None and (drafter.kind == "ngram" or cfg.shard is not None):
        raise ConfigError("--against compares a model drafter's estimate from one process", "leave out --shard, or use a model drafter")
    if drafter.kind == "ngram":  # no model to score: its proposals walked along the references
        return diagnose_ngram(cfg, pair, prompt_set, header, metrics, table, align.evidence, progress, on_references)

    # 2. references: what the target would write (or the dataset's responses)
    #    (every turn: a later turn follows the target's own answers to the earlier ones)
    # 3. scoring: target vs drafter, teacher-forced over those references
    #    (+ the token-level drill-down and what-ifs, from the same logits)
    def references_and_scores(extra: Sequence[Any] = ()) -> tuple[Any, Scored]:
        refs = references_by_turn(target, list(prompt_set.prompts), cfg, pair.sampling.target, progress)
        if on_references is not None:
            on_references(refs)
        if refs.interrupted:
            done = sum(1 for c in refs.conts if c)
            cut = f" ({refs.cut} of them cut short where Ctrl-C stopped them)" if refs.cut else ""
            if done:
                progress.note(f"interrupted while generating references: finishing — scoring the {done} prompts with references{cut}, then the cost ratio; press Ctrl-C again to stop now")
            else:
                progress.note("interrupted while generating references: no reference token was generated, so nothing is scored or priced")
        drill = DrillCollector(target.tokenizer, refs.items, refs.encoded, refs.conts, pair.sampling, k_max=cfg.k_max, every=drill_every)
        t_score = time.perf_counter()
        by_length = [long_context.LengthCollector(refs.items, length_of, cfg)] if length_of else []
        # a side served quantized: the drafter against the full-precision sides too (a second forward per batch)
        served = served_differently(target) or served_differently(getattr(drafter, "loaded", None))
        whatif = [FullTargetWhatIf(target, drafter, refs.encoded, refs.conts, pair.sampling, cfg.drafting, cfg.batch_size)] if served and drafter.kind in ("independent", "layer_skip") else []
        trees = [TreeCollector(cfg, refs.items)] if wants_trees(cfg) else []
        # the run's own tree drafted on its candidate paths, from each scoring batch's target pass
        found = paths_collector(cfg, target, drafter, pair.sampling.target, refs.encoded, refs.conts, progress) if trees else None
        paths = [found] if found is not None else []
        scored = score(target, drafter, refs.items, refs.encoded, refs.conts, pair.sampling, cfg, progress, collectors=[drill, *by_length, *whatif, *trees, *paths, *extra])
        # the cost timing's budget: the scoring's time, not the paths drafting's
        scoring_s.append(time.perf_counter() - t_score - sum(p.seconds for p in paths))
        if trees:
            scored.tree = trees[0].acc  # read by assemble.summarise
            if paths and not scored.interrupted:
                paths[0].finish(scored.tree)
            elif paths:
                progress.note("interrupted: the tree keeps the estimate along the reference")
        if whatif:
            scored.served_whatif = whatif[0]  # read by assemble.build_result
        if by_length:
            long_context.attach(scored, by_length[0])
        scored.drill = drill
        scored.second_press = refs.interrupted and scored.interrupted
        scored.interrupted = scored.interrupted or refs.interrupted
        return refs, scored

    t0 = time.perf_counter()
    scoring_s: list[float] = []  # the teacher-forced scoring's own time (references not included)
    record_cost: Callable[[dict[str, Any]], None] = lambda cost: None  # noqa: E731
    # a shard's share of the prompts (every shard samples the same counterfactual prompts)
    drill_every = default_every(len(prompt_set.prompts)) if cfg.shard is not None else None
    if cfg.shard is None:
        refs, scored = references_and_scores()
    else:  # one shard: its part is saved (a finished one reused); under torchrun, the whole run comes back

        ids = [p.id for p in prompt_set.prompts]
        refs, scored, record_cost = run_shard(cfg, pair, header, metrics, ids, progress, references_and_scores, drafter.kind, align.evidence, drill_every)
    if server is not None and not scored.interrupted:
        run = live.send(server, refs.encoded, pair.sampling.target, cfg.max_new_tokens, cfg.seed, cfg.against_timeout, progress)
        if run.stopped:
            progress.note(f"--against: {run.stopped}")
        scored.live = live.compare(run, scored.acc, pair.sampling.target)
    # costs are timed at the context these prompts reach, within a budget set by the
    # scoring's time (a shard reused from disk: this run's time)
    # a run estimating trees also times the tree's passes (its own N and topk, and the grid's)
    tree_n, tree_w = tree_grid(cfg.tree_shape or (TreeShape(1, 1, 2) if wants_trees(cfg) else None))
    timing = timing_settings(cfg, refs.encoded, refs.conts, sum(scoring_s) if scoring_s else time.perf_counter() - t0, tree_n, tree_w)
    second_press = scored.second_press

    # 4. cost: the drafter's price per step, then estimates and rules
    def result(cost: dict[str, Any]) -> Result:
        record_cost(cost)
        return build_result(header, metrics, scored, cost, cfg, table, drafter.kind, align.evidence)

    def untimed() -> dict[str, Any]:  # no batch sizes: nothing is timed (a --cost-ratio given still applies)
        return cost_block(target, drafter, cfg.cost_ratio)

    if not scored.interrupted:
        if cfg.cost_ratio is None:
            progress.note("measuring the drafter/target cost ratio on the device")
        try:
            return result(cost_block(target, drafter, cfg.cost_ratio, **timing))
        except KeyboardInterrupt:
            progress.note("interrupted during the cost measurement: keeping the scores, without a cost ratio")
            scored.interrupted = True
            return result(untimed())

    # interrupted: what was computed is handed over (written) first, then the cost is
    # measured unless Ctrl-C comes again
    try:
        with shielded():  # a press while this is written is taken as the second one
            partial = result(untimed())
            if on_partial is not None:
                on_partial(partial)
        if second_press or not scored.acc.num_positions:  # nothing scored: nothing to price
            return partial
        progress.note("finishing, press Ctrl-C again to stop without the cost measurement")
        return result(cost_block(target, drafter, cfg.cost_ratio, **timing))
    except KeyboardInterrupt:
        progress.note("stopped without the cost measurement")
        return partial
