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

TargetArg = Annotated[str, typer.Argument(help="Target model: a checkpoint folder, a .gguf file, or 'smollm2' (built-in).")]
DrafterArg = Annotated[str, typer.Argument(help="Drafter: a checkpoint folder, a .gguf file, 'smollm2', 'self' or 'self:layers=N'.")]
TempOpt = Annotated[float | None, typer.Option("--temperature", help="Target sampling temperature (0 = greedy). Default: generation_config, else 1.")]
DraftTempOpt = Annotated[float | None, typer.Option("--draft-temperature", help="Drafter temperature. Default: its generation_config, else the target's.")]
TopKOpt = Annotated[int | None, typer.Option("--top-k", help="Target top-k (0 = off).")]
TopPOpt = Annotated[float | None, typer.Option("--top-p", help="Target top-p (1 = off).")]
MinPOpt = Annotated[float | None, typer.Option("--min-p", help="Target min-p (0 = off).")]
DraftTopKOpt = Annotated[int | None, typer.Option("--draft-top-k", help="Drafter top-k (default: the target's).")]
DraftTopPOpt = Annotated[float | None, typer.Option("--draft-top-p", help="Drafter top-p (default: the target's).")]


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


def check_outputs(json_path: Path | None, csv_dir: Path | None) -> None:
    from specprobe.report.files import check_writable_dir, check_writable_file

    check_writable_file(json_path, "--json")
    check_writable_dir(csv_dir, "--csv")


@handle_errors
def check(
    target: TargetArg,
    drafter: DrafterArg,
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

    check_outputs(json_path, None)
    flags = sampling_flags(temperature, draft_temperature, top_k, top_p, min_p, draft_top_k, draft_top_p)
    table = load_table(rules or [])
    tinfo = load_info(target, err.print)
    dinfo = drafter_info(drafter, tinfo, err.print)
    pair = effective_sampling(flags, tinfo.generation_config, None if dinfo is tinfo else dinfo.generation_config)
    report = compare(tinfo, dinfo, pair)
    kind = drafter_kind_of(drafter)
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
    target: TargetArg,
    drafter: DrafterArg,
    prompts: Annotated[str, typer.Option("--prompts", help="'builtin' or a JSONL file (Spec-Bench/MT-Bench questions, or {prompt, domain} lines).")] = "builtin",
    domains: Annotated[str | None, typer.Option("--domains", help="Comma-separated domains to keep, e.g. code,math.")] = None,
    max_prompts: Annotated[int | None, typer.Option("--max-prompts", help="At most this many prompts, taken round-robin across domains.")] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Reference continuation length per prompt.")] = 64,
    reference: Annotated[str, typer.Option("--reference", help="on-policy (sampled from the target, default) or dataset (responses in the prompts file; off-policy).")] = "on-policy",
    temperature: TempOpt = None,
    draft_temperature: DraftTempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    draft_top_k: DraftTopKOpt = None,
    draft_top_p: DraftTopPOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for on-policy sampling.")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Sequences per forward pass.")] = 8,
    k_max: Annotated[int, typer.Option("--k-max", help="Largest draft length K in the τ(K)/speedup table.")] = 8,
    verify_factor: Annotated[float, typer.Option("--verify-factor", help="Verify-cost factor v (≈1 for a memory-bound target at small batch).")] = 1.0,
    cost_ratio: Annotated[float | None, typer.Option("--cost-ratio", help="Drafter/target cost per step; default: measured on the device.")] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    rules: RulesOpt = None,
    fail_on: FailOnOpt = "error",
    json_path: JsonOpt = None,
    csv_dir: CsvOpt = None,
    force: Annotated[bool, typer.Option("--force", help="Score even when alignment errors make the numbers meaningless.")] = False,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Regenerate on-policy references instead of reusing the disk cache.")] = False,
    brief: Annotated[bool, typer.Option("--brief", help="Verdict and findings only.")] = False,
    config: Annotated[Path | None, typer.Option("--config", help="Probe config file (YAML or TOML); flags given on the command line override it.")] = None,
) -> None:
    """Teacher-forced diagnosis: acceptance α, KL(target‖draft), depth curves, τ(K),
    speedup per K, best K, adaptive-K threshold; by domain, entropy and context position.

    Examples:
      specprobe diagnose smollm2 self:layers=28 --temperature 0.7
      specprobe diagnose ./target ./drafter --prompts spec_bench.jsonl --json out.json --csv out/
    """
    from specprobe.diagnose import DiagnoseConfig, run_diagnose
    from specprobe.progress import RichProgress
    from specprobe.report.console import render
    from specprobe.rules import exit_code_for, load_table

    check_outputs(json_path, csv_dir)
    if reference not in ("on-policy", "dataset"):
        from specprobe.errors import ConfigError

        raise ConfigError(f"--reference {reference!r} is not known", "use on-policy or dataset")
    cfg = DiagnoseConfig(
        target=target,
        drafter=drafter,
        prompts=prompts,
        domains=[d.strip() for d in domains.split(",") if d.strip()] if domains else None,
        max_prompts=max_prompts,
        max_new_tokens=max_new_tokens,
        reference=reference,
        sampling=sampling_flags(temperature, draft_temperature, top_k, top_p, min_p, draft_top_k, draft_top_p),
        seed=seed,
        batch_size=batch_size,
        k_max=k_max,
        verify_factor=verify_factor,
        cost_ratio=cost_ratio,
        device=device,
        dtype=dtype,
        rules=[str(r) for r in rules or []],
        fail_on=fail_on,
        force=force,
        use_cache=not no_cache,
    )
    table = load_table(rules or [])
    result = run_diagnose(cfg, RichProgress(err), table=table)
    render(result, out, full=not brief)
    emit(result, json_path, csv_dir)
    from specprobe.rules import Finding

    findings = [Finding(**{**f, "evidence": tuple(f.get("evidence", ()))}) for f in result["findings"]]
    if result.get("interrupted"):
        raise typer.Exit(130)
    raise typer.Exit(exit_code_for(findings, fail_on))


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("diagnose")(diagnose)
