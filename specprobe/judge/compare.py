"""The regression gate: compare a candidate drafter's result against a baseline's.

`compare_results` turns two saved results into deltas (overall, per domain, per draft
depth, per K) and a flat dict of compare metrics (catalogue source "compare"); τ and
speedup are compared at one fixed K — the baseline's best K, or the K the caller serves —
never at each side's own best K, which a noisy cost timing can move; the SP5xx rules
in the rules table judge those metrics, so what counts as a regression is data, not
code. Pure functions over the typed results: no torch, nothing printed.

Every compared figure that a result carries a standard error for (τ, the acceptance
rate and the speedup at each K; the depth curve) keeps it, and each change carries the
standard error of the difference, sqrt(se_b² + se_c²): the two runs are taken as
independent. They ran on the same prompts, so their errors are positively correlated
and this overstates the noise: a change called beyond noise is beyond it. τ's gate
(SP505) holds back a drop within two standard errors (`tau_change_within_noise`; SP506
says so instead); results written before standard errors were kept judge as before.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from specprobe import __version__
from specprobe.core.errors import InputError
from specprobe.judge.catalog import CATALOG
from specprobe.judge.rules import Chain, Num, RuleTable, Var, worst_severity
from specprobe.report.fmt import NOISE_Z, k_change_lines, num, pct, signed_pct
from specprobe.result import Result
from specprobe.result import comparison as deltas  # the comparison's types: deltas.KDelta, …

# Overall metrics shown in the delta table, in reading order.
OVERALL_METRICS = (
    "accept_prob_mean",
    "greedy_agree_frac",
    "kl_target_draft_nats",
    "tv_mean",
    "accept_prob_domain_min",
    "accept_prob_high_entropy",
    "cond_accept_depth_decay",
    "tau_tokens",
    "best_k",
    "speedup_best",
    "cost_ratio",
)


def _rel(base: float | None, cand: float | None) -> float | None:
    if base is None or cand is None or base == 0:
        return None
    return (cand - base) / abs(base)


def _delta(base: float | None, cand: float | None) -> float | None:
    return None if base is None or cand is None else cand - base


def change_noise(base: float | None, base_se: float | None, cand: float | None, cand_se: float | None) -> tuple[float | None, float | None]:
    """(standard error of cand − base, the change in standard errors z): the runs taken as
    independent, se = sqrt(se_b² + se_c²). (None, None) when a side has no standard error;
    z is None where the standard error is 0 (nothing to scale by)."""
    if base is None or cand is None or base_se is None or cand_se is None:
        return None, None
    se = math.hypot(base_se, cand_se)
    return se, ((cand - base) / se if se > 0 else (0.0 if cand == base else None))


def _rel_se(base: float | None, diff_se: float | None) -> float | None:
    """Standard error of a relative change: the difference's over |baseline|, so that the
    relative change ÷ its standard error is the difference's z."""
    return None if diff_se is None or base is None or base == 0 else diff_se / abs(base)


def rel_change_noise(base: float | None, base_se: float | None, cand: float | None, cand_se: float | None) -> tuple[float | None, float | None, float | None]:
    """(relative change, its standard error, the change in standard errors z)."""
    se, z = change_noise(base, base_se, cand, cand_se)
    return _rel(base, cand), _rel_se(base, se), z


def overall_se(result: Result, name: str) -> float | None:
    """A headline metric's standard error over prompts, where the result carries one: τ
    and the speedup at the best K, from that K's row. α's mean carries none."""
    row = next((r for r in result.k_table if r.k == result.best_k), None)
    if row is None:
        return None
    if name == "tau_tokens":
        return row.tau_renewal_se if row.tau_renewal_tokens is not None else None
    if name == "speedup_best":
        return row.speedup_se
    return None


