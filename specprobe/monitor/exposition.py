"""Prometheus text exposition from a serving engine's /metrics: parsing, and the map
from each engine's metric names (vLLM V1 and V0, SGLang, llama.cpp's server) onto the
canonical quantities the windows module counts.

`ingest_samples` is pure bookkeeping: one scrape's samples in, counters and gauges per
`model_name` label added to the store. The same name maps drive the Prometheus source's
queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specprobe.monitor import windows  # the series' names: windows.ACCEPTED, …
from specprobe.monitor.base import MODEL_LABEL, UNLABELLED, IngestResult, SourceError, Store
from specprobe.monitor.windows import ModelData, pos_key

# ----------------------------------------------------------------------------- engine names
# Counter names without the `_total` suffix the client library adds on exposition.
VLLM_COUNTERS = {
    "vllm:spec_decode_num_drafts": windows.DRAFTS,
    "vllm:spec_decode_num_draft_tokens": windows.DRAFT_TOKENS,
    "vllm:spec_decode_num_accepted_tokens": windows.ACCEPTED,
    "vllm:spec_decode_num_emitted_tokens": windows.EMITTED,  # V0
}
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
VLLM_GAUGES = {
    "vllm:spec_decode_draft_acceptance_rate": windows.GAUGE_ACCEPT_RATE,  # V0
    "vllm:spec_decode_efficiency": windows.GAUGE_EFFICIENCY,  # V0
}
SGLANG_GAUGES = {
    "sglang:spec_accept_length": windows.GAUGE_ACCEPT_LEN,  # bonus token included
    "sglang:spec_accept_rate": windows.GAUGE_ACCEPT_RATE,
}
# Newer SGLang: verify steps as a counter (one per draft, added when a request finishes)
# and the active draft shape as gauges (adaptive speculation changes them at run time).
SGLANG_COUNTERS = {"sglang:spec_verify_calls": windows.DRAFTS}
SGLANG_NUM_STEPS = "sglang:spec_num_steps"  # draft depth K of a chain
SGLANG_NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"  # tokens per verify, root included: K + 1 for a chain
# llama.cpp's server (`--metrics`, builds from 2025 on): the vLLM V1 set under its own prefix.
LLAMACPP_COUNTERS = {
    "llamacpp:spec_decode_num_drafts": windows.DRAFTS,
    "llamacpp:spec_decode_num_draft_tokens": windows.DRAFT_TOKENS,
    "llamacpp:spec_decode_num_accepted_tokens": windows.ACCEPTED,
}
LLAMACPP_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"
LLAMACPP_REQUIRED = tuple(LLAMACPP_COUNTERS)
VLLM_V1_REQUIRED = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
VLLM_V0_REQUIRED = ("vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_emitted_tokens")


# family → (counters, per-position counter, gauges)
_NAME_MAPS: dict[str, tuple[dict[str, str], str | None, dict[str, str]]] = {
    "vllm": (VLLM_COUNTERS, VLLM_PER_POS, VLLM_GAUGES),
    "sglang": (SGLANG_COUNTERS, None, SGLANG_GAUGES),
    "llamacpp": (LLAMACPP_COUNTERS, LLAMACPP_PER_POS, {}),
    "": ({}, None, {}),
}


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

    # The library parser raises ValueError on most damage, but IndexError, TypeError and
    # others on some (garbage bytes, a lone quote): any of them means "not exposition".
    try:
        return samples_of(text), 0
    except Exception:  # noqa: BLE001 - see above
        pass
    good: list[str] = []
    bad = kept = 0
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            good.append(line)
            continue
        try:
            samples_of(line + "\n")
        except Exception:  # noqa: BLE001 - see above
            bad += 1
            if bad >= 1000 and bad > 10 * kept:  # an HTML page, a binary, megabytes of noise
                raise SourceError(f"not Prometheus exposition text ({bad} of the first {bad + kept} sample lines malformed)") from None
            continue
        kept += 1
        good.append(line)
    try:
        return samples_of("\n".join(good) + "\n"), bad
    except Exception as e:  # noqa: BLE001 - a broken HELP/TYPE line: give up on this scrape
        raise SourceError(f"unparseable exposition text ({type(e).__name__}: {str(e)[:80]})") from e


def _series_id(labels: dict[str, str], prefix: str) -> str:
    rest = sorted((k, v) for k, v in labels.items() if k not in (MODEL_LABEL, "position"))
    return prefix + ",".join(f"{k}={v}" for k, v in rest)


def detect_engine(names: set[str]) -> str | None:
    if any(n.startswith("vllm:spec_decode") for n in names):
        return "vllm-v1" if "vllm:spec_decode_num_drafts" in names else "vllm-v0"
    if any(n.startswith("sglang:spec_accept") or n == "sglang:spec_verify_calls" for n in names):
        return "sglang"
    if any(n.startswith("llamacpp:spec_decode") for n in names):
        return "llamacpp"
    return None


def _family(detected: str | None) -> str | None:
    """vllm-v1/vllm-v0 → vllm; the others are their own family."""
    return detected.split("-")[0] if detected else None


def missing_families(engine: str | None, names: set[str], wanted: str) -> list[str]:
    """The spec-decode families this engine should export but did not."""
    if engine is None:
        if wanted == "sglang":
            return ["sglang:spec_accept_length"]
        if wanted == "vllm":
            return ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens"]
        if wanted == "llamacpp" or any(n.startswith("llamacpp:") for n in names):
            # A llama.cpp server without a draft model, or a build older than its
            # spec_decode counters, still exports llamacpp:* names.
            return list(LLAMACPP_REQUIRED)
        return ["vllm:spec_decode_*, sglang:spec_accept_* or llamacpp:spec_decode_*"]
    required: tuple[str, ...]
    if engine == "vllm-v1":
        required = (*VLLM_V1_REQUIRED, VLLM_PER_POS)
    elif engine == "vllm-v0":
        required = VLLM_V0_REQUIRED
    elif engine == "llamacpp":
        required = LLAMACPP_REQUIRED
    else:
        required = ("sglang:spec_accept_length",)
    return [n for n in required if n not in names]


ENGINE_LABEL = "engine"  # vLLM's data-parallel engine index


def engine_row(model: str, engine: str) -> str:
    """The row of one data-parallel engine of a model (`--per-engine`)."""
    return f"{model} [engine {engine}]"


def ingest_samples(samples: list[Sample], engine: str, t: float, store: Store, source: str, prev_t: float | None = None,
                   per_engine: bool = False) -> IngestResult:
    """Map one scrape onto the canonical quantities, per model_name (summed over vLLM's
    `engine` label); with `per_engine`, also one row per model and engine.

    `prev_t` is the time of this source's previous good scrape. A counter series first
    seen now was absent then, so it was created since and counted from zero: it gets a
    zero at `prev_t`, or its first window would lose everything it counted (llama.cpp
    creates its per-position series at the first verify step, a new model_name appears
    with its first request)."""
    names = {_base_name(s.name) for s in samples if not s.name.endswith("_created")}
    detected = detect_engine(names)
    if engine not in ("auto", None) and _family(detected) != engine:
        detected = None  # the user said which engine; another one's names do not count
    result = IngestResult(detected, set(), missing=missing_families(detected, names, engine))
    if detected is None:
        return result
    totals: dict[str, dict[str, float]] = {}  # model → quantity → cumulative sum (for V0's K)
    shapes: dict[str, dict[str, float]] = {}  # model → SGLang draft-shape gauge → value
    for s in samples:
        if s.name.endswith("_created"):
            continue
        base = _base_name(s.name)
        model = s.labels.get(MODEL_LABEL, UNLABELLED)
        quantity: str | None = None
        kind = ""
        counters, per_pos, gauges = _NAME_MAPS[_family(detected) or ""]
        if base in counters:
            quantity, kind = counters[base], "counter"
        elif base == per_pos:
            pos = s.labels.get("position", "")
            if not pos.isdigit():
                result.malformed += 1
                continue
            quantity, kind = pos_key(int(pos)), "counter"
        elif base in gauges:
            quantity, kind = gauges[base], "gauge"
        elif detected == "sglang" and base in (SGLANG_NUM_STEPS, SGLANG_NUM_DRAFT_TOKENS):
            quantity, kind = base, "shape"
        if quantity is None:
            continue
        if math.isnan(s.value) or math.isinf(s.value) or (kind == "counter" and s.value < 0):
            result.malformed += 1
            continue
        if kind == "shape":
            shapes.setdefault(model, {})[quantity] = s.value
            continue
        sid = _series_id(s.labels, source + "|")
        rows = [model]
        if per_engine and s.labels.get(ENGINE_LABEL):
            rows.append(engine_row(model, s.labels[ENGINE_LABEL]))
        for row in rows:
            data = store.setdefault(row, ModelData())
            data.sources.add(source)
            if kind == "counter":
                if prev_t is not None and prev_t < t and (quantity, sid) not in data.counters:
                    data.add_counter(quantity, sid, prev_t, 0.0)
                data.add_counter(quantity, sid, t, s.value)
                totals.setdefault(row, {}).setdefault(quantity, 0.0)
                totals[row][quantity] += s.value
            else:
                data.add_gauge(quantity, sid, t, s.value)
                totals.setdefault(row, {})[quantity] = s.value
            result.models.add(row)
    if detected == "vllm-v0":
        for model, tot in totals.items():
            k = v0_num_spec_tokens(tot.get(windows.DRAFT_TOKENS), tot.get(windows.EMITTED), tot.get(windows.GAUGE_EFFICIENCY))
            if k:
                store[model].num_spec_tokens = store[model].num_spec_tokens or k
    for model, shape in shapes.items():
        k = sglang_num_spec_tokens(shape.get(SGLANG_NUM_STEPS), shape.get(SGLANG_NUM_DRAFT_TOKENS))
        if k and model in store:
            store[model].num_spec_tokens = k  # the active tier: adaptive K moves, latest wins
    return result


def sglang_num_spec_tokens(num_steps: float | None, num_draft_tokens: float | None) -> int | None:
    """K, the drafted tokens per verify of a chain, from SGLang's draft-shape gauges:
    the step count, else the tokens per verify less the root token (0 = not speculating)."""
    if num_steps and num_steps >= 1:
        return int(num_steps)
    if num_draft_tokens and num_draft_tokens >= 2:
        return int(num_draft_tokens) - 1
    return None


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
