"""Prometheus text exposition from a serving engine's /metrics: parsing, and the map
from each engine's metric names (its `monitor` module's COUNTERS, PER_POS, GAUGES,
SHAPES, see `dialects`) onto the canonical quantities the windows module counts.

`ingest_samples` is pure bookkeeping: one scrape's samples in, counters and gauges per
`model_name` label added to the store. The same name maps drive the Prometheus source's
queries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specprobe.monitor.base import MODEL_LABEL, UNLABELLED, IngestResult, SourceError, Store
from specprobe.monitor.dialects import dialects, module
from specprobe.monitor.windows import ModelData, pos_key


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
    """The first engine (in the engines' order) whose metric names the scrape shows."""
    for _, _, mod in dialects():
        detected = mod.detect(names) if hasattr(mod, "detect") else None
        if detected:
            return str(detected)
    return None


def _family(detected: str | None) -> str | None:
    """A detected variant's family: vllm-v1/vllm-v0 → vllm; the others are their own."""
    return detected.split("-")[0] if detected else None


def missing_families(engine: str | None, names: set[str], wanted: str) -> list[str]:
    """The spec-decode families this engine should export but did not."""
    if engine is None:
        mod = module(wanted)
        if mod is not None and hasattr(mod, "EXPECTED"):
            return list(mod.EXPECTED)
        for _, _, m in dialects():
            if hasattr(m, "exports_without_spec") and m.exports_without_spec(names):
                return list(m.EXPECTED)
        globs = [m.GLOB for _, _, m in dialects() if hasattr(m, "GLOB")]
        return [", ".join(globs[:-1]) + " or " + globs[-1] if len(globs) > 1 else "".join(globs)]
    required: tuple[str, ...] = tuple(getattr(module(engine), "REQUIRED", {}).get(engine, ()))
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
    shapes: dict[str, dict[str, float]] = {}  # model → draft-shape gauge → value
    mod = module(detected)
    if mod is None:
        return result
    counters: dict[str, str] = getattr(mod, "COUNTERS", {})
    per_pos: str | None = getattr(mod, "PER_POS", None)
    gauges: dict[str, str] = getattr(mod, "GAUGES", {})
    shape_names: tuple[str, ...] = getattr(mod, "SHAPES", ())
    for s in samples:
        if s.name.endswith("_created"):
            continue
        base = _base_name(s.name)
        model = s.labels.get(MODEL_LABEL, UNLABELLED)
        quantity: str | None = None
        kind = ""
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
        elif base in shape_names:
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
    if hasattr(mod, "k_from_totals"):
        for model, tot in totals.items():
            k = mod.k_from_totals(detected, tot)
            if k:
                store[model].num_spec_tokens = store[model].num_spec_tokens or k
    for model, shape in shapes.items():
        k = mod.k_from_shapes(shape)
        if k and model in store:
            store[model].num_spec_tokens = k  # the active tier: adaptive K moves, latest wins
    return result