def identity(result: Result) -> deltas.Identity:
    cfg = result.config
    return deltas.Identity(
        command=result.command,
        created=result.created,
        target=result.target.spec or cfg.target,
        target_name=result.target.name,
        drafter=result.drafter.spec or cfg.drafter,
        drafter_kind=result.drafter.kind,
        prompt_set=result.prompt_set.name if result.prompt_set else cfg.prompts,
        prompt_sha256=result.prompt_set.sha256 if result.prompt_set else None,
        temperature=cfg.temperature,
        draft_temperature=cfg.draft_temperature,
        reference=result.reference,
        verdict=result.verdict,
        describe=result.describe(),
    )


def check_comparable(
    baseline: Result,
    candidate: Result,
    *,
    allow_target_change: bool = False,
    allow_prompt_change: bool = False,
    allow_procedure_change: bool = False,
) -> list[str]:
    """Refuse pairs that cannot be compared; return notes about differences allowed."""
    b, c = identity(baseline), identity(candidate)
    notes: list[str] = []
    b_target = b.target_name or b.target
    c_target = c.target_name or c.target
    if b_target != c_target:
        if not allow_target_change:
            raise InputError(
                f"the baseline was measured on target {b_target!r}, the candidate on {c_target!r}",
                "acceptance is only comparable on one target; pass --allow-target-change to compare anyway",
            )
        notes.append(f"target changed: {b_target} → {c_target} (allowed by --allow-target-change)")
    b_ps, c_ps = b.prompt_sha256, c.prompt_sha256
    if b_ps != c_ps or b.prompt_set != c.prompt_set:
        if not allow_prompt_change:
            raise InputError(
                f"the baseline used prompt set {b.prompt_set!r} ({str(b_ps)[:12]}), the candidate {c.prompt_set!r} ({str(c_ps)[:12]})",
                "re-run both on the same prompts, or pass --allow-prompt-change",
            )
        notes.append(f"prompt set changed: {b.prompt_set} ({str(b_ps)[:12]}) → {c.prompt_set} ({str(c_ps)[:12]}) (allowed by --allow-prompt-change)")
    notes += _procedures_comparable(baseline, candidate, allow_procedure_change)
    if b.temperature != c.temperature:
        notes.append(f"target temperature differs: {b.temperature} → {c.temperature}; acceptance depends on it")
    if b.reference != c.reference:
        notes.append(f"reference trajectories differ: {b.reference} → {c.reference}")
    if b.drafter == c.drafter:
        notes.append("baseline and candidate name the same drafter spec")
    return notes


def _procedure(result: Result) -> tuple[str, str, str]:
    """(engine label, drafting, the procedure in words): results written before specprobe
    followed an engine were scored with sampled drafts."""
    p = result.procedure
    if p is None:
        return ("—", "probabilistic", "sampled drafts, acceptance = Σ min(p, q) (written before specprobe followed an engine)")
    return (p.engine_label or p.engine or "—", p.drafting, p.description)


def _procedures_comparable(baseline: Result, candidate: Result, allow: bool) -> list[str]:
    """Acceptance, τ and speedup follow the procedure: greedy drafts against sampled ones
    are two acceptance laws, refused unless allowed; another engine with the same drafting
    (or another early stop or threshold) is noted."""
    (be, bd, bw), (ce, cd, cw) = _procedure(baseline), _procedure(candidate)
    if bd != cd:
        if not allow:
            raise InputError(
                f"the baseline's acceptance follows {bd} drafting ({bw}), the candidate's {cd} ({cw})",
                "re-run one with the other's --engine and --draft-sampling, or pass --allow-procedure-change",
            )
        return [f"drafting changed: {bd} → {cd} (allowed by --allow-procedure-change); acceptance and τ follow it"]
    if bw != cw:
        return [f"procedure differs: {be}: {bw} → {ce}: {cw}"]
    return []


def _depth_curve(result: Result, prefer_measured: bool) -> tuple[list[float | None], list[float | None], Literal["estimate", "measured"]]:
    """(cumulative, conditional, source); measured when asked and present."""
    m = result.measured.depth if result.measured else None
    if prefer_measured and m is not None and m.cumulative:
        return list(m.cumulative), list(m.conditional), "measured"
    d = result.depth
    if d is None:
        return [], [], "estimate"
    return list(d.cumulative), list(d.conditional), d.source


