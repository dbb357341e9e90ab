"""What a head checkpoint is, read from its files: `HeadLayout` (kind, on-disk layout,
sizes, family details), the drafter-spec grammar for heads, and the EAGLE-3 auxiliary
layer conventions of the two engines that serve it.

Aux layers. An EAGLE-3 head reads three residual-stream states of the target, named by
index k = transformers' `hidden_states[k]` (the output of k decoder layers; 0 is the
embedding). Without explicit ids both engines take (2, L//2, L−3). With explicit ids
vLLM reads `hidden_states[id]`, while SGLang (llama, qwen and most other targets)
captures the input of layer id+1, i.e. `hidden_states[id + 1]`; SpecForge trains with
SGLang's capture and the speculators library with vLLM's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specprobe.core.errors import ConfigError, ModelLoadError
from specprobe.engines import ENGINES
from specprobe.models.heads.files import HeadFiles

HEAD_KINDS = ("eagle", "eagle3", "medusa", "mtp")
SPEC_PREFIXES = {"eagle3:": "eagle3", "eagle:": "eagle", "medusa:": "medusa"}
MTP_SPEC = "mtp"
# model types vLLM's speculators loader runs as an EAGLE-3 layer
EAGLE3_LAYER_TYPES = ("llama", "qwen3")


@dataclass
class HeadLayout:
    """One head checkpoint as found on disk (no weights loaded)."""

    kind: str  # eagle | eagle3 | medusa | mtp
    layout: str  # human-readable: "EAGLE-3 (speculators)", "Medusa (FasterDecoding v2)", …
    files: HeadFiles
    hidden_size: int  # the head's own hidden size
    vocab_size: int  # target-space vocabulary the head's config declares (0: not declared)
    draft_vocab_size: int  # rows of the head's own LM head (the target's when it reuses it)
    depths: int | None  # Medusa heads / MTP layers; None: an EAGLE head chains any depth
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return self.files.folder

    @property
    def config(self) -> dict[str, Any]:
        return self.files.config

    def describe(self) -> str:
        parts = [self.layout, f"hidden {self.hidden_size}"]
        if self.draft_vocab_size and self.vocab_size and self.draft_vocab_size != self.vocab_size:
            parts.append(f"draft vocab {self.draft_vocab_size} of {self.vocab_size}")
        if self.depths is not None:
            parts.append(f"{self.depths} {'heads' if self.kind == 'medusa' else 'layers'}")
        return ", ".join(parts)


def split_spec(spec: str) -> tuple[str | None, str]:
    """'eagle3:PATH' -> ('eagle3', PATH); 'mtp' -> ('mtp', ''); PATH -> (None, PATH)."""
    if spec == MTP_SPEC:
        return "mtp", ""
    for prefix, kind in SPEC_PREFIXES.items():
        if spec.startswith(prefix):
            rest = spec[len(prefix) :]
            if not rest:
                raise ConfigError(f"drafter spec {spec!r} names no path", f"write {prefix}PATH (the head's checkpoint folder)")
            return kind, rest
    return None, spec


def missing_head(kind: str, path: str) -> ModelLoadError:
    """The one message for a head folder that does not exist, whichever command finds it
    first (check reads the head's files, diagnose checks paths before the target loads)."""
    prefix = next((p for p, k in SPEC_PREFIXES.items() if k == kind), f"{kind}:")
    return ModelLoadError(f"model path {path} does not exist", f"pass the folder that holds the head's config.json and weights ({prefix}PATH)")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    return (2, num_layers // 2, num_layers - 3)


def aux_layers_by_engine(ids: tuple[int, ...] | None, num_layers: int) -> dict[str, tuple[int, ...]]:
    """hidden_states indices each engine feeds the head, for ids as written (None: default)."""
    capture = [e for e in ENGINES if e.eagle3_aux_offset is not None]
    if not ids:
        d = default_aux_layers(num_layers)
        return {e.name: d for e in capture}
    return {e.name: tuple(i + (e.eagle3_aux_offset or 0) for i in ids) for e in capture}


def int_tuple(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(int(x) for x in v)
    return None


_BUFFERS = ("d2t", "t2d", "token_map")


def header_params(layout: HeadLayout) -> int:
    """Parameters of the head's own tensors, from the headers (MTP: its layers only)."""
    import math

    if layout.kind == "mtp":
        pres = tuple(layout.details["prefixes"]) + (("mtp.",) if layout.details["format"] == "qwen3_next" else ())
        names = [n for n in layout.files.tensors if n.startswith(pres)]
    else:
        names = [n for n in layout.files.tensors if n.rsplit(".", 1)[-1] not in _BUFFERS]
    return sum(math.prod(layout.files.tensors[n].shape) for n in names)
