"""`specprobe check TARGET DRAFTER`: alignment only, in seconds, no forward pass — vocab,
token ids, special tokens, chat template, context length and each side's sampling
settings, from flags, a probe config and the serving configs the engine runs with."""

from __future__ import annotations

from typing import Any

import typer

from specprobe.cli.common import (
    ConfigOpt,
    err,
    gather,
    handle_errors,
    out,
    takes_settings,
    write_outputs,
)
from specprobe.engines import get


@takes_settings("check")
@handle_errors
def check(
    ctx: typer.Context,
    config: ConfigOpt = None,
) -> None:
    """Alignment only, in seconds, no forward pass: vocab, token ids, special tokens,
    chat template, normalizer, context length, sampling settings.

    Sampling, engine and drafting: a flag typed here wins, then the probe config, then the
    serving configs (what the engine is launched with: a vLLM, SGLang or TensorRT-LLM
    config, or a launch script such as llama-server's), then the target's
    generation_config and the engine's defaults; the drafter shares the target's
    sampling unless a --draft-* setting says otherwise, as the engines do. A temperature
    written differently in two of these places is an error (SP019). A probe config's
    outputs are diagnose's: check writes only where --json says.

    Examples:
      specprobe check smollm2 self:layers=24

      specprobe check ./llama-3-8b ./llama-3.2-1b --temperature 0.7 --draft-temperature 1.0

      specprobe check smollm2 self:layers=28 --serving-config sample_configs/sglang-launch.yaml

      specprobe check --serving-config launch-llama-server.sh
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.errors import ConfigError
    from specprobe.judge.rules import load_table
    from specprobe.probe.alignment import compare, declared_gaps, effective_sampling
    from specprobe.settings.options import relabel_sources

    # the merge reads the serving configs: what they set fills what no flag or --config sets
    opts = gather(ctx, "check")
    servings = opts.servings
    target_spec, drafter_spec = opts.target, opts.drafter
    if not target_spec or not drafter_spec:
        raise ConfigError("check needs a TARGET and a DRAFTER", "give them as arguments, or in --config / --serving-config")
    flags = opts.sampling_flags()
    declared = opts.declared
    table = load_table(opts.rules)  # a bad rules file fails before anything loads

    from specprobe.models.drafters import drafter_info, drafter_kind_of
    from specprobe.models.loader import load_info, local_spec

    # a Hugging Face repo id: its snapshot folder, downloaded unless cached or --offline (models.hub)
    target_local = local_spec(target_spec, opts.revision, opts.offline, err.print)
    drafter_local = local_spec(drafter_spec, opts.draft_revision, opts.offline, err.print)
    tinfo = load_info(target_local, err.print)
    dinfo = drafter_info(drafter_local, tinfo, err.print)
    if "head" in dinfo.extra:  # a head: the serving K is checked against its heads / MTP layers
        dinfo.extra["serving_k"] = next((sv.num_speculative_tokens for sv in servings if sv.num_speculative_tokens), None)
    pair = effective_sampling(
        flags, tinfo.generation_config, None if dinfo is tinfo else dinfo.generation_config, declared=declared, engine=opts.engine, drafting=opts.draft_sampling
    )
    pair.sources = relabel_sources(pair.sources, opts.sampling_origins())
    report = compare(tinfo, dinfo, pair, serving_context=next((sv.context_length for sv in servings if sv.context_length), None))
    relaxed_acceptance(report, servings)
    kind = drafter_kind_of(drafter_local)
    result = _result(opts, target_spec, drafter_spec, kind, tinfo, dinfo, flags, pair, report, table)

    from specprobe.report.console import render
    from specprobe.report.load import gate_exit_code

    render(result, out)
    drafter_from_serving = opts.origins.get("drafter") in {sv.where("drafter") for sv in servings}
    for sv in servings:
        _serving_lines(sv, drafter_spec, drafter_from_serving)
    for key, gap in declared_gaps(declared).items():
        if gap > 0 and key != "temperature":  # a temperature gap is rule SP019's
            said = ", ".join(f"{name} {vals[key]:g}" for name, vals in declared.items() if key in vals)
            out.print(f"[yellow]note:[/] {key} differs: {said}", highlight=False, soft_wrap=True)
    write_outputs(result, opts, fail_on=opts.fail_on)
    raise typer.Exit(gate_exit_code(result, opts.fail_on))


def _serving_lines(sv: Any, drafter_spec: str, drafter_from_serving: bool) -> None:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.settings.serving import describe_serving

    out.print(f"serving config {describe_serving(sv)}", highlight=False, soft_wrap=True)
    if not drafter_from_serving and sv.drafter_spec and sv.drafter_spec != drafter_spec:
        out.print(f"[yellow]note:[/] {sv.source.name} serves drafter {sv.drafter_spec}; this check compared {drafter_spec}", highlight=False, soft_wrap=True)


def relaxed_acceptance(report: Any, servings: Any) -> None:
    """TensorRT-LLM's relaxed acceptance for thinking models (use_relaxed_acceptance_for_thinking):
    in the thinking phase a draft in the target's relaxed_topk whose probability is within
    relaxed_delta of the top one is accepted — lossy, and not what specprobe estimates."""
    on = [sv for sv in servings if get(sv.engine).relaxed_acceptance(sv.extra)]
    report.metrics["relaxed_acceptance_served"] = int(bool(on))
    if on:
        sv = on[0]
        report.evidence["relaxed_acceptance_served"] = [
            f"{sv.source.name}: use_relaxed_acceptance_for_thinking true, relaxed_topk {sv.extra.get('relaxed_topk', 1)}, relaxed_delta {sv.extra.get('relaxed_delta', 0.0)}"
        ]


def _result(opts: Any, target_spec: str, drafter_spec: str, kind: str, tinfo: Any, dinfo: Any, flags: Any, pair: Any, report: Any, table: Any) -> Any:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.probe.assemble import check_result

    return check_result(
        config={
            "target": target_spec,
            "drafter": drafter_spec,
            **flags.__dict__,
            "engine": opts.engine,
            "draft_sampling": get(opts.engine).drafting(opts.draft_sampling),  # resolved, as diagnose records it
            "rules": [str(r) for r in opts.rules],
            "fail_on": opts.fail_on,
            **{k: getattr(opts, k) for k in ("target_quant", "draft_quant", "kv_cache_dtype", "draft_kv_cache_dtype") if getattr(opts, k)},  # recorded; check loads no weights
        },
        target={"spec": target_spec, "name": tinfo.name},
        drafter={"spec": drafter_spec, "kind": kind, "name": dinfo.name if dinfo is not tinfo else drafter_spec},
        sampling=pair,
        alignment=report,
        table=table,
    )


def register(app: typer.Typer) -> None:
    app.command("check")(check)
