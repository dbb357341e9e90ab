"""`specprobe check` (alignment only, no forward pass) and `specprobe diagnose`
(teacher-forced acceptance, KL, depth curves, τ(K), speedup, rules)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from specprobe.cli.common import (
    CsvOpt,
    DeviceOpt,
    DtypeOpt,
    FailOnOpt,
    JsonOpt,
    RulesOpt,
    err,
    handle_errors,
    out,
)

TargetArg = Annotated[str | None, typer.Argument(help="Target model: a checkpoint folder, a .gguf file, or 'smollm2' (built-in).")]
DrafterArg = Annotated[str | None, typer.Argument(help="Drafter: a checkpoint folder, a .gguf file, 'smollm2', 'self' or 'self:layers=N'.")]
TempOpt = Annotated[float | None, typer.Option("--temperature", help="Target sampling temperature (0 = greedy). Default: generation_config, else 1.")]
DraftTempOpt = Annotated[float | None, typer.Option("--draft-temperature", help="Drafter temperature. Default: its generation_config, else the target's.")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Target top-k (0 = off).")]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Target top-p (1 = off).")]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help="Target min-p (0 = off).")]
DraftTopKOpt = Annotated[int | None, typer.Option("--draft-top-k", help="Drafter top-k (default: the target's).")]
DraftTopPOpt = Annotated[float | None, typer.Option("--draft-top-p", help="Drafter top-p (default: the target's).")]
PromptsOpt = Annotated[str, typer.Option("--prompts", help="'builtin' or a JSONL file (Spec-Bench/MT-Bench questions, or {prompt, domain} lines).")]
DomainsOpt = Annotated[str | None, typer.Option("--domains", help="Comma-separated domains to keep, e.g. code,math.")]
MaxPromptsOpt = Annotated[int | None, typer.Option("--max-prompts", help="At most this many prompts, taken round-robin across domains.")]
ReferenceOpt = Annotated[str, typer.Option("--reference", help="on-policy (sampled from the target, default) or dataset (responses in the prompts file; off-policy).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for sampling (on-policy references; the simulate loop).")]
KMaxOpt = Annotated[int, typer.Option("--k-max", help="Largest draft length K in the estimated τ(K)/speedup table.")]
VerifyFactorOpt = Annotated[float, typer.Option("--verify-factor", help="Verify-cost factor v (≈1 for a memory-bound target at small batch).")]
CostRatioOpt = Annotated[float | None, typer.Option("--cost-ratio", help="Drafter/target cost per step for the estimate; default: measured on the device.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even when alignment errors make the numbers meaningless.")]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Regenerate on-policy references instead of reusing the disk cache.")]


def sampling_flags(temperature: float | None, draft_temperature: float | None, top_k: int | None, top_p: float | None, min_p: float | None, draft_top_k: int | None, draft_top_p: float | None) -> Any:
    from specprobe.alignment import SamplingFlags
    from specprobe.errors import ConfigError

    for name, v in (("--temperature", temperature), ("--draft-temperature", draft_temperature)):
        if v is not None and v < 0:
            raise ConfigError(f"{name} {v} is negative", "use 0 for greedy or a positive temperature")
    for name, v in (("--top-p", top_p), ("--draft-top-p", draft_top_p)):
        if v is not None and not 0 < v <= 1:
            raise ConfigError(f"{name} {v} is outside (0, 1]", "use e.g. 0.9, or 1 for off")
    for name, v in (("--top-k", top_k), ("--draft-top-k", draft_top_k)):
        if v is not None and v < 0:
            raise ConfigError(f"{name} {v} is negative", "use 0 for off")
    if min_p is not None and not 0 <= min_p < 1:
        raise ConfigError(f"--min-p {min_p} is outside [0, 1)", "use e.g. 0.05, or 0 for off")
    return SamplingFlags(temperature, draft_temperature, top_k, top_p, min_p, draft_top_k, draft_top_p)


def emit(result: dict[str, Any], json_path: Path | None, csv_dir: Path | None) -> None:
    from specprobe.report.files import write_json

    if json_path:
        write_json(json_path, result)
        err.print(f"[dim]wrote {json_path}[/]")
    if csv_dir:
        from specprobe.report.csv_out import write_csv

        write_csv(result, csv_dir)
        err.print(f"[dim]wrote CSV tables into {csv_dir}[/]")


def _conflict_gap(conflicts: list[str]) -> float:
    """Largest temperature gap named in 'temperature differs: a 0.7, b 1' lines."""
    import re

    gap = 0.0
    for line in conflicts:
        if line.startswith("temperature"):
            vals = [float(x) for x in re.findall(r"\s(-?\d+(?:\.\d+)?)(?:,|$)", line)]
            if len(vals) >= 2:
                gap = max(gap, max(vals) - min(vals))
    return gap


def check_outputs(json_path: Path | None, csv_dir: Path | None) -> None:
    from specprobe.report.files import check_writable_dir, check_writable_file

    check_writable_file(json_path, "--json")
    check_writable_dir(csv_dir, "--csv")


@handle_errors
def check(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    temperature: TempOpt = None,
    draft_temperature: DraftTempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    draft_top_k: DraftTopKOpt = None,
    draft_top_p: DraftTopPOpt = None,
    rules: RulesOpt = None,
    fail_on: FailOnOpt = "error",
    json_path: JsonOpt = None,
    serving_config: Annotated[list[Path] | None, typer.Option("--serving-config", help="vLLM --speculative-config JSON / vllm serve YAML / SGLang launch config: read the drafter and sampling settings from it and compare temperatures across files.")] = None,
    config: Annotated[Path | None, typer.Option("--config", help="Probe config file (YAML/TOML); flags override it.")] = None,
) -> None:
    """Alignment only, in seconds, no forward pass: vocab, token ids, special tokens,
    chat template, normalizer, context length, sampling settings.

    Examples:
      specprobe check smollm2 self:layers=24

      specprobe check ./llama-3-8b ./llama-3.2-1b --temperature 0.7 --draft-temperature 1.0
    """
    from specprobe.alignment import compare, effective_sampling
    from specprobe.diagnose import SCHEMA_VERSION, evaluate_rules
    from specprobe.models.drafters import drafter_info, drafter_kind_of
    from specprobe.models.loader import load_info
    from specprobe.report.console import render
    from specprobe.rules import load_table

    conflicts: list[str] = []
    if config or serving_config:
        from specprobe.config import (
            load_probe_config,
            probe_sampling,
            read_serving_config,
            sampling_conflicts,
        )

        pc = load_probe_config(config) if config else None
        serving = [read_serving_config(p) for p in (serving_config or [])] + ([read_serving_config(p) for p in (pc.serving_configs or [])] if pc else [])
        file_vals = pc.explicit() if pc else {}
        target = target or file_vals.get("target") or next((sv.target for sv in serving if sv.target), None)
        drafter = drafter or file_vals.get("drafter") or next((sv.drafter for sv in serving if sv.drafter), None)
        temperature = temperature if temperature is not None else file_vals.get("temperature")
        draft_temperature = draft_temperature if draft_temperature is not None else file_vals.get("draft_temperature")
        top_k = top_k if top_k is not None else file_vals.get("top_k")
        top_p = top_p if top_p is not None else file_vals.get("top_p")
        rules = rules or file_vals.get("rules")
        json_path = json_path or file_vals.get("outputs_json")
        sides: dict[str, Any] = {}
        if pc:
            sides[Path(pc.source or str(config)).name] = probe_sampling(pc)[0]
        for sv in serving:
            if sv.sampling:
                sides[Path(sv.source).name] = sv.sampling
        conflicts = sampling_conflicts(sides)
    if not target or not drafter:
        from specprobe.errors import ConfigError

        raise ConfigError("check needs a TARGET and a DRAFTER", "give them as arguments, or in --config / --serving-config")
    check_outputs(json_path, None)
    flags = sampling_flags(temperature, draft_temperature, top_k, top_p, min_p, draft_top_k, draft_top_p)
    table = load_table(rules or [])
    tinfo = load_info(target, err.print)
    dinfo = drafter_info(drafter, tinfo, err.print)
    pair = effective_sampling(flags, tinfo.generation_config, None if dinfo is tinfo else dinfo.generation_config)
    report = compare(tinfo, dinfo, pair)
    kind = drafter_kind_of(drafter)
    if conflicts:
        # settings written differently in two files: the serving engine will use one of
        # them and the drafter may have been validated with the other
        report.metrics["temperature_abs_diff"] = max(report.metrics["temperature_abs_diff"], _conflict_gap(conflicts))
        report.evidence["temperature_abs_diff"] = conflicts + report.evidence.get("temperature_abs_diff", [])
    findings, evals = evaluate_rules(table, report.metrics, kind, report.evidence, families=("0",))
    from specprobe.diagnose import _verdict_block

    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "command": "check",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {"target": target, "drafter": drafter, **flags.__dict__, "rules": [str(r) for r in rules or []], "fail_on": fail_on},
        "target": {"spec": target, "name": tinfo.name},
        "drafter": {"spec": drafter, "kind": kind, "name": dinfo.name if dinfo is not tinfo else drafter},
        "sampling": {"target": pair.target.to_dict(), "draft": pair.draft.to_dict(), "sources": pair.sources},
        "alignment": {"facts": report.facts, "evidence": report.evidence},
        "metrics": report.metrics,
        "scored": False,
        **_verdict_block(findings, evals),
    }
    if not findings or all(f.severity == "info" for f in findings):
        result["verdict"] = "aligned"
    render(result, out)
    emit(result, json_path, None)
    from specprobe.rules import exit_code_for

    raise typer.Exit(exit_code_for(findings, fail_on))


@handle_errors
def diagnose(
    ctx: typer.Context,
    target: TargetArg = None,
    drafter: DrafterArg = None,
    prompts: PromptsOpt = "builtin",
    domains: DomainsOpt = None,
    max_prompts: MaxPromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Reference continuation length per prompt.")] = 64,
    reference: ReferenceOpt = "on-policy",
    temperature: TempOpt = None,
    draft_temperature: DraftTempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    draft_top_k: DraftTopKOpt = None,
    draft_top_p: DraftTopPOpt = None,
    seed: SeedOpt = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass.")] = 8,
    k_max: KMaxOpt = 8,
    verify_factor: VerifyFactorOpt = 1.0,
    cost_ratio: CostRatioOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    rules: RulesOpt = None,
    fail_on: FailOnOpt = "error",
    json_path: JsonOpt = None,
    csv_dir: CsvOpt = None,
    force: ForceOpt = False,
    no_cache: NoCacheOpt = False,
    brief: Annotated[bool, typer.Option("--brief", help="Verdict and findings only.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="Probe config file (YAML or TOML); flags given on the command line override it.")] = None,
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report.")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML (one testcase per rule evaluated).")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="Write a Markdown summary (for a CI job summary).")] = None,
) -> None:
    """Teacher-forced diagnosis: acceptance α, KL(target‖draft), depth curves, τ(K),
    speedup per K, best K, adaptive-K threshold; by domain, entropy and context position.

    Examples:
      specprobe diagnose smollm2 self:layers=28 --temperature 0.7

      specprobe diagnose ./target ./drafter --prompts spec_bench.jsonl --json out.json --csv out/
    """
    p = {k: v for k, v in locals().items() if k != "ctx"}  # every parameter, by name
    from specprobe.diagnose import run_diagnose
    from specprobe.progress import RichProgress
    from specprobe.report.console import render
    from specprobe.rules import Finding, exit_code_for, load_table

    if config is not None:
        p.update(config_overrides(ctx, config, p))
    cfg = build_config(p, "diagnose")
    from specprobe.report.files import check_writable_file

    for flag in ("html", "junit", "markdown"):
        check_writable_file(p[flag], f"--{flag}")
    table = load_table(p["rules"] or [])
    result = run_diagnose(cfg, RichProgress(err), table=table)
    render(result, out, full=not brief)
    emit(result, p["json_path"], p["csv_dir"])
    if p["html"] or p["junit"] or p["markdown"]:
        from specprobe.cli.report_cmd import write_outputs

        write_outputs(result, html=p["html"], csv=None, junit=p["junit"], markdown=p["markdown"], fail_on=cfg.fail_on)
    findings = [Finding(**{**f, "evidence": tuple(f.get("evidence", ()))}) for f in result["findings"]]
    if result.get("interrupted"):
        raise typer.Exit(130)
    raise typer.Exit(exit_code_for(findings, cfg.fail_on))


_CONFIG_RENAME = {"outputs_json": "json_path", "outputs_csv": "csv_dir", "outputs_html": "html", "outputs_junit": "junit", "outputs_markdown": "markdown"}


def config_overrides(ctx: typer.Context, config: Path, params: dict[str, Any]) -> dict[str, Any]:
    """Values from a probe config file for every parameter NOT given on the command line
    (flags override the file). Keys for other commands (baseline, serving configs) are
    ignored here."""
    from specprobe.config import load_probe_config

    file_vals = load_probe_config(config).explicit()
    if file_vals.get("k") and "k_max" not in file_vals:
        file_vals["k_max"] = max(file_vals["k"])  # τ(K) is tabulated for every K up to the largest
    values: dict[str, Any] = {}
    for key, value in file_vals.items():
        name = _CONFIG_RENAME.get(key, key)
        if name not in params or name == "config":
            continue
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":
            continue
        if name == "domains" and isinstance(value, list):
            value = ",".join(value)
        if name == "rules":
            value = [Path(v) for v in value]
        values[name] = value
    return values


def build_config(p: dict[str, Any], command: str, **extra: Any) -> Any:
    """Validate the shared diagnose/simulate parameters (before any model loads or file
    is written) and build the DiagnoseConfig."""
    from specprobe.diagnose import DiagnoseConfig
    from specprobe.errors import ConfigError

    if not p["target"] or not p["drafter"]:
        also = ", or give them in a --config file" if "config" in p else ""
        raise ConfigError(f"{command} needs a TARGET and a DRAFTER", f"e.g. specprobe {command} smollm2 self:layers=28{also}")
    check_outputs(p["json_path"], p["csv_dir"])
    if p["reference"] not in ("on-policy", "dataset"):
        raise ConfigError(f"--reference {p['reference']!r} is not known", "use on-policy or dataset")
    for name in ("max_new_tokens", "batch_size"):
        if p[name] < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {p[name]} must be at least 1", "use a positive integer")
    if not 1 <= p["k_max"] <= 32:
        raise ConfigError(f"--k-max {p['k_max']} is out of range", "use 1 ≤ K ≤ 32")
    domains = p["domains"]
    return DiagnoseConfig(
        target=p["target"],
        drafter=p["drafter"],
        prompts=p["prompts"],
        domains=[d.strip() for d in domains.split(",") if d.strip()] if domains else None,
        max_prompts=p["max_prompts"],
        max_new_tokens=p["max_new_tokens"],
        reference=p["reference"],
        sampling=sampling_flags(p["temperature"], p["draft_temperature"], p["top_k"], p["top_p"], p["min_p"], p["draft_top_k"], p["draft_top_p"]),
        seed=p["seed"],
        batch_size=p["batch_size"],
        k_max=p["k_max"],
        verify_factor=p["verify_factor"],
        cost_ratio=p["cost_ratio"],
        device=p["device"],
        dtype=p["dtype"],
        rules=[str(r) for r in p["rules"] or []],
        fail_on=p["fail_on"],
        force=p["force"],
        use_cache=not p["no_cache"],
        **extra,
    )


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("diagnose")(diagnose)
