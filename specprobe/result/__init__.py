"""The result of a run, typed: what `check`, `diagnose` and `simulate` return and write
as JSON, and what `compare` makes of two of them. Defined once, here — `base` (numbers,
shared parts), `run` (`Result`), `comparison` (`Comparison`) — and read by every report,
the compare gate and the JSON Schema in docs/result.schema.json
(`python -m specprobe.result > docs/result.schema.json` regenerates it).

Conventions held by the types themselves:
- a number that could not be measured is None (JSON null), never NaN or inf: every
  numeric field goes through `finite`, the one place that turns NaN/inf into None;
- metric names are the catalogue's (specprobe/judge/catalog.py); an unknown name is refused;
- per-depth arrays are indexed from depth 1; τ includes the bonus token.

Versioning: SCHEMA_VERSION is written into every file. `upgrade` turns an older
file's dict into the current layout before validation; add one step per version. A
new section is one optional field (default None) on `Result` — see the marked place.

Imports nothing heavy: `specprobe report` and `compare` must start without torch.
"""

from __future__ import annotations

from typing import Any

from specprobe.result.base import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    Document,
    Evaluation,
    Finding,
    Num,
    Part,
    Record,
    Severity,
    Value,
    finite,
)
from specprobe.result.comparison import (
    CompareConfig,
    Comparison,
    DepthDelta,
    DomainDelta,
    Identity,
    KDelta,
    OverallDelta,
)
from specprobe.result.drill import DrillDown
from specprobe.result.run import (
    NOTHING_SCORED,
    Adaptive,
    Alignment,
    AlignmentFacts,
    BucketRow,
    Cost,
    Depth,
    DomainRow,
    Drafter,
    Environment,
    Histogram,
    Histograms,
    KRow,
    Measured,
    MeasuredAdaptive,
    MeasuredDepth,
    MeasuredRow,
    Positions,
    Procedure,
    PromptSetInfo,
    Result,
    RunConfig,
    SamplingInfo,
    SamplingSide,
    SideFacts,
    Target,
)

__all__ = [
    "NOTHING_SCORED", "READABLE_VERSIONS", "SCHEMA_VERSION", "Adaptive", "Alignment", "AlignmentFacts", "BucketRow", "CompareConfig", "Comparison",
    "Cost", "Depth", "DepthDelta", "Document", "DrillDown", "DomainDelta", "DomainRow", "Drafter", "Environment", "Evaluation", "Finding",
    "Histogram", "Histograms", "Identity", "KDelta", "KRow", "Measured", "MeasuredAdaptive", "MeasuredDepth", "MeasuredRow", "Num",
    "OverallDelta", "Part", "Positions", "Procedure", "PromptSetInfo", "Record", "Result", "RunConfig", "SamplingInfo", "SamplingSide", "Severity",
    "SideFacts", "Target", "Value", "finite", "json_schema", "upgrade",
]


# ----------------------------------------------------------------------------- older files
def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2: the top-level `best_k` copy of metrics.best_k is gone (read the metric);
    comparisons carried their config last and only once judged."""
    out = {k: v for k, v in data.items() if k != "best_k"}
    if out.get("command") == "compare":
        out.setdefault("config", {})
    out["schema_version"] = 2
    return out


# What results written before specprobe followed an engine's procedure measured: every
# draft sampled from q and accepted with Σ min(p, q), whatever their config said.
OLDER_PROCEDURE = {
    "engine": None,
    "engine_label": None,
    "drafting": "probabilistic",
    "acceptance": "Σ min(p, q)",
    "description": "sampled drafts, acceptance = Σ min(p, q) (written before specprobe followed an engine's procedure)",
    "adaptive_knob": None,
}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v2 → v3: the procedure the estimates follow (greedy drafts by default). A v2 file's
    τ and speedups were computed from Σ min(p, q): it is labelled probabilistic, and its
    procedure's mean acceptance is its accept_prob_mean, in the metrics and the tables."""
    out = dict(data)
    out["schema_version"] = 3
    if out.get("command") not in ("diagnose", "simulate"):
        return out
    out["procedure"] = dict(OLDER_PROCEDURE)
    metrics = dict(out.get("metrics") or {})
    if "accept_prob_mean" in metrics:
        metrics.setdefault("accept_prob_engine_mean", metrics["accept_prob_mean"])
    out["metrics"] = metrics
    for table in ("by_domain", "by_category", "by_entropy", "by_position"):
        out[table] = [{**row, "accept_prob_engine_mean": row.get("accept_prob_mean")} if isinstance(row, dict) else row for row in out.get(table) or []]
    return out


_UPGRADES = {1: _v1_to_v2, 2: _v2_to_v3}


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A parsed result dict of any readable version → the current layout (unvalidated)."""
    version = data.get("schema_version")
    while version in _UPGRADES:
        data = _UPGRADES[version](data)
        version = data.get("schema_version")
    return data


def json_schema() -> dict[str, Any]:
    """The JSON Schema of result and comparison files (docs/result.schema.json)."""
    from pydantic.json_schema import models_json_schema

    _, schema = models_json_schema([(Result, "validation"), (Comparison, "validation")], title="specprobe result files")
    schema["description"] = (
        f"Files written by `specprobe check|diagnose|simulate --json` (Result) and `specprobe compare --json` (Comparison), schema_version {SCHEMA_VERSION}. "
        "Numbers that could not be measured are null; metric names are those of `specprobe rules metrics`; depth arrays start at depth 1."
    )
    schema["anyOf"] = [{"$ref": "#/$defs/Result"}, {"$ref": "#/$defs/Comparison"}]
    return schema
