"""CSV tables of a result, written with pandas for spreadsheets and notebooks.

Files: summary.csv (one row per metric, with unit, target and drafter; flags and
counts as integers), findings.csv, by_domain.csv,
by_entropy.csv, by_position.csv, depth.csv (estimate and, for simulate, measured
columns; depth indexed from 1), k_table.csv, k_positions.csv (each K's per-position
acceptance as an engine counts it, rounds starting where the previous one ended, with
its standard error), positions.csv when the result carries
per-position rows; ngram.csv for an n-gram drafter (its walk overall, by domain and by
category: verify steps, proposal rate, tokens a draft, accepted per token, τ, speedup). For a compare result: summary, findings, overall, by_domain,
by_depth, k_table.

All files are written into a temporary folder beside the destination and moved in at
the end, so an interrupted run never leaves a half-written table behind.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specprobe.core.errors import OutputError
from specprobe.core.files import make_temp_dir
from specprobe.judge.catalog import CATALOG
from specprobe.report.fmt import num
from specprobe.result import Comparison, Finding, Part, Result

if TYPE_CHECKING:
    from specprobe.probe.sweep import SweepReport

def _frame(rows: Sequence[Part]) -> Any:
    import pandas as pd

    return pd.DataFrame([r.model_dump() for r in rows])


def _findings(findings: Sequence[Finding]) -> Any:
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "rule_id": f.rule_id, "name": f.name, "severity": f.severity, "message": f.message,
                "threshold": f.threshold, "remedy": f.remedy,
                "measured": "; ".join(f"{k}={v}" for k, v in f.measured.items()),
                "evidence": " | ".join(f.evidence),
            }
            for f in findings
        ],
        columns=["rule_id", "name", "severity", "message", "threshold", "remedy", "measured", "evidence"],
    )


def _value(name: str, v: Any) -> Any:
    """A metric as its cell: flags and counts as integers (1, not 1.0 — the unit column
    says which is a flag), nothing as empty; the column stays numeric for notebooks."""
    x = num(v)
    if x is None:
        return ""
    unit = CATALOG[name].unit if name in CATALOG else ""
    if unit in ("bool", "count") or (isinstance(v, int) and not isinstance(v, bool)):
        return int(x)
    return format(x, ".6g")


def _summary(result: Result | Comparison) -> Any:
    """One row per metric, each naming the run's target and drafter (and, for compare,
    the baseline drafter), so summaries of many runs concatenate into one table."""
    import pandas as pd

    if isinstance(result, Comparison):
        who = {"target": result.candidate.target, "drafter": result.candidate.drafter, "baseline_drafter": result.baseline.drafter}
    else:
        who = {"target": result.target.spec or result.config.target or "", "drafter": result.drafter.spec or result.config.drafter or ""}
    rows = [
        {**who, "metric": k, "value": _value(k, v), "unit": CATALOG[k].unit if k in CATALOG else "", "source": CATALOG[k].source if k in CATALOG else ""}
        for k, v in result.metrics.items()
    ]
    return pd.DataFrame(rows, columns=[*who, "metric", "value", "unit", "source"])


def tables(result: Result | Comparison) -> dict[str, Any]:
    """name → pandas DataFrame, for every table this result holds."""
    import pandas as pd

    out: dict[str, Any] = {}
    out["summary"] = _summary(result)
    out["findings"] = _findings(result.findings)
    if isinstance(result, Comparison):
        compare_tables: dict[str, Sequence[Part]] = {"overall": result.overall, "by_domain": result.by_domain, "by_depth": result.by_depth, "k_table": result.k_table}
        for key, rows in compare_tables.items():
            if rows:
                out[key] = _frame(rows)
        return out

    result_tables: dict[str, Sequence[Part]] = {"by_domain": result.by_domain, "by_category": result.categories, "by_entropy": result.by_entropy, "by_position": result.by_position, "k_table": result.k_table}
    for key, rows in result_tables.items():
        if rows:
            out[key] = _frame(rows)
    if "k_table" in out:  # per draft position, long form: one row per (K, position)
        out["k_table"] = out["k_table"].drop(columns=["per_position_renewal", "per_position_renewal_se"], errors="ignore")
        per_pos = [{"k": r.k, "position": i, "rate": v, "se": (r.per_position_renewal_se[i - 1] if i - 1 < len(r.per_position_renewal_se) else None)}
                   for r in result.k_table for i, v in enumerate(r.per_position_renewal, start=1)]
        if per_pos:
            out["k_positions"] = pd.DataFrame(per_pos)
    if result.drafter.kind == "ngram" and result.scored:
        out["ngram"] = _ngram_frame(result)
    if result.trees is not None:  # draft trees: the grid, and the run's tree by depth and accepted rank
        if result.trees.grid:
            out["trees"] = _frame(result.trees.grid).drop(columns=["paths"])
        t = result.trees.tree
        if t is not None and t.depth_accept:
            width = max((len(r) for r in t.rank_shares), default=0)
            out["tree_depth"] = pd.DataFrame([{"depth": d, "accepted": a, **{f"rank_{r + 1}_share": (t.rank_shares[d - 1][r] if d - 1 < len(t.rank_shares) and r < len(t.rank_shares[d - 1]) else None) for r in range(width)}}
                                              for d, a in enumerate(t.depth_accept, start=1)])
    meas = result.measured
    if meas and meas.k_table and "k_table" in out:
        m = _frame(meas.k_table).add_prefix("measured_").rename(columns={"measured_k": "k"})
        out["k_table"] = out["k_table"].merge(m, on="k", how="outer")
    d = result.depth
    if d and d.depth:
        depth = pd.DataFrame({"depth": d.depth, "cumulative_estimate": d.cumulative, "conditional_estimate": d.conditional, **_depth_se(d, "estimate")})
        md = meas.depth if meas else None
        if md and md.depth:
            mdf = pd.DataFrame({"depth": md.depth, "cumulative_measured": md.cumulative, "conditional_measured": md.conditional, **_depth_se(md, "measured")})
            depth = depth.merge(mdf, on="depth", how="outer")
        out["depth"] = depth
    if result.positions is not None:
        cols = result.positions.columns()
        if len({len(v) for v in cols.values()}) == 1:
            out["positions"] = pd.DataFrame(cols)
    return out


NGRAM_COLUMNS = ["scope", "group", "verify_steps", "proposal_frac", "draft_tokens_mean", "accept_frac", "tau_tokens", "speedup"]


def _depth_se(d: Any, side: str) -> dict[str, list[Any]]:
    """The depth curve's standard errors and thin flags as columns (none in results
    written before they were kept)."""
    n = len(d.depth)
    out: dict[str, list[Any]] = {}
    if len(d.cumulative_se) == n:
        out[f"cumulative_se_{side}"] = d.cumulative_se
    if len(d.thin) == n:
        out[f"thin_{side}"] = d.thin
    return out


def _ngram_frame(result: Result) -> Any:
    """One row for the whole run (scope 'all', at the best K), then one per domain and per
    category of the prompt file."""
    import pandas as pd

    m = result.metrics
    rows: list[list[Any]] = [["all", "all", sum(r.positions for r in result.by_domain) or None, m.get("ngram_proposal_frac"), m.get("ngram_draft_tokens_mean"), m.get("ngram_accept_frac"), m.get("tau_tokens"), m.get("speedup_best")]]
    for scope, rs in (("domain", result.by_domain), ("category", result.categories)):
        rows += [[scope, r.group, r.positions, r.ngram_proposal_frac, r.ngram_draft_tokens_mean, r.accept_prob_engine_mean, r.tau_tokens, r.speedup] for r in rs]
    return pd.DataFrame(rows, columns=NGRAM_COLUMNS)


def write_csv(result: Result | Comparison, folder: str | Path) -> list[Path]:
    """Write every table as <folder>/<name>.csv; returns the paths written."""
    return write_frames(tables(result), folder)


def write_sweep_csv(report: SweepReport, folder: str | Path) -> list[Path]:
    """`sweep --csv`: sweep.csv, one row per drafter, τ and speedup per K as columns;
    sweep_groups.csv, one row per (group, drafter): τ and speedup at the group's best K."""
    import pandas as pd

    rows = []
    for r in report.rows:
        d = r.model_dump(exclude={"tau_by_k", "speedup_by_k"})
        d.update({f"tau_k{k}": v for k, v in enumerate(r.tau_by_k, 1)})
        d.update({f"speedup_k{k}": v for k, v in enumerate(r.speedup_by_k, 1)})
        d["recommended"] = r.drafter == report.recommended
        rows.append(d)
    frames = {"sweep": pd.DataFrame(rows)}
    if report.by_group:  # sweep_groups.csv: every drafter in every domain and category
        cols = ["scope", "group", "positions", "drafter", "best_k", "tau_tokens", "speedup", "recommended"]
        frames["sweep_groups"] = pd.DataFrame(
            [[g.scope, g.group, g.positions, e.drafter, e.best_k, e.tau_tokens, e.speedup, e.drafter == g.recommended] for g in report.by_group for e in g.drafters], columns=cols,
        )
    return write_frames(frames, folder)


def write_frames(frames: dict[str, Any], folder: str | Path) -> list[Path]:
    """Write each table as <folder>/<name>.csv, all or none; returns the paths written."""
    dest = Path(folder)
    if dest.exists() and not dest.is_dir():
        raise OutputError(f"{dest} exists and is not a folder", "--csv takes a folder to write the tables into")
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = make_temp_dir(parent, dest.name)  # umask-respecting, unlike mkdtemp
    except OSError as e:
        raise OutputError(f"cannot write into {parent}: {e.strerror or e}", "choose a writable folder for --csv") from None
    try:
        for name, df in frames.items():
            # NaN → empty cell, matching JSON null
            df.to_csv(tmp / f"{name}.csv", index=False, float_format="%.6g")
        if not dest.exists():
            os.replace(tmp, dest)
        else:
            dest.mkdir(exist_ok=True)
            for name in frames:
                os.replace(tmp / f"{name}.csv", dest / f"{name}.csv")
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(f"cannot write CSV tables into {dest}: {e.strerror or e}", "choose a writable folder for --csv") from None
    return [dest / f"{name}.csv" for name in frames]

