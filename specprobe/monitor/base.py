"""What every monitor source shares: the per-model store it writes into, the result of
one poll, and the error that marks a poll as transiently failed.

A source is anything with `name`, `kind`, `detected` and
`poll(t, store, warn, **window_settings) -> IngestResult`; the runner drives them all
the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specprobe.monitor.windows import ModelData

MODEL_LABEL = "model_name"
UNLABELLED = "(no model_name)"

Store = dict[str, ModelData]
Warn = Callable[[str, str], None]  # (key, message): the runner prints each key once


class SourceError(Exception):
    """A transient failure of one poll: endpoint down, slow, or answering garbage."""


@dataclass
class IngestResult:
    engine: str | None  # the detected family variant (an engine's `detect`), or None
    models: set[str]
    malformed: int = 0
    missing: list[str] = field(default_factory=list)
    detected: str | None = None  # the engine this source settled on so far


