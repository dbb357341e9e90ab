"""The result of a run, typed: what `check`, `diagnose` and `simulate` return and write
as JSON, and what `compare` makes of two of them. Defined once here; every report, the
compare gate and the docs' JSON Schema (docs/result.schema.json) read these models.

Conventions held by the types themselves:
- a number that could not be measured is None (JSON null), never NaN or inf: every
  numeric field goes through `finite`, the one place that turns NaN/inf into None;
- metric names are the catalogue's (specprobe/catalog.py); an unknown name is refused;
- per-depth arrays are indexed from depth 1; τ includes the bonus token.

Versioning: SCHEMA_VERSION is written into every file. `upgrade` turns an older
file's dict into the current layout before validation; add one step per version. A
new section is one optional field (default None) on `Result` — see the marked place.

Imports nothing heavy: `specprobe report` and `compare` must start without torch.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

SCHEMA_VERSION: Literal[2] = 2
READABLE_VERSIONS = (1, 2)

Severity = Literal["error", "warning", "info"]


# ----------------------------------------------------------------------------- numbers
def finite(x: Any) -> Any:
    """NaN/inf → None and numpy scalars → Python numbers: the schema's one cleaner."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if not isinstance(x, (int, float)) and hasattr(x, "item"):
        x = x.item()  # numpy scalar
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    return x


Num = Annotated[float | None, BeforeValidator(finite)]
# A metric value keeps its int-ness (counts, flags, K) so that JSON shows 3, not 3.0.
Value = Annotated[int | float | None, BeforeValidator(finite)]


class Part(BaseModel):
    """Every section: immutable, and refuses fields it does not know (a typo in the
    assembly or a file from a newer specprobe fails loudly instead of vanishing)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Record(Part):
    """A record of settings or facts (config, environment, sampling, alignment facts):
    the fields reports read are typed; keys that newer flags or checks add are kept as
    they are, so adding a setting never breaks reading a result."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _catalogue_names(v: dict[str, Any]) -> dict[str, Any]:
    from specprobe.catalog import CATALOG

    unknown = sorted(k for k in v if k not in CATALOG)
    if unknown:
        raise ValueError(f"metric(s) not in the catalogue: {', '.join(unknown)}")
    return v


Metrics = Annotated[dict[str, Value], Field(description="Catalogue metric name → value (null: not measured).")]


# ----------------------------------------------------------------------------- run header
class RunConfig(Record):
    """The settings the run used (flags and config file merged). Every key is optional:
    `check` records only the ones it takes."""

    target: str | None = None
    drafter: str | None = None
    prompts: str | None = None
    domains: list[str] | None = None
    max_prompts: int | None = None
    max_new_tokens: int | None = None
    reference: str | None = None
    seed: int | None = None
    batch_size: int | None = None
    k_max: int | None = None
    verify_factor: float | None = None
    cost_ratio: float | None = None
    device: str | None = None
    dtype: str | None = None
    rules: list[str] = Field(default_factory=list)
    fail_on: str | None = None
    force: bool | None = None
    use_cache: bool | None = None
    chunk_positions: int | None = None
    keep_positions: bool | None = None
    temperature: float | None = None
    draft_temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    draft_top_k: int | None = None
    draft_top_p: float | None = None
    # simulate only
    k: list[int] | None = None
    adaptive_threshold: float | None = None

    @model_serializer(mode="wrap")
    def _only_given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written back as given: a command's config lists the settings it has, no more.
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}


class Environment(Record):
    device: str
    dtype: str
    torch: str | None = None
    transformers: str | None = None
    python: str
    platform: str
    packages: dict[str, str | None] = Field(default_factory=dict)


class Target(Part):
    spec: str
    name: str | None = None
    num_layers: int | None = None
    vocab_size: int | None = None
    params: int | None = None


class Drafter(Part):
    spec: str
    kind: str | None = None
    name: str | None = None
    num_layers: int | None = None
    params: int | None = None


class PromptSetInfo(Part):
    name: str
    source: str
    sha256: str
    num_prompts: int
    domains: list[str]


