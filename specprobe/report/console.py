"""The terminal report (rich): verdict first, then findings with remedies, then the
evidence tables. Renders the plain result dict, so `report` can re-render saved JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan", None: "green"}


def _pct(x: Any) -> str:
    return "—" if x is None else f"{100 * float(x):.1f}%"


def _f(x: Any, fmt: str = ".3f") -> str:
    return "—" if x is None else format(float(x), fmt)


def verdict_panel(result: dict[str, Any]) -> Panel:
    sev = result.get("worst_severity")
    m = result.get("metrics", {})
    cmd = result.get("command", "diagnose")
    lines = [Text(result.get("verdict", "?").upper(), style=SEV_STYLE.get(sev, "bold"))]
    t, d = result.get("target", {}), result.get("drafter", {})
    lines.append(Text(f"target  {t.get('name', t.get('spec', '?'))}   drafter  {d.get('name', d.get('spec', '?'))} [{d.get('kind', '?')}]"))
    s = result.get("sampling") or {}
    if s:
        def desc(x: dict[str, Any]) -> str:
            if not x or x.get("temperature", 1) <= 0:
                return "greedy"
            return f"T={x['temperature']:g}" + (f" top_k={x['top_k']}" if x.get("top_k") else "") + (f" top_p={x['top_p']:g}" if x.get("top_p", 1) < 1 else "")
        lines.append(Text(f"sampling  target {desc(s.get('target', {}))}   drafter {desc(s.get('draft', {}))}"))
    if result.get("scored"):
        ref = result.get("reference", "on-policy")
        lines.append(Text(
            f"acceptance {_pct(m.get('accept_prob_mean'))}   KL(target‖draft) {_f(m.get('kl_target_draft_nats'))} nats   "
            f"τ {_f(m.get('tau_tokens'), '.2f')} at K={m.get('best_k')}   speedup {_f(m.get('speedup_best'), '.2f')}×   "
            f"({m.get('num_positions')} positions, {m.get('num_prompts')} prompts, {ref} references, teacher-forced estimate)"
        ))
    if result.get("stopped"):
        lines.append(Text(f"stopped: {result['stopped']}", style="red"))
    if result.get("interrupted"):
        lines.append(Text("interrupted: these numbers cover only what was scored before Ctrl-C", style="yellow"))
    return Panel(Group(*lines), title=f"specprobe {cmd}", border_style=SEV_STYLE.get(sev, "green"))


def findings_table(result: dict[str, Any]) -> Table:
    t = Table(title="findings", show_lines=True, expand=True)
    t.add_column("sev", no_wrap=True)
    t.add_column("rule", no_wrap=True)
    t.add_column("diagnosis", ratio=3)
    t.add_column("remedy", ratio=2)
    for f in result.get("findings", []):
        msg = f["message"]
        if f.get("evidence"):
            msg += "\n" + "\n".join(f"  · {e}" for e in f["evidence"])
        t.add_row(Text(f["severity"], style=SEV_STYLE[f["severity"]]), f"{f['rule_id']}\n{f['name']}", msg, f["remedy"])
    return t


def _group_table(title: str, rows: list[dict[str, Any]]) -> Table:
    t = Table(title=title)
    for c in ("group", "positions", "α accept", "greedy agree", "KL nats", "entropy nats", "draft conf"):
        t.add_column(c, justify="right" if c != "group" else "left")
    for r in rows:
        t.add_row(str(r["group"]), str(r["positions"]), _pct(r.get("accept_prob_mean")), _pct(r.get("greedy_agree_frac")), _f(r.get("kl_target_draft_nats")), _f(r.get("target_entropy_nats")), _pct(r.get("draft_confidence_mean")))
    return t


def depth_k_table(result: dict[str, Any]) -> Table:
    t = Table(title="by draft depth / K (teacher-forced estimate; depth from 1)")
    for c in ("K", "r_K cumulative", "a_K conditional", "τ(K) tokens", "accept rate", "i.i.d. τ", "speedup"):
        t.add_column(c, justify="right")
    depth = result.get("depth") or {}
    cum, cond = depth.get("cumulative", []), depth.get("conditional", [])
    best = result.get("best_k")
    for i, row in enumerate(result.get("k_table", [])):
        mark = " ◀ best" if row["k"] == best else ""
        t.add_row(
            str(row["k"]), _pct(cum[i] if i < len(cum) else None), _pct(cond[i] if i < len(cond) else None),
            _f(row["tau_tokens"], ".2f"), _pct(row["accept_rate"]), _f(row["iid_tau_tokens"], ".2f"), f"{_f(row['speedup'], '.2f')}×{mark}",
        )
    return t


def check_facts_table(result: dict[str, Any]) -> Table:
    facts = (result.get("alignment") or {}).get("facts", {})
    t = Table(title="alignment")
    t.add_column("")
    t.add_column("target")
    t.add_column("drafter")
    tg, dr = facts.get("target", {}), facts.get("drafter", {})
    for key in ("name", "vocab", "tokenizer", "context", "sampling"):
        t.add_row(key, str(tg.get(key)), str(dr.get(key)))
    return t


def render(result: dict[str, Any], console: Console, full: bool = True) -> None:
    console.print(verdict_panel(result))
    if result.get("findings"):
        console.print(findings_table(result))
    if result.get("command") == "check" or not result.get("scored"):
        console.print(check_facts_table(result))
        return
    if not full:
        return
    if result.get("by_domain"):
        console.print(_group_table("by domain", result["by_domain"]))
    if result.get("by_entropy"):
        console.print(_group_table("by target entropy", result["by_entropy"]))
    if result.get("by_position"):
        console.print(_group_table("by context position (tokens before the predicted one)", result["by_position"]))
    if result.get("k_table"):
        console.print(depth_k_table(result))
    a, c = result.get("adaptive"), result.get("cost") or {}
    if a:
        console.print(f"adaptive K: stop drafting when drafter confidence < {a['threshold']:.2f} → τ {a['tau_tokens']:.2f}, mean K {a['mean_k']:.2f}, speedup {a['speedup']:.2f}×")
    if c:
        how = "measured on the device" if c.get("measured") else "given"
        console.print(f"cost ratio c = {_f(c.get('cost_ratio'))} ({how}; target step {_f(c.get('target_step_ms'), '.1f')} ms, drafter step {_f(c.get('draft_step_ms'), '.1f')} ms), verify factor v = {c.get('verify_factor')}")
    console.print("[dim]KL is computed on the untruncated tempered softmax (T=1 when greedy) so it stays finite; α uses each side's sampling distribution.[/]")