def kl_band_edges(table: RuleTable | None) -> list[float]:
    """Band boundaries on KL: the constants KL is compared with in the SP1xx rules.

    Taken from the loaded table so that a team that moves the bands with --rules gets
    a regression rule that follows them."""
    edges: set[float] = set()
    for rule in table.family("divergence") if table else ():
        stack = [rule.condition]
        while stack:
            node = stack.pop()
            if isinstance(node, Chain):
                names = {o.name for o in node.operands if isinstance(o, Var)}
                if names == {"kl_target_draft_nats"}:
                    edges.update(o.value for o in node.operands if isinstance(o, Num))
            elif hasattr(node, "args"):
                stack.extend(node.args)
    return sorted(edges) or [0.5, 1.0, 4.0]


def _band(value: float, edges: Sequence[float]) -> int:
    return sum(1 for e in edges if value >= e)


def compare_results(
    baseline: Result,
    candidate: Result,
    *,
    table: RuleTable | None = None,
    allow_target_change: bool = False,
    allow_prompt_change: bool = False,
    allow_procedure_change: bool = False,
    files: tuple[str, str] | None = None,
    ks: Sequence[int] | None = None,
) -> deltas.Comparison:
    """Deltas and compare metrics (no rules applied; see `judge`). `files` names the
    two result files in the comparison's config; `ks`: the draft lengths to compare τ and
    speedup at (default: the baseline's best K)."""
    notes = check_comparable(baseline, candidate, allow_target_change=allow_target_change, allow_prompt_change=allow_prompt_change, allow_procedure_change=allow_procedure_change)
    bm, cm = baseline.metrics, candidate.metrics

    overall = []
    for name in OVERALL_METRICS:
        b, c = bm.get(name), cm.get(name)
        if b is None and c is None:
            continue
        hib = CATALOG[name].higher_is_better if name in CATALOG else None
        d = _delta(num(b), num(c))
        worse = None if d is None or hib is None else (d < 0 if hib else d > 0)
        b_se, c_se = overall_se(baseline, name), overall_se(candidate, name)
        d_se, z = change_noise(num(b), b_se, num(c), c_se)
        overall.append(deltas.OverallDelta(
            metric=name, baseline=b, candidate=c, delta=d, rel_change=_rel(num(b), num(c)), higher_is_better=hib, worse=worse,
            baseline_se=b_se, candidate_se=c_se, delta_se=d_se, delta_z=z, rel_change_se=_rel_se(num(b), d_se),
        ))

    b_dom = {r.group: r for r in baseline.by_domain}
    c_dom = {r.group: r for r in candidate.by_domain}
    by_domain = []
    for g in list(b_dom) + [g for g in c_dom if g not in b_dom]:
        bd, cd = b_dom.get(g), c_dom.get(g)
        b_a = bd.accept_prob_mean if bd else None
        c_a = cd.accept_prob_mean if cd else None
        by_domain.append(deltas.DomainDelta(
            group=g,
            baseline=b_a,
            candidate=c_a,
            delta=_delta(b_a, c_a),
            rel_change=_rel(b_a, c_a),
            kl_baseline=bd.kl_target_draft_nats if bd else None,
            kl_candidate=cd.kl_target_draft_nats if cd else None,
            positions_baseline=bd.positions if bd else None,
            positions_candidate=cd.positions if cd else None,
        ))

    # Compare like with like: measured curves only when both sides have them.
    both_measured = all(r.measured is not None and r.measured.depth is not None for r in (baseline, candidate))
    b_cum, b_cond, src = _depth_curve(baseline, both_measured)
    c_cum, c_cond, _ = _depth_curve(candidate, both_measured)
    b_dse, b_thin = _depth_noise(baseline, both_measured)
    c_dse, c_thin = _depth_noise(candidate, both_measured)

    def at(xs: Sequence[Any], j: int) -> Any:
        return xs[j] if j < len(xs) else None

    by_depth = [
        deltas.DepthDelta(
            depth=j + 1,
            cumulative_baseline=at(b_cum, j),
            cumulative_candidate=at(c_cum, j),
            conditional_baseline=at(b_cond, j),
            conditional_candidate=at(c_cond, j),
            delta_conditional=_delta(at(b_cond, j), at(c_cond, j)),
            rel_change_cumulative=_rel(at(b_cum, j), at(c_cum, j)),
            cumulative_baseline_se=at(b_dse, j),
            cumulative_candidate_se=at(c_dse, j),
            thin_baseline=at(b_thin, j),
            thin_candidate=at(c_thin, j),
        )
        for j in range(max(len(b_cum), len(c_cum)))
    ]

    b_k = {r.k: r for r in baseline.k_table}
    c_k = {r.k: r for r in candidate.k_table}
    k_table = []
    for k in sorted(set(b_k) | set(c_k)):
        bk, ck = b_k.get(k), c_k.get(k)
        k_table.append(deltas.KDelta(
            k=k,
            tau_baseline=_tau(bk),
            tau_candidate=_tau(ck),
            speedup_baseline=bk.speedup if bk else None,
            speedup_candidate=ck.speedup if ck else None,
            tau_baseline_se=_tau_se(bk),
            tau_candidate_se=_tau_se(ck),
            speedup_baseline_se=bk.speedup_se if bk else None,
            speedup_candidate_se=ck.speedup_se if ck else None,
            accept_rate_baseline=_rate(bk),
            accept_rate_candidate=_rate(ck),
            accept_rate_baseline_se=_rate_se(bk),
            accept_rate_candidate_se=_rate_se(ck),
        ))

    compare_ks = list(ks) if ks else ([baseline.best_k] if baseline.best_k is not None else [])
    metrics = {**compare_metrics(bm, cm, by_domain, by_depth, kl_band_edges(table)), **fixed_k_metrics(k_table, compare_ks)}
    return deltas.Comparison(
        specprobe_version=__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        config=deltas.CompareConfig(
            baseline=files[0] if files else None,
            candidate=files[1] if files else None,
            allow_target_change=allow_target_change,
            allow_prompt_change=allow_prompt_change,
            allow_procedure_change=allow_procedure_change,
            k=compare_ks or None,
        ),
        baseline=identity(baseline),
        candidate=identity(candidate),
        notes=notes,
        metrics=metrics,
        overall=overall,
        by_domain=by_domain,
        by_depth=by_depth,
        depth_source=src,
        k_table=k_table,
    )


