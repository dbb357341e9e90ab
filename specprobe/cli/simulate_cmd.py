"""`specprobe simulate TARGET DRAFTER`: real speculative decoding (draft→verify with
rejection sampling) on the same prompts as `diagnose`, measured next to its
teacher-forced estimate, with the SP6xx calibration rules on top."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

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
from specprobe.cli.diagnose_cmd import (
    CostRatioOpt,
    DomainsOpt,
    DrafterArg,
    DraftTempOpt,
    DraftTopKOpt,
    DraftTopPOpt,
    ForceOpt,
    KMaxOpt,
    MaxPromptsOpt,
    MinPOpt,
    NoCacheOpt,
    PromptsOpt,
    ReferenceOpt,
    SeedOpt,
    TargetArg,
    TempOpt,
    TopKOpt,
    TopPOpt,
    VerifyFactorOpt,
    build_config,
    emit,
)


def _f(x: Any, fmt: str = ".2f") -> str:
    return "—" if x is None else format(float(x), fmt)


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}%"


def measured_tables(result: dict[str, Any], console: Console) -> None:
    """The measured K table (with the estimate and gap beside it) and per-position rates."""
    m = result.get("measured") or {}
    rows = m.get("k_table") or []
    if not rows:
        if result.get("scored"):
            console.print("[yellow]nothing was measured (interrupted before the first K finished a batch)[/]")
        return
    t = Table(title="measured by real speculative decoding (τ includes the bonus token)")
    for c in ("K", "τ measured", "τ estimate", "gap est−meas", "accept rate", "tokens/s", "speedup", "drafts", "draft ms/step", "target ms/step"):
        t.add_column(c, justify="right")
    best = max(rows, key=lambda r: r.get("speedup") or -1.0)
    for r in rows:
        mark = " ◀ best" if r is best else ""
        t.add_row(
            str(r["k"]), _f(r.get("tau_tokens")), _f(r.get("tau_estimate")), _f(r.get("tau_gap"), "+.2f"), _pct(r.get("accept_rate")),
            _f(r.get("tokens_per_s"), ".1f"), f"{_f(r.get('speedup'))}×{mark}", str(r.get("num_drafts")),
            _f(r.get("draft_ms_per_step"), ".1f"), _f(r.get("target_ms_per_step"), ".1f"),
        )
    console.print(t)
    d = m.get("depth") or {}
    est = (result.get("depth") or {}).get("cumulative") or []
    if d.get("depth"):
        t = Table(title=f"per draft position at K={d['k']} (depth from 1; vLLM counting)")
        for c in ("position", "accepted", "r_i measured", "a_i measured", "r_i estimate"):
            t.add_column(c, justify="right")
        for i, pos in enumerate(d["depth"]):
            t.add_row(str(pos), str(d["accepted_per_position"][i]), _pct(d["cumulative"][i]), _pct(d["conditional"][i]), _pct(est[i] if i < len(est) else None))
        console.print(t)
    console.print(f"plain target decoding (baseline): {_f(m.get('baseline_tokens_per_s'), '.1f')} tokens/s on the same prompts, device and batch size")
    a = m.get("adaptive")
    if a:
        console.print(
            f"adaptive K≤{a['k_max']}, stop when drafter confidence < {a['threshold']:g}: {_f(a.get('tokens_per_verify'))} tokens per verify, "
            f"mean K {_f(a.get('mean_k'))}, accept rate {_pct(a.get('accept_rate'))}, {_f(a.get('tokens_per_s'), '.1f')} tokens/s, speedup {_f(a.get('speedup'))}× (measured)"
        )
    if m.get("interrupted"):
        console.print("[yellow]interrupted: the measured numbers cover only what ran before Ctrl-C[/]")


@handle_errors
def simulate(
    target: TargetArg = None,
    drafter: DrafterArg = None,
    k: Annotated[str, typer.Option("--k", help="Draft lengths to measure, comma-separated.")] = "1,2,4",
    adaptive_threshold: Annotated[float | None, typer.Option("--adaptive-threshold", help="Also measure adaptive K: stop drafting at the first depth whose drafter confidence max q is below this.")] = None,
    prompts: PromptsOpt = "builtin",
    domains: DomainsOpt = None,
    max_prompts: MaxPromptsOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt (and reference length for the estimate).")] = 64,
    reference: ReferenceOpt = "on-policy",
    temperature: TempOpt = None,
    draft_temperature: DraftTempOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    min_p: MinPOpt = None,
    draft_top_k: DraftTopKOpt = None,
    draft_top_p: DraftTopPOpt = None,
    seed: SeedOpt = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Prompts decoded together; each row advances by its own accepted count.")] = 8,
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
) -> None:
    """Real speculative decoding, measured: τ, acceptance per draft position, tokens/s
    and speedup against plain target decoding for each K — next to diagnose's
    teacher-forced estimate on the same prompts, with the gap between them.

    Examples:
      specprobe simulate smollm2 self:layers=28 --temperature 0.7 --k 1,2,4 --max-prompts 8

      specprobe simulate ./target ./drafter --k 2,4,6 --adaptive-threshold 0.4 --json sim.json --csv sim/
    """
    params = dict(locals())  # every parameter, by name
    from specprobe.progress import RichProgress
    from specprobe.report.console import render
    from specprobe.report.load import gate_exit_code
    from specprobe.rules import load_table
    from specprobe.simulate import SimulateConfig, parse_ks, run_simulate, validate

    # every bad input fails here, before any model is loaded or file written
    dcfg = build_config(params, "simulate", keep_positions=False)
    cfg = SimulateConfig(dcfg, ks=parse_ks(k), adaptive_threshold=adaptive_threshold)
    validate(cfg)
    table = load_table(rules or [])
    from specprobe.diagnose import load_prompt_set

    load_prompt_set(dcfg)  # a bad prompts file fails before the models load
    result = run_simulate(cfg, RichProgress(err), table=table)
    render(result, out)
    measured_tables(result, out)
    emit(result, json_path, csv_dir)
    if result.get("interrupted"):
        raise typer.Exit(130)
    raise typer.Exit(gate_exit_code(result, fail_on))


def register(app: typer.Typer) -> None:
    app.command("simulate")(simulate)

