"""Entry point: builds the typer app from the command modules."""

from __future__ import annotations

from specprobe.core.openmp import shorten_spin

shorten_spin()  # before anything loads torch (OpenMP reads it once)

import typer  # noqa: E402

from specprobe import __version__  # noqa: E402
from specprobe.cli.help import App  # noqa: E402

app = App(
    name="specprobe",
    help="Is this speculative-decoding drafter any good for its target model, and why?\n\n"
    "Start with 'specprobe demo', then 'specprobe check TARGET DRAFTER' and 'specprobe diagnose TARGET DRAFTER'.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specprobe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version and exit."),
) -> None:
    """specprobe: speculative-decoding drafter diagnostics."""


# One module per command group; each exposes register(app).
from specprobe.cli import rules_cmd  # noqa: E402

rules_cmd.register(app)
from specprobe.cli import check_cmd, diagnose_cmd  # noqa: E402

check_cmd.register(app)
diagnose_cmd.register(app)
from specprobe.cli import simulate_cmd  # noqa: E402

simulate_cmd.register(app)
from specprobe.cli import demo_cmd  # noqa: E402

demo_cmd.register(app)
from specprobe.cli import compare_cmd, merge_cmd, report_cmd  # noqa: E402

merge_cmd.register(app)

report_cmd.register(app)
compare_cmd.register(app)
from specprobe.cli import monitor_cmd  # noqa: E402

monitor_cmd.register(app)
from specprobe.cli import alerts_cmd  # noqa: E402

alerts_cmd.register(app)
from specprobe.cli import explain_cmd, sweep_cmd  # noqa: E402

explain_cmd.register(app)
sweep_cmd.register(app)
from specprobe.cli import export_cmd  # noqa: E402

export_cmd.register(app)


def run() -> None:
    app()


if __name__ == "__main__":
    run()