def _depth_noise(result: Result, prefer_measured: bool) -> tuple[list[float | None], list[bool]]:
    """(standard error of each cumulative r_j, the depths too thin to read) of the curve
    `_depth_curve` compares; empty where the result carries none."""
    m = result.measured.depth if result.measured else None
    d = m if prefer_measured and m is not None and m.cumulative else result.depth
    return (list(d.cumulative_se), list(d.thin)) if d is not None else ([], [])


def _tau(row: Any) -> float | None:
    """A K row's headline τ: the renewal estimate when the result has it, else the window."""
    if row is None:
        return None
    renewal = getattr(row, "tau_renewal_tokens", None)
    return renewal if renewal is not None else row.tau_tokens


def _tau_se(row: Any) -> float | None:
    """The standard error of `_tau(row)`: the renewal estimate's (the window's has none)."""
    return row.tau_renewal_se if row is not None and row.tau_renewal_tokens is not None else None


def _rate(row: Any) -> float | None:
    """A K row's acceptance (accepted ÷ drafted): the renewal estimate's, else the window's."""
    if row is None:
        return None
    return row.accept_rate_renewal if row.accept_rate_renewal is not None else row.accept_rate


def _rate_se(row: Any) -> float | None:
    return row.accept_rate_renewal_se if row is not None and row.accept_rate_renewal is not None else None


