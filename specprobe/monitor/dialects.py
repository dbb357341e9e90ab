"""Each engine's own monitoring knowledge, found by asking the engines: an engine with a
`monitor_family` keeps its metric names, log parser and rule names in its package's
`monitor` module (`specprobe.engines.<engine>.monitor`), loaded here by name, as a
linter loads its dialects. The generic sources (exposition, prometheus, logs,
promrules) iterate these and never name an engine.

A monitor module may define, each optional:
    COUNTERS, GAUGES      /metrics name (no `_total`) → the windows series it counts
    PER_POS               the per-position accepted counter, labelled `position`
    PROM_GAUGES           the gauges a Prometheus server's windows average
    SHAPES                draft-shape gauges whose latest value gives K (`k_from_shapes`)
    detect(names)         the family variant one scrape's names show, or None
    REQUIRED              variant → the names that variant must export
    EXPECTED, GLOB        what it should export when it exports nothing of spec decoding
    exports_without_spec(names)  its names are there though spec decoding is not
    k_from_totals(variant, totals)  K from one model's cumulative numbers
    RULES                 `specprobe alerts`' names: by, counters, per_pos, gauges, engine_label
    parse_log_line(line), apply_record(rec, t, data, state, series), flush(data, state),
    detected_kind(kind)   its log lines
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from specprobe.engines import ENGINES, Engine


@functools.cache
def dialects() -> tuple[tuple[Engine, str, ModuleType], ...]:
    """(engine, monitor family, its monitor module) for every engine that has one, in
    the engines' order (the order detection tries them in)."""
    out = []
    for engine in ENGINES:
        family = engine.monitor_family
        if family is None:
            continue
        out.append((engine, family, importlib.import_module(type(engine).__module__ + ".monitor")))
    return tuple(out)


def families() -> tuple[str, ...]:
    """The monitor families (`--engine` of monitor, bar 'auto')."""
    return tuple(f for _, f, _ in dialects())


def engine_choices() -> tuple[str, ...]:
    """monitor's --engine: auto, or the family of each engine whose metrics or logs it reads."""
    return ("auto", *(f for _, f, m in dialects() if hasattr(m, "detect")))


def module(family: str | None) -> ModuleType | None:
    """The monitor module of a family (or of a detected variant: 'vllm-v1' → vllm's)."""
    if not family:
        return None
    name = family.split("-")[0]
    return next((m for _, f, m in dialects() if f == name), None)
