"""The building blocks of result files: the number types (NaN/inf → null in one
place), the immutable base models, catalogue-checked metrics, and the verdict parts
(findings, evaluations) that results and comparisons share. The rules engine
(specprobe/judge/rules.py) builds these very types, so a finding is written as it was
made; this module stays below the engine and never imports it."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from specprobe.judge.catalog import CATALOG

SCHEMA_VERSION: Literal[3] = 3
READABLE_VERSIONS = (1, 2, 3)

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


def catalogue_names(v: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(k for k in v if k not in CATALOG)
    if unknown:
        raise ValueError(f"metric(s) not in the catalogue: {', '.join(unknown)}")
    return v


Metrics = Annotated[dict[str, Value], Field(description="Catalogue metric name → value (null: not measured).")]


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


class Document(Part):
    def to_json(self) -> str:
        """The file format: indented UTF-8 JSON, null for what was not measured."""
        return json.dumps(self.model_dump(mode="json"), indent=1, ensure_ascii=False, allow_nan=False) + "\n"