def fixed_k_metrics(k_table: Sequence[deltas.KDelta], ks: Sequence[int]) -> dict[str, Any]:
    """τ and speedup compared at fixed draft lengths: at the K (of `ks`) where τ fell most.
    Neither side's cost timing can move the K compared, so it cannot flip the τ gate."""
    rows = {r.k: r for r in k_table}
    cands = []
    for k in ks:
        r = rows.get(k)
        if r is not None and (rel := _rel(r.tau_baseline, r.tau_candidate)) is not None:
            cands.append((rel, k, r))
    if not cands:
        none = dict.fromkeys(("tau_tokens_rel_change", "tau_rel_drop_frac", "tau_tokens_rel_change_se", "tau_tokens_change_z", "tau_change_within_noise", "accept_rate_rel_change",
                              "accept_rate_rel_change_se", "accept_rate_change_z", "speedup_rel_change", "speedup_rel_change_se", "speedup_change_z"))
        return {"compare_k": ks[0] if ks else None, **none}
    rel, k, r = min(cands, key=lambda x: (x[0], x[1]))
    tau_se, tau_z = change_noise(r.tau_baseline, r.tau_baseline_se, r.tau_candidate, r.tau_candidate_se)
    rate_se, rate_z = change_noise(r.accept_rate_baseline, r.accept_rate_baseline_se, r.accept_rate_candidate, r.accept_rate_candidate_se)
    sp_se, sp_z = change_noise(r.speedup_baseline, r.speedup_baseline_se, r.speedup_candidate, r.speedup_candidate_se)
    return {
        "compare_k": k,
        "tau_tokens_rel_change": rel,
        "tau_rel_drop_frac": max(0.0, -rel),
        "tau_tokens_rel_change_se": _rel_se(r.tau_baseline, tau_se),
        "tau_tokens_change_z": tau_z,
        # A positive claim needs a standard error: without one (older results) the drop is
        # not shown to be noise, and the threshold alone judges it, as before.
        "tau_change_within_noise": 1 if tau_z is not None and abs(tau_z) <= NOISE_Z else 0,
        "accept_rate_rel_change": _rel(r.accept_rate_baseline, r.accept_rate_candidate),
        "accept_rate_rel_change_se": _rel_se(r.accept_rate_baseline, rate_se),
        "accept_rate_change_z": rate_z,
        "speedup_rel_change": _rel(r.speedup_baseline, r.speedup_candidate),
        "speedup_rel_change_se": _rel_se(r.speedup_baseline, sp_se),
        "speedup_change_z": sp_z,
    }