class SamplingSide(Record):
    """One side's effective sampling settings (temperature 0 = greedy)."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    semantics: str | None = None  # whose transform: vllm | sglang | transformers

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


class SamplingInfo(Record):
    target: SamplingSide
    draft: SamplingSide
    sources: dict[str, str] = Field(default_factory=dict, description="Where each setting came from: flag, generation_config, default, target's.")


class SideFacts(Record):
    name: str | None = None
    vocab: int | None = None
    tokenizer: int | None = None
    context: int | None = None
    sampling: str | None = None


class AlignmentFacts(Record):
    target: SideFacts
    drafter: SideFacts
    sampling_sources: dict[str, str] = Field(default_factory=dict)
    sampling_semantics: str | None = None
    drafter_own_sampling: dict[str, float] | None = None


class Alignment(Part):
    facts: AlignmentFacts
    evidence: dict[str, list[str]] = Field(default_factory=dict, description="Metric name → lines that show where its value came from.")


# ----------------------------------------------------------------------------- estimate tables
class DomainRow(Part):
    """Means over the positions of one domain."""

    group: str
    positions: int
    accept_prob_mean: Num = None
    greedy_agree_frac: Num = None
    kl_target_draft_nats: Num = None
    target_entropy_nats: Num = None
    draft_confidence_mean: Num = None
    tv_mean: Num = None


class BucketRow(Part):
    """Means over the positions of one bucket [lo, hi) of target entropy or context position."""

    group: str
    lo: Value
    hi: Value = None  # None: open-ended
    positions: int
    accept_prob_mean: Num = None
    greedy_agree_frac: Num = None
    kl_target_draft_nats: Num = None
    target_entropy_nats: Num = None
    draft_confidence_mean: Num = None
    tv_mean: Num = None


GroupRow = DomainRow | BucketRow


class Histogram(Part):
    edges: list[Num] = Field(description="len(counts) + 1 bin edges; a null last edge is +∞.")
    counts: list[int]


class Histograms(Part):
    accept_prob: Histogram | None = None
    kl_target_draft_nats: Histogram | None = None


class Depth(Part):
    """Acceptance by draft depth (from 1): cumulative r_j and conditional a_j = r_j / r_(j−1)."""

    depth: list[int]
    cumulative: list[Num]
    conditional: list[Num]
    source: Literal["estimate", "measured"] = "estimate"
    head_depths: list[int] = Field(default_factory=list, description="Depths a head drafter predicted directly (others chain depth 1).")


class KRow(Part):
    """One draft length K. tau_tokens/accept_rate: the window estimate (every start
    position); *_renewal: rounds start where the previous one ended, as in a real loop;
    speedup uses the renewal τ when known (speedup_window: from the window τ)."""

    k: int
    tau_tokens: Num
    accept_rate: Num
    iid_tau_tokens: Num
    speedup: Num
    tau_renewal_tokens: Num = None
    accept_rate_renewal: Num = None
    speedup_window: Num = None


class Adaptive(Part):
    threshold: Num
    tau_tokens: Num
    speedup: Num
    mean_k: Num


class Cost(Part):
    cost_ratio: Num
    target_step_ms: Num = None
    draft_step_ms: Num = None
    measured: bool = False
    verify_factor: Num = 1.0


class Positions(Part):
    """Per-position rows (diagnose --csv positions.csv), all columns the same length."""

    prompt_id: list[str]
    domain: list[str]
    position: list[int]
    accept_prob: list[Num]
    greedy_agree: list[Num]
    kl_target_draft_nats: list[Num]
    target_entropy_nats: list[Num]
    draft_confidence: list[Num]

    def columns(self) -> dict[str, list[Any]]:
        return {name: getattr(self, name) for name in type(self).model_fields}


# ----------------------------------------------------------------------------- measured (simulate)
class MeasuredRow(Part):
    k: int
    tau_tokens: Num
    tokens_per_verify: Num
    accept_rate: Num
    speedup: Num
    tokens_per_s: Num
    num_drafts: int
    draft_ms_per_step: Num
    target_ms_per_step: Num
    tau_estimate: Num
    tau_gap: Num
    emitted_tokens: int
    wall_s: Num
    prompts: int


class MeasuredDepth(Depth):
    k: int
    accepted_per_position: list[int]
    drafted_per_position: list[int]
    num_drafts: int
    source: Literal["estimate", "measured"] = "measured"


class MeasuredAdaptive(Part):
    threshold: Num
    k_max: int
    tokens_per_verify: Num
    mean_k: Num
    accept_rate: Num
    tokens_per_s: Num
    speedup: Num
    num_drafts: int


class Measured(Part):
    """What the real draft→verify loop measured (simulate)."""

    k_table: list[MeasuredRow] = Field(default_factory=list)
    depth: MeasuredDepth | None = None
    baseline_tokens_per_s: Num = None
    baseline_wall_s: Num = None
    baseline_target_ms_per_step: Num = None
    adaptive: MeasuredAdaptive | None = None
    note: str = ""
    interrupted: bool = False


# ----------------------------------------------------------------------------- verdict
class Finding(Part):
    rule_id: str
    name: str
    severity: Severity
    message: str
    remedy: str
    threshold: str
    measured: dict[str, Value | str] = Field(default_factory=dict)
    verdict: str = ""
    evidence: list[str] = Field(default_factory=list)


class Evaluation(Part):
    rule_id: str
    name: str
    severity: Severity
    status: Literal["pass", "fail", "skipped"]


class Verdict(Part):
    """The rules' judgement; shared by results and comparisons."""

    verdict: str
    worst_severity: Severity | None = None
    findings: list[Finding] = Field(default_factory=list)
    evaluations: list[Evaluation] = Field(default_factory=list)


