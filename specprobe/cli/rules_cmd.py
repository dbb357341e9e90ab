"""`specprobe rules list | explain | metrics`: the rules table and the metric catalogue."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from specprobe.cli.common import (
    handle_errors,
    out,
    takes_settings,
)
from specprobe.cli.help import App
from specprobe.core.errors import ConfigError
from specprobe.judge.catalog import CATALOG

rules_app = App(help="List and explain the rules table.", no_args_is_help=True)

_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


@rules_app.command("list")
@takes_settings("rules")
@handle_errors
def list_rules(
    rules: list[Path] | None = None,
    family: Annotated[str | None, typer.Option("--family", help="Only one family, by name or by the digit of its ids: 0 alignment, 1 divergence, 2 acceptance, 3 cost, 4 monitoring, 5 regression, 6 calibration.", metavar="FAMILY")] = None,
) -> None:
    """List every rule: id, severity, name, the condition it fires on.

    Example: specprobe rules list --family acceptance"""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.judge.rules import load_table
    from specprobe.report.terminal import Column, Grid

    table = load_table(rules or [])
    fam = None
    if family is not None:
        fam = next((f for f in table.families if family == f.name or (family and f.ids == f"SP{family}")), None)
        if fam is None:
            raise ConfigError(f"--family {family!r} is not a family", f"use one of {', '.join(f.name for f in table.families)} or the digit of its ids (2 for SP2xx)")
    shown = [r for r in table.rules if fam is None or r.family == fam.name]
    sources = ", ".join(Path(s).name for s in table.sources)
    which = f"family {fam.name}{f' ({fam.ids}xx)' if fam.ids else ''}: {len(shown)} of {len(table.rules)} rules" if fam is not None else f"{len(shown)} rules"
    g = Grid(
        [
            Column("id"),
            Column("severity", "sev"),
            Column("name"),
            Column("fires when", fallback="under", order=1, label="when: "),
            Column("drafter kinds", "kinds", fallback="under", order=2, label="kinds: "),
        ],
        title=f"{which} from {sources}",
        caption="SP0xx alignment, 1xx divergence, 2xx acceptance, 3xx cost, 4xx monitoring, 5xx regression, 6xx calibration; "
        "a blank kinds applies to every drafter. 'specprobe rules explain ID' says why each one matters.",
    )
    for r in shown:
        g.add(r.id, Text(r.severity, style=_SEV_STYLE[r.severity]), r.name, r.when, ",".join(r.kinds))
    out.print(g)


@rules_app.command("explain")
@takes_settings("rules")
@handle_errors
def explain(
    rule_id: Annotated[str, typer.Argument(help="Rule id, e.g. SP003.")],
    rules: list[Path] | None = None,
) -> None:
    """Explain one rule: what it detects, why it matters, the condition, the remedy.

    Example: specprobe rules explain SP003"""
    from rich.table import Table

    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.judge.rules import load_table, threshold_text

    table = load_table(rules or [])
    r = table.get(rule_id.upper())
    # label | text, the text wrapping under itself (a hanging indent) at any width
    g = Table.grid(padding=(0, 2))
    g.add_column(style="bold", no_wrap=True)
    g.add_column()
    detects = threshold_text(r.condition)
    g.add_row("Detects", Text(detects if detects == r.when else f"{detects}  (when: {r.when})"))
    g.add_row("Why", Text(r.doc) if r.doc else Text(f"no doc given for this rule ({r.source})", style="dim"))
    g.add_row("Message", Text(r.diagnosis))
    if r.example:
        g.add_row("Example", Text(r.example))
    g.add_row("Remedy", Text(r.remedy))
    g.add_row("Applies to", ", ".join(r.kinds) if r.kinds else "every drafter kind")
    if r.verdict:
        g.add_row("Verdict", Text(r.verdict))
    g.add_row("Metrics", Text("\n".join(f"{name} ({CATALOG[name].unit}): {CATALOG[name].description}" for name in r.metrics)))
    title = Text(f"{r.id} {r.name}", style="bold")
    title.append(" (")
    title.append(r.severity, style=_SEV_STYLE[r.severity])
    title.append(f", {r.family})\n")
    out.print(title)
    out.print(g)
    out.print(f"[dim]defined in {r.source}[/]", highlight=False)


@rules_app.command("metrics")
@handle_errors
def metrics(source: Annotated[str | None, typer.Option("--source", help="check | diagnose | simulate | compare | monitor", metavar="SOURCE")] = None) -> None:
    """The metric catalogue that rule conditions may use.

    Example: specprobe rules metrics --source monitor"""
    # deferred: the command's own work: `specprobe --help` imports every command module and none of this
    from specprobe.report.terminal import Column, Grid

    g = Grid(
        [Column("name"), Column("unit"), Column("better", fallback="drop", order=1), Column("source", fallback="drop", order=2), Column("definition", fallback="under", order=3)],
        title="metric catalogue",
    )
    for m in CATALOG.values():
        if source and m.source != source:
            continue
        better = "higher" if m.higher_is_better else ("lower" if m.higher_is_better is False else "—")
        g.add(m.name, m.unit, better, m.source, m.description)
    if not g.rows:
        raise ConfigError(f"no metrics with source {source!r}", "use check, diagnose, simulate, compare or monitor")
    out.print(g)


def register(app: typer.Typer) -> None:
    app.add_typer(rules_app, name="rules")
