"""The terminal report (rich): verdict first, then findings with remedies, then the
evidence tables. Renders the typed result, so `report` can re-render saved JSON."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from specprobe.report.fmt import EM_DASH, fixed, metric, pct, signed_pct
from specprobe.result import BucketRow, Comparison, DomainRow, Finding, Result, SamplingSide

SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", None: "green"}


def _pct(x: float | None) -> str:
    return pct(x, none=EM_DASH)


def _f(x: float | None, fmt: str = ".3f") -> str:
    return fixed(x, fmt, none=EM_DASH)


def _sampling(x: SamplingSide) -> str:
    if x.temperature <= 0:
        return "greedy"
    return f"T={x.temperature:g}" + (f" top_k={x.top_k}" if x.top_k else "") + (f" top_p={x.top_p:g}" if x.top_p < 1 else "")


def verdict_panel(result: Result) -> Panel:
    sev = result.worst_severity
    m = result.metrics
    lines = [Text(result.verdict.upper(), style=SEV_STYLE.get(sev, "bold"))]
    t, d = result.target, result.drafter
    lines.append(Text(f"target  {t.name or t.spec}   drafter  {d.name or d.spec} [{d.kind or '?'}]"))
    s = result.sampling
    if s is not None:
        lines.append(Text(f"sampling  target {_sampling(s.target)}   drafter {_sampling(s.draft)}"))
    if result.scored:
        ref = result.reference or "on-policy"
        lines.append(Text(
            f"acceptance {_pct(m.get('accept_prob_mean'))}   KL(target‖draft) {_f(m.get('kl_target_draft_nats'))} nats   "
            f"τ {_f(m.get('tau_tokens'), '.2f')} at K={m.get('best_k')}   speedup {_f(m.get('speedup_best'), '.2f')}×   "
            f"({m.get('num_positions')} positions, {m.get('num_prompts')} prompts, {ref} references, teacher-forced estimate)"
        ))
    if result.stopped:
        lines.append(Text(f"stopped: {result.stopped}", style="red"))
    if result.interrupted:
        lines.append(Text("interrupted: these numbers cover only what was scored before Ctrl-C", style="yellow"))
    return Panel(Group(*lines), title=f"specprobe {result.command}", border_style=SEV_STYLE.get(sev, "green"))


def findings_table(result: Result) -> Table:
    t = Table(title="findings", show_lines=True, expand=True)
    t.add_column("sev", no_wrap=True)
    t.add_column("rule", no_wrap=True)
    t.add_column("diagnosis", ratio=3)
    t.add_column("remedy", ratio=2)
    for f in result.findings:
        msg = f.message
        if f.evidence:
            msg += "\n" + "\n".join(f"  · {e}" for e in f.evidence)
        t.add_row(Text(f.severity, style=SEV_STYLE[f.severity]), f"{f.rule_id}\n{f.name}", msg, f.remedy)
    return t


def _group_table(title: str, rows: list[DomainRow] | list[BucketRow]) -> Table:
    t = Table(title=title)
    for c in ("group", "positions", "α accept", "greedy agree", "KL nats", "entropy nats", "draft conf"):
        t.add_column(c, justify="right" if c != "group" else "left")
    for r in rows:
        t.add_row(r.group, str(r.positions), _pct(r.accept_prob_mean), _pct(r.greedy_agree_frac), _f(r.kl_target_draft_nats), _f(r.target_entropy_nats), _pct(r.draft_confidence_mean))
    return t


def depth_k_table(result: Result) -> Table:
    t = Table(title="by draft depth / K (teacher-forced estimate; depth from 1)")
    for c in ("K", "r_K cumulative", "a_K conditional", "τ(K) tokens", "accept rate", "i.i.d. τ", "speedup"):
        t.add_column(c, justify="right")
    cum = result.depth.cumulative if result.depth else []
    cond = result.depth.conditional if result.depth else []
    best = result.best_k
    for i, row in enumerate(result.k_table):
        mark = " ◀ best" if row.k == best else ""
        t.add_row(
            str(row.k), _pct(cum[i] if i < len(cum) else None), _pct(cond[i] if i < len(cond) else None),
            _f(row.tau_tokens, ".2f"), _pct(row.accept_rate), _f(row.iid_tau_tokens, ".2f"), f"{_f(row.speedup, '.2f')}×{mark}",
        )
    return t


def check_facts_table(result: Result) -> Table:
    t = Table(title="alignment")
    t.add_column("")
    t.add_column("target")
    t.add_column("drafter")
    if result.alignment is None:
        return t
    tg, dr = result.alignment.facts.target, result.alignment.facts.drafter
    for key in ("name", "vocab", "tokenizer", "context", "sampling"):
        t.add_row(key, str(getattr(tg, key)), str(getattr(dr, key)))
    return t


def render(result: Result, console: Console, full: bool = True) -> None:
    console.print(verdict_panel(result))
    if result.findings:
        console.print(findings_table(result))
    if result.command == "check" or not result.scored:
        console.print(check_facts_table(result))
        return
    if not full:
        return
    if result.by_domain:
        console.print(_group_table("by domain", result.by_domain))
    if result.categories:
        console.print(_group_table("by the prompt file's category", result.categories))
    if result.by_entropy:
        console.print(_group_table("by target entropy", result.by_entropy))
    if result.by_position:
        console.print(_group_table("by context position (tokens before the predicted one)", result.by_position))
    if result.k_table:
        console.print(depth_k_table(result))
    a, c = result.adaptive, result.cost
    if a:
        console.print(f"adaptive K: stop drafting when drafter confidence < {_f(a.threshold, '.2f')} → τ {_f(a.tau_tokens, '.2f')}, mean K {_f(a.mean_k, '.2f')}, speedup {_f(a.speedup, '.2f')}×")
    if c:
        how = "measured on the device" if c.measured else "given"
        console.print(f"cost ratio c = {_f(c.cost_ratio)} ({how}; target step {_f(c.target_step_ms, '.1f')} ms, drafter step {_f(c.draft_step_ms, '.1f')} ms), verify factor v = {c.verify_factor}")
    console.print("[dim]KL is computed on the untruncated tempered softmax (T=1 when greedy) so it stays finite; α uses each side's sampling distribution.[/]")


# ----------------------------------------------------------------------------- simulate: the measured block
def measured_tables(result: Result, console: Console) -> None:
    """The measured K table (with the estimate and gap beside it) and per-position rates."""
    m = result.measured
    if m is None or not m.k_table:
        if result.scored:
            console.print("[yellow]nothing was measured (interrupted before the first K finished a batch)[/]")
        return
    t = Table(title="measured by real speculative decoding (τ includes the bonus token)")
    for c in ("K", "τ measured", "τ estimate", "gap est−meas", "accept rate", "tokens/s", "speedup", "drafts", "draft ms/step", "target ms/step"):
        t.add_column(c, justify="right")
    best = max(m.k_table, key=lambda r: r.speedup or -1.0)
    for r in m.k_table:
        mark = " ◀ best" if r is best else ""
        t.add_row(
            str(r.k), _f(r.tau_tokens, ".2f"), _f(r.tau_estimate, ".2f"), _f(r.tau_gap, "+.2f"), _pct(r.accept_rate),
            _f(r.tokens_per_s, ".1f"), f"{_f(r.speedup, '.2f')}×{mark}", str(r.num_drafts),
            _f(r.draft_ms_per_step, ".1f"), _f(r.target_ms_per_step, ".1f"),
        )
    console.print(t)
    d = m.depth
    est = result.depth.cumulative if result.depth else []
    if d is not None and d.depth:
        t = Table(title=f"per draft position at K={d.k} (depth from 1; vLLM counting)")
        for c in ("position", "accepted", "r_i measured", "a_i measured", "r_i estimate"):
            t.add_column(c, justify="right")
        for i, pos in enumerate(d.depth):
            t.add_row(str(pos), str(d.accepted_per_position[i]), _pct(d.cumulative[i]), _pct(d.conditional[i]), _pct(est[i] if i < len(est) else None))
        console.print(t)
    console.print(f"plain target decoding (baseline): {_f(m.baseline_tokens_per_s, '.1f')} tokens/s on the same prompts, device and batch size")
    a = m.adaptive
    if a:
        console.print(
            f"adaptive K≤{a.k_max}, stop when drafter confidence < {_f(a.threshold, 'g')}: {_f(a.tokens_per_verify, '.2f')} tokens per verify, "
            f"mean K {_f(a.mean_k, '.2f')}, accept rate {_pct(a.accept_rate)}, {_f(a.tokens_per_s, '.1f')} tokens/s, speedup {_f(a.speedup, '.2f')}× (measured)"
        )
    if m.interrupted:
        console.print("[yellow]interrupted: the measured numbers cover only what ran before Ctrl-C[/]")


# ----------------------------------------------------------------------------- `report`: the short summary
SUMMARY_METRICS = ("accept_prob_mean", "kl_target_draft_nats", "greedy_agree_frac", "accept_prob_domain_min", "tau_tokens", "best_k", "speedup_best", "cost_ratio", "num_prompts", "num_positions")


def _findings_brief(findings: list[Finding], console: Console) -> None:
    t = Table(show_header=True, header_style="bold", expand=False)
    for col in ("rule", "severity", "diagnosis", "remedy"):
        t.add_column(col, overflow="fold")
    for f in findings:
        t.add_row(f"{f.rule_id} {f.name}", f"[{SEV_STYLE.get(f.severity, '')}]{f.severity}[/]", f.message, f.remedy)
    console.print(t)


def render_summary(result: Result, console: Console) -> None:
    """Verdict, findings table and key metrics of a saved diagnose/simulate result."""
    console.print(f"[bold]{result.describe()}[/]  [dim]({result.command}, {result.created})[/]")
    console.print(f"verdict: [{SEV_STYLE.get(result.worst_severity, 'bold')}]{result.verdict}[/]")
    if result.findings:
        _findings_brief(result.findings, console)
    else:
        console.print("[green]no findings[/]")
    m = result.metrics
    t = Table(title="key metrics (estimates from teacher forcing)", show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for n in SUMMARY_METRICS:
        if n in m:
            t.add_row(n, metric(n, m[n], none="n/a"))
    console.print(t)
    mk = result.measured.k_table if result.measured else []
    if mk:
        best = max(mk, key=lambda r: r.speedup or -1.0)
        console.print(f"measured (real draft→verify loop): best K={best.k} τ={best.tau_tokens or 0:.2f} speedup {best.speedup or 0:.2f}×")


# ----------------------------------------------------------------------------- `compare`
def render_comparison(comparison: Comparison, console: Console) -> None:
    """Verdict, findings and the overall deltas of a judged comparison."""
    b, c = comparison.baseline, comparison.candidate
    console.print(f"[bold]{c.drafter}[/] against baseline [bold]{b.drafter}[/] on {c.target_name or c.target}")
    for note in comparison.notes:
        console.print(f"[dim]note: {note}[/]")
    console.print(f"verdict: [{SEV_STYLE.get(comparison.worst_severity, 'bold')}]{comparison.verdict}[/]")
    if comparison.findings:
        _findings_brief(comparison.findings, console)
    t = Table(title="overall", show_header=True, header_style="bold")
    for col, just in (("metric", "left"), ("baseline", "right"), ("candidate", "right"), ("relative", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in comparison.overall:
        rel = r.rel_change
        shown = signed_pct(rel, none="n/a")
        style = "red" if r.worse and rel is not None and abs(rel) >= 0.05 else ""
        t.add_row(r.metric, metric(r.metric, r.baseline, none="n/a"), metric(r.metric, r.candidate, none="n/a"), f"[{style}]{shown}[/]" if style else shown)
    console.print(t)


# ----------------------------------------------------------------------------- `demo`
def demo_table(rows: list[tuple[str, Result]]) -> Table:
    """One line per demo drafter: alignment, α, greedy agreement, KL, τ(4), verdict."""
    t = Table(title="specprobe demo — SmolLM2-135M-Instruct target (teacher-forced, on-policy references)")
    for c in ("drafter", "check", "acceptance α", "greedy agree", "KL nats", "τ(4)", "verdict / diagnosis"):
        t.add_column(c, justify="right" if c not in ("drafter", "verdict / diagnosis", "check") else "left")
    for label, r in rows:
        m = r.metrics
        align_err = [f.rule_id for f in r.findings if f.rule_id.startswith("SP0") and f.severity == "error"]
        check = Text("✗ " + ", ".join(align_err), style="red") if align_err else Text("✓ aligned", style="green")
        k4 = next((row.tau_tokens for row in r.k_table if row.k == 4), None)
        # name the finding that gave the headline
        top = next((f for f in r.findings if f.verdict == r.verdict), r.findings[0] if r.findings else None)
        diag = Text(r.verdict, style=SEV_STYLE.get(r.worst_severity, "green"))
        if top:
            diag.append(f" ({top.rule_id} {top.name})", style="default")
        t.add_row(label, check, _pct(m.get("accept_prob_mean")), _pct(m.get("greedy_agree_frac")), _f(m.get("kl_target_draft_nats"), ".2f"), _f(k4, ".2f"), diag)
    return t
