"""Prometheus text exposition from a serving engine's /metrics: parsing, and the map
from each engine's metric names (vLLM V1 and V0, SGLang) onto the canonical quantities
the windows module counts.

`ingest_samples` is pure bookkeeping: one scrape's samples in, counters and gauges per
`model_name` label added to the store. The same name maps drive the Prometheus source's
queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specprobe.monitor.base import MODEL_LABEL, UNLABELLED, IngestResult, SourceError, Store
from specprobe.monitor.windows import (
    ACCEPTED,
    DRAFT_TOKENS,
    DRAFTS,
    EMITTED,
    GAUGE_ACCEPT_LEN,
    GAUGE_ACCEPT_RATE,
    GAUGE_EFFICIENCY,
    ModelData,
    pos_key,
)

# ----------------------------------------------------------------------------- engine names
# Counter names without the `_total` suffix the client library adds on exposition.
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": DRAFTS,
    "vllm:spec_decode_num_draft_tokens": DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens": ACCEPTED,
    "vllm:spec_decode_num_emitted_tokens": EMITTED,  # V0
}
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
VLLM_GAUGES = {
    "vllm:spec_decode_draft_acceptance_rate": GAUGE_ACCEPT_RATE,  # V0
    "vllm:spec_decode_efficiency": GAUGE_EFFICIENCY,  # V0
}
SGLANG_GAUGES = {
    "sglang:spec_accept_length": GAUGE_ACCEPT_LEN,
    "sglang:spec_accept_rate": GAUGE_ACCEPT_RATE,
}
VLLM_V1_REQUIRED = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
VLLM_V0_REQUIRED = ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_emitted_tokens")


def _base_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_exposition(text: str) -> tuple[list[Sample], int]:
    """Samples from Prometheus text exposition, and how many lines were malformed.

    The library parser rejects the whole text on one bad line, so on failure each sample
    line is tried alone and the bad ones are dropped (counted) before parsing the rest."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples_of(body: str) -> list[Sample]:
        return [
            Sample(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(body)
            for s in fam.samples
        ]

    try:
        return samples_of(text), 0
    except ValueError:
        pass
    good: list[str] = []
    bad = 0
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            good.append(line)
            continue
        try:
            samples_of(line + "\n")
        except ValueError:
            bad += 1
            continue
        good.append(line)
    try:
        return samples_of("\n".join(good) + "\n"), bad
    except ValueError as e:  # a broken HELP/TYPE line: give up on this scrape
        raise SourceError(f"unparseable exposition text ({e})") from e


def _series_id(labels: dict[str, str], prefix: str) -> str:
    rest = sorted((k, v) for k, v in labels.items() if k not in (MODEL_LABEL, "position"))
    return prefix + ",".join(f"{k}={v}" for k, v in rest)


def detect_engine(names: set[str]) -> str | None:
    if any(n.startswith("vllm:spec_decode") for n in names):
        return "vllm-v1" if "vllm:spec_decode_num_drafts" in names else "vllm-v0"
    if any(n.startswith("sglang:spec_accept") for n in names):
        return "sglang"
    return None


def missing_families(engine: str | None, names: set[str], wanted: str) -> list[str]:
    """The spec-decode families this engine should export but did not."""
    if engine is None:
        if wanted == "sglang":
            return ["sglang:spec_accept_length"]
        if wanted == "vllm":
            return ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"]
        return ["vllm:spec_decode_* or sglang:spec_accept_*"]
    required: tuple[str, ...]
    if engine == "vllm-v1":
        required = (*VLLM_V1_REQUIRED, VLLM_PER_POS)
    elif engine == "vllm-v0":
        required = VLLM_V0_REQUIRED
    else:
        required = ("sglang:spec_accept_length",)
    return [n for n in required if n not in names]


def ingest_samples(samples: list[Sample], engine: str, t: float, store: Store, source: str) -> IngestResult:
    """Map one scrape onto the canonical quantities, per model_name."""
    names = {_base_name(s.name) for s in samples if not s.name.endswith("_created")}
    detected = detect_engine(names)
    if engine == "vllm" and detected == "sglang" or engine == "sglang" and detected and detected.startswith("vllm"):
        detected = None  # the user said which engine; the other one's names do not count
    result = IngestResult(detected, set(), missing=missing_families(detected, names, engine))
    if detected is None:
        return result
    totals: dict[str, dict[str, float]] = {}  # model → quantity → cumulative sum (for V0's K)
    for s in samples:
        if s.name.endswith("_created"):
            continue
        base = _base_name(s.name)
        model = s.labels.get(MODEL_LABEL, UNLABELLED)
        quantity: str | None = None
        kind = ""
        if detected.startswith("vllm"):
            if base in VLLM_COUNTERS:
                quantity, kind = VLLM_COUNTERS[base], "counter"
            elif base == VLLM_PER_POS:
                pos = s.labels.get("position", "")
                if not pos.isdigit():
                    result.malformed += 1
                    continue
                quantity, kind = pos_key(int(pos)), "counter"
            elif base in VLLM_GAUGES:
                quantity, kind = VLLM_GAUGES[base], "gauge"
        elif base in SGLANG_GAUGES:
            quantity, kind = SGLANG_GAUGES[base], "gauge"
        if quantity is None:
            continue
        if math.isnan(s.value) or math.isinf(s.value) or (kind == "counter" and s.value < 0):
            result.malformed += 1
            continue
        data = store.setdefault(model, ModelData())
        data.sources.add(source)
        sid = _series_id(s.labels, source + "|")
        if kind == "counter":
            data.add_counter(quantity, sid, t, s.value)
            totals.setdefault(model, {}).setdefault(quantity, 0.0)
            totals[model][quantity] += s.value
        else:
            data.add_gauge(quantity, sid, t, s.value)
            totals.setdefault(model, {})[quantity] = s.value
        result.models.add(model)
    if detected == "vllm-v0":
        for model, tot in totals.items():
            k = v0_num_spec_tokens(tot.get(DRAFT_TOKENS), tot.get(EMITTED), tot.get(GAUGE_EFFICIENCY))
            if k:
                store[model].num_spec_tokens = store[model].num_spec_tokens or k
    return result


def v0_num_spec_tokens(draft_tokens: float | None, emitted: float | None, efficiency: float | None) -> int | None:
    """K from vLLM V0's cumulative numbers: efficiency = emitted / (drafts·(K+1)) and
    draft_tokens = drafts·K, so drafts = emitted/efficiency − draft_tokens."""
    if not draft_tokens or not emitted or not efficiency or efficiency <= 0:
        return None
    drafts = emitted / efficiency - draft_tokens
    if drafts <= 0:
        return None
    k = round(draft_tokens / drafts)
    return k if 1 <= k <= 64 else None