def compare_metrics(
    bm: Mapping[str, Any],
    cm: Mapping[str, Any],
    by_domain: Sequence[deltas.DomainDelta],
    by_depth: Sequence[deltas.DepthDelta],
    kl_edges: Sequence[float],
) -> dict[str, Any]:
    """The flat compare metrics the SP5xx rules read (None when not measurable)."""
    b_a, c_a = num(bm.get("accept_prob_mean")), num(cm.get("accept_prob_mean"))
    rel = _rel(b_a, c_a)
    out: dict[str, Any] = {
        "accept_prob_mean_baseline": b_a,
        "accept_prob_mean_candidate": c_a,
        "overall_accept_prob_rel_change": rel,
        "accept_prob_rel_drop_frac": None if rel is None else max(0.0, -rel),
        "speedup_best_rel_change": _rel(num(bm.get("speedup_best")), num(cm.get("speedup_best"))),
    }

    paired = [d for d in by_domain if d.baseline is not None and d.candidate is not None]
    out["domain_accept_prob_min_baseline"] = min((b for d in paired if (b := d.baseline) is not None), default=None)
    out["domain_accept_prob_min_candidate"] = min((c for d in paired if (c := d.candidate) is not None), default=None)
    # The domain that lost most (relative): "did one domain fall while the mean held?"
    worst = min(paired, key=lambda d: d.rel_change if d.rel_change is not None else 0.0, default=None)
    out["domain_worst_accept_prob_baseline"] = worst.baseline if worst else None
    out["domain_worst_accept_prob_candidate"] = worst.candidate if worst else None
    out["domain_worst_rel_drop_frac"] = max(0.0, -(worst.rel_change or 0.0)) if worst else None

    # Depth decay: conditional acceptance at the deepest depth both curves reach, over
    # depth 1. The level can move with the drafter; the *shape* says whether deeper
    # drafts compound errors faster.
    pairs: list[tuple[int, float, float]] = [
        (d.depth, b, c) for d in by_depth if (b := d.conditional_baseline) is not None and (c := d.conditional_candidate) is not None
    ]
    b_decay = c_decay = None
    if len(pairs) >= 2 and pairs[0][1] and pairs[0][2]:
        b_decay = pairs[-1][1] / pairs[0][1]
        c_decay = pairs[-1][2] / pairs[0][2]
    out["cond_accept_decay_baseline"] = b_decay
    out["cond_accept_decay_candidate"] = c_decay
    out["depth_decay_excess"] = None if b_decay is None or c_decay is None else b_decay - c_decay
    out["depth_compared"] = pairs[-1][0] if pairs else None

    b_kl, c_kl = num(bm.get("kl_target_draft_nats")), num(cm.get("kl_target_draft_nats"))
    out["kl_target_draft_nats_baseline"] = b_kl
    out["kl_target_draft_nats_candidate"] = c_kl
    if b_kl is None or c_kl is None:
        out["kl_band_worsened"] = None
        out["kl_band_boundary_crossed_nats"] = None
    else:
        worsened = _band(c_kl, kl_edges) > _band(b_kl, kl_edges)
        crossed = [e for e in kl_edges if b_kl < e <= c_kl]
        out["kl_band_worsened"] = 1 if worsened else 0
        out["kl_band_boundary_crossed_nats"] = max(crossed) if crossed else None
    return out


def _evidence(comparison: deltas.Comparison) -> dict[str, list[str]]:
    """Lines that point at the rows behind each compare metric."""
    dom_lines = [
        f"{d.group}: {pct(d.baseline, none='n/a')} → {pct(d.candidate, none='n/a')} ({signed_pct(d.rel_change, none='n/a')} relative)"
        for d in sorted(comparison.by_domain, key=lambda d: d.rel_change if d.rel_change is not None else 0.0)
        if d.baseline is not None and d.candidate is not None
    ][:3]
    depth_lines = [
        f"depth {d.depth}: conditional {pct(d.conditional_baseline, none='n/a')} → {pct(d.conditional_candidate, none='n/a')}"
        for d in comparison.by_depth
        if d.conditional_baseline is not None and d.conditional_candidate is not None
    ]
    depth_lines = depth_lines[:1] + depth_lines[-1:] if len(depth_lines) > 1 else depth_lines
    tau_lines = k_change_lines(comparison)[:1]
    return {
        "domain_worst_accept_prob_candidate": dom_lines,
        "depth_decay_excess": depth_lines,
        "tau_rel_drop_frac": tau_lines,
    }


def judge(comparison: deltas.Comparison, table: RuleTable, *, fail_on: str = "error") -> deltas.Comparison:
    """Apply the SP5xx rules to a comparison -> the comparison with findings, evaluations
    and verdict filled in."""
    findings, evals = table.evaluate(comparison.metrics, families=["regression"], evidence=_evidence(comparison))
    return comparison.model_copy(update={
        "findings": findings,
        "evaluations": evals,
        "verdict": table.verdict(findings, default="no regression"),
        "worst_severity": worst_severity(findings),
        "config": comparison.config.model_copy(update={"fail_on": fail_on, "rules": list(table.sources)}),
    })
