"""CSV tables of a result, written with pandas for spreadsheets and notebooks.

Files: summary.csv (one row per metric, with unit), findings.csv, by_domain.csv,
by_entropy.csv, by_position.csv, depth.csv (estimate and, for simulate, measured
columns; depth indexed from 1), k_table.csv, positions.csv when the result carries
per-position rows. For a compare result: summary, findings, overall, by_domain,
by_depth, k_table.

All files are written into a temporary folder beside the destination and moved in at
the end, so an interrupted run never leaves a half-written table behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specprobe.catalog import CATALOG
from specprobe.errors import OutputError
from specprobe.report.load import measured, rows


def tables(result: Mapping[str, Any]) -> dict[str, Any]:
    """name → pandas DataFrame, for every table this result holds."""
    import pandas as pd

    out: dict[str, Any] = {}
    metrics = result.get("metrics") or {}
    out["summary"] = pd.DataFrame(
        [{"metric": k, "value": v, "unit": CATALOG[k].unit if k in CATALOG else "", "source": CATALOG[k].source if k in CATALOG else ""} for k, v in metrics.items()],
        columns=["metric", "value", "unit", "source"],
    )
    out["findings"] = pd.DataFrame(
        [
            {
                "rule_id": f.get("rule_id"), "name": f.get("name"), "severity": f.get("severity"), "message": f.get("message"),
                "threshold": f.get("threshold"), "remedy": f.get("remedy"),
                "measured": "; ".join(f"{k}={v}" for k, v in (f.get("measured") or {}).items()),
                "evidence": " | ".join(f.get("evidence") or []),
            }
            for f in result.get("findings") or []
        ],
        columns=["rule_id", "name", "severity", "message", "threshold", "remedy", "measured", "evidence"],
    )
    if result.get("command") == "compare":
        for key in ("overall", "by_domain", "by_depth", "k_table"):
            if rows(result, key):
                out[key] = pd.DataFrame(rows(result, key))
        return out

    for key in ("by_domain", "by_entropy", "by_position", "k_table"):
        if rows(result, key):
            out[key] = pd.DataFrame(rows(result, key))
    mk = rows(measured(result), "k_table")
    if mk and "k_table" in out:
        m = pd.DataFrame(mk).add_prefix("measured_").rename(columns={"measured_k": "k"})
        out["k_table"] = out["k_table"].merge(m, on="k", how="outer")
    d = result.get("depth") or {}
    if d.get("depth"):
        depth = pd.DataFrame({"depth": d.get("depth"), "cumulative_estimate": d.get("cumulative"), "conditional_estimate": d.get("conditional")})
        md = measured(result).get("depth") or {}
        if md.get("depth"):
            mdf = pd.DataFrame({"depth": md.get("depth"), "cumulative_measured": md.get("cumulative"), "conditional_measured": md.get("conditional")})
            depth = depth.merge(mdf, on="depth", how="outer")
        out["depth"] = depth
    pos = result.get("positions")
    if isinstance(pos, dict) and pos:
        lengths = {len(v) for v in pos.values() if isinstance(v, list)}
        if len(lengths) == 1:
            out["positions"] = pd.DataFrame({k: v for k, v in pos.items() if isinstance(v, list)})
    return out


def write_csv(result: Mapping[str, Any], folder: str | Path) -> list[Path]:
    """Write every table as <folder>/<name>.csv; returns the paths written."""
    dest = Path(folder)
    if dest.exists() and not dest.is_dir():
        raise OutputError(f"{dest} exists and is not a folder", "--csv takes a folder to write the tables into")
    frames = tables(result)
    parent = dest.parent if str(dest.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=parent))
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

