"""`specprobe check TARGET DRAFTER`: alignment only, in seconds, no forward pass — vocab,
token ids, special tokens, chat template, context length and each side's sampling
settings, from flags, a probe config and the serving configs the engine runs with."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

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

ServingConfigOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--serving-config",
        help="vLLM --speculative-config JSON / vllm serve YAML / SGLang launch config (repeatable): its sampling settings, drafter and K are what the engine runs with.",
        metavar="FILE",
        readable=False,  # read by specprobe: an unreadable file is our one-line error
    ),
]


@takes_settings("check")
@handle_errors
def check(
    ctx: typer.Context,
    config: ConfigOpt = None,
) -> None:
    """Alignment only, in seconds, no forward pass: vocab, token ids, special tokens,
    chat template, normalizer, context length, sampling settings.

    Sampling: a flag typed here wins, then the probe config, then the serving configs
    (what the engine runs with), then the target's generation_config; the drafter shares
    the target's unless a --draft-* setting says otherwise, as the engines do. A
    temperature written differently in two of these places is an error (SP019). A probe
    config's outputs are diagnose's: check writes only where --json says.

    Examples:
      specprobe check smollm2 self:layers=24

      specprobe check ./llama-3-8b ./llama-3.2-1b --temperature 0.7 --draft-temperature 1.0

      specprobe check smollm2 self:layers=28 --serving-config sample_configs/sglang-launch.yaml
    """
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.core.errors import ConfigError
    from specprobe.judge.rules import load_table
    from specprobe.probe.alignment import compare, declared_gaps, effective_sampling
    from specprobe.settings.engines import BY_ENGINE
    from specprobe.settings.options import SAMPLING_SLOT, relabel_sources
    from specprobe.settings.pipeline import SamplingFlags
    from specprobe.settings.serving import Setting, read_serving_config, resolve_sampling

    opts = gather(ctx, "check")
    servings = [read_serving_config(p) for p in opts.serving_config]
    target_spec = opts.target or next((sv.target for sv in servings if sv.target), None)
    drafter_spec = opts.drafter or next((sv.drafter for sv in servings if sv.drafter), None)
    if not target_spec or not drafter_spec:
        raise ConfigError("check needs a TARGET and a DRAFTER", "give them as arguments, or in --config / --serving-config")
    given = {k: Setting(float(getattr(opts, k)), opts.source(k), opts.from_command_line(k)) for k in SAMPLING_SLOT if getattr(opts, k) is not None}
    chosen, declared = resolve_sampling(given, servings)
    explicit: dict[str, Any] = {k: int(s.value) if k.endswith("top_k") else s.value for k, s in chosen.items()}
    flags = SamplingFlags(**explicit, sampling_semantics=opts.sampling_semantics or BY_ENGINE[opts.engine].semantics)
    table = load_table(opts.rules)  # a bad rules file fails before anything loads

    from specprobe.models.drafters import drafter_info, drafter_kind_of
    from specprobe.models.loader import load_info

    tinfo = load_info(target_spec, err.print)
    dinfo = drafter_info(drafter_spec, tinfo, err.print)
    if "head" in dinfo.extra:  # a head: the serving K is checked against its heads / MTP layers
        dinfo.extra["serving_k"] = next((sv.num_speculative_tokens for sv in servings if sv.num_speculative_tokens), None)
    pair = effective_sampling(flags, tinfo.generation_config, None if dinfo is tinfo else dinfo.generation_config, declared=declared)
    pair.sources = relabel_sources(pair.sources, {SAMPLING_SLOT[k]: s.source for k, s in chosen.items()})
    report = compare(tinfo, dinfo, pair)
    kind = drafter_kind_of(drafter_spec)
    result = _result(opts, target_spec, drafter_spec, kind, tinfo, dinfo, flags, pair, report, table)

    from specprobe.report.console import render
    from specprobe.report.load import gate_exit_code

    render(result, out)
    for sv in servings:
        _serving_lines(sv, drafter_spec, opts.drafter is not None)
    for key, gap in declared_gaps(declared).items():
        if gap > 0 and key != "temperature":  # a temperature gap is rule SP019's
            said = ", ".join(f"{name} {vals[key]:g}" for name, vals in declared.items() if key in vals)
            out.print(f"[yellow]note:[/] {key} differs: {said}", highlight=False, soft_wrap=True)
    write_outputs(result, opts, fail_on=opts.fail_on)
    raise typer.Exit(gate_exit_code(result, opts.fail_on))


def _serving_lines(sv: Any, drafter_spec: str, drafter_given: bool) -> None:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.settings.serving import describe_serving

    out.print(f"serving config {describe_serving(sv)}", highlight=False, soft_wrap=True)
    if drafter_given and sv.drafter and sv.drafter != drafter_spec:
        out.print(f"[yellow]note:[/] {sv.source.name} serves drafter {sv.drafter}; this check compared {drafter_spec}", highlight=False, soft_wrap=True)


def _result(opts: Any, target_spec: str, drafter_spec: str, kind: str, tinfo: Any, dinfo: Any, flags: Any, pair: Any, report: Any, table: Any) -> Any:
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.probe.assemble import check_result

    return check_result(
        config={"target": target_spec, "drafter": drafter_spec, **flags.__dict__, "rules": [str(r) for r in opts.rules], "fail_on": opts.fail_on},
        target={"spec": target_spec, "name": tinfo.name},
        drafter={"spec": drafter_spec, "kind": kind, "name": dinfo.name if dinfo is not tinfo else drafter_spec},
        sampling=pair,
        alignment=report,
        table=table,
    )


def register(app: typer.Typer) -> None:
    app.command("check")(check)
