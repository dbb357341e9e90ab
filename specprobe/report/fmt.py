"""Numbers as text, for every report: percentages, fixed decimals, signed changes and
catalogue metrics with their units. Each report passes the mark it shows for a value
that was not measured (`none`), so the terminal, Markdown and HTML keep their looks."""

from __future__ import annotations

import math
from typing import Any

from specprobe.catalog import CATALOG, format_value

DASH = "–"  # en dash: Markdown and HTML
EM_DASH = "—"  # the terminal


def num(value: Any) -> float | None:
    """A number, or None for null/NaN/inf/missing/non-numeric."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float)):
        v = float(value)
        return None if math.isnan(v) or math.isinf(v) else v
    return None


def pct(x: Any, digits: int = 1, none: str = DASH) -> str:
    """0.724 → '72.4%'."""
    v = num(x)
    return none if v is None else f"{100 * v:.{digits}f}%"


def signed_pct(x: Any, none: str = DASH) -> str:
    """-0.05 → '-5.0%' (a relative change)."""
    v = num(x)
    return none if v is None else f"{100 * v:+.1f}%"


def fixed(x: Any, fmt: str = ".3f", none: str = DASH) -> str:
    """A number in a format spec, e.g. fixed(2.345, '.2f') → '2.35'."""
    v = num(x)
    return none if v is None else format(v, fmt)


def metric(name: str, x: Any, none: str = DASH) -> str:
    """A catalogue metric with its unit (counts and flags as integers)."""
    v = num(x)
    if v is None:
        return none
    unit = CATALOG[name].unit if name in CATALOG else ""
    return format_value(name, int(v) if unit in ("count", "bool") else v)


def signed_delta(name: str, x: Any, none: str = DASH) -> str:
    """A difference of two values of a metric: percentage points for fractions."""
    v = num(x)
    if v is None:
        return none
    unit = CATALOG[name].unit if name in CATALOG else ""
    return f"{100 * v:+.1f} pts" if unit == "frac" else f"{v:+.3g}"
