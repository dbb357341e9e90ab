"""`specprobe rules list | explain | metrics`: the rules table and the metric catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from specprobe.catalog import CATALOG
from specprobe.cli.common import RulesOpt, handle_errors, out
from specprobe.errors import ConfigError

rules_app = typer.Typer(help="List and explain the rules table.", no_args_is_help=True)

_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@rules_app.command("list")
@handle_errors
def list_rules(
    rules: RulesOpt = None,
    family: Annotated[str | None, typer.Option("--family", help="Only one family digit: 0 alignment … 6 calibration.")] = None,
) -> None:
    """List every rule: id, severity, condition, name.

    Example: specprobe rules list --family 2"""
    from specprobe.rules import load_table

    table = load_table(rules or [])
    t = Table(title=f"rules ({len(table.rules)}) from {', '.join(Path(s).name for s in table.sources)} — SP0xx alignment, 1xx divergence, 2xx acceptance, 3xx cost, 4xx monitoring, 5xx regression, 6xx calibration", expand=True)
    t.add_column("id", no_wrap=True)
    t.add_column("severity", no_wrap=True)
    t.add_column("name", overflow="fold", ratio=2)
    t.add_column("when", overflow="fold", ratio=3)
    t.add_column("kinds", overflow="fold", ratio=1)
    for r in table.rules:
        if family is not None and r.id[2] != family:
            continue
        t.add_row(r.id, f"[{_SEV_STYLE[r.severity]}]{r.severity}[/]", r.name, r.when, ",".join(r.kinds) or "all")
    out.print(t)


@rules_app.command("explain")
@handle_errors
def explain(
    rule_id: Annotated[str, typer.Argument(help="Rule id, e.g. SP003.")],
    rules: RulesOpt = None,
) -> None:
    """Explain one rule: what it detects, why it matters, the condition, the remedy.

    Example: specprobe rules explain SP003"""
    from specprobe.rules import load_table, threshold_text

    table = load_table(rules or [])
    r = table.get(rule_id.upper())
    out.print(f"[bold]{r.id} {r.name}[/] ([{_SEV_STYLE[r.severity]}]{r.severity}[/], {r.family})")
    out.print(f"\n[bold]Detects[/]   {threshold_text(r.condition)}   [dim](when: {r.when})[/]")
    if r.doc:
        out.print(f"[bold]Why[/]       {r.doc}")
    out.print(f"[bold]Message[/]   {r.diagnosis}")
    if r.example:
        out.print(f"[bold]Example[/]   {r.example}")
    out.print(f"[bold]Remedy[/]    {r.remedy}")
    out.print(f"[bold]Applies to[/] {', '.join(r.kinds) if r.kinds else 'every drafter kind'}")
    if r.verdict:
        out.print(f"[bold]Verdict[/]   {r.verdict}")
    out.print("[bold]Metrics[/]")
    for name in r.metrics:
        m = CATALOG[name]
        out.print(f"  {name} ({m.unit}): {m.description}")
    out.print(f"[dim]defined in {r.source}[/]")


@rules_app.command("metrics")
@handle_errors
def metrics(source: Annotated[str | None, typer.Option("--source", help="check | diagnose | simulate | compare | monitor")] = None) -> None:
    """The metric catalogue that rule conditions may use."""
    t = Table(title="metric catalogue")
    for col in ("name", "unit", "better", "source", "definition"):
        t.add_column(col, overflow="fold")
    for m in CATALOG.values():
        if source and m.source != source:
            continue
        better = "higher" if m.higher_is_better else ("lower" if m.higher_is_better is False else "—")
        t.add_row(m.name, m.unit, better, m.source, m.description)
    if not t.rows:
        raise ConfigError(f"no metrics with source {source!r}", "use check, diagnose, simulate, compare or monitor")
    out.print(t)


def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")
