"""What every model and drafter is, whatever its kind: a model's facts read without its
weights (`ModelInfo`), the `Drafter` base class (an independent model, a layer-skip
self-draft, Medusa/MTP/EAGLE heads) and the target's teacher-forced outputs it reads
(`TargetPass`), and what a drafter reads of its target (`Target`). The kinds built on a
model live in `models/drafters.py` (models with a KV cache) and `models/heads/` (heads
over the target's hidden states); the n-gram drafters beside this module need no model."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass
class TargetPass:
    """The target's teacher-forced outputs over a batch: hidden states it exposes to drafters."""

    input_ids: Any  # [B, S]
    attention_mask: Any  # [B, S]
    last_hidden: Any  # [B, S, H] final-normed
    layer_hidden: dict[int, Any]  # layer index -> [B, S, H] (raw, pre-norm) for the layers drafters asked for


class Drafter(ABC):
    """A draft model paired with a target."""

    kind: str = "independent"
    #: depths the drafter predicts directly; None means autoregressive (depth 1 chained)
    head_depths: tuple[int, ...] | None = None

    def __init__(self, spec: str, target: Target) -> None:
        self.spec = spec
        self.target = target

    @property
    @abstractmethod
    def info(self) -> ModelInfo: ...

    @property
    def name(self) -> str:
        return self.spec

    @property
    def num_layers(self) -> int | None:
        return None

    @property
    def params(self) -> int | None:
        return None

    def target_layers_needed(self) -> tuple[int, ...]:
        """Raw hidden states of these target layers are handed over in TargetPass.layer_hidden."""
        return ()

    @abstractmethod
    def hidden(self, tp: TargetPass) -> Mapping[int, Any]:
        """depth -> [B, S, H'] features whose `logits(·, depth)` predict token t+depth at t."""

    @abstractmethod
    def logits(self, hidden: Any, depth: int) -> Any:
        """[N, H'] -> [N, V_draft] logits."""

    def step_model(self) -> Any:
        """A causal LM with a KV cache for real draft loops and cost timing (None for heads)."""
        return None


@dataclass
class ModelInfo:
    """What `check` needs: tokenizer, configs — no weights."""

    spec: str
    name: str
    path: Path
    config: Any
    tokenizer: Any
    generation_config: Any
    extra: dict[str, Any] = field(default_factory=dict)


class Target(Protocol):
    """What a drafter reads of the target it is paired with: `models.loader.LoadedModel`
    is the one kind. A protocol, so this module imports nothing from `models/` (the loader
    reads `ModelInfo` from here)."""

    info: ModelInfo
    model: Any  # a transformers causal LM in eval mode
    device: str
    dtype: Any

    @property
    def head(self) -> Any: ...

    def last_hidden(self, input_ids: Any, attention_mask: Any, cache_out: list[Any] | None = None) -> Any: ...

    @property
    def spec(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> Any: ...

    @property
    def tokenizer(self) -> Any: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def params(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...