class _Document(Part):
    def to_json(self) -> str:
        """The file format: indented UTF-8 JSON, null for what was not measured."""
        return json.dumps(self.model_dump(mode="json"), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


# ----------------------------------------------------------------------------- the result
class Result(_Document):
    """A check, diagnose or simulate run. Sections a run did not reach stay empty/None:
    `check` and a run stopped by alignment errors have no tables; only `simulate` has
    `measured`."""

    schema_version: Literal[2] = SCHEMA_VERSION
    command: Literal["check", "diagnose", "simulate"]
    specprobe_version: str | None = None
    created: str
    config: RunConfig
    environment: Environment | None = None
    target: Target
    drafter: Drafter
    prompt_set: PromptSetInfo | None = None
    reference: Literal["on-policy", "off-policy"] | None = None
    sampling: SamplingInfo | None = None
    alignment: Alignment | None = None
    interrupted: bool = False
    scored: bool = False
    stopped: str | None = Field(default=None, description="Why scoring did not run (alignment errors); null when it ran.")
    metrics: Metrics = Field(default_factory=dict)
    by_domain: list[DomainRow] = Field(default_factory=list)
    by_entropy: list[BucketRow] = Field(default_factory=list)
    by_position: list[BucketRow] = Field(default_factory=list)
    histograms: Histograms | None = None
    depth: Depth | None = None
    k_table: list[KRow] = Field(default_factory=list)
    adaptive: Adaptive | None = None
    cost: Cost | None = None
    positions: Positions | None = None
    measured: Measured | None = None
    # ---- new sections go here, one optional field each (default None), e.g. renewal τ,
    # per-category tables, token-level drill-down, head coverage, shard provenance.
    verdict: str
    worst_severity: Severity | None = None
    findings: list[Finding] = Field(default_factory=list)
    evaluations: list[Evaluation] = Field(default_factory=list)

    @field_validator("metrics")
    @classmethod
    def _known_metrics(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _catalogue_names(v)

    @property
    def best_k(self) -> int | None:
        v = self.metrics.get("best_k")
        return None if v is None else int(v)

    def metric(self, name: str) -> float | None:
        """A catalogue metric as a float (None when not measured)."""
        v = self.metrics.get(name)
        return None if v is None else float(v)

    def describe(self) -> str:
        """'self:layers=28 → smollm2' for titles."""
        return f"{self.drafter.spec or self.config.drafter or '?'} → {self.target.spec or self.config.target or '?'}"

    def temperatures(self) -> tuple[float | None, float | None]:
        """(target, drafter) temperatures the run used: the resolved sampling settings
        when present, else the flags."""
        if self.sampling is not None:
            return self.sampling.target.temperature, self.sampling.draft.temperature
        return self.config.temperature, self.config.draft_temperature


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


class KDelta(Part):
    k: int
    tau_baseline: Num
    tau_candidate: Num
    speedup_baseline: Num
    speedup_candidate: Num


class CompareConfig(Record):
    fail_on: str | None = None
    rules: list[str] = Field(default_factory=list)
    baseline: str | None = None  # the files compared
    candidate: str | None = None
    allow_target_change: bool = False
    allow_prompt_change: bool = False


class Comparison(_Document):
    """A candidate drafter's result against a baseline's (the regression gate)."""

    schema_version: Literal[2] = SCHEMA_VERSION
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
        return _catalogue_names(v)


# ----------------------------------------------------------------------------- older files
def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 → v2: the top-level `best_k` copy of metrics.best_k is gone (read the metric);
    comparisons carried their config last and only once judged."""
    out = {k: v for k, v in data.items() if k != "best_k"}
    if out.get("command") == "compare":
        out.setdefault("config", {})
    out["schema_version"] = 2
    return out


_UPGRADES = {1: _v1_to_v2}


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


if __name__ == "__main__":  # python -m specprobe.result > docs/result.schema.json
    print(json.dumps(json_schema(), indent=1, ensure_ascii=False))
