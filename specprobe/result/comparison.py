"""What `compare` makes of two results: who each side is, the deltas, the verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from specprobe.result.base import (
    SCHEMA_VERSION,
    Document,
    Evaluation,
    Finding,
    Metrics,
    Num,
    Part,
    Record,
    Severity,
    Value,
    catalogue_names,
)


# ----------------------------------------------------------------------------- comparison
class Identity(Part):
    """Who a compared result is: enough to refuse an unfair comparison and to title it."""

    command: str | None = None
    created: str | None = None
    target: str | None = None
    target_name: str | None = None
    drafter: str | None = None
    drafter_kind: str | None = None
    prompt_set: str | None = None
    prompt_sha256: str | None = None
    temperature: float | None = None
    draft_temperature: float | None = None
    reference: str | None = None
    verdict: str | None = None
    describe: str


class OverallDelta(Part):
    metric: str
    baseline: Value
    candidate: Value
    delta: Num
    rel_change: Num
    higher_is_better: bool | None = None
    worse: bool | None = None
    baseline_se: Num = Field(default=None, description="The baseline value's standard error over prompts (null: the result carries none).")
    candidate_se: Num = Field(default=None, description="The candidate value's standard error over prompts.")
    delta_se: Num = Field(default=None, description="Standard error of delta: sqrt(baseline_se² + candidate_se²), the two runs taken as independent.")
    delta_z: Num = Field(default=None, description="delta ÷ delta_se: the change in standard errors; beyond ±2 it is more than noise.")
    rel_change_se: Num = Field(default=None, description="Standard error of rel_change: delta_se ÷ |baseline|.")


class DomainDelta(Part):
    group: str
    baseline: Num
    candidate: Num
    delta: Num
    rel_change: Num
    kl_baseline: Num = None
    kl_candidate: Num = None
    positions_baseline: int | None = None
    positions_candidate: int | None = None


class DepthDelta(Part):
    depth: int
    cumulative_baseline: Num
    cumulative_candidate: Num
    conditional_baseline: Num
    conditional_candidate: Num
    delta_conditional: Num
    rel_change_cumulative: Num
    cumulative_baseline_se: Num = Field(default=None, description="Standard error of cumulative_baseline over prompts (null: the result carries none).")
    cumulative_candidate_se: Num = None
    thin_baseline: bool | None = Field(default=None, description="The baseline's evidence at this depth is too thin to read (null: not judged).")
    thin_candidate: bool | None = None


class KDelta(Part):
    """τ, acceptance (accepted ÷ drafted) and speedup at one K on each side, each with its
    standard error over prompts where the result carries one."""

    k: int
    tau_baseline: Num
    tau_candidate: Num
    speedup_baseline: Num
    speedup_candidate: Num
    tau_baseline_se: Num = None
    tau_candidate_se: Num = None
    speedup_baseline_se: Num = None
    speedup_candidate_se: Num = None
    accept_rate_baseline: Num = Field(default=None, description="Accepted ÷ drafted tokens at this K (renewal estimate when the result has it, else the window).")
    accept_rate_candidate: Num = None
    accept_rate_baseline_se: Num = None
    accept_rate_candidate_se: Num = None


class CompareConfig(Record):
    fail_on: str | None = None
    rules: list[str] = Field(default_factory=list)
    baseline: str | None = None  # the files compared
    candidate: str | None = None
    allow_target_change: bool = False
    allow_prompt_change: bool = False
    allow_procedure_change: bool = False
    k: list[int] | None = None  # the draft lengths τ and speedup were compared at


class Comparison(Document):
    """A candidate drafter's result against a baseline's (the regression gate)."""

    schema_version: Literal[3] = SCHEMA_VERSION
    command: Literal["compare"] = "compare"
    specprobe_version: str | None = None
    created: str
    config: CompareConfig = Field(default_factory=CompareConfig)
    baseline: Identity
    candidate: Identity
    notes: list[str] = Field(default_factory=list)
    metrics: Metrics = Field(default_factory=dict)
    overall: list[OverallDelta] = Field(default_factory=list)
    by_domain: list[DomainDelta] = Field(default_factory=list)
    by_depth: list[DepthDelta] = Field(default_factory=list)
    depth_source: Literal["estimate", "measured"] = "estimate"
    k_table: list[KDelta] = Field(default_factory=list)
    verdict: str = "not judged"
    worst_severity: Severity | None = None
    findings: list[Finding] = Field(default_factory=list)
    evaluations: list[Evaluation] = Field(default_factory=list)

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        return catalogue_names(v)
